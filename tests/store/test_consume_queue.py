"""Consume queues: entries across files, gaps, idempotent re-dispatch, blanks before a late start,
recovery of the tail, dirty-entry truncation and min-offset correction (RocketMQ ConsumeQueueTest)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from hostmq.message import Message
from hostmq.records import CQ_ENTRY
from hostmq.store.consume_queue import BLANK_SIZE, ConsumeQueue
from hostmq.store.mapped_file import file_name
from hostmq.store.reader import GetStatus

from .conftest import body_for, commitlog_files, parse_log, read_queue

pytestmark = pytest.mark.timeout(120)

PER_FILE = 8
ENTRY = CQ_ENTRY.itemsize


def cq_dir(root, topic="T", qid=0):
    return os.path.join(str(root), "consumequeue", topic, str(qid))


def arrays(phys: list[int], sizes: list[int] | None = None, tags: list[int] | None = None):
    n = len(phys)
    return (np.array(phys, np.int64), np.array(sizes or [100] * n, np.int64),
            np.array(tags or list(range(n)), np.int64))


def new_cq(root) -> ConsumeQueue:
    return ConsumeQueue(str(root), "T", 0, PER_FILE)


def reopen(cq: ConsumeQueue, root) -> tuple[ConsumeQueue, bool]:
    cq.close()
    again = new_cq(root)
    again.load()
    return again, again.recover()


def phys_of(i: int) -> int:
    return 1000 + 150 * i          # the commitlog offset the test gives entry i


def test_entries_across_files(tmp_path):
    cq = new_cq(tmp_path)
    n = 3 * PER_FILE + 5
    assert cq.put_many(0, *arrays([phys_of(i) for i in range(n)], [100 + i for i in range(n)],
                                  [-i for i in range(n)]))
    assert (cq.min_offset(), cq.max_offset()) == (0, n)
    assert sorted(os.listdir(cq_dir(tmp_path))) == [file_name(k * PER_FILE * ENTRY) for k in range(4)]
    for i in range(n):
        assert cq.entry(i) == (phys_of(i), 100 + i, -i)
    assert cq.entry(n) is None and cq.entry(-1) is None
    assert cq.last_entry() == (phys_of(n - 1), 100 + n - 1, -(n - 1))
    # entries() stays inside one file.
    got = cq.entries(PER_FILE - 2, 100)
    assert got["phys_offset"].tolist() == [phys_of(PER_FILE - 2), phys_of(PER_FILE - 1)]
    got = cq.entries(3 * PER_FILE, 100)
    assert got["phys_offset"].tolist() == [phys_of(i) for i in range(3 * PER_FILE, n)]
    assert len(cq.entries(n, 10)) == 0
    cq.close()


def test_single_puts_and_a_gap_is_refused(tmp_path):
    cq = new_cq(tmp_path)
    for i in range(5):
        assert cq.put(i, phys_of(i), 100, 7)
    assert not cq.put(6, phys_of(6), 100, 7)        # offset 5 missing
    assert cq.max_offset() == 5 and cq.entry(5) is None
    assert cq.put(5, phys_of(5), 100, 7) and cq.max_offset() == 6
    cq.close()


def test_re_putting_identical_entries_is_a_no_op(tmp_path):
    cq = new_cq(tmp_path)
    n = 2 * PER_FILE + 3
    assert cq.put_many(0, *arrays([phys_of(i) for i in range(n)]))
    assert cq.put_many(4, *arrays([phys_of(i) for i in range(4, 12)]))
    assert cq.max_offset() == n
    assert [cq.entry(i)[0] for i in range(n)] == [phys_of(i) for i in range(n)]
    # Overlapping the end: the known part is kept, the rest appended.
    assert cq.put_many(n - 2, *arrays([phys_of(i) for i in range(n - 2, n + 4)]))
    assert cq.max_offset() == n + 4
    assert [cq.entry(i)[0] for i in range(n + 4)] == [phys_of(i) for i in range(n + 4)]
    cq.close()


def test_a_disagreeing_entry_replaces_the_stale_tail(tmp_path):
    cq = new_cq(tmp_path)
    n = 2 * PER_FILE + 3
    cq.put_many(0, *arrays([phys_of(i) for i in range(n)]))
    # The commitlog now says offsets 10, 11 are elsewhere and there is nothing after them.
    assert cq.put_many(9, *arrays([phys_of(9), 77_000, 78_000]))
    assert cq.max_offset() == 12
    assert [cq.entry(i)[0] for i in range(12)] == [phys_of(i) for i in range(10)] + [77_000, 78_000]
    assert cq.entry(12) is None
    cq, intact = reopen(cq, tmp_path)
    assert intact and cq.max_offset() == 12 and cq.entry(11)[0] == 78_000
    cq.close()


def test_a_queue_that_starts_late_is_padded_with_blanks(tmp_path):
    cq = new_cq(tmp_path)
    start = 3 * PER_FILE + 3
    assert cq.put_many(start, *arrays([phys_of(i) for i in range(start, start + 4)]))
    assert (cq.min_offset(), cq.max_offset()) == (start, start + 4)
    assert cq.entry(start - 1) is None and cq.entry(start)[0] == phys_of(start)
    # Only the file holding the first entry exists; its first entries are RocketMQ blanks.
    assert os.listdir(cq_dir(tmp_path)) == [file_name(3 * PER_FILE * ENTRY)]
    with open(os.path.join(cq_dir(tmp_path), file_name(3 * PER_FILE * ENTRY)), "rb") as f:
        raw = np.frombuffer(f.read(), CQ_ENTRY)
    assert raw["size"][:3].tolist() == [BLANK_SIZE] * 3
    assert raw["size"][3:7].tolist() == [100] * 4
    cq, intact = reopen(cq, tmp_path)
    assert intact and (cq.min_offset(), cq.max_offset()) == (start, start + 4)
    assert cq.entry(start)[0] == phys_of(start)
    cq.close()


def test_recover_finds_the_last_valid_entry(tmp_path):
    cq = new_cq(tmp_path)
    n = 2 * PER_FILE + 5
    cq.put_many(0, *arrays([phys_of(i) for i in range(n)]))
    cq.flush()
    cq, intact = reopen(cq, tmp_path)
    assert intact and cq.max_offset() == n
    assert [cq.entry(i)[0] for i in range(n)] == [phys_of(i) for i in range(n)]
    # Zero the last 3 entries in the file (lost pages): recovery ends before them.
    cq.close()
    last = os.path.join(cq_dir(tmp_path), file_name(2 * PER_FILE * ENTRY))
    with open(last, "r+b") as f:
        f.seek(2 * ENTRY)
        f.write(b"\0" * 3 * ENTRY)
    cq = new_cq(tmp_path)
    cq.load()
    assert cq.recover() and cq.max_offset() == 2 * PER_FILE + 2
    assert cq.put(2 * PER_FILE + 2, phys_of(99), 100, 0)    # appends continue there
    assert cq.entry(2 * PER_FILE + 2)[0] == phys_of(99)
    cq.close()


def test_recover_reports_a_hole_and_drops_the_files_after_it(tmp_path):
    cq = new_cq(tmp_path)
    n = 4 * PER_FILE + 2
    cq.put_many(0, *arrays([phys_of(i) for i in range(n)]))
    cq.close()
    os.unlink(os.path.join(cq_dir(tmp_path), file_name(2 * PER_FILE * ENTRY)))
    cq = new_cq(tmp_path)
    cq.load()
    assert cq.recover() is False
    assert cq.max_offset() == 2 * PER_FILE
    assert sorted(os.listdir(cq_dir(tmp_path))) == [file_name(0), file_name(PER_FILE * ENTRY)]
    cq.close()


def test_truncate_dirty_drops_entries_past_the_commitlog_end(tmp_path):
    cq = new_cq(tmp_path)
    n = 3 * PER_FILE
    cq.put_many(0, *arrays([phys_of(i) for i in range(n)], [100] * n))
    # Entry i covers [phys_of(i), phys_of(i) + 100).
    for end, keep in [(phys_of(n - 1) + 100, n), (phys_of(n - 1) + 99, n - 1), (phys_of(20) + 100, 21),
                      (phys_of(5), 5), (0, 0)]:
        assert cq.truncate_dirty(end) == keep, end
        assert cq.max_offset() == keep
        if keep:
            assert cq.entry(keep - 1)[0] == phys_of(keep - 1)
    cq.close()


def test_correct_min_offset_and_delete_expired(tmp_path):
    cq = new_cq(tmp_path)
    n = 4 * PER_FILE + 3
    cq.put_many(0, *arrays([phys_of(i) for i in range(n)], [100] * n))
    cq.correct_min_offset(phys_of(5))
    assert cq.min_offset() == 5 and cq.entry(4) is None and cq.entry(5)[0] == phys_of(5)
    cq.correct_min_offset(phys_of(5) + 1)
    assert cq.min_offset() == 6
    # Files whose every entry ends at or before the commitlog min go; the rest stay.
    gone = cq.delete_expired(phys_of(2 * PER_FILE + 1))
    assert gone == 2
    assert sorted(os.listdir(cq_dir(tmp_path))) == [file_name(k * PER_FILE * ENTRY) for k in (2, 3, 4)]
    assert cq.min_offset() == 2 * PER_FILE + 1 and cq.max_offset() == n
    # Everything deleted from the commitlog: the last file stays, the queue is empty but keeps max.
    cq.delete_expired(phys_of(n + 10))
    assert os.listdir(cq_dir(tmp_path)) == [file_name(4 * PER_FILE * ENTRY)]
    assert cq.min_offset() == cq.max_offset() == n
    cq.close()


def _fill_for_cleanup(store):
    """Queue ("A", 0) gets messages all along, ("B", 0) only at the start. Returns sent bodies."""
    sent = {"A": [], "B": []}
    for i in range(150):
        m = Message("B", body_for("B", 0, i, 1500))
        store.put(m)
        sent["B"].append(m.body)
    for chunk in range(12):
        msgs = [Message("A", body_for("A", 0, len(sent["A"]) + j, 700)) for j in range(100)]
        store.put_batch(msgs)
        sent["A"] += [m.body for m in msgs]
    store.dispatch()
    return sent


def test_min_offset_moves_when_commitlog_files_are_deleted(open_store):
    store = open_store()
    sent = _fill_for_cleanup(store)
    files_before = commitlog_files(store.path)
    assert len(files_before) > 12
    assert store.min_offset("A", 0) == 0 and store.min_offset("B", 0) == 0

    gone = store.clean_expired(now_ms=10 ** 15, force=True)
    assert len(gone) == store.config.delete_files_batch_max
    files_after = commitlog_files(store.path)
    assert files_after == files_before[len(gone):]

    # The survivors, found by parsing what is left of the commitlog.
    bodies = {r.body for r in parse_log(store.path)}
    first_a = next(i for i, b in enumerate(sent["A"]) if b in bodies)
    assert first_a > 0 and all(b in bodies for b in sent["A"][first_a:])
    assert not any(b in bodies for b in sent["B"])

    assert store.min_offset("A", 0) == first_a
    assert store.max_offset("A", 0) == len(sent["A"])
    for old in (0, first_a // 2, first_a - 1):
        g = store.get("A", 0, old)
        assert g.status == GetStatus.OFFSET_TOO_SMALL, old
        assert g.next_offset == first_a and not g.messages
    g = store.get("A", 0, first_a, max_count=3)
    assert g.status == GetStatus.FOUND
    assert [m.body for m in g.messages] == sent["A"][first_a:first_a + 3]
    assert [m.queue_offset for m in g.messages] == [first_a, first_a + 1, first_a + 2]

    # B's data is all gone: its range is empty but its max offset stays.
    assert store.min_offset("B", 0) == store.max_offset("B", 0) == len(sent["B"])
    assert store.get("B", 0, 0).status == GetStatus.OFFSET_TOO_SMALL
    assert store.get("B", 0, len(sent["B"])).status == GetStatus.OFFSET_OVERFLOW_ONE
    r = store.put(Message("B", b"B-new"))
    assert r.queue_offset == len(sent["B"])
    store.dispatch()
    assert [m.body for m in read_queue(store, "B", 0, len(sent["B"]))] == [b"B-new"]

    # The consume-queue files that only pointed at deleted data are gone too.
    a_files = sorted(os.listdir(cq_dir(store.path, "A")))
    first_file_offset = int(a_files[0]) // ENTRY
    assert first_file_offset <= first_a < first_file_offset + store.config.consume_queue_file_entries

    # A restart keeps the corrected min offsets.
    path = store.path
    store.close()
    store = open_store(path)
    assert store.min_offset("A", 0) == first_a
    assert store.get("A", 0, first_a - 1).status == GetStatus.OFFSET_TOO_SMALL
    assert [m.body for m in read_queue(store, "A", 0, first_a)] == sent["A"][first_a:]
    assert store.min_offset("B", 0) == len(sent["B"])
