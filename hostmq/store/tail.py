"""The commitlog tail: records a consumer may read before the dispatcher has put them in a consume queue.

Delivery does not wait for the dispatcher (issue 16). The writer publishes a batch (``write_pos``)
and wakes the consumers of its queues at once (``records.queue_wake_word``); a consumer whose
position is at the end of its consume queue finds the newer records here: ``CommitlogTail`` scans the
commitlog from ``dispatched_pos`` up to what is stored (``BrokerState.stored_pos``) with the
dispatcher's own record-by-record scan (``dispatch.scan_records`` — the same checks, the same
consume-queue entry for each record: queue offset, position, size, tag code), and keeps the entries
per queue. ``TailedQueue`` then serves a queue as its consume queue followed by its tail entries, so
the read side (``reader.get_messages`` / ``get_batch``) reads and re-checks the records as it reads
any other.

The entries live in ``hostmq/store/_read.c`` ``TailQueues`` (C arrays per queue; ``PyTailQueues`` below
is their spec, used where the native read side is not built), and ``_read.tail_read`` runs the common
case of ``advance``, ``count_after`` and the read of a consumer's position in one call
(``StoreReader.read_tail``; docs/internals.md).

Nothing here writes. Entries below ``dispatched_pos`` are dropped as the dispatcher covers them (the
consume queue has them then); the tail is bounded (``max_bytes``): past that the consumer waits for
the dispatcher, as it did before. A queue's tail entries are used only when they continue its consume
queue exactly (queue offsets consecutive from the consume queue's end): anything else — a record the
scan stopped at, a consume queue seen at another moment — shows nothing until the next refresh.
"""
from __future__ import annotations

import operator
from collections import deque
from itertools import islice

import numpy as np

from .. import records as R
from ..records import CQ_ENTRY
from . import read_check
from .dispatch import SCHEDULE_TOPIC

SCHEDULE_B = SCHEDULE_TOPIC.encode()

TAIL_MAX_BYTES = 4 << 20        # commitlog bytes a consumer tails past dispatched_pos at most
SCAN_RECORDS = 4096             # records scanned per refresh at most


class PyTailQueues:
    """The tail's entries per queue: (topic, queue id) → a deque of (queue offset, phys, size, tag
    code), oldest first; a queue left with none is removed. The spec of ``hostmq/store/_read.c``
    ``TailQueues``, which holds the same entries in C arrays (tests/store/test_tail_native.py drives
    both with the same operations and compares them after each)."""

    __slots__ = ("_q",)

    def __init__(self) -> None:
        self._q: dict[tuple[str, int], deque] = {}

    def extend(self, rows) -> None:
        """Append ``(topic, queue_id, queue_offset, phys, size, tag)`` rows (``scan``'s)."""
        q = self._q
        for row in rows:
            if row.__class__ is not tuple or len(row) != 6 or row[0].__class__ is not str:
                raise TypeError("TailQueues.extend(): rows of (topic, queue_id, queue_offset, phys, size, tag) "
                                "expected")
            topic, qid, qoff, phys, size, tag = row[0], *map(_i64, row[1:])
            if not -(1 << 31) <= size < 1 << 31:
                raise OverflowError("TailQueues.extend(): a size past an i32")
            d = q.get((topic, qid))
            if d is None:
                d = q[(topic, qid)] = deque()
            d.append((qoff, phys, size, tag))

    def drop_below(self, phys: int) -> None:
        """Drop each queue's first entries whose record starts below ``phys`` (the dispatcher has them)."""
        for key in list(self._q):
            d = self._q[key]
            while d and d[0][1] < phys:
                d.popleft()
            if not d:
                del self._q[key]

    def clear(self) -> None:
        self._q.clear()

    def count_after(self, topic: str, queue_id: int, cq_max: int) -> int:
        """How many entries of the queue continue a consume queue that ends at ``cq_max``."""
        d = self._q.get((topic, queue_id))
        if not d or d[0][0] != cq_max:
            return 0
        n = len(d)
        return n if d[-1][0] == cq_max + n - 1 else _consecutive(d, cq_max)

    def rows(self, topic: str, queue_id: int, from_offset: int, count: int) -> bytes:
        """The CQ_ENTRY rows (big-endian bytes) of up to ``count`` entries from the one read as
        ``from_offset``; KeyError for a queue with none, ValueError for an offset before its first."""
        d = self._q[(topic, queue_id)]
        i = from_offset - d[0][0]
        if i < 0 or count < 0:
            raise ValueError("rows(): an offset before the queue's first tail entry, or a negative count")
        return np.array([(p, s, t) for _, p, s, t in islice(d, i, i + count)], dtype=CQ_ENTRY).tobytes()

    def entries(self, topic: str, queue_id: int) -> list[tuple[int, int, int, int]]:
        return list(self._q[(topic, queue_id)])

    def keys(self) -> list[tuple[str, int]]:
        return list(self._q)

    def __len__(self) -> int:
        return len(self._q)


def _i64(v) -> int:
    v = operator.index(v)
    if not -(1 << 63) <= v < 1 << 63:
        raise OverflowError("TailQueues: a value past an i64")
    return v


def new_queues():
    """The tail's per-queue entries: in C where the native read side is built, else the spec."""
    return read_check.NATIVE.TailQueues() if read_check.NATIVE is not None else PyTailQueues()


class CommitlogTail:
    """Consume-queue entries of the records in [``start``, ``cursor``) of a commitlog, per queue."""

    def __init__(self, commitlog, max_bytes: int = TAIL_MAX_BYTES) -> None:
        self.cl = commitlog
        self.max_bytes = max_bytes
        self.start = 0          # dispatched_pos the entries continue from
        self.cursor = 0         # scanned up to here (a record boundary)
        self.queues = new_queues()      # (topic, qid) → its entries (PyTailQueues / _read.TailQueues)
        self.capped = False     # the tail reached max_bytes: newer records wait for the dispatcher
        self.limit = 0          # how far the last advance was to scan (a record boundary or the stored end)
        self.stopped_at: tuple[int, str] | None = None      # a record the scan cannot read (the dispatcher reports it)

    def advance(self, dispatched: int, stored: int) -> None:
        """Drop what the dispatcher covered (below ``dispatched``), scan new records up to ``stored``."""
        if dispatched > self.start:
            self.start = dispatched
            if dispatched >= self.cursor:
                self.cursor = dispatched
                self.queues.clear()
            else:
                self.queues.drop_below(dispatched)
        if self.stopped_at is not None and self.stopped_at[0] < self.start:
            self.stopped_at = None      # the dispatcher got past it (a record cut by the bound stops a scan too)
        limit = self.limit = min(stored, self.start + self.max_bytes)
        self.capped = stored > limit
        if self.cursor >= limit:
            return
        cl = self.cl
        mfq = cl.mfq
        mf = mfq.last()
        if mf is None or not mf.file_from_offset <= self.cursor < limit <= mf.file_from_offset + mf.file_bytes:
            # not all in the newest file mapped (the common case): map new files, find the cursor's
            last = mf
            if last is None or limit > last.file_end_offset or self.cursor < mfq.min_offset():
                mfq.refresh()
            mf = mfq.find(self.cursor)
            if mf is None:
                return
        try:
            nxt = scan_into(cl, self.cursor, limit, SCAN_RECORDS, self.queues, mf)
        except BaseException:
            # part of a scan may be in the queues: start them over from what the dispatcher covered
            self.queues.clear()
            self.cursor = self.start
            raise
        self.stopped_at = cl.scan_error
        if nxt > self.cursor:
            self.cursor = nxt

    def caught_up(self) -> bool:
        """Every stored record has been scanned: the tail knows each queue's true end."""
        return not self.capped and self.stopped_at is None and self.cursor >= self.limit

    def scanning(self) -> bool:
        """Stored records are left that the next advance will scan (neither at the bound nor stopped)."""
        return not self.capped and self.stopped_at is None and self.cursor < self.limit

    def count_after(self, topic: str, queue_id: int, cq_max: int) -> int:
        """How many tail entries continue the queue whose consume queue ends at ``cq_max``."""
        return self.queues.count_after(topic, queue_id, cq_max)

    def entries(self, topic: str, queue_id: int, from_offset: int, count: int) -> np.ndarray:
        """Tail entries of a queue from ``from_offset`` (which the tail holds) as CQ_ENTRY rows."""
        return np.frombuffer(self.queues.rows(topic, queue_id, from_offset, count), dtype=CQ_ENTRY)

    def clear(self) -> None:
        self.queues.clear()
        self.start = self.cursor = self.limit = 0


def scan_into(cl, from_phys: int, limit: int, max_records: int, out, mf=None) -> int:
    """Consume-queue rows ``(topic, queue_id, queue_offset, phys, size, tag code)`` of the records from
    the boundary ``from_phys`` up to ``limit`` (at most ``max_records``; the schedule topic's left out)
    appended to ``out`` — a list, a ``PyTailQueues``, or a ``_read.TailQueues``, which ``tail_scan``
    fills directly — and the next offset; ``cl.scan_error`` says where a broken record stopped it. The
    spec is ``CommitLog.scan`` (``dispatch.scan_records``); ``hostmq/store/_read.c`` ``tail_scan``
    serves the records of the current file it decides alone and hands the rest to the spec. ``mf``:
    the mapped file holding ``from_phys``, when the caller has it."""
    if out.__class__ is PyTailQueues:
        rows: list[tuple] = []
        nxt = scan_into(cl, from_phys, limit, max_records, rows, mf)
        out.extend(rows)
        return nxt
    if read_check.NATIVE is None:
        mf = None
    elif mf is None:
        mf = cl.mfq.find(from_phys)
    if mf is not None:
        base = mf.file_from_offset
        end = min(mf.committed_pos, limit - base)
        rel, status, counted = read_check.NATIVE.tail_scan(mf.mm, from_phys - base, end, base, max_records,
                                                           R.MAX_TOPIC_CHARS, SCHEDULE_B, out)
        from_phys = base + rel
        max_records -= counted
        if not status and (max_records <= 0 or from_phys >= limit):
            cl.scan_error = None
            return from_phys
    reqs, nxt = cl.scan(from_phys, limit, max_records)
    out.extend([(r.topic, r.queue_id, r.queue_offset, r.phys_offset, r.size, r.tag_hash) for r in reqs
                if r.topic != SCHEDULE_TOPIC])      # its tag code is a due time only the broker computes
    return max(nxt, from_phys)


def scan(cl, from_phys: int, limit: int, max_records: int) -> tuple[list[tuple], int]:
    """``scan_into`` a new list: (the rows, the next offset)."""
    rows: list[tuple] = []
    return rows, scan_into(cl, from_phys, limit, max_records, rows)


def _consecutive(d: deque, first: int) -> int:
    n = 0
    for qoff, *_ in d:
        if qoff != first + n:
            break
        n += 1
    return n


class TailedQueue:
    """A consume queue (or None: none exists yet) followed by ``count`` tail entries — what
    ``reader.get_messages`` and ``get_batch`` read a queue through."""

    __slots__ = ("cq", "tail", "topic", "queue_id", "cq_max", "count")

    def __init__(self, cq, tail: CommitlogTail, topic: str, queue_id: int, cq_max: int, count: int) -> None:
        self.cq, self.tail, self.topic, self.queue_id = cq, tail, topic, queue_id
        self.cq_max, self.count = cq_max, count

    def min_offset(self) -> int:
        return self.cq.min_offset() if self.cq is not None else self.cq_max

    def max_offset(self) -> int:
        return self.cq_max + self.count

    def entries(self, queue_offset: int, max_count: int) -> np.ndarray:
        """Up to ``max_count`` entries from ``queue_offset``: within one consume-queue file, and the
        tail's after the queue's last one (as if the dispatcher had written them)."""
        if queue_offset < self.cq_max:
            ents = self.cq.entries(queue_offset, min(max_count, self.cq_max - queue_offset))
            end = queue_offset + len(ents)
            if end < self.cq_max or len(ents) >= max_count or not self.count:
                return ents
            more = self.tail.entries(self.topic, self.queue_id, end, min(max_count - len(ents), self.count))
            return np.concatenate([ents, more])
        n = min(max_count, self.cq_max + self.count - queue_offset)
        if n <= 0:
            return np.empty(0, dtype=CQ_ENTRY)
        return self.tail.entries(self.topic, self.queue_id, queue_offset, n)
