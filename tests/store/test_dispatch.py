"""The dispatcher's columnar scan against the record-at-a-time reference scan, and index hashing.

``CommitLog.scan`` parses each record on its own (the reference); ``scan_batch`` finds runs of
equal-size records, gathers fields with strided views and parses each distinct tail once. Both must
report exactly the same facts for every record, however the workload mixes sizes, tags, keys,
properties, unique ids, delay messages and file boundaries.
"""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostmq import records as R
from hostmq.message import Message
from hostmq.store.commitlog import SCHEDULE_TOPIC
from hostmq.store.dispatch import index_entries, scan_batch, stored_unique_ids
from hostmq.store.encode import encode_message
from hostmq.store.index import index_key, index_key_hash, index_key_hashes, prefix_hash


pytestmark = pytest.mark.timeout(120)


def _fill(store, seed: int, n: int) -> None:
    """A mixed workload: singles and batches, equal-size runs and odd sizes, every property kind."""
    rng = random.Random(seed)
    i = 0
    while i < n:
        topic = rng.choice(["A", "B", "Topic_C"])
        qid = rng.randrange(4)
        if rng.random() < 0.3:   # a batch of equal-size records (a run), maybe one odd one at the end
            k = rng.randrange(2, 40)
            size = rng.randrange(1, 300)
            msgs = [Message(topic, bytes([65 + j % 26]) * size, tags="run") for j in range(k)]
            if rng.random() < 0.5:
                msgs.append(Message(topic, b"odd" * rng.randrange(1, 50), tags="run"))
            store.put_batch(msgs, queue_id=qid)
            i += len(msgs)
            continue
        kind = rng.randrange(5)
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
        if kind == 0:
            m = Message(topic, body)
        elif kind == 1:
            m = Message(topic, body, tags=rng.choice(["a", "b", "TagA"]))
        elif kind == 2:
            m = Message(topic, body, tags="k", keys=[f"key{i}", f"alt{i % 7}"])
        elif kind == 3:
            m = Message(topic, body, properties={"region": rng.choice(["eu", "us"]), "n": str(i)})
        else:
            m = Message(SCHEDULE_TOPIC, body, tags="d", properties={"REAL_TOPIC": topic},
                        delay_level=rng.randrange(1, 19))
        store.put(m, queue_id=qid)
        i += 1
    # A record without a unique id (encoded by hand), so the full-parse path is covered too.
    raw = R.encode_record(b"A", b"no-uniq", R.encode_properties({"TAGS": "x", "KEYS": "bare"}))
    blob, starts = R.encode_batch([raw])
    store.append_encoded("A", 0, blob, starts)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), chunk=st.sampled_from([1, 7, 64, 5000]))
def test_columnar_scan_equals_the_reference_scan(open_store, tmp_path_factory, seed, chunk):
    store = open_store(tmp_path_factory.mktemp("s"), message_index_enable=False)
    _fill(store, seed, 400)
    cl = store.commitlog
    end = cl.max_offset()
    assert len(cl.mfq.files) > 1, "the workload must cross commitlog files"
    reference, ref_next = cl.scan(0, end, 10 ** 6)
    got, phys = [], 0
    while phys < end:
        batch, nxt = scan_batch(cl, phys, end, chunk)
        assert nxt > phys
        got += batch.requests()
        phys = nxt
    assert phys == ref_next == end
    assert len(got) == len(reference)
    for a, b in zip(reference, got):
        assert a == b


def test_delay_messages_carry_their_due_time_as_tag_code(open_store):
    store = open_store(message_index_enable=False)
    r = store.put(Message(SCHEDULE_TOPIC, b"later", delay_level=3), queue_id=2)
    batch, _ = scan_batch(store.commitlog, 0, store.commitlog.max_offset())
    (req,) = batch.requests()
    stored = store.commitlog.store_ts_at(r.phys_offset)
    assert req.tag_hash == stored + 10_000     # level 3 = 10 s in RocketMQ's default table


def test_index_hashes_of_sliced_unique_ids_equal_the_string_hashes(open_store):
    store = open_store(message_index_enable=False)
    _fill(store, 3, 300)
    cl = store.commitlog
    batch, _ = scan_batch(cl, 0, cl.max_offset(), 10 ** 6)
    hashes, phys, ts = index_entries(batch, prefix_hash, index_key_hashes)
    expected = []
    for r in batch.requests():
        if r.sys_flag & R.SYSFLAG_TX_MASK in (R.SYSFLAG_TX_PREPARED, R.SYSFLAG_TX_ROLLBACK):
            continue
        keys = ([r.uniq_key] if r.uniq_key else []) + [k for k in r.keys.split(" ") if k]
        expected += [(index_key_hash(index_key(r.topic, k)), r.phys_offset, r.store_ts_ms) for k in keys]
    assert list(zip(hashes.tolist(), phys.tolist(), ts.tolist())) == expected
    assert len(batch.uniq_rows) > 0 and len(batch.keys) > 0


def test_the_appender_writes_the_queue_id_it_counted_the_record_in(open_store):
    store = open_store(message_index_enable=False)
    # Encoded for queue 0, appended to queue 3: the record must say queue 3.
    recs = [encode_message(Message("Q", b"m%d" % i), b"Q", 0, max_body_bytes=1 << 20,
                           max_props_bytes=4096, born_host=R.host_bytes()) for i in range(5)]
    blob, starts = R.encode_batch(recs)
    res = store.append_encoded("Q", 3, blob, starts)
    store.dispatch()
    assert store.max_offset("Q", 3) == 5 and store.max_offset("Q", 0) == 0
    got = store.get("Q", 3, 0, 10).messages
    assert [m.queue_id for m in got] == [3] * 5
    assert [m.queue_offset for m in got] == list(range(5))
    assert [m.commitlog_offset for m in got] == res.phys_offsets.tolist()
    assert np.array_equal(res.queue_offsets, np.arange(5))


def test_stored_unique_ids_name_every_record_with_an_id_by_topic_from_a_start(open_store):
    """The scheduler's check after a restart: (topic, unique id) → phys offsets of the records in a
    range, equal to what the reference scan finds there, in chunks of any size."""
    store = open_store(message_index_enable=False)
    _fill(store, 5, 400)
    cl = store.commitlog
    reqs = scan_batch(cl, 0, cl.max_offset(), 10 ** 6)[0].requests()
    start = reqs[len(reqs) // 3].phys_offset
    expected: dict = {}
    for r in reqs:
        if r.phys_offset >= start and r.uniq_key:
            expected.setdefault((r.topic, r.uniq_key), []).append(r.phys_offset)
    assert expected
    for chunk in (7, 8192):
        assert stored_unique_ids(cl, start, cl.max_offset(), chunk) == expected
    assert stored_unique_ids(cl, cl.max_offset(), cl.max_offset()) == {}
