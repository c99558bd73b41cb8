"""Transactions, broker side: the half / commit / op records, the check walk (pure), its progress
file, and TransactionCheck over a real store (ops read, restart rebuilds what is resolved)."""
from __future__ import annotations

import json
import time
import zlib

import pytest

from hostmq import records as R
from hostmq.errors import ValidationError
from hostmq.message import Message, MessageExt
from hostmq.store import MessageStore
from hostmq.store.readonly import StoreReader
from hostmq.semantics.transaction import (HALF_TOPIC, OP_TOPIC, Half, TransactionProgress, check_view, commit_record,
                                       half_parts, op_half_offset, op_record, plan_checks)
from hostmq.broker.transaction_check import TransactionCheck

from tests.store.conftest import small_config

pytestmark = pytest.mark.timeout(60)
HOST = b"\x7f\0\0\x01\0\0\0\x09"


def half_raw(topic="orders", qid=3, group="tx", body=b"pay 42", sys_flag=0, user=None) -> bytes:
    props = R.encode_properties({R.PROP_TAGS: "paid", R.PROP_UNIQ_KEY: "U1", **(user or {})})
    topic_b, hq, hp = half_parts(topic, qid, props, group)
    return R.encode_record(topic_b, body, hp, queue_id=hq, flag=7, sys_flag=sys_flag, born_ts_ms=1234,
                           born_host=HOST, store_ts_ms=5678, store_host=HOST, queue_offset=11, phys_offset=4096)


def test_a_half_is_stored_under_the_half_topic_with_its_route_and_group():
    h, topic, body, props = R.decode_record(half_raw(), verify_crc=True)
    assert (topic, h.queue_id, body) == (HALF_TOPIC, 0, b"pay 42")
    assert props == {R.PROP_TAGS: "paid", R.PROP_UNIQ_KEY: "U1", R.PROP_REAL_TOPIC: "orders",
                     R.PROP_REAL_QUEUE_ID: "3", R.PROP_TRANSACTION_PREPARED: "true", R.PROP_PRODUCER_GROUP: "tx"}
    assert h.sys_flag & R.SYSFLAG_TX_MASK == 0        # dispatched into the half queue (not PREPARED)


def test_commit_record_goes_to_the_real_queue_and_points_at_its_half():
    packed = zlib.compress(b"x" * 5000)
    topic, qid, rec = commit_record(half_raw(body=packed, sys_flag=R.SYSFLAG_COMPRESSED), 4096, HOST)
    h, t, body, props = R.decode_record(rec, verify_crc=True)
    assert (topic, qid, t, h.queue_id) == ("orders", 3, "orders", 3)
    assert h.sys_flag == R.SYSFLAG_COMPRESSED | R.SYSFLAG_TX_COMMIT and body == packed
    assert h.prepared_tx_offset == 4096 and (h.flag, h.born_ts_ms, bytes(h.born_host)) == (7, 1234, HOST)
    assert props == {R.PROP_TAGS: "paid", R.PROP_UNIQ_KEY: "U1", R.PROP_PRODUCER_GROUP: "tx"}
    assert MessageExt(rec).body == b"x" * 5000


def test_the_checker_sees_the_real_topic_and_the_halfs_offsets():
    m = MessageExt(check_view(half_raw(user={"k": "v"})), "broker-a")
    assert (m.topic, m.queue_id, m.queue_offset, m.commitlog_offset) == ("orders", 3, 11, 4096)
    assert m.properties["k"] == "v" and m.properties[R.PROP_TRANSACTION_PREPARED] == "true"
    assert R.PROP_REAL_TOPIC not in m.properties and m.unique_id == "U1" and m.store_timestamp_ms == 5678


def test_a_record_that_is_not_a_half_is_refused():
    plain = R.encode_record(b"orders", b"b", R.encode_properties({"a": "b"}))
    with pytest.raises(ValidationError, match="not a half message"):
        commit_record(plain, 0, HOST)
    with pytest.raises(ValidationError):
        check_view(plain)


def test_op_records_name_the_half_offset():
    h, topic, body, props = R.decode_record(op_record(123, HOST), verify_crc=True)
    assert (topic, h.queue_id, props[R.PROP_TAGS], op_half_offset(body)) == (OP_TOPIC, 0, "d", 123)
    assert op_half_offset(b"-1") is None and op_half_offset(b"\xff") is None and op_half_offset(b"") is None


def H(off, age_ms, now=100_000, immunity_ms=0):
    return Half(off, now - age_ms, immunity_ms)


def test_the_walk_moves_over_the_resolved_prefix_and_checks_old_halves():
    halves = [H(5, 9000), H(6, 9000), H(7, 9000), H(8, 9000), H(9, 100)]
    p = plan_checks(halves, 5, done={5, 6, 8}, busy=set(), checks={}, now_ms=100_000, timeout_ms=6000, check_max=15)
    assert p.half_offset == 7 and p.check == (7,) and p.give_up == ()      # 8 done but after 7; 9 too young


def test_a_busy_half_is_not_checked_and_holds_the_walk():
    p = plan_checks([H(0, 9000), H(1, 9000)], 0, done=set(), busy={0}, checks={}, now_ms=100_000,
                    timeout_ms=6000, check_max=15)
    assert p == type(p)(0, (1,), ())


def test_a_half_checked_check_max_times_is_given_up():
    p = plan_checks([H(0, 9000), H(1, 9000)], 0, done=set(), busy=set(), checks={0: 15, 1: 14}, now_ms=100_000,
                    timeout_ms=6000, check_max=15)
    assert (p.half_offset, p.check, p.give_up) == (1, (1,), (0,))


def test_check_immunity_delays_the_first_check():
    halves = [H(0, 9000, immunity_ms=60_000), H(1, 9000)]
    p = plan_checks(halves, 0, set(), set(), {}, 100_000, 6000, 15)
    assert (p.half_offset, p.check) == (0, ())       # the walk stops at the first half not due


def test_progress_round_trips_and_survives_a_garbage_file(tmp_path):
    path = str(tmp_path / "transaction.json")
    p = TransactionProgress(path)
    assert (p.half_offset, p.op_offset, p.checks, p.given_up) == (0, 0, {}, set())
    p.half_offset, p.op_offset, p.checks, p.given_up, p.checks_total = 4, 2, {5: 1, 7: 3}, {6}, 4
    assert p.persist() and not p.persist()
    q = TransactionProgress(path)
    assert (q.half_offset, q.op_offset, q.checks, q.given_up, q.checks_total) == (4, 2, {5: 1, 7: 3}, {6}, 4)
    with open(path, "w") as f:
        json.dump({"half_offset": -3, "checks": {"x": 1, "9": "two", "8": 2}, "given_up": ["a", 12]}, f)
    r = TransactionProgress(path)
    assert (r.half_offset, r.checks, r.given_up) == (0, {8: 2}, {12})


def _half_msg(i: int, group: str = "tx") -> Message:
    return Message(HALF_TOPIC, b"half-%d" % i, properties={R.PROP_REAL_TOPIC: "orders", R.PROP_REAL_QUEUE_ID: "0",
                                                           R.PROP_TRANSACTION_PREPARED: "true",
                                                           R.PROP_PRODUCER_GROUP: group})


def test_transaction_check_over_a_store_reads_ops_checks_and_restarts(tmp_path):
    path = str(tmp_path / "store")
    progress = str(tmp_path / "transaction.json")
    with MessageStore(path, small_config()) as s:
        for i in range(6):
            s.put(_half_msg(i, "tx" if i != 4 else "other"), 0)
        for half in (0, 2):
            s.put(Message(OP_TOPIC, str(half).encode(), tags="d"), 0)
        s.dispatch()
    later_ms = int(time.time() * 1000) + 60_000
    with StoreReader(path, small_config()) as reader:
        tc = TransactionCheck(progress, timeout_s=6.0, check_max=2)
        tc.walk(reader, later_ms)
        assert tc.progress.half_offset == 1 and tc.progress.checks == {1: 1, 3: 1, 4: 1, 5: 1}
        rows, bodies = tc.poll("tx", 2)
        assert [r["queue_offset"] for r in rows] == [1, 3] and [MessageExt(b).body for b in bodies] == [b"half-1", b"half-3"]
        assert tc.poll("tx", 32)[0][0]["queue_offset"] == 5 and tc.poll("tx", 32) == ([], [])
        assert [r["queue_offset"] for r in tc.poll("other", 32)[0]] == [4]
        phys3 = MessageExt(bodies[1]).commitlog_offset
        assert tc.end(reader, "tx", 3, phys3, "COMMIT")["resolve"] is True
        assert tc.end(reader, "tx", 3, phys3, "COMMIT") == {"resolve": False, "reason": "being resolved by another producer"}
        assert tc.end(reader, "tx", 0, 0, "ROLLBACK")["resolve"] is False           # an op says so
        assert tc.end(reader, "tx", 1, _phys(reader, 1), "UNKNOWN")["resolve"] is False
        with pytest.raises(ValidationError, match="producer group"):
            tc.end(reader, "tx", 4, _phys(reader, 4), "COMMIT")
        with pytest.raises(ValidationError, match="commitlog offset"):
            tc.end(reader, "tx", 5, phys3, "COMMIT")
        with pytest.raises(ValidationError, match="transaction state"):
            tc.end(reader, "tx", 5, 0, "MAYBE")
        tc.walk(reader, later_ms)                        # second check of 1, 4, 5 (3 is busy)
        tc.walk(reader, later_ms)                        # third: given up (check_max 2)
        assert tc.progress.given_up_total == 3 and tc.progress.checks == {3: 1}
        assert tc.progress.half_offset == 3 and tc.progress.given_up == {4, 5}   # 1, 2 done; 3 is busy
    with MessageStore(path, small_config()) as s:
        s.put(Message(OP_TOPIC, b"3", tags="d"), 0)                              # the producer stored the op
        s.dispatch()
    with StoreReader(path, small_config()) as reader:
        again = TransactionCheck(progress, timeout_s=6.0, check_max=2)           # a broker restart
        assert again.progress.given_up == {4, 5} and again.progress.half_offset == 3
        again.walk(reader, later_ms)
        assert again.progress.half_offset == 6 and again.stats()["pending"] == 0
        assert again.end(reader, "tx", 3, phys3, "COMMIT")["resolve"] is False


def _phys(reader, half: int) -> int:
    return reader.get(HALF_TOPIC, 0, half, 1).messages[0].commitlog_offset


def test_a_poll_answer_carries_a_bounded_number_of_bytes(tmp_path, monkeypatch):
    from hostmq.broker import transaction_check
    monkeypatch.setattr(transaction_check, "MAX_POLL_BYTES", 1000)
    tc = TransactionCheck(str(tmp_path / "transaction.json"), timeout_s=6.0, check_max=15)
    tc.pending["tx"] = {i: (i * 1000, 1, bytes([i]) * 600) for i in range(4)}
    sizes = []
    while True:
        rows, bodies = tc.poll("tx", 32)
        if not rows:
            break
        sizes.append([len(b) for b in bodies])
    assert sizes == [[600]] * 4                   # 2 × 600 > 1000: one half per answer, none lost
    tc.pending["tx"] = {0: (0, 1, b"x" * 5000)}
    assert len(tc.poll("tx", 32)[1]) == 1         # a half bigger than the bound still goes out


def test_a_resolve_lease_ends_and_the_half_may_be_resolved_again(tmp_path):
    """A producer told "resolve it" holds the half for ``transaction_resolve_lease_s``; if it died
    before storing its commit and op, another producer (a check-back's answer) may resolve it after."""
    tc = TransactionCheck(str(tmp_path / "transaction.json"), timeout_s=6.0, check_max=15, lease_s=0.2)
    assert tc.end(None, "tx", 7, 700, "COMMIT")["resolve"]
    again = tc.end(None, "tx", 7, 700, "COMMIT")
    assert not again["resolve"] and again["reason"] == "being resolved by another producer"
    deadline = time.monotonic() + 10
    while not tc.end(None, "tx", 7, 700, "COMMIT")["resolve"]:
        assert time.monotonic() < deadline, "the lease never ended"
        time.sleep(0.05)


def test_a_half_stored_before_the_wall_clock_stepped_back_is_still_checked(tmp_path):
    """Store times never go back, so after the wall clock stepped back a half's store time lies in the
    future until the clock catches up. The walk also ages a half by how long this run has seen it:
    it is checked once that reaches the timeout (the fault run on 8c9fbaa lost committed transactions
    whose end died with their broker, after a one-hour step, because their halves were never checked)."""
    path = str(tmp_path / "store")
    with MessageStore(path, small_config()) as s:
        for i in range(3):
            s.put(_half_msg(i), 0)
        s.put(Message(OP_TOPIC, b"1", tags="d"), 0)
        s.dispatch()
    stepped_back_ms = int(time.time() * 1000) - 3_600_000          # the wall clock an hour behind the store's
    with StoreReader(path, small_config()) as reader:
        tc = TransactionCheck(str(tmp_path / "transaction.json"), timeout_s=0.3, check_max=5)
        tc.walk(reader, stepped_back_ms)
        assert tc.progress.checks == {} and tc.stats()["pending"] == 0     # not old enough yet, by either clock
        deadline = time.monotonic() + 10
        while not tc.progress.checks:
            assert time.monotonic() < deadline, "a half stored in the clock's future was never checked"
            time.sleep(0.05)
            tc.walk(reader, stepped_back_ms)
        assert tc.progress.checks == {0: 1, 2: 1} and tc.progress.half_offset == 0
        assert [r["queue_offset"] for r in tc.poll("tx", 32)[0]] == [0, 2]
