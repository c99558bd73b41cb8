"""Verification logic on synthetic ack logs and synthetic store files (no broker)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from hostmq import records as R
from hostmq.faults.verify import (EXPECTED, HALF, REAL, SCHEDULE, Ledger, Stored, check_queues, queue_mismatches,
                                  recheck, scan_commitlog, scan_cut_file)
from hostmq.faults.workload import encode_body

pytestmark = pytest.mark.timeout(60)
TOPIC = "hmqf"
HOST = b"\x01\x02\x03\x04\x00\x00\x00\x07"
FILE_BYTES = 4096


def record(phys: int, producer: str, seq: int, *, topic: str = TOPIC, mode: str = "sync", queue_offset: int = 0,
           patched: bool = True, trial: int = 1) -> bytes:
    return R.encode_record(topic.encode(), encode_body(trial, producer, mode, seq), b"", queue_offset=queue_offset,
                           phys_offset=phys if patched else 0, store_host=HOST, store_ts_ms=1000)


def write_commitlog(d: str, records: list[bytes]) -> list[int]:
    """Records packed into FILE_BYTES files, blank-padded like the store; their positions."""
    os.makedirs(d, exist_ok=True)
    files: dict[int, bytearray] = {}
    pos, out = 0, []
    for rec in records:
        room = FILE_BYTES - pos % FILE_BYTES
        if len(rec) + R.MIN_BLANK_BYTES > room:
            f = files.setdefault(pos - pos % FILE_BYTES, bytearray(FILE_BYTES))
            R.BLANK.pack_into(f, pos % FILE_BYTES, room, R.BLANK_MAGIC_CODE)
            pos += room
        f = files.setdefault(pos - pos % FILE_BYTES, bytearray(FILE_BYTES))
        f[pos % FILE_BYTES:pos % FILE_BYTES + len(rec)] = rec
        out.append(pos)
        pos += len(rec)
    for start, data in files.items():
        with open(os.path.join(d, f"{start:020d}"), "wb") as fh:
            fh.write(data)
    return out + [pos]


def build(d: str, n: int, **kw) -> list[int]:
    """``n`` records of producer p0.1 (seq 1..n) with their real positions."""
    size = len(record(0, "p0.1", 1, **kw))
    positions, pos = [], 0
    for _ in range(n):
        if size + R.MIN_BLANK_BYTES > FILE_BYTES - pos % FILE_BYTES:
            pos += FILE_BYTES - pos % FILE_BYTES
        positions.append(pos)
        pos += size
    return write_commitlog(d, [record(p, "p0.1", i + 1, queue_offset=i, **kw) for i, p in enumerate(positions)])


def test_scan_finds_every_record_across_files(tmp_path):
    d = str(tmp_path / "commitlog")
    pos = build(d, 60)
    assert pos[-1] > 2 * FILE_BYTES          # the records span three files
    recs, problems, reached = scan_commitlog(d, FILE_BYTES, 0, pos[-1], TOPIC)
    assert problems == []
    assert reached == pos[-1]
    assert [r.seq for r in recs] == list(range(1, 61))
    assert [r.phys for r in recs] == pos[:-1]
    assert all(r.kind == REAL and r.msg_id == R.encode_msg_id(HOST, r.phys) for r in recs)
    # scanning in pieces finds the same records once
    mid = pos[17]
    a, _, r1 = scan_commitlog(d, FILE_BYTES, 0, mid, TOPIC)
    b, _, r2 = scan_commitlog(d, FILE_BYTES, r1, pos[-1], TOPIC)
    assert [r.seq for r in a + b] == list(range(1, 61)) and r2 == pos[-1]


def test_scan_sorts_topics_and_ignores_foreign_records(tmp_path):
    d = str(tmp_path / "commitlog")
    recs = [record(0, "p0.1", 1, topic="SCHEDULE_TOPIC_XXXX", mode="delay")]
    p1 = len(recs[0])
    recs.append(record(p1, "p0.1", 2, topic="RMQ_SYS_TRANS_HALF_TOPIC", mode="tx"))
    p2 = p1 + len(recs[1])
    recs.append(R.encode_record(b"other", b"not ours", b"", phys_offset=p2))
    pos = write_commitlog(d, recs)
    found, problems, _ = scan_commitlog(d, FILE_BYTES, 0, pos[-1], TOPIC)
    assert problems == [] and [(r.kind, r.seq) for r in found] == [(SCHEDULE, 1), (HALF, 2)]


def test_scan_reports_an_unfinished_append_and_goes_on(tmp_path):
    d = str(tmp_path / "commitlog")
    a = record(0, "p0.1", 1)
    b = record(len(a), "p0.1", 2, patched=False)           # copied, PHYSICALOFFSET never patched
    c = record(len(a) + len(b), "p0.1", 3)
    pos = write_commitlog(d, [a, b, c])
    found, problems, _ = scan_commitlog(d, FILE_BYTES, 0, pos[-1], TOPIC)
    assert [r.seq for r in found] == [1, 2, 3]
    assert len(problems) == 1 and "PHYSICALOFFSET 0 is not its position" in problems[0]


def test_scan_skips_the_rest_of_a_file_after_garbage(tmp_path):
    d = str(tmp_path / "commitlog")
    pos = build(d, 60)
    path = os.path.join(d, f"{0:020d}")
    with open(path, "r+b") as f:                       # trash the third record's magic
        f.seek(pos[2] + 4)
        f.write(b"\xde\xad\xbe\xef")
    found, problems, reached = scan_commitlog(d, FILE_BYTES, 0, pos[-1], TOPIC)
    assert len(problems) == 1 and "bad magic" in problems[0]
    assert [r.seq for r in found][:2] == [1, 2]
    assert all(r.phys >= FILE_BYTES for r in found[2:])     # the next file is read again
    assert reached == pos[-1]


def test_scan_reports_a_missing_file(tmp_path):
    d = str(tmp_path / "commitlog")
    pos = build(d, 60)
    os.unlink(os.path.join(d, f"{FILE_BYTES:020d}"))
    _, problems, reached = scan_commitlog(d, FILE_BYTES, 0, pos[-1], TOPIC)
    assert any("missing" in p for p in problems) and reached == FILE_BYTES


# -- the ledger -------------------------------------------------------------------------------------------
def ack(seq: int, mode: str = "sync", trial: int = 1, producer: str = "p0.1", phys: int | None = None,
        q: int = 0, qo: int | None = None, **extra) -> dict:
    phys = seq * 100 if phys is None else phys
    return {"e": "ack", "t": trial, "p": producer, "m": mode, "s": seq, "id": R.encode_msg_id(HOST, phys),
            "q": q, "qo": seq if qo is None else qo, "st": "SEND_OK", "t0": 1.0, "t1": 1.1, "k": "", "o": -1,
            **extra}


def stored(seq: int, kind: str = REAL, mode: str = "sync", trial: int = 1, producer: str = "p0.1",
           phys: int | None = None, q: int = 0, qo: int | None = None, okey: str = "", oseq: int = -1) -> Stored:
    phys = seq * 100 if phys is None else phys
    return Stored(phys, 90, kind, q, seq if qo is None else qo, 1000, R.encode_msg_id(HOST, phys), trial, producer,
                  mode, seq, okey, oseq)


def recv(seq: int, trial: int = 1, producer: str = "p0.1", consumer: str = "c0.1", k: str = "", o: int = -1,
         mode: str = "sync") -> dict:
    return {"e": "recv", "c": consumer, "t": trial, "p": producer, "m": mode, "s": seq, "k": k, "o": o, "q": 0,
            "qo": seq, "ph": seq * 100}


def ledger_with(events, records, trial: int = 1) -> Ledger:
    led = Ledger()
    led.open_trial(trial)
    led.add_events(events)
    led.add_stored(records)
    return led


def test_everything_stored_once_and_seen_passes():
    led = ledger_with([ack(i) for i in range(1, 6)] + [recv(i) for i in range(1, 6)],
                      [stored(i) for i in range(1, 6)])
    assert led.missing(1) == (0, 0)
    v = led.verdict(1)
    assert v.acked == 5 and not v.failed and v.details == []


def test_an_acknowledged_message_not_stored_is_lost():
    led = ledger_with([ack(1), ack(2), recv(1)], [stored(1)])
    assert led.missing(1) == (1, 0)
    v = led.verdict(1)
    assert (v.acked, v.lost, v.unseen) == (2, 1, 0)
    assert "p0.1.2" in v.details[0]


def test_a_second_copy_is_duplicated_even_unacknowledged():
    led = ledger_with([ack(1), recv(1)], [stored(1), stored(1, phys=900, qo=9), stored(7), stored(7, phys=1000)])
    v = led.verdict(1)
    assert v.duplicated == 2 and v.lost == 0


def test_a_transaction_may_be_stored_once_per_commit_decision():
    events = [{"e": "local", "t": 1, "p": "p2.1", "s": 3, "a": "COMMIT"}, ack(3, "tx", producer="p2.1"),
              {"e": "check", "t": 1, "p": "p2.1", "s": 3, "a": "COMMIT"}, recv(3, producer="p2.1", mode="tx")]
    twice = [stored(3, mode="tx", producer="p2.1"), stored(3, mode="tx", producer="p2.1", phys=5000)]
    assert ledger_with(events, twice).verdict(1).duplicated == 0
    once = [e for e in events if e["e"] != "check"]
    assert ledger_with(once, twice).verdict(1).duplicated == 1


def test_a_rolled_back_transaction_that_was_stored_is_a_phantom():
    events = [{"e": "local", "t": 1, "p": "p2.1", "s": 8, "a": "ROLLBACK"}]
    v = ledger_with(events, [stored(8, mode="tx", producer="p2.1")]).verdict(1)
    assert v.phantom == 1 and v.acked == 0
    assert ledger_with(events, []).verdict(1).phantom == 0


def test_an_acknowledgement_naming_another_position_is_mismatched():
    v = ledger_with([ack(1, phys=4242), recv(1)], [stored(1)]).verdict(1)
    assert v.mismatched == 1 and "stored as" in v.details[0]
    v = ledger_with([ack(1, qo=5), recv(1)], [stored(1)]).verdict(1)
    assert v.mismatched == 1


def test_delay_and_transaction_acknowledgements_name_their_schedule_and_half_copies():
    events = [ack(1, "delay"), recv(1, mode="delay"), ack(2, "tx"), recv(2, mode="tx"),
              {"e": "txend", "t": 1, "p": "p0.1", "s": 2, "id": R.encode_msg_id(HOST, 777), "a": "COMMIT"}]
    good = [stored(1, SCHEDULE, "delay"), stored(1, mode="delay", phys=5000), stored(2, HALF, "tx", phys=777),
            stored(2, mode="tx", phys=6000)]
    assert not ledger_with(events, good).verdict(1).failed
    bad = [stored(1, mode="delay", phys=5000), stored(2, mode="tx", phys=6000)]
    assert ledger_with(events, bad).verdict(1).mismatched == 2


def test_after_a_failover_only_sends_not_answered_send_ok_may_be_found_only_in_a_cut_file():
    """An acknowledged message the old master cut (``Ledger.add_cut``) is lost if its send was
    answered SEND_OK (a slave had it: the promoted master must too), and counted apart if the
    SYNC_MASTER answered SLAVE_NOT_AVAILABLE or FLUSH_SLAVE_TIMEOUT (for a transaction: its half's
    status, from txend). One missing from the cut file too is lost whatever its status."""
    events = [ack(1), ack(2, st="SLAVE_NOT_AVAILABLE"), ack(3, st="FLUSH_SLAVE_TIMEOUT"), ack(4, "tx"),
              {"e": "txend", "t": 1, "p": "p0.1", "s": 4, "id": R.encode_msg_id(HOST, 400), "a": "COMMIT",
               "st": "SLAVE_NOT_AVAILABLE"}, ack(5, st="SLAVE_NOT_AVAILABLE"), ack(6), recv(6)]
    led = ledger_with(events, [stored(6)])
    led.add_cut([stored(1), stored(2), stored(3), stored(4, HALF, "tx")], [], "cut-100-500.bin")
    assert led.missing(1) == (2, 0)          # nothing to wait for but the two lost ones
    v = led.verdict(1)
    assert (v.acked, v.lost) == (6, 2)
    assert "p0.1.1 (sync" in v.details[1] and "SEND_OK: only in cut-100-500.bin at 100" in v.details[1]
    assert "p0.1.5" in v.details[2] and "only in" not in v.details[2]
    assert v.details[0].startswith("cut: 3 acknowledged but not SEND_OK")


def test_a_cut_file_is_read_record_by_record_at_their_own_positions(tmp_path):
    """``store/cut-FROM-TO.bin`` holds whole records back to back, file ends left out: each is where
    its PHYSICALOFFSET says; a broken one ends the scan and is a problem."""
    recs = [record(5000, "p0.1", 1), record(5200, "p0.1", 2, trial=2), record(FILE_BYTES * 2, "p0.1", 3)]
    path = tmp_path / "cut-5000-8500.bin"
    path.write_bytes(b"".join(recs) + b"\x00" * 10)
    found, problems = scan_cut_file(str(path), TOPIC)
    assert [(r.seq, r.phys, r.trial) for r in found] == [(1, 5000, 1), (2, 5200, 2), (3, 2 * FILE_BYTES, 1)]
    assert len(problems) == 1 and "cut-5000-8500.bin" in problems[0]


def test_a_stored_message_no_consumer_received_is_unseen():
    led = ledger_with([ack(1), ack(2), recv(1)], [stored(1), stored(2)])
    assert led.missing(1) == (0, 1)
    assert led.verdict(1).unseen == 1


def test_ordered_receipts_out_of_order_are_found_and_replays_are_not():
    rs = [recv(1, k="p0.1.k0", o=0), recv(2, k="p0.1.k0", o=1), recv(1, k="p0.1.k0", o=0),   # a replay
          recv(3, k="p0.1.k0", o=2), recv(5, k="p0.1.k0", o=4), recv(4, k="p0.1.k0", o=3),   # 3 after 4
          recv(4, consumer="c0.2", k="p0.1.k0", o=3)]                                    # new consumer: fresh
    led = ledger_with([ack(i, "ordered") for i in range(1, 6)] + rs, [stored(i, mode="ordered") for i in range(1, 6)])
    v = led.verdict(1)
    assert v.out_of_order == 1 and "#3 after #4" in v.details[0]


def test_ordered_records_stored_out_of_order_are_found():
    recs = [stored(1, okey="k", oseq=0), stored(2, okey="k", oseq=2), stored(3, okey="k", oseq=1),
            stored(4, okey="j", oseq=0)]
    v = ledger_with([], recs).verdict(1)
    assert v.out_of_order == 1


def test_findings_are_charged_to_the_next_verdict_and_unreachable_is_counted():
    led = Ledger()
    led.open_trial(1)
    led.open_trial(2)
    led.add_stored([stored(1, trial=1), stored(1, trial=1, phys=999)], ["record at 5: bad magic"])
    v1 = led.verdict(1, ["p0.1.1: not found by key"])
    assert (v1.duplicated, v1.corrupt, v1.unreachable) == (1, 1, 1)
    assert not led.verdict(2).failed


def test_records_of_a_closed_trial_only_count_copies():
    led = Ledger()
    led.open_trial(2)
    led.add_events([ack(1, trial=1)])                 # trial 1 is not open: ignored
    led.add_stored([stored(1, trial=1)])
    assert led.records(2) == [] and led.verdict(2).acked == 0


# -- consume queues -------------------------------------------------------------------------------------------
def test_check_queues_reads_the_entries_from_the_files(tmp_path):
    per_file = 4
    qdir = tmp_path / "consumequeue" / TOPIC / "1"
    qdir.mkdir(parents=True)
    for first in (0, per_file):
        ents = np.zeros(per_file, dtype=R.CQ_ENTRY)
        ents["phys_offset"] = [(first + i) * 100 for i in range(per_file)]
        ents["size"] = 90
        ents.tofile(str(qdir / f"{first * R.CQ_ENTRY.itemsize:020d}"))
    good = [stored(i, q=1, qo=i) for i in range(8)]
    assert check_queues(str(tmp_path), per_file, TOPIC, good) == []
    bad = [stored(3, q=1, qo=2), stored(9, q=1, qo=9), stored(1, q=2, qo=1)]
    problems = check_queues(str(tmp_path), per_file, TOPIC, bad)
    assert len(problems) == 3
    assert "points at 200" in problems[0] and "no consume-queue entry 1/9" in problems[1]


# -- the end-of-run recheck -------------------------------------------------------------------------------------
def expected(*rows) -> np.ndarray:
    return np.array([(k, p, 90, 0, i, 1000) for i, (k, p) in enumerate(rows)], dtype=EXPECTED)


def test_recheck_finds_moved_and_vanished_messages_and_extra_copies():
    exp = expected((1, 100), (2, 200), (3, 300), (4, 400))
    keys = np.array([2, 1, 3, 9, 9, 5], np.int64)           # 4 vanished; 9 twice; 3 moved to 350
    phys = np.array([200, 100, 350, 500, 600, 700], np.int64)
    v = recheck(exp, keys, phys, lambda ks: np.ones(len(ks), np.int64), str)
    assert (v.acked, v.lost, v.duplicated) == (4, 2, 1)
    assert v.details == ["lost: 3 is no longer at 300", "lost: 4 is no longer at 400",
                         "duplicated: 9 is stored 2 times"]
    allow_two = recheck(exp[:2], keys, phys, lambda ks: np.where(ks == 9, 2, 1), str)
    assert not allow_two.failed
    empty = recheck(exp, np.zeros(0, np.int64), np.zeros(0, np.int64), lambda ks: np.ones(len(ks)), str)
    assert empty.lost == 4


def test_ledger_keeps_where_each_acknowledged_message_was_found():
    led = ledger_with([ack(1), ack(2), recv(1), recv(2)], [stored(1), stored(2, qo=7)])
    led.verdict(1)
    rows = np.concatenate(led.verified)
    assert [(led.name(int(r["key"])), int(r["phys"]), int(r["queue_offset"])) for r in rows] == [
        ("p0.1.1", 100, 1), ("p0.1.2", 200, 7)]
    assert list(led.allowed_copies(rows["key"])) == [1, 1]


def test_queue_mismatches_vectorised(tmp_path):
    per_file = 4
    qdir = tmp_path / "consumequeue" / TOPIC / "0"
    qdir.mkdir(parents=True)
    ents = np.zeros(per_file, dtype=R.CQ_ENTRY)
    ents["phys_offset"], ents["size"] = [0, 100, 200, 300], 90
    ents[:3].tofile(str(qdir / f"{0:020d}"))                # entry 3 not written yet
    bad, found = queue_mismatches(str(tmp_path), per_file, TOPIC, np.array([0, 0, 0, 0, 1]),
                                  np.array([0, 2, 3, 9, 0]), np.array([0, 250, 300, 900, 0]),
                                  np.array([90, 90, 90, 90, 90]))
    assert list(bad) == [False, True, True, True, True]
    assert list(found[1]) == [200, 90] and list(found[2]) == [-1, -1]
