"""The commitlog: rolling with blank padding, record placement, batches, timestamps, scanning, ids."""
from __future__ import annotations

import os
import random

import numpy as np
import pytest

from hostmq import records as R
from hostmq.errors import CorruptRecordError, MessageNotFoundError, ValidationError
from hostmq.message import Message
from hostmq.store.commitlog import CommitLog
from hostmq.store.mapped_file import file_name

from .conftest import CL_FILE_BYTES, body_for, commitlog_files, parse_file, parse_log

pytestmark = pytest.mark.timeout(120)

SMALL_FILE = 4096
HOST = b"HOST\0\0\0\1"


def test_rolls_across_many_files_with_blank_padding(open_store):
    rng = random.Random(7)
    store = open_store()
    sent: list[tuple[str, int, bytes]] = []          # (topic, queue_id, body) in append order
    counts: dict[tuple[str, int], int] = {}

    runs: list[int] = []                               # bytes of each batch (an upper bound)

    def note(topic, qid, body):
        sent.append((topic, qid, body))
        counts[(topic, qid)] = counts.get((topic, qid), 0) + 1

    for round_ in range(30):
        topic, qid = f"Roll{round_ % 3}", round_ % 2
        msgs = []
        for _ in range(rng.randrange(10, 60)):
            i = counts.get((topic, qid), 0) + len(msgs)
            msgs.append(Message(topic, body_for(topic, qid, i, rng.randrange(0, 3000)), tags="r"))
        r = store.put_batch(msgs, queue_id=qid)
        runs.append(int(r.phys_offsets[-1]) - int(r.phys_offsets[0]) + len(msgs[-1].body) + 200)
        for m in msgs:
            note(topic, qid, m.body)
        for _ in range(rng.randrange(1, 5)):       # single puts between the batches
            i = counts.get((topic, qid), 0)
            body = body_for(topic, qid, i, rng.randrange(0, 8000))
            store.put(Message(topic, body), queue_id=qid)
            note(topic, qid, body)

    files = commitlog_files(store.path)
    assert len(files) >= 20
    assert [os.path.basename(p) for p in files] == [file_name(i * CL_FILE_BYTES) for i in range(len(files))]
    assert all(os.path.getsize(p) == CL_FILE_BYTES for p in files)

    messages = []
    for n, path in enumerate(files):
        recs, stop = parse_file(path)
        start = n * CL_FILE_BYTES
        assert recs, path
        for r in recs[:-1]:
            assert r.kind == R.RecordKind.MESSAGE, (path, r.phys)
        if n < len(files) - 1:
            blank = recs[-1]
            assert blank.kind == R.RecordKind.BLANK, path
            assert blank.phys + blank.total == start + CL_FILE_BYTES and stop == CL_FILE_BYTES
            assert blank.total >= R.MIN_BLANK_BYTES
            # The blank is there because the next file's first record — or the batch it starts, a batch
            # never spans files — did not fit.
            nxt, _ = parse_file(files[n + 1])
            assert blank.total < max(nxt[0].total, max(runs)) + R.MIN_BLANK_BYTES
        else:
            assert recs[-1].kind == R.RecordKind.MESSAGE
            assert start + stop == store.commitlog.max_offset()
            with open(path, "rb") as f:
                tail = f.read()[stop:]
            assert tail == b"\0" * len(tail)
        for r in recs:
            assert start <= r.phys and r.phys + r.total <= start + CL_FILE_BYTES   # one file each
        messages += [r for r in recs if r.kind == R.RecordKind.MESSAGE]

    assert [(r.topic, r.queue_id, r.body) for r in messages] == sent
    assert all(r.header_phys == r.phys for r in messages)
    seen: dict[tuple[str, int], int] = {}
    for r in messages:
        k = (r.topic, r.queue_id)
        assert r.queue_offset == seen.get(k, 0)
        seen[k] = r.queue_offset + 1
    assert seen == counts


def _append(cl: CommitLog, total: int, now_ms: int = 1000, topic: str = "T"):
    """Append one record of exactly ``total`` bytes (no properties)."""
    body = b"b" * (total - R.record_size(0, len(topic), 0))
    return cl.append(topic, topic.encode(), 0, body, b"", now_ms=now_ms)


@pytest.mark.parametrize("first, second, rolls", [
    (100, SMALL_FILE - 100 - R.MIN_BLANK_BYTES, False),       # leaves exactly the minimum blank
    (100, SMALL_FILE - 100 - R.MIN_BLANK_BYTES + 1, True),    # one byte too many: next file
    (SMALL_FILE - R.MIN_BLANK_BYTES, 200, True),              # largest record a file takes
])
def test_record_placement_at_the_file_edge(tmp_path, first, second, rolls):
    cl = CommitLog(str(tmp_path), SMALL_FILE, store_host=HOST)
    a = _append(cl, first)
    b = _append(cl, second)
    assert (a.phys_offset, a.size) == (0, first)
    assert b.size == second
    assert b.phys_offset == (SMALL_FILE if rolls else first)
    assert b.queue_offset == 1
    cl.flush()
    recs0, _ = parse_file(os.path.join(cl.directory, file_name(0)))
    if rolls:
        assert [(r.kind, r.phys, r.total) for r in recs0] == [
            (R.RecordKind.MESSAGE, 0, first), (R.RecordKind.BLANK, first, SMALL_FILE - first)]
    else:
        assert [(r.kind, r.total) for r in recs0] == [(R.RecordKind.MESSAGE, first),
                                                      (R.RecordKind.MESSAGE, second)]
        # The next record of any size rolls, padding the last MIN_BLANK_BYTES.
        c = _append(cl, 100)
        assert c.phys_offset == SMALL_FILE
        recs0, _ = parse_file(os.path.join(cl.directory, file_name(0)))
        assert (recs0[-1].kind, recs0[-1].total) == (R.RecordKind.BLANK, R.MIN_BLANK_BYTES)
    cl.close()


def test_a_record_larger_than_a_file_is_refused_and_nothing_is_written(tmp_path):
    cl = CommitLog(str(tmp_path), SMALL_FILE, store_host=HOST)
    _append(cl, 300)
    with pytest.raises(ValidationError):
        _append(cl, SMALL_FILE - R.MIN_BLANK_BYTES + 1)
    assert cl.max_offset() == 300
    assert cl.topic_queue_table[("T", 0)] == 1
    assert _append(cl, 50).phys_offset == 300
    cl.close()


def test_store_timestamps_never_go_backwards(tmp_path):
    cl = CommitLog(str(tmp_path), SMALL_FILE, store_host=HOST)
    sent = [5000, 7000, 6000, 6500, 9000, 1000, 9000, 9500]
    got = [_append(cl, 120, now_ms=t).store_ts_ms for t in sent]
    expect = list(np.maximum.accumulate(sent))
    assert got == expect
    recs = parse_log(tmp_path)
    assert [r.store_ts_ms for r in recs] == expect
    cl.close()


def _encoded(topic: str, bodies: list[bytes], queue_id: int = 0) -> tuple[bytes, np.ndarray]:
    recs = [R.encode_record(topic.encode(), b, b"", queue_id=queue_id, born_host=HOST, store_host=HOST)
            for b in bodies]
    return R.encode_batch(recs)


def test_a_batch_starts_the_next_file_rather_than_span_two(tmp_path):
    """RocketMQ's batch append: a batch that does not fit what is left of a file starts the next one,
    so a batch's records are contiguous (the message ids producers compute assume it); a batch
    larger than a file is refused with nothing written."""
    cl = CommitLog(str(tmp_path), SMALL_FILE, store_host=HOST)
    singles = [cl.append("B", b"B", 3, b"single-%d" % i, b"", now_ms=100) for i in range(3)]
    assert [s.queue_offset for s in singles] == [0, 1, 2]
    bodies = [b"batch-%04d-" % i + b"p" * (150 + i * 37 % 100) for i in range(13)]
    blob, starts = _encoded("B", bodies, queue_id=3)
    assert len(blob) < SMALL_FILE < cl.max_offset() + len(blob) + R.MIN_BLANK_BYTES
    r = cl.append_batch("B", 3, blob, starts, now_ms=200)
    assert r.queue_offset == 3 and r.store_ts_ms == 200
    assert int(r.phys_offsets[0]) == SMALL_FILE                        # the next file's first byte
    assert (np.diff(r.phys_offsets) == r.sizes[:-1]).all()             # contiguous
    recs = parse_log(tmp_path)
    assert [x.body for x in recs] == [b"single-%d" % i for i in range(3)] + bodies
    assert [x.queue_offset for x in recs] == list(range(16))
    assert [x.phys for x in recs[3:]] == r.phys_offsets.tolist()
    too_big = [b"x" * 1000 for _ in range(SMALL_FILE // 1000 + 1)]
    blob, starts = _encoded("B", too_big, queue_id=3)
    end = cl.max_offset()
    with pytest.raises(ValidationError, match="does not fit a commitlog file"):
        cl.append_batch("B", 3, blob, starts, now_ms=300)
    assert cl.max_offset() == end
    after = cl.append("B", b"B", 3, b"after", b"", now_ms=300)
    assert after.queue_offset == 16 and after.phys_offset == cl.max_offset() - after.size
    cl.close()


def test_scan_gives_one_request_per_message_across_files(open_store):
    store = open_store(message_index_enable=False)
    sent = []
    for i in range(400):
        topic, qid = f"S{i % 2}", i % 3
        m = Message(topic, b"s" * (500 + i), tags=f"tag{i % 4}", keys=[f"key{i}", f"alt{i}"])
        r = store.put(m, queue_id=qid)
        sent.append((topic, qid, f"tag{i % 4}", f"key{i} alt{i}", r.phys_offset))
    reqs, nxt = store.commitlog.scan(0, store.commitlog.max_offset(), 10_000)
    assert nxt == store.commitlog.max_offset()
    recs = parse_log(store.path)
    assert len(reqs) == len(recs) == 400
    for q, rec, (topic, qid, tag, keys, phys) in zip(reqs, recs, sent):
        assert (q.topic, q.queue_id, q.phys_offset, q.size) == (topic, qid, rec.phys, rec.total)
        assert q.tag_hash == R.java_string_hash(tag) and q.keys == keys
        assert q.uniq_key == rec.props[R.PROP_UNIQ_KEY] and len(q.uniq_key) == 32
        assert q.queue_offset == rec.queue_offset and q.store_ts_ms == rec.store_ts_ms
        assert phys == rec.phys
    # Scanning in small steps gives the same requests.
    again, phys = [], 0
    while phys < store.commitlog.max_offset():
        part, phys = store.commitlog.scan(phys, store.commitlog.max_offset(), 7)
        assert len(part) <= 7
        again += part
    assert again == reqs


def test_view_by_message_id(open_store):
    store = open_store(message_index_enable=False)
    results = [(store.put(Message("V", b"view-%d" % i + b"v" * (i * 50)), queue_id=i % 2), i)
               for i in range(300)]
    assert len(commitlog_files(store.path)) > 1
    for r, i in results:
        m = store.view(r.msg_id)
        assert m.body == b"view-%d" % i + b"v" * (i * 50)
        assert m.msg_id == r.msg_id and m.queue_id == i % 2
    last = results[-1][0]
    host = last.msg_id[:16]
    with pytest.raises(MessageNotFoundError):
        store.view(f"{host}{store.commitlog.max_offset() + 1000:016X}")      # beyond the log
    with pytest.raises(MessageNotFoundError):
        store.view(f"{host}{last.phys_offset + 1:016X}")                   # not a record start
    for bad in ("xyz", "G" * 32, "0" * 31):
        with pytest.raises(ValidationError):
            store.view(bad)


def test_record_at_refuses_blank_and_missing_offsets(open_store):
    store = open_store(message_index_enable=False)
    body = b"r" * 20_000
    for _ in range(4):                                      # 3 fit in a 64 KiB file, the 4th rolls
        store.put(Message("RA", body))
    recs0, _ = parse_file(commitlog_files(store.path)[0])
    blank = recs0[-1]
    assert blank.kind == R.RecordKind.BLANK
    with pytest.raises(CorruptRecordError):
        store.commitlog.record_at(blank.phys)
    with pytest.raises(CorruptRecordError):
        store.commitlog.record_at(10 * CL_FILE_BYTES)
    raw = store.commitlog.record_at(recs0[1].phys)
    assert R.decode_record(raw)[2] == body


def test_keys_and_tags_survive_in_the_record(open_store):
    store = open_store(message_index_enable=False)
    store.put(Message("KT", b"x", tags="TagA", keys=["k1", "k2"], properties={"p": "v"}), queue_id=1)
    (rec,) = parse_log(store.path)
    assert rec.props[R.PROP_TAGS] == "TagA" and rec.props[R.PROP_KEYS] == "k1 k2"
    assert rec.props["p"] == "v" and rec.queue_id == 1 and rec.topic == "KT"
