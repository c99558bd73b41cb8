"""A read-only view of a store directory, safe to use while another process writes it.

Consumers, admin tools and the Spark data source read consume queues and message bytes straight from
the files through read-only maps — no message bytes over a socket. ``StoreReader`` never writes,
never takes the store's ``lock`` and never truncates anything.

What it may read (never more than crash recovery would keep):
  * a live broker publishes how far is safe (its dispatched offset under ASYNC_FLUSH, its flushed
    offset under SYNC_FLUSH): pass that as ``limit_phys`` (a number or a callable), and consume-queue
    entries whose record ends past it are invisible;
  * with no broker: a cleanly closed store (no ``abort``) is readable up to the checkpoint's
    confirmed end; a store whose writer died (``abort`` present) is scanned read-only from the
    checkpoint's durable point, checking every record as abnormal recovery would, and the first
    torn or garbage record ends what is visible.

``refresh()`` picks up files and entries written since; it is cheap (a directory listing and a
look at the last entries of each queue).
"""
from __future__ import annotations

import logging
import os
import struct
from typing import Callable

import numpy as np

from .. import records as R
from ..config import Config, StoreConfig, store_config
from ..errors import CorruptRecordError, MessageNotFoundError
from ..message import MessageExt, MessageQueue
from .checkpoint import StoreCheckpoint
from .commitlog import CommitLog
from ..records import CQ_ENTRY
from .meta import infer_sizes, read_sizes
from .consume_queue import ENTRY_BYTES, ConsumeQueue
from . import read_check
from .reader import GetResult, GetStatus, MessageBatch, _status, get_batch, get_messages
from .recovery import commitlog_scan_start
from .message_store import _check_read, _tag_filter
from .tail import SCHEDULE_B, SCAN_RECORDS, CommitlogTail, TailedQueue

log = logging.getLogger(__name__)

_TAKE_DONE, _TAKE_FULL = (0, 1) if read_check.NATIVE is None else (read_check.NATIVE.TAKE_DONE,
                                                                   read_check.NATIVE.TAKE_FULL)

SCALAR_ENTRIES = 16             # refresh_queue checks this many new entries one by one before numpy
MAX_WARNED = 1024               # positions a view remembers having warned about (then it forgets them all)
MAX_REFRESHED = 4096            # queues whose last consume-queue refresh a view remembers (then it forgets them all)
_CQ_PHYS, _CQ_SIZE = struct.Struct(">q"), struct.Struct(">i")      # CQ_ENTRY's first two fields
_CQ_SIZE_AT = CQ_ENTRY.fields["size"][1]
R.layout_check(CQ_ENTRY.fields["phys_offset"][1] == 0 and _CQ_SIZE.size == CQ_ENTRY["size"].itemsize,
               "CQ_ENTRY starts with PHYSICALOFFSET and its SIZE is an i32")


def readable_entries(mm, pos: int, end: int, limit: int) -> int:
    """The boundary after the readable new entries of a consume-queue file a live dispatcher appends
    to: from ``pos`` (an entry boundary) up to ``end``, each entry whose size is > 0 and whose record
    ends by ``limit``. The spec of ``hostmq/store/_read.c`` ``cq_readable``."""
    size_at, phys_at = _CQ_SIZE.unpack_from, _CQ_PHYS.unpack_from
    while pos + ENTRY_BYTES <= end:
        # The size first: the entry at ``pos`` may be the one the dispatcher is storing now (past
        # dispatched_pos; ``pack_into`` zeroes it, then stores phys, size, tag). Its size seen stored
        # means its phys is too; loaded the other way round an entry can read as (phys 0, its size),
        # "ending" far below the bound, and be counted before its record is readable — the view's
        # max then no longer meets the tail's entries and falls below positions read from them
        # (fault run fce7182, trial 456). And the size once more after the phys offset: a dispatcher
        # that drops entries at its start (``ConsumeQueue.truncate_offset``) zeroes their sizes
        # before the rest, so an entry whose size still holds after its phys was loaded was whole.
        size = size_at(mm, pos + _CQ_SIZE_AT)[0]
        if size <= 0 or phys_at(mm, pos)[0] + size > limit or size_at(mm, pos + _CQ_SIZE_AT)[0] != size:
            break
        pos += ENTRY_BYTES
    return pos


_readable_entries = read_check.NATIVE.cq_readable if read_check.NATIVE is not None else readable_entries


def infer_store_config(path: str, base: StoreConfig | None = None) -> StoreConfig:
    """``base`` with the file sizes the store at ``path`` was written with (its commitlog and
    consume-queue files are all of one size), for reading a store whose broker is not running."""
    cfg = base or StoreConfig()
    over = read_sizes(path) or infer_sizes(path)
    return StoreConfig(**{**cfg.__dict__, **over}) if over else cfg


class StoreReader:
    def __init__(self, path: str, config: StoreConfig | Config | dict | None = None, *,
                 broker: str = "", limit_phys: int | Callable[[], int] | None = None,
                 scan_queues: bool = True, consumed_below: Callable[[], int] | None = None,
                 tail_limit: Callable[[], int] | None = None, alive: Callable[[], bool] | None = None,
                 corrects: bool = True) -> None:
        """``tail_limit``: a live broker's stored position; records between ``limit_phys`` (dispatched)
        and it are read from the commitlog itself (``tail.CommitlogTail``) — a consumer's view.
        ``corrects=False``: a store that may hold less than its reader has read elsewhere (a slave
        read while its master is down) never moves a position past a queue's end."""
        self.path = os.path.abspath(path)
        if not os.path.isdir(os.path.join(self.path, "commitlog")):
            raise MessageNotFoundError(f"{self.path} is not a hostmq store (no commitlog directory)")
        self.config = store_config(config)
        self.broker = broker
        self._limit = limit_phys
        self._consumed_below = consumed_below      # the broker's consumed_below_pos (madvise_dontneed_consumed)
        self._dropped_below = 0
        self.commitlog = CommitLog(self.path, self.config.commitlog_file_bytes, writable=False,
                                   advice=self.config.commitlog_advice)
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._max: dict[tuple[str, int], int] = {}
        self.readable_end = 0
        self._static_clean = False      # a store with no live writer was shut down cleanly (no ``abort``)
        self._tail_limit = tail_limit
        self._alive = alive                 # whether the live broker behind ``limit_phys`` still runs
        self._corrects = corrects
        self.tail = CommitlogTail(self.commitlog) if tail_limit is not None else None
        self._shown: dict[tuple[str, int], int] = {}    # per queue, the highest max offset shown (see _uncorrected)
        # per queue, (readable_end, max offset) of its last consume-queue refresh: with the same bound
        # the same entries are readable (the dispatcher stores entries before it publishes), so a
        # refresh while the dispatcher has not moved is one dict lookup (the tail serves the news)
        self._cq_refreshed: dict[tuple[str, int], tuple[int, int]] = {}
        self._earlier: dict[tuple[str, int], int] = {}  # the same, shown by views this one replaced (carry_shown)
        self._warned: set[tuple[str, str, int, int]] = set()
        if scan_queues:
            self.refresh()
        else:       # queues are opened one by one with refresh_queue (a consumer's few queues)
            cl_mfq = self.commitlog.mfq
            cl_mfq.refresh()
            self.readable_end = self._static_end() if limit_phys is None else \
                int(limit_phys() if callable(limit_phys) else limit_phys)

    # -- what is visible --------------------------------------------------------------------------
    def _static_end(self) -> int:
        """How far a store with no live writer is valid (what recovery would keep)."""
        cl = self.commitlog
        cp_file = StoreCheckpoint(os.path.join(self.path, "checkpoint"))
        cp = cp_file.load()
        abnormal = os.path.exists(os.path.join(self.path, "abort"))
        self._static_clean = not abnormal
        starts = [mf.file_from_offset for mf in cl.mfq.files]
        start = commitlog_scan_start(abnormal, cp, cp_file.valid, starts, cl.file_bytes)
        end, _ = cl.valid_end(start, check_crc=abnormal)
        return end

    def refresh(self) -> None:
        """Map new files, find each queue's readable max offset."""
        cl = self.commitlog
        cl.mfq.refresh()
        self.drop_consumed()
        if self._limit is None:
            self.readable_end = self._static_end()
        else:
            self.readable_end = int(self._limit() if callable(self._limit) else self._limit)
        root = os.path.join(self.path, "consumequeue")
        for topic in sorted(os.listdir(root)) if os.path.isdir(root) else ():
            tdir = os.path.join(root, topic)
            for qid in sorted(os.listdir(tdir)) if os.path.isdir(tdir) else ():
                if not qid.isdigit():
                    continue
                key = (topic, int(qid))
                cq = self.queues.get(key)
                if cq is None:
                    cq = self.queues[key] = ConsumeQueue(self.path, topic, int(qid),
                                                         self.config.consume_queue_file_entries,
                                                         writable=False, advice=self.config.consume_queue_advice)
                cq.mfq.refresh()
                self._set_readable_max(cq)

    def _set_readable_max(self, cq: ConsumeQueue) -> None:
        """Readable entries: valid (size > 0) and pointing at records that end within the limit."""
        files = cq.mfq.files
        if not files:
            return
        first = files[0]
        sizes0 = cq._entries(first)["size"]
        lead = np.flatnonzero(sizes0 != 0x7FFFFFFF)    # blank padding of a queue that starts late
        cq.min_logic_offset = first.file_from_offset + (int(lead[0]) if len(lead) else 0) * ENTRY_BYTES
        for mf in reversed(files):                     # only the newest files can be partly written
            ents = cq._entries(mf)
            ok = (ents["size"] > 0) & (ents["phys_offset"] + ents["size"] <= self.readable_end)   # sizes first
            bad = np.flatnonzero(~ok)
            n = int(bad[0]) if len(bad) else len(ents)
            mf.wrote_pos = mf.committed_pos = n * ENTRY_BYTES
            if n or mf is files[0]:
                break
        # Unmap the files after it: max_offset() is the last file's end of entries, so a newer file
        # left mapped with none readable made the max its start — past the bound when the readable
        # entries end inside an earlier file (the dispatcher ahead of the flushed position).
        while files[-1] is not mf:
            files.pop().close()

    def drop_consumed(self) -> None:
        """Let go of commitlog files every consumer group has read (``broker.consumed``)."""
        below = self._consumed_below() if self._consumed_below is not None else 0
        if below > self._dropped_below:
            self._dropped_below = below
            self.commitlog.mfq.drop_below(below)

    # -- one queue, incrementally (the consumer's hot path) -------------------------------------------
    def refresh_queue(self, topic: str, queue_id: int, stored: int | None = None, readable: int | None = None) -> int:
        """Bring one queue up to date with the limit, looking only at entries not seen before; its
        readable max offset (with the tail's entries that continue it, for a tailing reader). Cheap
        enough to call before every read of a live broker's queue. ``stored`` and ``readable``: the
        tail limit and the limit, when the caller has just read them (in that order)."""
        m = self._refresh_cq(topic, queue_id, readable)
        tail = self.tail
        if tail is not None:
            # The tail continues from the same readable_end the consume queue was bounded by: every
            # record below it is in a consume queue, every record from it on is scanned.
            tail.advance(self.readable_end, int(self._tail_limit() if stored is None else stored))
            m += tail.queues.count_after(topic, queue_id, m)
        return self._show(topic, queue_id, m)

    def _refresh_cq(self, topic: str, queue_id: int, readable: int | None) -> int:
        """``refresh_queue``'s consume-queue part: the queue's readable max offset in its consume queue."""
        if readable is not None:
            self.readable_end = readable
        elif self._limit is not None:
            self.readable_end = int(self._limit() if callable(self._limit) else self._limit)
        key = (topic, queue_id)
        seen = self._cq_refreshed.get(key)
        # Also a queue with no consume queue yet (a retry topic nothing failed into): its directory
        # appears with its first entries, which become readable only when readable_end moves — so
        # no directory look per round while it does not.
        if seen is not None and seen[0] == self.readable_end and (key in self.queues or not seen[1]):
            m = seen[1]
        else:
            m = self._refresh_consume_queue(topic, queue_id)
            if len(self._cq_refreshed) >= MAX_REFRESHED:
                self._cq_refreshed.clear()
            self._cq_refreshed[key] = (self.readable_end, m)
        return m

    def knows_end(self) -> bool:
        """Whether a queue's max offset here is the store's: a live broker's view whose tail (when it
        tails) has scanned every stored record, or a cleanly stopped store (its consume queues hold
        every record). Otherwise a position past a queue's end may only be ahead of this view — a
        tailing consumer's position is past the dispatcher's; a killed broker's consume queues lag
        its commitlog; a new tail is still scanning — and reads do not move it (RocketMQ's
        ``nextOffsetCorrection``: a lagging slave does not correct offsets either)."""
        if not self._corrects:
            return False
        if self._limit is None:
            return self._static_clean
        if self._alive is not None and not self._alive():
            return False                    # killed: what it published is frozen while recovery runs
        return self.tail_caught_up()

    def tail_caught_up(self) -> bool:
        """No stored record is left unscanned by the tail (True for a reader that does not tail).
        Cheap: a consumer asks after every refresh (``knows_end`` also asks the OS about the broker)."""
        return self.tail is None or self.tail.caught_up()

    def _show(self, topic: str, queue_id: int, max_offset: int) -> int:
        """Remember the highest max offset this view showed for a queue: positions up to it were reachable."""
        if max_offset > self._shown.get((topic, queue_id), 0):
            self._shown[(topic, queue_id)] = max_offset
        return max_offset

    def carry_shown(self, earlier: "StoreReader") -> None:
        """This view replaces ``earlier``, a view of the same broker name whose run ended (a restart,
        or a failover to a slave): positions it showed readable were reached by reading, so one past
        this store's end is not a stale or foreign position but records the new run does not hold
        (see ``_uncorrected``)."""
        for src in (earlier._earlier, earlier._shown):
            for key, off in src.items():
                if off > self._earlier.get(key, 0):
                    self._earlier[key] = off

    def _first_warning(self, what: str, topic: str, queue_id: int, queue_offset: int) -> bool:
        """Whether this is the first warning of kind ``what`` for this queue position (once per position,
        not per poll; the set is bounded, as a long-lived view may meet many)."""
        key = (what, topic, queue_id, queue_offset)
        if key in self._warned:
            return False
        if len(self._warned) >= MAX_WARNED:
            self._warned.clear()
        self._warned.add(key)
        return True

    def _uncorrected(self, result, queue, topic: str, queue_id: int, queue_offset: int):
        """OFFSET_OVERFLOW_BADLY moves the position (RocketMQ's correction) only when this view knows
        the queue's end and never showed the queue reaching ``queue_offset``. A live store's consume
        queue never shrinks: an end below one this view showed is the view's own mistake (a race of
        its reads with the broker's writes), and a position reached through it is kept — no message
        yet — rather than sent back to the queue's start. The broker's own answer is unchanged."""
        if result.status is not GetStatus.OFFSET_OVERFLOW_BADLY:
            return result
        shown = self._shown.get((topic, queue_id), 0)
        if queue_offset <= shown:
            if self.knows_end() and self._first_warning("shown", topic, queue_id, queue_offset):
                log.warning("store view of %s: queue %s/%d ends before offset %d, which it showed readable "
                            "(up to %d); the position stays", self.broker or self.path, topic, queue_id,
                            queue_offset, shown)
            result.next_offset = queue_offset
        elif queue_offset <= self._earlier.get((topic, queue_id), 0):
            # Read through an earlier run of this broker name: the records from this store's end up to
            # the position were cut (an ASYNC_MASTER's unreplicated tail a failover gave up, or a slave
            # that lagged). Continue from the end, where the new run writes new messages — not from
            # the queue's first offset, which would deliver the whole queue again.
            if self.knows_end():
                end = queue.max_offset() if queue is not None else 0
                if self._first_warning("earlier", topic, queue_id, queue_offset):
                    log.warning("store view of %s: queue %s/%d ends at %d, before offset %d an earlier run of "
                                "it showed readable; continuing from its end", self.broker or self.path, topic,
                                queue_id, end, queue_offset)
                result.next_offset = end
            else:
                result.next_offset = queue_offset
        elif not self.knows_end():
            result.next_offset = queue_offset
        return result

    def _tailed(self, topic: str, queue_id: int):
        """The queue to read: its consume queue, followed by its tail entries when there are some."""
        cq = self.queues.get((topic, queue_id))
        m = cq.max_offset() if cq is not None else 0
        n = self.tail.count_after(topic, queue_id, m) if self.tail is not None else 0
        self._show(topic, queue_id, m + n)
        return TailedQueue(cq, self.tail, topic, queue_id, m, n) if n else cq

    def _refresh_consume_queue(self, topic: str, queue_id: int) -> int:
        key = (topic, queue_id)
        cq = self.queues.get(key)
        if cq is None:
            cq = self._open_queue(topic, queue_id)
            if cq is None:
                return 0
        if self._consumed_below is not None:
            self.drop_consumed()
        cl_last = self.commitlog.mfq.last()
        if cl_last is None or self.readable_end > cl_last.file_end_offset:
            self.commitlog.mfq.refresh()
        files = cq.mfq.files
        if not files:
            cq.mfq.refresh()
            files = cq.mfq.files
            if not files:
                return 0
            self._set_readable_max(cq)
            self._trim_files(cq)
        limit = self.readable_end
        mf = files[-1]
        pos = mf.wrote_pos
        if pos < mf.file_bytes:
            # The common case: the next entry lies in the newest file mapped (no file to trim after it).
            end = min(mf.file_bytes, pos + SCALAR_ENTRIES * ENTRY_BYTES)
            new = _readable_entries(mf.mm, pos, end, limit)
            if new > pos:
                mf.wrote_pos = mf.committed_pos = new
            if new < end or new == pos:
                return (mf.file_from_offset + new) // ENTRY_BYTES
        m = cq.max_offset()
        per_file = self.config.consume_queue_file_entries
        # Scalar look at the next few entries first: a live consumer usually finds none or a handful
        # new, and numpy's per-call cost would dominate (a poll refreshes every assigned queue).
        mf = cq.mfq.find(m * ENTRY_BYTES)
        if mf is not None:
            pos = m * ENTRY_BYTES - mf.file_from_offset
            end = min(mf.file_bytes, pos + SCALAR_ENTRIES * ENTRY_BYTES)
            start = pos
            pos = _readable_entries(mf.mm, pos, end, limit)
            if pos > start:
                mf.wrote_pos = mf.committed_pos = pos
                m += (pos - start) // ENTRY_BYTES
            if pos < end or pos == start:
                self._trim_files(cq, m)
                return cq.max_offset()
        while True:
            mf = cq.mfq.find(m * ENTRY_BYTES)
            if mf is None:
                cq.mfq.refresh()
                mf = cq.mfq.find(m * ENTRY_BYTES)
                if mf is None:
                    break
            first = mf.file_from_offset // ENTRY_BYTES
            i = m - first
            ents = cq._entries(mf)[i:min(per_file, i + 4096)]
            # every size loaded before any phys offset, and again after it, as in the scalar loop above
            sizes = ents["size"].copy()
            phys = ents["phys_offset"].copy()
            ok = (sizes > 0) & (phys + sizes <= self.readable_end) & (ents["size"] == sizes)
            bad = np.flatnonzero(~ok)
            k = int(bad[0]) if len(bad) else len(ents)
            m += k
            mf.wrote_pos = mf.committed_pos = (i + k) * ENTRY_BYTES
            if k < len(ents) or k == 0:
                break
        self._trim_files(cq, m)
        return cq.max_offset()

    def _open_queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        if not os.path.isdir(os.path.join(self.path, "consumequeue", topic, str(queue_id))):
            return None
        cq = self.queues[(topic, queue_id)] = ConsumeQueue(self.path, topic, queue_id,
                                                           self.config.consume_queue_file_entries,
                                                           writable=False, advice=self.config.consume_queue_advice)
        return cq

    @staticmethod
    def _trim_files(cq: ConsumeQueue, max_offset: int | None = None) -> None:
        """Unmap files after the one holding ``max_offset`` (mapped early, they would make
        ``max_offset()`` count entries that are not readable yet)."""
        files = cq.mfq.files
        if max_offset is None:
            max_offset = cq.max_offset()
        keep = cq.mfq.find(max_offset * ENTRY_BYTES) if max_offset * ENTRY_BYTES < files[-1].file_end_offset \
            else files[-1]
        while files and keep is not None and files[-1] is not keep:
            files.pop().close()

    # -- the MessageStore read API ------------------------------------------------------------------
    def topics(self) -> list[str]:
        return sorted({t for t, _ in self.queues})

    def queue_ids(self, topic: str) -> list[int]:
        return sorted(q for t, q in self.queues if t == topic)

    def min_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get((topic, queue_id))
        return cq.min_offset() if cq else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get((topic, queue_id))
        return cq.max_offset() if cq else 0

    def phys_at(self, topic: str, queue_id: int, queue_offset: int) -> int | None:
        """The commitlog offset of the message at ``queue_offset`` as the last refresh of the queue
        found it in its consume queue (None: not there — not dispatched or not readable yet)."""
        cq = self.queues.get((topic, queue_id))
        e = cq.entry(queue_offset) if cq is not None else None
        return e[0] if e is not None else None

    def get(self, topic: str, queue_id: int, queue_offset: int, max_count: int = 32,
            expression: str | None = "*") -> GetResult:
        _check_read(queue_offset, max_count)
        q = self._tailed(topic, queue_id)
        return self._uncorrected(get_messages(q, self.commitlog, queue_offset, max_count, _tag_filter(expression),
                                              self.config.max_transfer_bytes, self.broker),
                                 q, topic, queue_id, queue_offset)

    def read_tail(self, topic: str, queue_id: int, queue_offset: int, max_count: int,
                  stored: int | None = None, readable: int | None = None) -> tuple[int, GetResult | None]:
        """``refresh_queue`` and then, for a position past the consume queue that the tail holds,
        ``get`` with no filter — a tailing consumer's round: (the queue's readable max offset, the
        result, or None where ``get`` reads it). The tail's part in one native call where it can
        (``_read.tail_read``: the tail's advance, its count and the read, the spec's answer), else
        the spec's steps (``CommitlogTail.advance``, ``count_after``, ``_take_tail``)."""
        tail = self.tail
        if tail is None or read_check.NATIVE is None:
            return self.refresh_queue(topic, queue_id, stored, readable), None
        m = self._refresh_cq(topic, queue_id, readable)
        if stored is None:
            stored = int(self._tail_limit())
        mf = self.commitlog.mfq.last()
        r = None
        msgs: list[MessageExt] = []
        if mf is not None:
            try:
                r = read_check.NATIVE.tail_read(
                    tail, self.readable_end, stored, mf.mm, mf.file_from_offset, mf.file_bytes, mf.committed_pos,
                    topic, queue_id, m, queue_offset, max_count, self.commitlog.mfq.min_offset(), topic.encode(),
                    self.config.max_transfer_bytes, self.broker, msgs, SCHEDULE_B, R.MAX_TOPIC_CHARS, SCAN_RECORDS)
            except BaseException:
                tail.clear()            # whatever it had applied: the tail starts over from the dispatcher
                raise
        if r is None:
            tail.advance(self.readable_end, stored)
            hi = self._show(topic, queue_id, m + tail.queues.count_after(topic, queue_id, m))
            if not m <= queue_offset < hi or max_count < 1:
                return hi, None
            return hi, self._take_tail(topic, queue_id, queue_offset, max_count, m, hi)
        hi, i, why, removed = r
        self._show(topic, queue_id, hi)
        return hi, self._tail_result(topic, queue_id, queue_offset, msgs, i, why, removed, m, hi)

    def poll_context(self) -> tuple | None:
        """What ``_read.tail_poll`` (a tailing consumer's round for one queue in one native call,
        ``PullConsumer._fetch``) reads of this reader besides the queue: None where this reader does
        not tail or the native read side is off (the consumer then runs ``read_tail``, its spec)."""
        native = read_check.NATIVE
        if self.tail is None or native is None or not hasattr(native, "tail_poll"):
            return None
        return (self, self.tail, self.broker, self.config.max_transfer_bytes, SCHEDULE_B, R.MAX_TOPIC_CHARS,
                SCAN_RECORDS)

    def _take_tail(self, topic: str, queue_id: int, queue_offset: int, max_count: int, m: int,
                   hi: int) -> GetResult | None:
        """The tail's entries from ``queue_offset`` (which lies in [``m``, ``hi``): the consume queue's
        end and the tail's end of the queue) taken in one native call; None: the general path."""
        mf = self.commitlog.mfq.last()
        if mf is None:
            return None
        msgs: list[MessageExt] = []
        i, why, _, removed = self.tail.queues.take(
            topic, queue_id, queue_offset, min(max_count, hi - queue_offset), mf.mm, mf.file_from_offset,
            mf.file_end_offset, self.commitlog.mfq.min_offset(), topic.encode(), self.config.max_transfer_bytes, 0,
            self.broker, msgs)
        return self._tail_result(topic, queue_id, queue_offset, msgs, i, why, removed, m, hi)

    def _tail_result(self, topic: str, queue_id: int, queue_offset: int, msgs: list, i: int, why: int,
                     removed: int, m: int, hi: int) -> GetResult | None:
        """What ``get_messages`` returns for a native take of the tail's entries from ``queue_offset``
        that ended ``why`` after ``i`` entries; None where it did not finish (an entry in another
        file, a record the spec checks, a position outside the tail): the general path reads it."""
        if why != _TAKE_DONE and why != _TAKE_FULL:
            return None
        cq = self.queues.get((topic, queue_id))
        return GetResult(_status(msgs, removed), msgs, queue_offset + i, cq.min_offset() if cq is not None else m, hi)

    def get_batch(self, topic: str, queue_id: int, queue_offset: int, max_count: int = 4096) -> MessageBatch:
        _check_read(queue_offset, max_count)
        q = self._tailed(topic, queue_id)
        return self._uncorrected(get_batch(q, self.commitlog, MessageQueue(topic, self.broker, queue_id),
                                           queue_offset, max_count), q, topic, queue_id, queue_offset)

    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int) -> int:
        cq = self.queues.get((topic, queue_id))
        return cq.offset_for_timestamp(ts_ms, self.commitlog.store_ts_at) if cq else 0

    def view(self, msg_id: str) -> MessageExt:
        _, phys = R.decode_msg_id(msg_id)
        try:
            raw = self.commitlog.record_at(phys) if phys < self.readable_end else None
        except CorruptRecordError:
            raw = None
        m = MessageExt(raw, self.broker) if raw is not None else None
        if m is None or m.commitlog_offset != phys:
            raise MessageNotFoundError(f"no message {msg_id} in {self.path}")
        return m

    def close(self) -> None:
        for cq in self.queues.values():
            cq.close()
        self.commitlog.close()

    def __enter__(self) -> "StoreReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def queue_offsets_table(store_dir: str, cfg: StoreConfig, commitlog, dispatched_phys: int,
                        write_pos: int) -> dict[tuple[str, int], int]:
    """Next queue offset of every queue, for an appender taking over: the consume queues' counts,
    then the records the dispatcher has not covered yet (each record carries its queue offset)."""
    table: dict[tuple[str, int], int] = {}
    if not os.path.isdir(commitlog.directory):
        return table
    with StoreReader(store_dir, cfg, limit_phys=write_pos) as reader:
        for key in reader.queues:
            table[key] = reader.max_offset(*key)
    for r in commitlog.records_between(max(min(dispatched_phys, write_pos), commitlog.min_offset()), write_pos):
        key = (r.topic, r.queue_id)
        if r.queue_offset + 1 > table.get(key, 0):
            table[key] = r.queue_offset + 1
    return table
