"""The flusher process: makes the commitlog durable and keeps the checkpoint (RocketMQ's
``FlushRealTimeService`` / ``GroupCommitService`` and ``StoreCheckpoint``).

ASYNC_FLUSH: every ``flush_interval_ms`` it flushes if at least ``flush_least_pages`` pages are dirty,
and everything every ``flush_thorough_interval_ms`` (``store.flush.async_flush_pages``).
SYNC_FLUSH (group commit): the writer raises ``flush_request_pos`` and wakes the flusher (futex
``flush_wake``); one ``fdatasync`` covers every record written so far, then ``flushed_pos`` is published
and the writer is woken (the broker's doorbell) to acknowledge everyone the flush covered.

Files and words it writes: ``store/checkpoint`` (every ``flush_cq_interval_ms`` and at stop) and
the flusher line of the broker state. It never writes commitlog bytes: ``fdatasync`` on a read-only
descriptor writes back the pages the writer dirtied through its mapping.

Crash policy: ``flushed_pos`` only moves after the sync returned; a restarted flusher starts from
the published value (re-flushing is harmless).

A failed ``fdatasync`` (EIO, ENOSPC on a thin disk) is never retried into a success: the kernel may
already have dropped the dirty pages, and a second sync — even on a new descriptor — would report
nothing (PostgreSQL's "fsyncgate"). The flusher publishes the errno in ``flush_error`` and from then on
this broker run never moves ``flushed_pos`` again (a restarted flusher reads the word too); the writer
answers waiting SYNC_FLUSH sends with FLUSH_DISK_TIMEOUT and refuses new writes. A restart of the
broker (abnormal recovery, which re-reads and re-checks the files) is what clears it. The checkpoint's ``confirm_phys_offset`` is written
only at a clean stop, when writer and dispatcher have already stopped.
"""
from __future__ import annotations

import logging
import os
import time

from .. import records as R
from ..shm.signal import notify_if_waiting, wait_for
from ..store.checkpoint import StoreCheckpoint
from ..store.flush import AsyncFlushState, async_flush_pages
from ..store.mapped_file import PAGE_BYTES, file_name
from ..live.runtime import BrokerRuntime
from ..waiting import SLEEP
from ..live.state import W_COMMITTED_POS, W_FLUSH_REQUEST_POS, W_FLUSHED_POS, W_WRITE_POS, BrokerState, open_doorbell

W_FLUSH_ERROR = R.STATE_WORD["flush_error"]

log = logging.getLogger(__name__)

_W = R.STATE_WORD
IDLE_WAKE_S = 0.05


class Flusher:
    """The flusher's state and loop body (``run_once``), usable without spawning a process."""

    def __init__(self, rt: BrokerRuntime) -> None:
        self.rt = rt
        self.cfg = rt.config.store
        self.state = BrokerState.attach(rt.state_name)
        self.sync = self.state.sync_flush
        self.idle = rt.config.broker.idle_strategy("flusher")
        self.doorbell_segment, self.doorbell = open_doorbell(self.state)
        self.directory = os.path.join(rt.store_dir, "commitlog")
        self.file_bytes = self.state.commitlog_file_bytes
        self.checkpoint = StoreCheckpoint(os.path.join(rt.store_dir, "checkpoint"))
        self.checkpoint.load()
        self._fds: dict[int, int] = {}
        now_ms = time.time() * 1000
        self.async_state = AsyncFlushState(now_ms, now_ms)
        self._next_checkpoint_s = time.monotonic() + self.cfg.flush_cq_interval_ms / 1000
        self.state.set("flusher_pid", os.getpid())

    # -- flushing -------------------------------------------------------------------------------------
    def _fd(self, start: int) -> int | None:
        fd = self._fds.get(start)
        if fd is None:
            try:
                fd = os.open(os.path.join(self.directory, file_name(start)), os.O_RDONLY)
            except FileNotFoundError:       # deleted by retention, or never created
                return None
            self._fds[start] = fd
        return fd

    def flush_to(self, end: int) -> int:
        """fdatasync every commitlog file with data in [flushed_pos, end); publish ``end``."""
        w = self.state.w
        flushed = w[W_FLUSHED_POS]
        if end <= flushed:
            return flushed
        if w[W_FLUSH_ERROR]:
            return flushed                                       # fsyncgate: never again this run
        t0 = time.perf_counter()
        fb = self.file_bytes
        try:
            for start in range(flushed - flushed % fb, end, fb):
                fd = self._fd(start)
                if fd is not None:
                    os.fdatasync(fd)
        except OSError as e:
            self._failed(e)
            return flushed
        for start in [s for s in self._fds if s + fb <= end]:     # full and flushed: done with it
            os.close(self._fds.pop(start))
        w[W_FLUSHED_POS] = end                                   # publish
        w[_W["flush_count"]] += 1
        w[_W["last_flush_ms"]] = int(time.time() * 1000)
        took_us = int((time.perf_counter() - t0) * 1e6)
        w[_W["flush_latency_us"]] = took_us
        self.state.flush_histogram[R.histogram_bucket(took_us)] += 1
        w[_W["flush_latency_sum_us"]] += took_us
        notify_if_waiting(self.state.writer_waiting, self.doorbell)
        if self.state.sync_flush:
            # Under SYNC_FLUSH a record becomes readable when it is flushed: wake the consumers that
            # sleep on flush_count (they cannot say they wait: their mapping is read-only).
            self.state.flush_count_word.wake()
        return end

    def _failed(self, e: OSError) -> None:
        w = self.state.w
        w[W_FLUSH_ERROR] = e.errno or -1
        log.critical("flusher: fdatasync of the commitlog failed (%s): nothing written after position %d "
                     "is known to be on disk; writes are refused until the broker is restarted",
                     os.strerror(e.errno or 0), w[W_FLUSHED_POS])
        notify_if_waiting(self.state.writer_waiting, self.doorbell)

    def run_once(self, now_s: float) -> bool:
        """Flush if the policy says so; True if it flushed."""
        w = self.state.w
        end = min(w[W_WRITE_POS], w[W_COMMITTED_POS])      # what is in the files
        flushed = w[W_FLUSHED_POS]
        did = False
        if w[W_FLUSH_ERROR]:
            pass                    # nothing more is ever flushed in this run (see the module doc)
        elif self.sync:
            if w[W_FLUSH_REQUEST_POS] > flushed:
                self.flush_to(end)
                did = True
        else:
            pages = async_flush_pages(time.time() * 1000, self.async_state, self.cfg.flush_interval_ms,
                                      self.cfg.flush_least_pages, self.cfg.flush_thorough_interval_ms)
            dirty = end // PAGE_BYTES - flushed // PAGE_BYTES
            if pages is not None and end > flushed and dirty >= pages:
                self.flush_to(end)
                did = True
        if now_s >= self._next_checkpoint_s:
            self._next_checkpoint_s = now_s + self.cfg.flush_cq_interval_ms / 1000
            self.write_checkpoint()
        return did

    def write_checkpoint(self, confirm: int | None = None) -> None:
        """Record how far commitlog, consume queues and index are durable (and, at a clean stop,
        the confirmed end of the commitlog)."""
        st = self.state
        ts = st.get("last_store_ts_ms")
        cq = min(st.get("cq_flushed_pos"), st.w[W_FLUSHED_POS])
        fields = dict(physic_msg_ts_ms=ts, logics_msg_ts_ms=ts, index_msg_ts_ms=ts,
                      commitlog_flushed_offset=st.w[W_FLUSHED_POS], cq_flushed_phys_offset=cq,
                      index_flushed_phys_offset=cq)
        if confirm is not None:
            fields["confirm_phys_offset"] = confirm
        self.checkpoint.update(**fields)
        try:
            self.checkpoint.flush()
        except OSError as e:            # the checkpoint only lets recovery start later: an old one is safe
            log.error("flusher: cannot write the checkpoint: %s", os.strerror(e.errno or 0))
            return
        st.set("checkpoint_ms", int(time.time() * 1000))

    def wait(self, stop) -> bool:
        w = self.state.w
        if self.sync:
            ready = lambda: w[W_FLUSH_REQUEST_POS] > w[W_FLUSHED_POS] and not w[W_FLUSH_ERROR]  # noqa: E731
            idle = self.idle
        else:
            ready = lambda: False                                          # noqa: E731 - a timer
            idle = SLEEP
        timeout = IDLE_WAKE_S if self.sync else self.cfg.flush_interval_ms / 1000
        return wait_for(ready, self.state.flush_wake, time.monotonic() + timeout, flag=self.state.flusher_waiting,
                        idle=idle, stop=stop)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self.doorbell = None
        self.doorbell_segment.close()
        self.state.close()


def run(rt: BrokerRuntime, stop) -> int:
    """The flusher process's entry point (spawned by the broker)."""
    f = Flusher(rt)
    log.info("flusher ready: flushed_pos %d (%s)", f.state.get("flushed_pos"),
             "SYNC_FLUSH" if f.sync else "ASYNC_FLUSH")
    try:
        while not stop.is_set():
            f.state.set("flusher_heartbeat_ms", int(time.time() * 1000))
            if not f.run_once(time.monotonic()):
                f.wait(stop)
        # Writer and dispatcher stopped first: everything is final now.
        end = f.state.committed_end()
        # Confirm the end for a normal recovery only if it is on disk (not after a failed sync).
        f.write_checkpoint(confirm=end if f.flush_to(end) >= end else None)
    finally:
        f.close()
    return 0
