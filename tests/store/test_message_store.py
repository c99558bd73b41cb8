"""The embedded store facade: bulk round trips, get statuses, filters, pull sizes, time and key
lookups, validation, the store lock."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from hostmq import records as R
from hostmq.errors import StoreLockedError, ValidationError
from hostmq.message import Message
from hostmq.store.message_store import MessageStore
from hostmq.store.reader import GetStatus

from .conftest import (BASE_MS, body_for, key_for, parse_log, put_at, read_queue, read_queue_batches,
                       small_config)

pytestmark = pytest.mark.timeout(120)

# -- bulk round trip ---------------------------------------------------------------------------------
@pytest.mark.slow      # 100,000 messages through every flush mode: ~20 s
def test_100k_messages_over_8_topics_and_4_queues_read_back_exactly(open_store):
    store = open_store()
    topics = [f"Bulk{t}" for t in range(8)]
    sent: dict[tuple[str, int], list[tuple[bytes, str | None, tuple[str, ...]]]] = {
        (t, q): [] for t in topics for q in range(4)}

    def message(topic, q, i):
        tags = None if i % 7 == 0 else f"tag{i % 5}"
        keys = (key_for(topic, q, i),) + ((f"even{i}",) if i % 2 == 0 else ())
        return Message(topic, body_for(topic, q, i, i % 50), tags=tags, keys=keys)

    for round_ in range(31):
        for (topic, q), log in sent.items():
            msgs = [message(topic, q, len(log) + j) for j in range(100)]
            r = store.put_batch(msgs, queue_id=q)
            assert r.queue_offsets.tolist() == list(range(len(log), len(log) + 100))
            log += [(m.body, m.tags, m.keys) for m in msgs]
            if round_ < 25:
                m = message(topic, q, len(log))
                assert store.put(m, queue_id=q).queue_offset == len(log)
                log.append((m.body, m.tags, m.keys))
    assert sum(map(len, sent.values())) == 100_000
    store.dispatch()

    for (topic, q), log in sent.items():
        assert (store.min_offset(topic, q), store.max_offset(topic, q)) == (0, len(log))
        got = read_queue(store, topic, q, max_count=1000)
        assert [(m.body, m.tags, m.keys) for m in got] == log, (topic, q)
        assert [m.queue_offset for m in got] == list(range(len(log)))
        assert {(m.topic, m.queue_id) for m in got} == {(topic, q)}
        assert read_queue_batches(store, topic, q) == [b for b, _, _ in log]
    # Keys are indexed: a sample of them finds exactly their message.
    for topic, q, i in [("Bulk0", 0, 0), ("Bulk3", 2, 1717), ("Bulk7", 3, 3124), ("Bulk5", 1, 2500)]:
        (m,) = store.query_by_key(topic, key_for(topic, q, i))
        assert m.body == sent[(topic, q)][i][0] and m.queue_offset == i


def test_get_batch_arrays_and_statuses(modal_store):
    open_store = modal_store
    store = open_store(message_index_enable=False)
    bodies = [body_for("GB", 1, i, i) for i in range(200)]
    store.put_batch([Message("GB", b) for b in bodies[:150]], queue_id=1)
    for b in bodies[150:]:
        store.put(Message("GB", b), queue_id=1)
    store.dispatch()
    b = store.get_batch("GB", 1, 10, max_count=20)
    assert b.status == GetStatus.FOUND and len(b) == 20 and b.next_offset == 30
    assert b.queue_offsets.tolist() == list(range(10, 30))
    assert [bytes(x) for x in b.bodies] == bodies[10:30]
    assert [m.body for m in b] == bodies[10:30]
    assert (np.diff(b.store_timestamps_ms) >= 0).all()
    assert store.get_batch("GB", 1, 200).status == GetStatus.OFFSET_OVERFLOW_ONE
    assert store.get_batch("GB", 1, 201).status == GetStatus.OFFSET_OVERFLOW_BADLY
    assert store.get_batch("GB", 7, 0).status == GetStatus.NO_MESSAGE_IN_QUEUE
    assert read_queue_batches(store, "GB", 1, max_count=33) == bodies


# -- get statuses --------------------------------------------------------------------------------------
def test_get_statuses_when_min_is_zero(modal_store):
    open_store = modal_store
    store = open_store(message_index_enable=False)
    for i in range(10):
        store.put(Message("St", body_for("St", 0, i)))
    store.dispatch()
    cases = [  # offset -> status, next_offset
        (0, GetStatus.FOUND, 10), (9, GetStatus.FOUND, 10),
        (10, GetStatus.OFFSET_OVERFLOW_ONE, 10),
        (11, GetStatus.OFFSET_OVERFLOW_BADLY, 0), (10 ** 9, GetStatus.OFFSET_OVERFLOW_BADLY, 0),
        (-1, GetStatus.OFFSET_TOO_SMALL, 0),
    ]
    for offset, status, nxt in cases:
        g = store.get("St", 0, offset)
        assert (g.status, g.next_offset) == (status, nxt), offset
        assert (g.min_offset, g.max_offset) == (0, 10)
        assert bool(g.messages) == (status == GetStatus.FOUND)
    assert [m.body for m in store.get("St", 0, 9).messages] == [body_for("St", 0, 9)]
    for topic, qid in [("St", 1), ("Nope", 0)]:
        g = store.get(topic, qid, 0)
        assert (g.status, g.next_offset, g.messages) == (GetStatus.NO_MESSAGE_IN_QUEUE, 0, [])
        assert store.min_offset(topic, qid) == store.max_offset(topic, qid) == 0


def test_get_statuses_after_old_files_are_deleted(open_store):
    store = open_store(message_index_enable=False)
    times = [BASE_MS + 1000 * i for i in range(400)]
    bodies = [body_for("Old", 0, i, 900) for i in range(400)]
    for t, b in zip(times, bodies):
        put_at(store, Message("Old", b), t)
    store.dispatch()
    store.clean_expired(now_ms=10 ** 15, force=True)
    survivors = {r.body for r in parse_log(store.path)}
    lo = next(i for i, b in enumerate(bodies) if b in survivors)
    hi = len(bodies)
    assert lo > 0 and all(b in survivors for b in bodies[lo:])
    assert (store.min_offset("Old", 0), store.max_offset("Old", 0)) == (lo, hi)
    cases = [
        (lo - 1, GetStatus.OFFSET_TOO_SMALL, lo), (0, GetStatus.OFFSET_TOO_SMALL, lo),
        (lo, GetStatus.FOUND, lo + 1),
        (hi, GetStatus.OFFSET_OVERFLOW_ONE, hi),
        (hi + 1, GetStatus.OFFSET_OVERFLOW_BADLY, hi), (hi + 10 ** 6, GetStatus.OFFSET_OVERFLOW_BADLY, hi),
    ]
    for offset, status, nxt in cases:
        g = store.get("Old", 0, offset, max_count=1)
        assert (g.status, g.next_offset) == (status, nxt), offset
        assert (g.min_offset, g.max_offset) == (lo, hi)
    assert store.get("Old", 0, lo, max_count=1).messages[0].body == bodies[lo]
    # Time search is clamped to what is left.
    assert store.offset_for_timestamp("Old", 0, 0) == lo
    assert store.offset_for_timestamp("Old", 0, times[lo // 2]) == lo
    assert store.offset_for_timestamp("Old", 0, times[lo + 3]) == lo + 3
    assert store.offset_for_timestamp("Old", 0, times[-1] + 1) == hi


# -- filters and pull sizes ----------------------------------------------------------------------------
def test_tag_filter_returns_only_matching_tags_and_skipped_entries_advance(modal_store):
    open_store = modal_store
    store = open_store(message_index_enable=False)
    tags = [["a", "b", "c", None, "Aa", "BB", "bb"][i % 7] for i in range(300)]
    tags[250:] = ["c"] * 50                                    # a long tail nothing matches
    for i, t in enumerate(tags):
        store.put(Message("F", body_for("F", 0, i), tags=t))
    store.dispatch()

    got, off = [], 0
    while True:
        g = store.get("F", 0, off, max_count=10, expression="a || b")
        if g.status not in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE):
            break
        assert len(g.messages) <= 10 and g.next_offset > off
        # Every match in [off, next_offset) is returned; skipped entries count towards next_offset.
        window = [i for i in range(off, g.next_offset) if tags[i] in ("a", "b")]
        assert [m.queue_offset for m in g.messages] == window
        if len(g.messages) == 10:
            assert g.next_offset == window[-1] + 1
        got += g.messages
        off = g.next_offset
    want = [i for i, t in enumerate(tags) if t in ("a", "b")]
    assert [m.queue_offset for m in got] == want
    assert [m.body for m in got] == [body_for("F", 0, i) for i in want]
    assert (g.status, off) == (GetStatus.OFFSET_OVERFLOW_ONE, 300)

    # "Aa" and "BB" share a Java hash: the tag itself decides.
    assert R.tag_hash("Aa") == R.tag_hash("BB")
    g = store.get("F", 0, 0, max_count=1000, expression="BB")
    assert [m.queue_offset for m in g.messages] == [i for i, t in enumerate(tags) if t == "BB"]
    g = store.get("F", 0, 0, max_count=1000, expression="a||Aa")
    assert [m.queue_offset for m in g.messages] == [i for i, t in enumerate(tags) if t in ("a", "Aa")]
    g = store.get("F", 0, 3, max_count=2, expression="*")
    assert [m.queue_offset for m in g.messages] == [3, 4] and g.next_offset == 5
    # Only non-matching entries from the offset on: nothing found, next offset is the end.
    g = store.get("F", 0, 251, expression="a")
    assert (g.status, g.next_offset, g.messages) == (GetStatus.NO_MATCHED_MESSAGE, 300, [])


def test_max_count_limits_a_get(modal_store):
    open_store = modal_store
    store = open_store(message_index_enable=False)
    store.put_batch([Message("MC", body_for("MC", 0, i)) for i in range(100)])
    store.dispatch()
    for n in (1, 5, 32, 99):
        g = store.get("MC", 0, 0, max_count=n)
        assert len(g.messages) == n and g.next_offset == n
    g = store.get("MC", 0, 90, max_count=50)
    assert len(g.messages) == 10 and g.next_offset == 100


def test_max_transfer_bytes_limits_a_get_but_returns_at_least_one(modal_store):
    open_store = modal_store
    limit = 4096
    store = open_store(message_index_enable=False, max_transfer_bytes=limit)
    sizes_sent = [300, 700, 1500, 200, 900, 5000, 100, 100, 6000, 6000, 400]
    store.put_batch([Message("TB", body_for("TB", 0, i, pad)) for i, pad in enumerate(sizes_sent)])
    store.dispatch()
    sizes = [r.total for r in parse_log(store.path)]       # record sizes from the file
    off, pages = 0, []
    while off < len(sizes):
        g = store.get("TB", 0, off, max_count=100)
        assert g.status == GetStatus.FOUND
        n, total = 0, 0
        while off + n < len(sizes) and (n == 0 or total + sizes[off + n] <= limit):
            total += sizes[off + n]
            n += 1
        assert [m.queue_offset for m in g.messages] == list(range(off, off + n))
        assert g.next_offset == off + n
        pages.append(n)
        off = g.next_offset
    assert 1 in pages and max(pages) > 1       # a record bigger than the limit came alone


# -- time --------------------------------------------------------------------------------------------
def test_offset_for_timestamp_with_a_clock_that_goes_backwards(open_store):
    store = open_store(message_index_enable=False)
    sent = [1000, 2000, 2000, 1500, 3000, 2500, 2600, 4000, 3900, 5000]
    for i, t in enumerate(sent):
        put_at(store, Message("TS", body_for("TS", 0, i)), BASE_MS + t)
    store.dispatch()
    stored = np.maximum.accumulate(np.array(sent) + BASE_MS).tolist()
    assert [m.store_timestamp_ms for m in read_queue(store, "TS", 0)] == stored

    def expected(ts):
        return next((i for i, s in enumerate(stored) if s >= ts), len(stored))

    for t in [0, BASE_MS, BASE_MS + 999, BASE_MS + 1000, BASE_MS + 1001, BASE_MS + 1500, BASE_MS + 2000,
              BASE_MS + 2001, BASE_MS + 2600, BASE_MS + 3000, BASE_MS + 3500, BASE_MS + 3900,
              BASE_MS + 4000, BASE_MS + 4999, BASE_MS + 5000, BASE_MS + 5001, BASE_MS + 10 ** 9]:
        assert store.offset_for_timestamp("TS", 0, t) == expected(t), t - BASE_MS
    assert store.offset_for_timestamp("TS", 0, 0) == store.min_offset("TS", 0) == 0
    assert store.offset_for_timestamp("TS", 0, BASE_MS + 10 ** 9) == store.max_offset("TS", 0) == 10
    assert store.offset_for_timestamp("TS", 3, BASE_MS) == 0                 # unknown queue


# -- key and unique-id lookups ----------------------------------------------------------------------
def _store_keyed(store, n=400, step_ms=1000, jitter=False):
    """n messages of topic "Q" with keys k{i} and "shared", unique id U{i}, stored at times[i]."""
    times = [BASE_MS + step_ms * i + ((i * 373) % 1000 if jitter else 0) for i in range(n)]
    uniq = [f"{i:032X}" for i in range(n)]
    for i, t in enumerate(times):
        put_at(store, Message("Q", body_for("Q", i % 2, i), keys=[f"k{i}", "shared"]), t, i % 2, uniq[i])
    put_at(store, Message("Other", b"other", keys=["k3", "shared"]), times[-1])  # same keys, other topic
    store.dispatch()
    return times, uniq


def _indices(msgs) -> list[int]:
    return sorted(int(m.body.split(b"|")[2]) for m in msgs)


def test_key_and_unique_id_lookup_inside_and_outside_a_time_range(open_store):
    store = open_store()
    times, uniq = _store_keyed(store)
    assert len(os.listdir(os.path.join(store.path, "index"))) >= 3      # spans several index files
    n = len(times)
    for i in (0, 1, 133, 134, 200, n - 1):
        (m,) = store.query_by_key("Q", f"k{i}")
        assert m.body == body_for("Q", i % 2, i) and m.queue_id == i % 2
        (m,) = store.query_by_key("Q", uniq[i])
        assert m.body == body_for("Q", i % 2, i) and m.unique_id == uniq[i]
        assert store.view(m.msg_id).body == m.body
        # Inside its time range, and just outside on either side.
        assert _indices(store.query_by_key("Q", f"k{i}", begin_ms=times[i], end_ms=times[i])) == [i]
        assert store.query_by_key("Q", f"k{i}", begin_ms=times[i] + 1000) == []
        assert store.query_by_key("Q", f"k{i}", begin_ms=0, end_ms=times[i] - 1000) == []
        assert store.query_by_key("Q", uniq[i], begin_ms=times[i] + 1000, end_ms=times[-1]) == []
    for lo, hi in [(3, 6), (120, 150), (0, 0), (n - 5, n - 1), (130, 270)]:
        got = store.query_by_key("Q", "shared", max_count=1000, begin_ms=times[lo], end_ms=times[hi])
        assert _indices(got) == list(range(lo, hi + 1)), (lo, hi)
    assert store.query_by_key("Q", "shared", begin_ms=0, end_ms=times[0] - 1000) == []
    assert store.query_by_key("Q", "shared", begin_ms=times[-1] + 1000) == []
    assert store.query_by_key("Q", "missing") == []
    (other,) = store.query_by_key("Other", "k3")
    assert other.topic == "Other" and other.body == b"other"
    few = store.query_by_key("Q", "shared", max_count=5)
    assert len(few) == 5 and set(_indices(few)) <= set(range(n))


def test_key_lookup_time_range_is_exact_to_the_millisecond(open_store):
    store = open_store()
    times, _ = _store_keyed(store, n=40, jitter=True)
    for lo, hi in [(3, 6), (10, 30), (5, 5)]:
        got = store.query_by_key("Q", "shared", max_count=100, begin_ms=times[lo], end_ms=times[hi])
        assert _indices(got) == list(range(lo, hi + 1)), (lo, hi)


def test_keys_are_found_after_a_restart(modal_store):
    open_store = modal_store
    store = open_store()
    times, uniq = _store_keyed(store, n=200)
    path = store.path
    store.close()
    store = open_store(path)
    for i in (0, 77, 199):
        (m,) = store.query_by_key("Q", f"k{i}")
        assert m.body == body_for("Q", i % 2, i)
        (m,) = store.query_by_key("Q", uniq[i], begin_ms=times[i], end_ms=times[i])
        assert m.body == body_for("Q", i % 2, i)


# -- validation ----------------------------------------------------------------------------------------
BAD = {
    "topic with a space": (Message("bad topic", b"x"), 0),
    "empty topic": (Message("", b"x"), 0),
    "topic too long": (Message("t" * 128, b"x"), 0),
    "topic with a slash": (Message("a/b", b"x"), 0),
    "topic not a string": (Message(123, b"x"), 0),
    "empty body": (Message("V", b""), 0),
    "body too large": (Message("V", b"x" * 1025), 0),
    "body not bytes": (Message("V", "text"), 0),
    "properties too large": (Message("V", b"x", properties={"p": "v" * 300}), 0),
    "key with a space": (Message("V", b"x", keys=["a b"]), 0),
    "empty key": (Message("V", b"x", keys=[""]), 0),
    "separator in a tag": (Message("V", b"x", tags="a\x01b"), 0),
    "queue id -1": (Message("V", b"x"), -1),
    "queue id 2**31": (Message("V", b"x"), 1 << 31),
}


@pytest.fixture
def validating_store(open_store):
    store = open_store(message_index_enable=False, max_message_bytes=1024, max_properties_bytes=256)
    for q in range(2):
        store.put_batch([Message("V", body_for("V", q, i)) for i in range(5)], queue_id=q)
    store.dispatch()
    return store


def _state(store):
    return store.commitlog.max_offset(), {k: cq.max_offset() for k, cq in store.queues.items()}


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("how", ["put", "put_batch"])
def test_invalid_messages_are_refused_and_nothing_is_stored(validating_store, case, how):
    store = validating_store
    before = _state(store)
    msg, qid = BAD[case]
    with pytest.raises(ValidationError):
        if how == "put":
            store.put(msg, queue_id=qid)
        else:
            topic = msg.topic if isinstance(msg.topic, str) and msg.topic else "V"
            good = [Message(topic, b"good-1"), Message(topic, b"good-2")]
            store.put_batch(good + [msg], queue_id=qid)
    store.dispatch()
    assert _state(store) == before
    assert store.max_offset("V", 0) == store.max_offset("V", 1) == 5
    # The store still works and offsets continue without a gap.
    assert store.put(Message("V", b"after"), queue_id=1).queue_offset == 5


def test_batch_needs_one_topic_and_no_delay(validating_store):
    store = validating_store
    before = _state(store)
    for msgs in ([], [Message("V", b"a"), Message("W", b"b")], [Message("V", b"a", delay_level=2)]):
        with pytest.raises(ValidationError):
            store.put_batch(msgs)
    assert _state(store) == before


def test_a_closed_store_refuses_writes(modal_store):
    open_store = modal_store
    store = open_store(message_index_enable=False)
    store.close()
    with pytest.raises(ValidationError):
        store.put(Message("C", b"x"))


# -- the lock ------------------------------------------------------------------------------------------
def test_a_second_open_is_refused_while_the_store_is_open(open_store, tmp_path):
    store = open_store(message_index_enable=False)
    store.put(Message("L", b"locked"))
    with pytest.raises(StoreLockedError) as e:
        MessageStore(store.path, small_config(message_index_enable=False))
    assert e.value.path == store.path and str(os.getpid()) in e.value.holder

    code = textwrap.dedent(f"""
        import sys
        from hostmq.errors import StoreLockedError
        from hostmq.store.message_store import MessageStore
        try:
            MessageStore({store.path!r})
        except StoreLockedError as e:
            print(e.holder)
            sys.exit(3)
        sys.exit(0)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, r.stderr
    assert str(os.getpid()) in r.stdout
    # The refused opens changed nothing: the store still works and, once closed, opens again.
    store.put(Message("L", b"still"))
    store.close()
    again = open_store(store.path, message_index_enable=False)
    assert [m.body for m in read_queue(again, "L", 0)] == [b"locked", b"still"]
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, r.stderr


def test_lock_is_released_when_the_holder_dies(tmp_path):
    path = str(tmp_path / "store")
    code = textwrap.dedent(f"""
        import os
        from hostmq.message import Message
        from hostmq.store.message_store import MessageStore
        s = MessageStore({path!r}, {small_config(message_index_enable=False)!r})
        s.put(Message("D", b"before-death"))
        s.dispatch()
        os._exit(9)          # no close: lock released by the kernel, abort left behind
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 9, r.stderr
    assert os.path.exists(os.path.join(path, "abort"))
    with MessageStore(path, small_config(message_index_enable=False)) as s:
        assert s.recovery.abnormal
        assert [m.body for m in read_queue(s, "D", 0)] == [b"before-death"]


# -- regressions: bugs found by this suite ----------------------------------------------------------------
@pytest.mark.parametrize("how", ["put", "put_batch"])
def test_an_unhashable_topic_is_a_validation_error(validating_store, how):
    store = validating_store
    before = _state(store)
    with pytest.raises(ValidationError):
        if how == "put":
            store.put(Message(["V"], b"x"))
        else:
            store.put_batch([Message(["V"], b"x")])
    assert _state(store) == before


def test_put_batch_validates_the_flag_like_put(validating_store):
    store = validating_store
    before = _state(store)
    with pytest.raises(ValidationError):
        store.put(Message("V", b"x", flag="1"))
    with pytest.raises(ValidationError):
        store.put_batch([Message("V", b"x", flag="1")])
    assert _state(store) == before


def test_get_batch_with_max_count_zero_is_refused(validating_store):
    with pytest.raises(ValidationError):
        validating_store.get_batch("V", 0, 2, max_count=0)
    with pytest.raises(ValidationError):
        validating_store.get("V", 0, 2, max_count=0)
