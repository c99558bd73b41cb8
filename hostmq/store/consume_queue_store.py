"""Every consume queue of a store plus its index: what the dispatcher builds (RocketMQ's
``ConsumeQueueStore`` + ``IndexService`` behind ``ReputMessageService``).

Ownership: one process writes these files — the dispatcher (in the embedded ``MessageStore``, the
store itself). It reads the commitlog (which may be a read-only view whose writer is another
process) and turns records into consume-queue entries and index entries. Dispatch is idempotent:
re-dispatching records already dispatched changes nothing, which is what crash recovery relies on.
It also writes ``consumequeues.json`` (``cq_manifest``) after each flush of the queues.

Nothing read back from the commitlog is trusted (issue 15): the scans re-check every record; a
record with an invalid topic is skipped, and a broken one stops dispatch at its position
(``dispatch_error``) until a later call finds it readable. A record claiming a queue offset that an
entry of a valid record already holds is refused (``ConsumeQueue.put_many`` with ``holds``).
Dispatch never leaves a half-dispatched range behind ``dispatched_phys``: it moves after each batch
that is complete, so an ``OSError`` (disk full, I/O error) from creating or writing a file loses
nothing — the caller retries from ``dispatched_phys``.
"""
from __future__ import annotations

import errno
import logging
import os

import numpy as np

from ..config import StoreConfig
from ..errors import StoreFullError
from ..records import stored_topic
from .commitlog import CommitLog
from .consume_queue import ConsumeQueue
from .cq_manifest import Manifest, read_manifest, write_manifest
from .dispatch import DispatchBatch, index_entries, scan_batch
from .entry_check import check_entries, holds_record
from .index_service import IndexService
from .index_keys import index_key_hashes, prefix_hash

log = logging.getLogger(__name__)
SMALL_RANGE_BYTES = 64 * 1024     # ranges this small try the record-by-record path first
SMALL_RECORDS = 32
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class ConsumeQueueStore:
    def __init__(self, path: str, config: StoreConfig, commitlog: CommitLog) -> None:
        self.path = path
        self.config = config
        self.commitlog = commitlog
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self.consume_queues_present = self._load_consume_queues()
        self.index = IndexService(path, config) if config.message_index_enable else None
        self.dispatched_phys = 0
        self.dispatch_error: tuple[int, str] | None = None   # (phys, why): dispatch stopped there
        self.skipped_records = 0       # records not dispatched: their topic is not a valid name
        self.gaps = 0                  # entries not stored: they claimed an offset past their queue's end
        self._logged_error_at = -1
        self._manifest_written: Manifest | None = None

    def _load_consume_queues(self) -> bool:
        """Open every queue found on disk; True if there was at least one. A directory whose name
        is not a topic name (or a queue id) is no queue of ours and is left alone."""
        root = os.path.join(self.path, "consumequeue")
        if not os.path.isdir(root):
            return False
        for topic in sorted(os.listdir(root)):
            tdir = os.path.join(root, topic)
            if stored_topic(os.fsencode(topic)) != topic or not os.path.isdir(tdir):
                continue
            for qid in os.listdir(tdir):
                if qid.isascii() and qid.isdigit() and str(int(qid)) == qid and int(qid) < (1 << 31):
                    cq = ConsumeQueue(self.path, topic, int(qid), self.config.consume_queue_file_entries,
                                      advice=self.config.consume_queue_advice)
                    cq.load()
                    self.queues[(topic, int(qid))] = cq
        return bool(self.queues)

    def all_consume_queues(self) -> list[ConsumeQueue]:
        return list(self.queues.values())

    def consume_queue(self, topic: str, queue_id: int, create: bool = False) -> ConsumeQueue | None:
        cq = self.queues.get((topic, queue_id))
        if cq is None and create:
            cq = self.queues[(topic, queue_id)] = ConsumeQueue(
                self.path, topic, queue_id, self.config.consume_queue_file_entries,
                advice=self.config.consume_queue_advice)
        return cq

    def topic_queue_table(self) -> dict[tuple[str, int], int]:
        """Next queue offset of every queue, as its consume queue says."""
        return {k: cq.max_offset() for k, cq in self.queues.items()}

    # -- checks against the commitlog ---------------------------------------------------------------
    def holds(self, topic: str, queue_id: int):
        """``holds(phys, size, queue_offset)`` for queue (topic, queue_id): ``entry_check.holds_record``."""
        topic_b, cl = topic.encode("ascii"), self.commitlog
        return lambda phys, size, queue_offset: holds_record(cl, phys, size, topic_b, queue_id, queue_offset)

    def entry_checker(self, topic: str, queue_id: int):
        """``check(first_queue_offset, phys, sizes)`` for ``ConsumeQueue.verify``, vectorised."""
        topic_b, cl = topic.encode("ascii"), self.commitlog
        return lambda first, phys, sizes: check_entries(cl, topic_b, queue_id, first, phys, sizes)

    # -- dispatching --------------------------------------------------------------------------------
    def dispatch(self, end: int | None = None) -> int:
        """Dispatch from where the last dispatch stopped up to ``end`` (default: the end of what is
        committed to the commitlog files). A full disk is a StoreFullError (nothing half done)."""
        try:
            n, _ = self.redispatch(self.dispatched_phys,
                                   self.commitlog.committed_offset() if end is None else end)
        except OSError as e:
            if e.errno in _NO_SPACE:
                raise StoreFullError(f"consume queues of {self.path}: {e.strerror}") from e
            raise
        return n

    def redispatch(self, start: int, end: int, batch: int = 8192, progress=None) -> tuple[int, bool]:
        """Dispatch records in [start, end); returns (count, whether a queue had a gap). ``progress(phys)``
        is called after each batch (recovery reports it).

        Stops early at a broken record (``dispatch_error``); ``dispatched_phys`` moves past each
        complete batch, so an exception leaves it where dispatch can resume."""
        self.dispatch_error = None
        if end - start <= SMALL_RANGE_BYTES and self._few_records(start, end):
            done = self._dispatch_small(start, end)
            if done is not None:
                return done, False
        phys, n, gap = start, 0, False
        full = start == self.commitlog.min_offset()
        while phys < end:
            b, nxt = scan_batch(self.commitlog, phys, end, batch)
            self.skipped_records += b.skipped
            if len(b):
                gap |= self._dispatch_batch(b, full)
                n += len(b)
            if nxt > phys:
                self.dispatched_phys = max(self.dispatched_phys, nxt)
                if progress is not None:
                    progress(nxt)
            if b.error is not None:
                self._stopped_at(b.error)
                break
            if nxt <= phys:
                break
            phys = nxt
        return n, gap

    def _stopped_at(self, error: tuple[int, str]) -> None:
        self.dispatch_error = error
        if error[0] != self._logged_error_at:       # once per position, not once per retry
            self._logged_error_at = error[0]
            log.error("dispatch stopped at commitlog offset %d of %s: %s", error[0], self.path, error[1])

    def _few_records(self, start: int, end: int) -> bool:
        """Guess from the first record's size whether [start, end) holds at most SMALL_RECORDS records
        (producers' records are mostly alike): a batch of a hundred goes straight to the columnar
        path instead of being parsed twice."""
        size = self.commitlog.record_size_at(start)
        return size <= 0 or (end - start) // size <= SMALL_RECORDS

    def _dispatch_small(self, start: int, end: int) -> int | None:
        """A few records (the live broker's usual case), one by one: the columnar path costs
        hundreds of µs of numpy set-up per call. None if anything needs the general path."""
        cl = self.commitlog
        skipped = cl.skipped_records
        reqs, nxt = cl.scan(start, end, SMALL_RECORDS)
        error = cl.scan_error
        if nxt < end and len(reqs) >= SMALL_RECORDS:
            return None
        for i, r in enumerate(reqs):
            cq = self.queues.get((r.topic, r.queue_id))
            if cq is None or not cq.put_one(r.queue_offset, r.phys_offset, r.size, r.tag_hash):
                if i:
                    self._index(reqs[:i])
                    self.dispatched_phys = max(self.dispatched_phys, r.phys_offset)
                return None
        self._index(reqs)
        self.skipped_records += cl.skipped_records - skipped
        self.dispatched_phys = max(self.dispatched_phys, nxt)
        if error is not None:
            self._stopped_at(error)
        return len(reqs)

    def _index(self, reqs) -> None:
        if self.index is not None and reqs:
            self.index.build_index(reqs)

    def _dispatch_batch(self, b: DispatchBatch, full: bool) -> bool:
        """Consume-queue entries per (topic, queue) in numpy runs, then the index."""
        gid = (b.topic_ids << 32) | b.queue_ids
        gap = False
        if (gid == gid[0]).all():
            runs = [(int(gid[0]), slice(None))]
        else:
            order = np.argsort(gid, kind="stable")
            bounds = np.flatnonzero(np.diff(gid[order])) + 1
            runs = [(int(gid[order[s]]), order[s:e]) for s, e in zip(np.r_[0, bounds], np.r_[bounds, len(order)])]
        for g, sel in runs:
            key = (b.topics[g >> 32], g & 0xFFFFFFFF)
            gap |= not self._put_entries(key, b.queue_offsets[sel], b.phys_offsets[sel], b.sizes[sel],
                                         b.tag_codes[sel], full)
        if self.index is not None:
            self.index.build_index_hashes(*index_entries(b, prefix_hash, index_key_hashes))
        return gap

    def _put_entries(self, key, qoffs, phys, sizes, tags, full: bool) -> bool:
        cq = self.consume_queue(key[0], key[1], create=True)
        holds = self.holds(*key)
        breaks = np.flatnonzero(np.diff(qoffs) != 1) + 1   # runs of consecutive queue offsets
        ok = True
        for s, e in zip(np.r_[0, breaks], np.r_[breaks, len(qoffs)]):
            q0 = int(qoffs[s])
            if cq.put_many(q0, phys[s:e], sizes[s:e], tags[s:e], holds):
                continue
            if full and not cq.tail_holds(holds):
                # The commitlog no longer holds what the queue has: restart the queue here.
                cq.destroy()
                cq.min_logic_offset = 0
                cq.put_many(q0, phys[s:e], sizes[s:e], tags[s:e], holds)
                continue
            if full:        # the queue ends at a valid record: these claim offsets nothing led to
                cq.refuse(q0, phys[s:e], f"a gap after the queue's end {cq.max_offset()}")
            else:
                self.gaps += e - s
            ok = False
        return ok

    # -- durability and retention -------------------------------------------------------------------
    def flush(self) -> None:
        """Flush every queue and the index, then record them in the manifest (if anything changed)."""
        for cq in self.queues.values():
            cq.flush(0)
        if self.index is not None:
            self.index.flush()
        now = self.manifest()
        if now != self._manifest_written:
            write_manifest(self.path, now)
            self._manifest_written = now

    def manifest(self) -> Manifest:
        """What ``cq_manifest`` records of the queues as they are now."""
        return {k: (cq.max_offset(), cq.last_entry_end()) for k, cq in self.queues.items()
                if cq.mfq.files}

    def read_manifest(self) -> Manifest | None:
        return read_manifest(self.path)

    def delete_expired(self, commitlog_min_offset: int) -> None:
        for cq in self.queues.values():
            cq.delete_expired(commitlog_min_offset)
        if self.index is not None:
            self.index.delete_expired(commitlog_min_offset)

    def close(self) -> None:
        for cq in self.queues.values():
            cq.close()
        if self.index is not None:
            self.index.close()
