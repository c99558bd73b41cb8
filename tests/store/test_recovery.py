"""Crash recovery: a store directory copied while open (as a killed process leaves it, ``abort``
present), damaged, reopened. After recovery every message fully written before the damage is
readable exactly once, in order, at its queue offset; nothing after the damage is visible; new puts
continue the queue offsets; and the next open is a clean one.

Expected values come from what the test sent and from parsing the copied commitlog with
``hostmq.records`` before damaging it.
"""
from __future__ import annotations

import os
import random
import shutil
import zlib

import numpy as np
import pytest

from hostmq import records as R
from hostmq.message import Message
from hostmq.records import Checkpoint
from hostmq.store import recovery
from hostmq.store.mapped_file import file_name
from hostmq.store.message_store import MessageStore
from hostmq.store.reader import GetStatus

from .conftest import (CL_FILE_BYTES, CQ_ENTRIES, CQ_FILE_BYTES, Rec, body_for, commitlog_files, crash_copy,
                       key_for, parse_log, read_queue, read_queue_batches)

pytestmark = pytest.mark.timeout(120)

QUEUES = [("R0", 0), ("R0", 1), ("R1", 0), ("R1", 1)]


class Workload:
    """Puts messages (batches and singles) and remembers, per queue, the bodies in queue order."""

    def __init__(self, seed: int = 1) -> None:
        self.rng = random.Random(seed)
        self.sent: dict[tuple[str, int], list[bytes]] = {k: [] for k in QUEUES}

    def message(self, topic: str, qid: int) -> Message:
        i = len(self.sent[(topic, qid)])
        m = Message(topic, body_for(topic, qid, i, self.rng.randrange(0, 1200)), tags=f"t{i % 3}",
                    keys=[key_for(topic, qid, i)])
        self.sent[(topic, qid)].append(m.body)
        return m

    def run(self, store: MessageStore, rounds: int) -> None:
        for _ in range(rounds):
            for topic, qid in QUEUES:
                n = self.rng.randrange(10, 40)
                store.put_batch([self.message(topic, qid) for _ in range(n)], queue_id=qid)
                for _ in range(self.rng.randrange(0, 4)):
                    store.put(self.message(topic, qid), queue_id=qid)

    def index_of(self, body: bytes) -> tuple[str, int, int]:
        topic, qid, i = body.split(b"|")[:3]
        return topic.decode(), int(qid), int(i)

    def expected_for(self, survivors: list[Rec]) -> dict[tuple[str, int], list[bytes]]:
        """Per queue, the bodies of the surviving records (a prefix of what was sent)."""
        out = {k: [] for k in QUEUES}
        for r in survivors:
            topic, qid, _ = self.index_of(r.body)
            out[(topic, qid)].append(r.body)
        for k, bodies in out.items():
            assert bodies == self.sent[k][:len(bodies)], k     # sanity of the test itself
        return out


def build(open_store, checkpoint: str, wl: Workload, rounds: tuple[int, int] = (6, 6)) -> MessageStore:
    """An open store after two phases of puts; ``checkpoint`` is "none", "middle" or "end"."""
    store = open_store()
    wl.run(store, rounds[0])
    store.dispatch()
    if checkpoint == "middle":
        store.flush()
    wl.run(store, rounds[1])
    store.dispatch()
    if checkpoint == "end":
        store.flush()
    return store


# -- checks ------------------------------------------------------------------------------------------
def verify(store: MessageStore, expected: dict, lost: dict | None = None, cl_end: int | None = None,
           keys: bool = True) -> None:
    for (topic, qid), bodies in expected.items():
        n = len(bodies)
        got = read_queue(store, topic, qid)
        assert [m.body for m in got] == bodies, (topic, qid, len(got), n)
        assert [m.queue_offset for m in got] == list(range(n)), (topic, qid)
        assert store.max_offset(topic, qid) == n, (topic, qid)
        if n:
            assert store.get(topic, qid, n).status == GetStatus.OFFSET_OVERFLOW_ONE
            assert read_queue_batches(store, topic, qid) == bodies
        if keys and store.index is not None:
            for i in sorted({0, n // 2, n - 1}) if n else ():
                (m,) = store.query_by_key(topic, key_for(topic, qid, i))
                assert m.body == bodies[i] and m.queue_offset == i
            for i in (lost or {}).get((topic, qid), [])[:3]:
                assert store.query_by_key(topic, key_for(topic, qid, i)) == [], (topic, qid, i)
    if cl_end is not None:
        assert store.commitlog.max_offset() == cl_end


def continue_and_reopen(open_store, store: MessageStore, wl: Workload, expected: dict) -> None:
    """New puts continue every queue's offsets; a second reopen is clean and sees the same."""
    expected = {k: list(v) for k, v in expected.items()}
    for j, (topic, qid) in enumerate(QUEUES):
        n = len(expected[(topic, qid)])
        msgs = [Message(topic, b"new|%s|%d|%d" % (topic.encode(), qid, x)) for x in range(3)]
        if j % 2:
            r = store.put_batch(msgs, queue_id=qid)
            assert r.queue_offsets.tolist() == [n, n + 1, n + 2], (topic, qid)
        else:
            assert [store.put(m, queue_id=qid).queue_offset for m in msgs] == [n, n + 1, n + 2]
        expected[(topic, qid)] += [m.body for m in msgs]
    store.dispatch()
    verify(store, expected, keys=False)
    path = store.path
    store.close()
    again = open_store(path)
    assert not again.recovery.abnormal
    verify(again, expected, keys=False)
    again.close()


def recover(open_store, path) -> MessageStore:
    store = open_store(path)
    assert store.recovery.abnormal
    assert os.path.exists(os.path.join(path, "abort"))
    return store


def lost_indices(wl: Workload, expected: dict) -> dict:
    return {k: list(range(len(expected[k]), len(wl.sent[k]))) for k in QUEUES}


def zero_range(path: str, start: int, end: int) -> None:
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(b"\0" * (end - start))


def file_of(store_dir, phys: int) -> tuple[str, int]:
    start = phys - phys % CL_FILE_BYTES
    return os.path.join(store_dir, "commitlog", file_name(start)), phys - start


# -- commitlog damage --------------------------------------------------------------------------------
def damage_torn_last(crash, recs, rng):
    """The last record loses its second half (bytes zeroed, as an unwritten page)."""
    last = recs[-1]
    path, rel = file_of(crash, last.phys)
    zero_range(path, rel + last.total // 2, CL_FILE_BYTES)
    return len(recs) - 1, last.phys


def damage_torn_middle(crash, recs, rng):
    """A record two files before the end is torn: it and everything after it are lost."""
    last_file = recs[-1].phys // CL_FILE_BYTES
    k = next(i for i, r in enumerate(recs) if r.phys // CL_FILE_BYTES == last_file - 2) + 5
    path, rel = file_of(crash, recs[k].phys)
    zero_range(path, rel + 10, rel + recs[k].total)
    return k, recs[k].phys


def damage_flipped_body_byte(crash, recs, rng):
    """One bit of the last record's body flipped: only the body CRC can tell."""
    last = recs[-1]
    path, rel = file_of(crash, last.phys)
    at = rel + R.MSG_HEADER.size + 3
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)[0]
        f.seek(at)
        f.write(bytes([b ^ 0x10]))
    return len(recs) - 1, last.phys


def damage_garbage_tail(crash, recs, rng):
    """Random bytes after the last record, to the end of the file."""
    last = recs[-1]
    path, rel = file_of(crash, last.phys + last.total)
    with open(path, "r+b") as f:
        f.seek(rel)
        f.write(rng.randbytes(CL_FILE_BYTES - rel))
    return len(recs), last.phys + last.total


def damage_garbage_over_last(crash, recs, rng):
    """Random bytes over the last three records (a torn multi-page write)."""
    k = len(recs) - 3
    path, rel = file_of(crash, recs[k].phys)
    if recs[-1].phys // CL_FILE_BYTES != recs[k].phys // CL_FILE_BYTES:
        pytest.skip("the last three records span two files in this layout")
    with open(path, "r+b") as f:
        f.seek(rel)
        f.write(b"\x55" + rng.randbytes(CL_FILE_BYTES - rel - 1))     # never a valid magic
    return k, recs[k].phys


def damage_zero_pages(crash, recs, rng):
    """The last file loses its pages from a 4 KiB boundary in the middle of its data."""
    last_start = recs[-1].phys - recs[-1].phys % CL_FILE_BYTES
    in_last = [r for r in recs if r.phys >= last_start]
    mid = in_last[len(in_last) // 2]
    boundary = (mid.phys - last_start) // 4096 * 4096 + 4096 + last_start
    k = next(i for i, r in enumerate(recs) if r.phys + r.total > boundary)
    path, _ = file_of(crash, last_start)
    zero_range(path, boundary - last_start, CL_FILE_BYTES)
    return k, recs[k].phys


def damage_zero_whole_last_file(crash, recs, rng):
    """The newest file was created but none of its pages reached the disk."""
    last_start = recs[-1].phys - recs[-1].phys % CL_FILE_BYTES
    zero_range(os.path.join(crash, "commitlog", file_name(last_start)), 0, CL_FILE_BYTES)
    k = next(i for i, r in enumerate(recs) if r.phys >= last_start)
    return k, last_start


def damage_empty_newest_file(crash, recs, rng):
    """The newest file is empty, as a crash while creating it leaves it: it is dropped."""
    newest = commitlog_files(crash)[-1]
    os.truncate(newest, 0)
    cut = int(os.path.basename(newest))
    return next(i for i, r in enumerate(recs) if r.phys >= cut), cut


def damage_delete_last_files(crash, recs, rng):
    """Consume queue ahead of the commitlog: the two newest commitlog files are gone."""
    files = commitlog_files(crash)
    for p in files[-2:]:
        os.unlink(p)
    cut = int(os.path.basename(files[-2]))
    k = next(i for i, r in enumerate(recs) if r.phys >= cut)
    return k, cut


COMMITLOG_DAMAGE = {f.__name__[len("damage_"):]: f for f in (
    damage_torn_last, damage_torn_middle, damage_flipped_body_byte, damage_garbage_tail,
    damage_garbage_over_last, damage_zero_pages, damage_zero_whole_last_file, damage_empty_newest_file,
    damage_delete_last_files)}
# Damage to data the checkpoint says is durable is not a crash outcome: recovery trusts that part.
BEFORE_DURABLE_POINT = {("torn_middle", "end"), ("delete_last_files", "end")}


@pytest.mark.parametrize("damage,checkpoint", [
    (d, c) for d in sorted(COMMITLOG_DAMAGE) for c in ("none", "middle", "end")
    if (d, c) not in BEFORE_DURABLE_POINT])
def test_commitlog_damage(open_store, tmp_path, damage, checkpoint):
    wl = Workload(seed=zlib.crc32(damage.encode()))
    store = build(open_store, checkpoint, wl)
    crash = crash_copy(store, tmp_path / "crash")
    store.close()
    recs = parse_log(crash)
    assert sum(map(len, wl.sent.values())) == len(recs)
    assert len(commitlog_files(crash)) >= 8
    k, cl_end = COMMITLOG_DAMAGE[damage](crash, recs, random.Random(5))
    assert 0 < k <= len(recs)
    expected = wl.expected_for(recs[:k])

    store = recover(open_store, crash)
    verify(store, expected, lost_indices(wl, expected), cl_end)
    # The tail after the recovered end is zero: stale bytes can never come back as records.
    path, rel = file_of(crash, cl_end)
    if os.path.exists(path):
        with open(path, "rb") as f:
            f.seek(rel)
            assert f.read() == b"\0" * (CL_FILE_BYTES - rel)
    assert [os.path.basename(p) for p in commitlog_files(crash)] == [
        file_name(i * CL_FILE_BYTES) for i in range((cl_end - 1) // CL_FILE_BYTES + 1)]
    continue_and_reopen(open_store, store, wl, expected)


def test_abort_file_written_back_after_a_clean_close(open_store):
    """The other way to fake a crash: close cleanly, put ``abort`` back, tear the last record."""
    wl = Workload(seed=2)
    store = build(open_store, "middle", wl)
    path = store.path
    store.close()
    recs = parse_log(path)
    k, cl_end = damage_torn_last(path, recs, None)
    open(os.path.join(path, "abort"), "wb").close()
    expected = wl.expected_for(recs[:k])
    store = recover(open_store, path)
    verify(store, expected, lost_indices(wl, expected), cl_end)
    continue_and_reopen(open_store, store, wl, expected)


def test_undispatched_tail_is_dispatched_by_recovery(open_store, tmp_path):
    wl = Workload(seed=3)
    store = build(open_store, "middle", wl)
    wl.run(store, 2)                        # appended, never dispatched: consume queues are behind
    shutil.copytree(store.path, tmp_path / "crash")
    os.unlink(tmp_path / "crash" / "lock")
    store.close()
    store = recover(open_store, str(tmp_path / "crash"))
    verify(store, wl.sent)
    continue_and_reopen(open_store, store, wl, wl.sent)


def test_crash_of_an_empty_store_and_of_a_store_with_one_message(open_store, tmp_path):
    store = open_store()
    crash = crash_copy(store, tmp_path / "empty")
    store.put(Message("R0", b"only"), queue_id=0)
    one = crash_copy(store, tmp_path / "one")
    store.close()
    s = recover(open_store, crash)
    assert s.commitlog.max_offset() == 0 and s.max_offset("R0", 0) == 0
    assert s.put(Message("R0", b"first"), queue_id=0).queue_offset == 0
    s.close()
    s = recover(open_store, one)
    assert [m.body for m in read_queue(s, "R0", 0)] == [b"only"]
    assert s.put(Message("R0", b"second"), queue_id=0).queue_offset == 1


def test_corrupt_checkpoint_means_a_full_scan(open_store, tmp_path):
    wl = Workload(seed=4)
    store = build(open_store, "end", wl)
    crash = crash_copy(store, tmp_path / "crash")
    store.close()
    recs = parse_log(crash)
    with open(os.path.join(crash, "checkpoint"), "r+b") as f:
        f.seek(3)
        f.write(b"\xff\xff")
    k, cl_end = damage_torn_middle(crash, recs, None)      # caught only by scanning from the start
    expected = wl.expected_for(recs[:k])
    store = recover(open_store, crash)
    assert store.recovery.full_redispatch
    verify(store, expected, lost_indices(wl, expected), cl_end)
    continue_and_reopen(open_store, store, wl, expected)


# -- consume-queue damage ----------------------------------------------------------------------------
def cq_files(store_dir, topic="R0", qid=0) -> list[str]:
    d = os.path.join(store_dir, "consumequeue", topic, str(qid))
    return sorted(os.path.join(d, n) for n in os.listdir(d))


def damage_cq_delete_newest_file(crash):
    os.unlink(cq_files(crash)[-1])


def damage_cq_delete_two_newest_files(crash):
    for p in cq_files(crash)[-2:]:
        os.unlink(p)


def damage_cq_delete_middle_file(crash):
    files = cq_files(crash)
    os.unlink(files[len(files) // 2])


def damage_cq_delete_first_file(crash):
    os.unlink(cq_files(crash)[0])


def damage_cq_delete_whole_dir(crash):
    shutil.rmtree(os.path.join(crash, "consumequeue"))


def damage_cq_delete_one_queue_dir(crash):
    shutil.rmtree(os.path.join(crash, "consumequeue", "R0", "0"))


def _zero_last_entries(crash, n: int) -> None:
    """Consume queue behind the commitlog: its last n entries are zero."""
    files = cq_files(crash)
    entries = []
    for p in files:
        raw = np.fromfile(p, dtype=R.CQ_ENTRY)
        entries += [(p, i) for i in np.flatnonzero(raw["size"] > 0).tolist()]
    assert len(entries) > n
    for p, i in entries[-n:]:
        zero_range(p, i * R.CQ_ENTRY.itemsize, (i + 1) * R.CQ_ENTRY.itemsize)


def damage_cq_zero_last_5_entries(crash):
    _zero_last_entries(crash, 5)


def damage_cq_zero_last_100_entries(crash):
    _zero_last_entries(crash, 100)         # more than one file's worth


def damage_cq_truncated_newest_file(crash):
    p = cq_files(crash)[-1]
    os.truncate(p, os.path.getsize(p) // 2 + 7)


CQ_DAMAGE = {f.__name__[len("damage_cq_"):]: f for f in (
    damage_cq_delete_newest_file, damage_cq_delete_two_newest_files, damage_cq_delete_middle_file,
    damage_cq_delete_first_file, damage_cq_delete_whole_dir, damage_cq_delete_one_queue_dir,
    damage_cq_zero_last_5_entries, damage_cq_zero_last_100_entries, damage_cq_truncated_newest_file)}


# Entries the checkpoint records as flushed were msync'ed: losing them is not a crash outcome, and
# recovery (as RocketMQ's) does not scan the commitlog to look for them.
CQ_NOT_A_CRASH = {("zero_last_5_entries", "end"), ("zero_last_100_entries", "end"),
                  ("delete_one_queue_dir", "end")}


@pytest.mark.parametrize("damage,checkpoint", [
    (d, c) for d in sorted(CQ_DAMAGE) for c in ("none", "middle", "end") if (d, c) not in CQ_NOT_A_CRASH])
def test_consume_queue_damage(open_store, tmp_path, damage, checkpoint):
    wl = Workload(seed=11)
    store = build(open_store, checkpoint, wl)
    crash = crash_copy(store, tmp_path / "crash")
    store.close()
    assert len(cq_files(crash)) >= 5
    CQ_DAMAGE[damage](crash)
    store = recover(open_store, crash)
    verify(store, wl.sent, cl_end=parse_log(crash)[-1].phys + parse_log(crash)[-1].total)
    continue_and_reopen(open_store, store, wl, wl.sent)


@pytest.mark.parametrize("damage", ["delete_whole_dir", "delete_newest_file", "delete_middle_file"])
def test_consume_queue_damage_after_a_clean_close(open_store, tmp_path, damage):
    wl = Workload(seed=12)
    store = build(open_store, "none", wl)
    path = store.path
    store.close()
    CQ_DAMAGE[damage](path)
    store = open_store(path)
    assert not store.recovery.abnormal
    verify(store, wl.sent)
    continue_and_reopen(open_store, store, wl, wl.sent)


def test_consume_queue_ahead_after_the_commitlog_tail_was_cut(open_store, tmp_path):
    """Entries for records past the recovered commitlog end are dropped, also across CQ files."""
    wl = Workload(seed=13)
    store = build(open_store, "middle", wl)
    crash = crash_copy(store, tmp_path / "crash")
    store.close()
    recs = parse_log(crash)
    max_before = {k: len(v) for k, v in wl.sent.items()}
    # Cut the commitlog so that queue R0/0 loses more than a consume-queue file of entries.
    r00 = [i for i, r in enumerate(recs) if wl.index_of(r.body)[:2] == ("R0", 0)]
    k = r00[-(CQ_FILE_BYTES // R.CQ_ENTRY.itemsize + 10)]
    cut = recs[k].phys
    path, rel = file_of(crash, cut)
    zero_range(path, rel, CL_FILE_BYTES)
    for p in commitlog_files(crash):
        if int(os.path.basename(p)) > cut:
            os.unlink(p)
    expected = wl.expected_for(recs[:k])
    assert all(len(expected[q]) < max_before[q] for q in QUEUES)
    store = recover(open_store, crash)
    verify(store, expected, lost_indices(wl, expected), cut)
    n = len(expected[("R0", 0)])
    assert len(cq_files(crash)) == -(-n // (CQ_FILE_BYTES // R.CQ_ENTRY.itemsize))
    continue_and_reopen(open_store, store, wl, expected)


# -- index damage --------------------------------------------------------------------------------------
def _index_files(store_dir) -> list[str]:
    d = os.path.join(store_dir, "index")
    return sorted(os.path.join(d, n) for n in os.listdir(d))


@pytest.mark.parametrize("abnormal", [True, False])
@pytest.mark.parametrize("which", ["all", "newest", "two_newest"])
def test_index_files_missing(open_store, tmp_path, which, abnormal):
    wl = Workload(seed=21)
    store = build(open_store, "end", wl)
    if abnormal:
        path = crash_copy(store, tmp_path / "crash")
        store.close()
    else:
        path = store.path
        store.close()
    files = _index_files(path)
    assert len(files) >= 4
    doomed = {"all": files, "newest": files[-1:], "two_newest": files[-2:]}[which]
    for p in doomed:
        os.unlink(p)
    store = open_store(path)
    assert store.recovery.abnormal == abnormal
    verify(store, wl.sent)
    # Every key of every message is back.
    for (topic, qid), bodies in wl.sent.items():
        for i in range(0, len(bodies), 7):
            (m,) = store.query_by_key(topic, key_for(topic, qid, i))
            assert m.body == bodies[i]
    continue_and_reopen(open_store, store, wl, wl.sent)


# -- clean reopen and the pure planning functions ----------------------------------------------------
def test_clean_reopen_keeps_everything_and_redispatches_little(open_store):
    wl = Workload(seed=31)
    store = build(open_store, "none", wl)
    path, end = store.path, store.commitlog.max_offset()
    store.close()
    assert not os.path.exists(os.path.join(path, "abort"))
    # No queue ends exactly at a consume-queue file boundary (that case re-dispatches its tail).
    assert all(len(v) % CQ_ENTRIES for v in wl.sent.values())
    store = open_store(path)
    rep = store.recovery
    assert not rep.abnormal and not rep.full_redispatch and rep.commitlog_max_offset == end
    assert rep.redispatched <= 1
    verify(store, wl.sent, cl_end=end)
    continue_and_reopen(open_store, store, wl, wl.sent)


@pytest.mark.parametrize("crash", [False, True])
def test_a_queue_ending_exactly_at_a_file_boundary(open_store, tmp_path, crash):
    store = open_store()
    bodies = [body_for("B", 0, i) for i in range(2 * CQ_ENTRIES)]
    store.put_batch([Message("B", b) for b in bodies[:CQ_ENTRIES + 5]])
    for b in bodies[CQ_ENTRIES + 5:]:
        store.put(Message("B", b))
    store.put(Message("Other", b"o"))
    if crash:
        path = crash_copy(store, tmp_path / "crash", flush=True)
        store.close()
    else:
        path = store.path
        store.close()
    store = open_store(path)
    assert store.recovery.abnormal == crash
    verify(store, {("B", 0): bodies, ("Other", 0): [b"o"]}, keys=False)
    assert store.put(Message("B", b"next")).queue_offset == 2 * CQ_ENTRIES
    store.dispatch()
    assert [m.body for m in read_queue(store, "B", 0)] == bodies + [b"next"]


CP = Checkpoint(physic_msg_ts_ms=0, logics_msg_ts_ms=0, index_msg_ts_ms=0, master_flushed_offset=0,
                confirm_phys_offset=0, commitlog_flushed_offset=0, cq_flushed_phys_offset=0,
                index_flushed_phys_offset=0)
FB = 1000
STARTS = [3000, 4000, 5000, 6000, 7000]


@pytest.mark.parametrize("abnormal, cp, valid, starts, want", [
    (True, CP, True, [], 0),                                                           # no files
    (True, CP, False, STARTS, 3000),                                                   # crash, no cp
    (False, CP, False, STARTS, 5000),                                       # clean, no cp: last 3 files
    (False, CP, False, STARTS[:2], 3000),
    (False, CP._replace(confirm_phys_offset=6500), True, STARTS, 6500),                # clean: confirmed end
    (False, CP._replace(confirm_phys_offset=8000), True, STARTS, 8000),
    (True, CP._replace(confirm_phys_offset=6500, commitlog_flushed_offset=6500,
                       cq_flushed_phys_offset=4200), True, STARTS, 4000),             # crash: durable file
    (True, CP._replace(commitlog_flushed_offset=5999, cq_flushed_phys_offset=7000), True, STARTS, 5000),
    (True, CP._replace(commitlog_flushed_offset=100, cq_flushed_phys_offset=100), True, STARTS, 3000),
    (True, CP._replace(commitlog_flushed_offset=9000, cq_flushed_phys_offset=9000), True, STARTS, 7000),
    (True, CP._replace(commitlog_flushed_offset=8000, cq_flushed_phys_offset=8000), True, STARTS, 7000),
])
def test_commitlog_scan_start(abnormal, cp, valid, starts, want):
    assert recovery.commitlog_scan_start(abnormal, cp, valid, starts, FB) == want


@pytest.mark.parametrize("cp, valid, intact, index_end, index_on, want", [
    (CP._replace(cq_flushed_phys_offset=5000), True, True, 9000, True, 5000),
    (CP._replace(cq_flushed_phys_offset=5000), True, True, 4000, True, 4000),
    (CP._replace(cq_flushed_phys_offset=5000), True, True, 4000, False, 5000),
    (CP._replace(cq_flushed_phys_offset=5000), False, True, 9000, True, 1000),         # no cp: from min
    (CP._replace(cq_flushed_phys_offset=5000), True, False, 9000, True, 1000),         # hole: from min
    (CP._replace(cq_flushed_phys_offset=500), True, True, 9000, True, 1000),           # clamped to min
    (CP._replace(cq_flushed_phys_offset=20000), True, True, 30000, True, 8000),        # clamped to max
])
def test_redispatch_start(cp, valid, intact, index_end, index_on, want):
    assert recovery.redispatch_start(cp, valid, intact, index_end, index_on, 1000, 8000) == want


def test_recovery_after_files_were_cleaned_keeps_min_offsets(open_store, tmp_path):
    wl = Workload(seed=41)
    store = build(open_store, "none", wl, rounds=(10, 4))
    store.clean_expired(now_ms=10 ** 15, force=True)
    assert store.commitlog.min_offset() > 0
    mins = {q: store.min_offset(*q) for q in QUEUES}
    assert all(m > 0 for m in mins.values())
    crash = crash_copy(store, tmp_path / "crash")
    store.close()
    recs = parse_log(crash)
    k, cl_end = damage_torn_last(crash, recs, None)
    store = recover(open_store, crash)
    for q in QUEUES:
        assert store.min_offset(*q) == mins[q]
        survivors = [r.body for r in recs[:k] if wl.index_of(r.body)[:2] == q]
        got = read_queue(store, *q, start=mins[q])
        assert [m.body for m in got] == survivors
        assert [m.queue_offset for m in got] == list(range(mins[q], mins[q] + len(survivors)))
        assert store.get(*q, mins[q] - 1).status == GetStatus.OFFSET_TOO_SMALL
    assert store.commitlog.max_offset() == cl_end
