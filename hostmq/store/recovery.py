"""Crash recovery: where to start scanning, and bringing every structure back in line.

Normal recovery (no ``abort`` file: the last run closed cleanly) trusts the checkpoint's confirmed
end of the commitlog and only checks that nothing valid follows it. Abnormal recovery (``abort``
present: the last run died) rescans the commitlog from the first file that may hold data written
after the last fsync, verifying magic, lengths and body CRC of every record, and stops at the first
torn, garbage or zero record. Then, in both cases:

1. the commitlog is truncated there (later files deleted, the tail zeroed so stale bytes never
   look like records again);
2. every consume queue drops entries beyond it (``truncate_dirty``) and index files beyond it go;
3. records from the re-dispatch point on are dispatched again. Dispatch is idempotent (existing
   identical entries are kept), so starting early is always safe; if a queue turns out to have a
   hole (entries missing before the re-dispatch point) everything is re-dispatched from the
   commitlog's first offset.

Consume-queue files can go missing where the checkpoint cannot tell (a new file's directory entry
is not fsynced): a queue whose last file is full may have lost the files after it, so re-dispatch
starts no later than the end of its last entry; a queue with entries missing at its head (its min
offset is above 0 while the commitlog still starts at 0), or one that re-appears during re-dispatch
at an offset above 0, means a full re-dispatch.

Consume queues are derived data, and recovery does not trust them either (issue 15):

* the manifest ``consumequeues.json`` (``cq_manifest``, written after every consume-queue flush) says
  which queues exist and how many entries each had on disk: a queue missing from disk (a topic's
  directory deleted) means a full re-dispatch, a queue with fewer entries is re-dispatched from the
  end of its last entry; after a crash with no readable manifest, everything is re-dispatched;
* a queue file of the wrong size is deleted with the files after it (``ConsumeQueue.load``), and the
  queue rebuilt;
* abnormal recovery checks every entry against the record it points at
  (``store.verify_consume_queues_on_recover``, ``ConsumeQueue.verify``) and cuts a queue at its first
  wrong entry, which re-dispatch then rebuilds.

The planning functions are pure; :func:`run` applies them to a ``MessageStore``'s parts.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

from ..records import Checkpoint
from .cq_manifest import lost_entries

log = logging.getLogger(__name__)
LOG_PROGRESS_BYTES = 64 << 20       # a commitlog scan longer than this logs its size and duration


@dataclass(frozen=True)
class RecoveryReport:
    abnormal: bool
    commitlog_max_offset: int
    redispatch_from: int
    redispatched: int
    full_redispatch: bool


@dataclass
class RecoveryProgress:
    """How far recovery is, for whoever watches it from another thread (the broker logs it and
    tells systemd, ``broker/supervisor.py``): the phase and bytes done of the phase's total. Plain
    attributes written by the recovering thread; a reader may see a slightly older value."""

    phase: str = "opening"            # opening → commitlog scan → redispatch → done
    done_bytes: int = 0
    total_bytes: int = 0
    started_s: float = field(default_factory=time.monotonic)
    phase_started_s: float = field(default_factory=time.monotonic)

    def enter(self, phase: str, total_bytes: int) -> None:
        self.phase, self.done_bytes, self.total_bytes = phase, 0, max(0, total_bytes)
        self.phase_started_s = time.monotonic()

    def line(self) -> str:
        """``commitlog scan 1.2 GiB of 4.0 GiB (30 %, 410 MiB/s)``."""
        if self.total_bytes <= 0:
            return self.phase
        rate = self.done_bytes / max(time.monotonic() - self.phase_started_s, 1e-3)
        return (f"{self.phase} {_size(self.done_bytes)} of {_size(self.total_bytes)} "
                f"({100 * self.done_bytes / self.total_bytes:.0f} %, {_size(rate)}/s)")


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def commitlog_scan_start(abnormal: bool, cp: Checkpoint, cp_valid: bool, file_starts: list[int],
                         file_bytes: int) -> int:
    """Physical offset (a record boundary) where the commitlog validity scan starts."""
    if not file_starts:
        return 0
    first = file_starts[0]
    end = file_starts[-1] + file_bytes
    if not cp_valid:
        # No trustworthy checkpoint: a clean store checks its last three files (RocketMQ), a crashed
        # one everything.
        return first if abnormal else file_starts[max(0, len(file_starts) - 3)]
    if not abnormal and first <= cp.confirm_phys_offset <= end:
        return cp.confirm_phys_offset
    durable = min(cp.commitlog_flushed_offset, cp.cq_flushed_phys_offset)
    durable = min(max(durable, first), end)
    # Start at the beginning of the file holding the durable point: files are scanned whole.
    return first + ((durable - first) // file_bytes) * file_bytes if durable < end else file_starts[-1]


def redispatch_start(cp: Checkpoint, cp_valid: bool, queues_intact: bool, index_end: int,
                     index_enabled: bool, commitlog_min: int, commitlog_max: int) -> int:
    """Physical offset from which records are dispatched again."""
    if not cp_valid or not queues_intact:
        return commitlog_min
    start = cp.cq_flushed_phys_offset
    if index_enabled:
        start = min(start, index_end)
    return min(max(start, commitlog_min), commitlog_max)


def run(store, progress: RecoveryProgress | None = None) -> RecoveryReport:
    """Recover ``store`` (a MessageStore whose files are loaded); returns what was done. Progress and
    duration are logged; ``progress`` (if given) is kept current for a watcher."""
    progress = progress if progress is not None else RecoveryProgress()
    cl, cp_file, cfg = store.commitlog, store.checkpoint, store.config
    cp = cp_file.load()
    abnormal = store.abnormal
    starts = [mf.file_from_offset for mf in cl.mfq.files]
    scan_from = commitlog_scan_start(abnormal, cp, cp_file.valid, starts, cl.file_bytes)
    scan_end = (starts[-1] + cl.file_bytes) if starts else 0
    progress.enter("commitlog scan", scan_end - scan_from)
    max_phys = cl.recover(scan_from, check_crc=abnormal and cfg.check_crc_on_recover,
                          known_last_ts_ms=cp.physic_msg_ts_ms if cp_file.valid else 0,
                          progress=lambda phys: setattr(progress, "done_bytes", phys - scan_from))
    if max_phys - scan_from > LOG_PROGRESS_BYTES:
        log.info("recovery of %s: %s scanned in %.1f s, valid data ends at %d", store.path,
                 _size(max_phys - scan_from), time.monotonic() - progress.phase_started_s, max_phys)
    cl_min = cl.min_offset()
    intact = store.consume_queues_present or max_phys == cl_min
    manifest = store.cq_store.read_manifest()
    if abnormal and manifest is None and max_phys > cl_min:
        log.warning("recovery of %s: no readable consume-queue manifest; every queue is rebuilt", store.path)
        intact = False
    intact &= not _missing_queues(store, manifest or {}, max_phys)
    tails = []                 # ends of queues that may have lost entries after them
    verify = abnormal and cfg.verify_consume_queues_on_recover
    for key, cq in store.queues.items():
        intact &= cq.recover() and not cq.damaged
        if verify and cq.verify(store.cq_store.entry_checker(*key), cl_min) is not None:
            log.warning("recovery of %s: consume queue %s/%d holds wrong entries from queue offset %d on; "
                        "rebuilt from the commitlog", store.path, key[0], key[1], cq.max_offset())
            tails.append(cq.last_entry_end())
        cq.truncate_dirty(max_phys)
        cq.correct_min_offset(cl_min)
        intact &= not (cl_min == 0 and cq.min_offset() > 0)
        if cq.may_miss_newer_files() or lost_entries(manifest or {}, key, cq.max_offset(), max_phys):
            tails.append(cq.last_entry_end())
    index_end = 0
    if store.index is not None:
        store.index.truncate(max_phys)
        index_end = store.index.max_indexed_phys_offset()
    start = redispatch_start(cp, cp_file.valid, intact, index_end, store.index is not None,
                             cl_min, max_phys)
    if tails:
        start = max(min(start, min(tails)), cl_min)
    full = start == cl_min and start < max_phys
    known = set(store.queues)
    progress.enter("redispatch", max_phys - start)
    n, gap = store.redispatch(start, max_phys, progress=lambda phys: setattr(progress, "done_bytes", phys - start))
    gap |= any(cq.min_offset() > 0 for k, cq in store.queues.items() if k not in known)
    if gap and not full:
        full = True
        n2, _ = store.redispatch(cl.min_offset(), max_phys)
        n += n2
    store.rebuild_topic_queue_table()
    progress.enter("done", 0)
    took_s = time.monotonic() - progress.started_s
    if abnormal or took_s >= 1.0 or n:
        log.info("recovery of %s (%s) took %.2f s: commitlog ends at %d, %d records redispatched from %d%s",
                 store.path, "abnormal" if abnormal else "normal", took_s, max_phys, n, start,
                 " (full)" if full else "")
    return RecoveryReport(abnormal, max_phys, start, n, full)


def _missing_queues(store, manifest: dict, commitlog_end: int) -> bool:
    """Whether a queue the manifest knows entries of is gone from disk (while the commitlog still
    holds their records): then everything is re-dispatched."""
    for key in manifest:
        cq = store.queues.get(key)
        if (cq is None or not cq.mfq.files) and lost_entries(manifest, key, -1, commitlog_end):
            log.warning("recovery of %s: consume queue %s/%d is missing; rebuilt from the commitlog",
                        store.path, *key)
            return True
    return False


def restore_short_files(directory: str, file_bytes: int) -> list[str]:
    """Give a commitlog file that lost its end (shorter than ``file_bytes`` while other files have
    exactly that size) its size back, the lost part reading as zeros: recovery then ends the log
    where the data ends instead of the file being deleted (the last one) or the open failing (one in
    the middle). An empty newest file is left alone (a crash while creating it: it holds nothing), and
    so is a store where no file has ``file_bytes`` (the configured size is not the store's). Returns
    the files given their size back."""
    names = sorted(n for n in os.listdir(directory) if len(n) == 20 and n.isdigit())
    sizes = {n: os.path.getsize(os.path.join(directory, n)) for n in names}
    if file_bytes not in sizes.values():
        return []
    fixed = []
    for i, n in enumerate(names):
        size = sizes[n]
        if size < file_bytes and int(n) % file_bytes == 0 and (size or i < len(names) - 1):
            fd = os.open(os.path.join(directory, n), os.O_RDWR)
            try:
                os.posix_fallocate(fd, 0, file_bytes)      # blocks reserved: no SIGBUS when mapped
            finally:
                os.close(fd)
            log.error("commitlog file %s was %d bytes, not %d: the missing end reads as zeros now and "
                      "recovery ends the log where the data ends", n, size, file_bytes)
            fixed.append(n)
    return fixed
