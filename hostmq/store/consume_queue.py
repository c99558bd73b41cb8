"""A consume queue: the index of one (topic, queue) into the commitlog (RocketMQ ConsumeQueue).

Files under ``store/consumequeue/TOPIC/QUEUEID/`` hold ``consume_queue_file_entries`` entries of
20 bytes (``records.CQ_ENTRY``: phys_offset i64, size i32, tag_hash i64); entry *n* is queue offset
*n*, and a file is named by the byte offset of its first entry (queue offset × 20).

Ownership: one writer (the dispatcher); readers map the files read-only and read entries below the
published max offset. An entry with ``size > 0`` is valid; a zero entry ends the queue. A queue
that starts after 0 (its commitlog data was already deleted when it was first built) is padded with
blank entries ``(0, 0x7FFFFFFF, 0)`` as RocketMQ does and its min offset is moved past them.

Crash policy: ``recover`` finds the last valid entry; ``verify`` (abnormal recovery) cuts the queue at
the first entry that does not point at its own record; ``truncate_dirty`` drops entries that point
past the recovered end of the commitlog (sizes zeroed first: readers may be loading them);
re-dispatch then appends whatever is missing. Re-dispatch never cuts a queue below entries that point at valid records of it (``put_many`` with ``holds``): a
record read back that claims a queue offset already taken by such an entry is refused, not obeyed.
"""
from __future__ import annotations

import logging
import os
from typing import Callable

import numpy as np

from ..records import CQ_ENTRY, CQ_ENTRY_STRUCT
from .mapped_file_queue import MappedFileQueue

ENTRY_BYTES = CQ_ENTRY.itemsize
BLANK_SIZE = 0x7FFFFFFF
log = logging.getLogger(__name__)
# holds(phys_offset, size, queue_offset): the commitlog has a valid record of this queue there
Holds = Callable[[int, int, int], bool]
# check(first_queue_offset, phys_offsets, sizes): the same for many consecutive entries (bool array)
CheckEntries = Callable[[int, np.ndarray, np.ndarray], np.ndarray]


class ConsumeQueue:
    def __init__(self, store_dir: str, topic: str, queue_id: int, entries_per_file: int,
                 writable: bool = True, advice: tuple[str, str] = ("NORMAL", "NORMAL")) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.directory = os.path.join(store_dir, "consumequeue", topic, str(queue_id))
        self.entries_per_file = entries_per_file
        self.mfq = MappedFileQueue(self.directory, entries_per_file * ENTRY_BYTES, writable=writable, advice=advice)
        self.min_logic_offset = 0     # bytes; entries before it are blanks or point at deleted data
        self.refused = 0              # entries refused: they disagreed with entries of valid records
        self.damaged = False          # load() found and deleted damaged files

    # -- offsets ----------------------------------------------------------------------------------
    def max_offset(self) -> int:
        """Queue offset the next entry will get."""
        return self.mfq.max_offset() // ENTRY_BYTES

    def min_offset(self) -> int:
        return max(self.min_logic_offset, self.mfq.min_offset()) // ENTRY_BYTES

    def _entries(self, mf) -> np.ndarray:
        return mf.view(CQ_ENTRY)

    def entry(self, queue_offset: int) -> tuple[int, int, int] | None:
        """``(phys_offset, size, tag_hash)`` at ``queue_offset``, or None if not stored."""
        if not self.min_offset() <= queue_offset < self.max_offset():
            return None
        mf = self.mfq.find(queue_offset * ENTRY_BYTES)
        if mf is None:
            return None
        e = self._entries(mf)[queue_offset - mf.file_from_offset // ENTRY_BYTES]
        return int(e["phys_offset"]), int(e["size"]), int(e["tag_hash"])

    def entries(self, queue_offset: int, max_count: int) -> np.ndarray:
        """Up to ``max_count`` entries from ``queue_offset`` within one file (a view, big-endian)."""
        end = min(self.max_offset(), queue_offset + max_count)
        mf = self.mfq.find(queue_offset * ENTRY_BYTES)
        if mf is None or end <= queue_offset:
            return np.empty(0, dtype=CQ_ENTRY)
        first = mf.file_from_offset // ENTRY_BYTES
        end = min(end, first + self.entries_per_file)
        return self._entries(mf)[queue_offset - first:end - first]

    def last_entry(self) -> tuple[int, int, int] | None:
        return self.entry(self.max_offset() - 1) if self.max_offset() > self.min_offset() else None

    def last_entry_end(self) -> int:
        """Commitlog offset just past the record of the last entry (0 if there is none)."""
        e = self.last_entry()
        return e[0] + e[1] if e is not None and e[1] != BLANK_SIZE else 0

    def may_miss_newer_files(self) -> bool:
        """Whether files after the last one may be missing: it is full and no successor exists.

        Files roll only when full, so this is also the normal state of a queue whose entry count is
        a multiple of ``entries_per_file``; recovery then re-dispatches from :meth:`last_entry_end`.
        """
        last = self.mfq.last()
        return last is not None and last.is_full()

    # -- writing ----------------------------------------------------------------------------------
    def put(self, queue_offset: int, phys_offset: int, size: int, tag_hash: int) -> bool:
        """Store one entry. Returns False on a gap (queue_offset beyond max + 0, entries missing)."""
        return self.put_many(queue_offset, np.array([phys_offset], np.int64),
                             np.array([size], np.int64), np.array([tag_hash], np.int64))

    def put_one(self, queue_offset: int, phys_offset: int, size: int, tag_hash: int) -> bool:
        """The dispatcher's scalar path: append one entry at the queue's end (False, storing nothing,
        if ``queue_offset`` is not the end or the last file is full — use :meth:`put_many` then)."""
        mf = self.mfq.last()
        if mf is None or mf.wrote_pos >= mf.file_bytes or queue_offset != self.max_offset():
            return False
        CQ_ENTRY_STRUCT.pack_into(mf.mm, mf.wrote_pos, phys_offset, size, tag_hash)
        mf.wrote_pos = mf.committed_pos = mf.wrote_pos + ENTRY_BYTES
        return True

    def put_many(self, queue_offset: int, phys_offsets: np.ndarray, sizes: np.ndarray,
                 tag_hashes: np.ndarray, holds: Holds | None = None) -> bool:
        """Store entries for consecutive queue offsets from ``queue_offset`` (in commitlog order).

        Idempotent: entries already present with the same phys offset are kept. A new entry that
        disagrees with a stored one: if ``holds`` confirms the stored entry points at a valid record
        of this queue at that offset, the new one is refused (logged, counted in ``refused``) — a
        record read back is never trusted over the queue; otherwise (a stale tail, or no ``holds``)
        the stored entry is overwritten along with everything after it.
        Returns False, storing nothing more, if an entry would leave a gap after the current end.
        """
        if self.mfq.files and queue_offset < self.min_offset():
            if self._older_than_head(phys_offsets, holds):
                # The commitlog holds entries from before this queue's first file (its head was lost):
                # the existing files cannot take them, so the queue restarts here; the caller supplies
                # the rest in commitlog order.
                self.destroy()
                self.min_logic_offset = 0
            else:           # newer records claiming offsets below the queue's head: not this queue's
                k = min(self.min_offset() - queue_offset, len(phys_offsets))
                self.refuse(queue_offset, phys_offsets[:k], "below the queue's first entry")
                queue_offset += k
                phys_offsets, sizes, tag_hashes = phys_offsets[k:], sizes[k:], tag_hashes[k:]
        cur = self.max_offset()
        if not self.mfq.files and queue_offset > 0:
            self._start_at(queue_offset)
            cur = queue_offset
        while len(phys_offsets) and queue_offset < cur:
            skip = self._matching_prefix(queue_offset, phys_offsets)
            queue_offset += skip
            phys_offsets, sizes, tag_hashes = phys_offsets[skip:], sizes[skip:], tag_hashes[skip:]
            if not len(phys_offsets) or queue_offset >= cur:
                break
            stored = self.entry(queue_offset)
            if holds is not None and stored is not None and holds(stored[0], stored[1], queue_offset):
                self.refuse(queue_offset, phys_offsets[:1], "already taken by a valid record")
                queue_offset += 1
                phys_offsets, sizes, tag_hashes = phys_offsets[1:], sizes[1:], tag_hashes[1:]
                continue
            self.truncate_offset(queue_offset)        # a stale tail: the commitlog says otherwise
            cur = queue_offset
        if not len(phys_offsets):
            return True
        if queue_offset > cur:
            return False
        self._append(queue_offset, phys_offsets, sizes, tag_hashes)
        return True

    def _older_than_head(self, phys_offsets: np.ndarray, holds: Holds | None) -> bool:
        """Whether entries claiming offsets below the queue's first entry come before it in the
        commitlog (its head was lost), or the first entry is not a valid record anyway."""
        first = self.entry(self.min_offset())
        if holds is None or first is None or not holds(first[0], first[1], self.min_offset()):
            return True
        return int(phys_offsets[0]) < first[0]

    def tail_holds(self, holds: Holds) -> bool:
        """Whether the last entry points at a valid record of this queue (so a gap after it is the
        new entries' fault, not the queue's)."""
        e = self.last_entry()
        return e is not None and e[1] != BLANK_SIZE and holds(e[0], e[1], self.max_offset() - 1)

    def refuse(self, queue_offset: int, phys_offsets: np.ndarray, why: str) -> None:
        if not len(phys_offsets):
            return
        self.refused += len(phys_offsets)
        log.error("consume queue %s/%d: refused %d entr%s from queue offset %d (record at commitlog "
                  "offset %d): %s", self.topic, self.queue_id, len(phys_offsets),
                  "y" if len(phys_offsets) == 1 else "ies", queue_offset, int(phys_offsets[0]), why)

    def _matching_prefix(self, queue_offset: int, phys_offsets: np.ndarray) -> int:
        """How many of the given entries are already stored identically."""
        have = min(len(phys_offsets), self.max_offset() - queue_offset)
        done = 0
        while done < have:
            stored = self.entries(queue_offset + done, have - done)
            if not len(stored):
                break
            same = stored["phys_offset"] == phys_offsets[done:done + len(stored)]
            if not same.all():
                return done + int(np.argmin(same))
            done += len(stored)
        return done

    def _append(self, queue_offset: int, phys, sizes, tags) -> None:
        i, n = 0, len(phys)
        while i < n:
            mf = self.mfq.last_for_write()
            first = mf.file_from_offset // ENTRY_BYTES
            pos = queue_offset + i - first
            k = min(n - i, self.entries_per_file - pos)
            view = self._entries(mf)[pos:pos + k]
            view["phys_offset"] = phys[i:i + k]
            view["size"] = sizes[i:i + k]
            view["tag_hash"] = tags[i:i + k]
            mf.wrote_pos = mf.committed_pos = (pos + k) * ENTRY_BYTES
            i += k

    def _start_at(self, queue_offset: int) -> None:
        """First entry of an empty queue is not 0: pad its file with blanks, move the min offset."""
        start_bytes = queue_offset * ENTRY_BYTES
        mf = self.mfq.create(start_bytes - start_bytes % self.mfq.file_bytes)
        pos = queue_offset - mf.file_from_offset // ENTRY_BYTES
        blank = self._entries(mf)[:pos]
        blank["phys_offset"] = 0
        blank["size"] = BLANK_SIZE
        blank["tag_hash"] = 0
        mf.wrote_pos = mf.committed_pos = pos * ENTRY_BYTES
        self.min_logic_offset = start_bytes

    # -- recovery and cleanup ---------------------------------------------------------------------
    def load(self) -> None:
        """Map the queue's files. They are derived data: a file of the wrong size or at a misaligned
        offset (damage) is deleted with every file after it, and ``damaged`` says so (recovery then
        rebuilds the queue from the commitlog)."""
        self.damaged = self._drop_misfit_files() if self.mfq.writable else False
        self.mfq.load()
        first = self.mfq.first()
        self.min_logic_offset = first.file_from_offset if first else 0

    def _drop_misfit_files(self) -> bool:
        try:
            names = sorted(n for n in os.listdir(self.directory) if len(n) == 20 and n.isdigit())
        except FileNotFoundError:
            return False
        fb = self.mfq.file_bytes
        for i, n in enumerate(names):
            size = os.path.getsize(os.path.join(self.directory, n))
            if size != fb or int(n) % fb:
                if i == len(names) - 1 and size == 0 and int(n) % fb == 0:
                    return False    # a crash while creating the newest file: MappedFileQueue.load drops it
                for gone in names[i:]:
                    os.unlink(os.path.join(self.directory, gone))
                log.error("consume queue %s/%d: file %s is %d bytes (expected %d) or misplaced; it and the %d "
                          "files after it are deleted and rebuilt from the commitlog", self.topic, self.queue_id,
                          n, size, fb, len(names) - i - 1)
                return True
        return False

    def recover(self) -> bool:
        """Set the write position after the last valid entry (size > 0), scanning the last files.

        Returns False if entries were lost in the middle (a file missing between two others): the
        files after the hole are dropped and the caller must re-dispatch from further back.
        """
        files = self.mfq.files
        if not files:
            return True
        intact = True
        for i, mf in enumerate(files):
            if mf.file_from_offset != files[0].file_from_offset + i * self.mfq.file_bytes:
                self.mfq.truncate(mf.file_from_offset)
                intact = False
                break
        files = self.mfq.files
        end = files[0].file_from_offset
        for mf in files[-3:]:
            sizes = self._entries(mf)["size"]
            bad = np.flatnonzero(sizes <= 0)
            n = int(bad[0]) if len(bad) else self.entries_per_file
            end = mf.file_from_offset + n * ENTRY_BYTES
            if n < self.entries_per_file:
                break
        self.mfq.truncate(end)
        if self.min_logic_offset < self.mfq.min_offset():
            self.min_logic_offset = self.mfq.min_offset()
        self._skip_leading_blanks()
        return intact

    def verify(self, check: CheckEntries, commitlog_min_offset: int) -> int | None:
        """Cut the queue at the first entry that does not point at its own record (``check``, against
        the commitlog); returns that queue offset, or None if every entry is right.

        Entries are checked from the min offset; a leading run of entries pointing before
        ``commitlog_min_offset`` (their records were deleted by retention) is accepted as it is.
        Abnormal recovery runs this: it catches damaged entries anywhere, not only in the newest files.
        """
        off, end = self.min_offset(), self.max_offset()
        leading = True
        while off < end:
            e = self.entries(off, end - off)
            if not len(e):
                break
            phys = e["phys_offset"].astype(np.int64)
            sizes = e["size"].astype(np.int64)
            good = check(off, phys, sizes)
            if leading:
                live = np.flatnonzero((phys >= commitlog_min_offset) | (sizes == BLANK_SIZE))
                k = int(live[0]) if len(live) else len(phys)
                good[:k] = True
                leading = k == len(phys)
            bad = np.flatnonzero(~good)
            if len(bad):
                cut = off + int(bad[0])
                self.truncate_offset(cut)
                return cut
            off += len(e)
        return None

    def _skip_leading_blanks(self) -> None:
        first = self.mfq.first()
        if first is None:
            return
        sizes = self._entries(first)["size"][:first.wrote_pos // ENTRY_BYTES]
        real = np.flatnonzero(sizes != BLANK_SIZE)
        n = int(real[0]) if len(real) else len(sizes)
        self.min_logic_offset = max(self.min_logic_offset, first.file_from_offset + n * ENTRY_BYTES)

    def truncate_offset(self, queue_offset: int) -> None:
        """Drop entries at and after ``queue_offset``. Their sizes are zeroed first, then the rest:
        consumers map these files and load an entry's size, its phys offset and its size again
        (``store/readonly.py``), so an entry being dropped never reads as a whole one (say phys
        zeroed, size not yet: a record "ending" below every bound)."""
        for mf in self.mfq.files:
            first = mf.file_from_offset // ENTRY_BYTES
            self._entries(mf)["size"][max(0, queue_offset - first):mf.wrote_pos // ENTRY_BYTES] = 0
        self.mfq.truncate(queue_offset * ENTRY_BYTES)

    def truncate_dirty(self, max_phys_offset: int) -> int:
        """Drop entries whose record ends past ``max_phys_offset``; returns the new max offset."""
        lo, hi = self.min_offset(), self.max_offset()
        while lo < hi:   # entries are in commitlog order, so the cut is a binary search
            mid = (lo + hi) // 2
            phys, size, _ = self.entry(mid)
            if size != BLANK_SIZE and phys + size > max_phys_offset:
                hi = mid
            else:
                lo = mid + 1
        if lo < self.max_offset():
            self.truncate_offset(lo)
        return self.max_offset()

    def correct_min_offset(self, commitlog_min_offset: int) -> None:
        """Move the min offset past entries whose records were deleted from the commitlog."""
        lo, hi = self.min_offset(), self.max_offset()
        while lo < hi:
            mid = (lo + hi) // 2
            phys, size, _ = self.entry(mid)
            if size == BLANK_SIZE or phys < commitlog_min_offset:
                lo = mid + 1
            else:
                hi = mid
        self.min_logic_offset = max(self.min_logic_offset, lo * ENTRY_BYTES)

    def delete_expired(self, commitlog_min_offset: int) -> int:
        """Delete whole files whose every entry points before ``commitlog_min_offset``."""
        gone = 0
        while len(self.mfq.files) > 1:
            mf = self.mfq.files[0]
            last = self._entries(mf)[self.entries_per_file - 1]
            if int(last["phys_offset"]) + int(last["size"]) > commitlog_min_offset:
                break
            self.mfq.delete_first(1)
            gone += 1
        self.correct_min_offset(commitlog_min_offset)
        return gone

    # -- time -------------------------------------------------------------------------------------
    def offset_for_timestamp(self, ts_ms: int, store_ts_at) -> int:
        """First queue offset whose message was stored at or after ``ts_ms`` (max offset if none).

        ``store_ts_at(phys_offset)`` reads a record's store time from the commitlog; store times are
        non-decreasing (the commitlog enforces it), so a binary search is exact.
        """
        lo, hi = self.min_offset(), self.max_offset()
        while lo < hi:
            mid = (lo + hi) // 2
            phys, size, _ = self.entry(mid)
            if store_ts_at(phys) < ts_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def flush(self, least_pages: int = 0) -> int:
        return self.mfq.flush(least_pages)

    def close(self) -> None:
        self.mfq.close()

    def destroy(self) -> None:
        self.mfq.destroy()
