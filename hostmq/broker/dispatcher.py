"""The dispatcher process: builds consume queues and the index from the commitlog (RocketMQ's
``ReputMessageService``), and wakes consumers waiting for new messages.

It reads the commitlog through read-only maps up to the ``write_pos`` the writer publishes, appends
consume-queue and index entries (``ConsumeQueueStore``, vectorised), then publishes
``dispatched_pos``, bumps ``dispatch_seq`` in the broker state and wakes every consumer sleeping on
that word's futex (consumers map the state read-only; they register nothing with the broker).

Files it writes: every consume-queue and index file (creates, appends, flushes, deletes those behind
the commitlog's first file); words: the dispatcher line of the broker state.

Crash policy: entries written past the published ``dispatched_pos`` may be torn, so a restarted
dispatcher drops consume-queue entries whose record ends past it and dispatches again from there
(dispatch is idempotent; the index skips what it already holds). Consumers never read an entry past
``dispatched_pos``.

Faults never make it exit (issue 15): a record it cannot parse stops dispatch at that record — logged,
published as ``dispatch_error_pos`` — and an ``OSError`` (ENOSPC, EIO) while creating, writing or
flushing consume-queue and index files stalls it; either way it retries every
``store.dispatch_retry_interval_ms`` while the broker keeps serving what is dispatched, and carries on
from ``dispatched_pos`` once the record reads back whole or the disk has room again (what a failed turn
half wrote is written again: dispatch is idempotent).
"""
from __future__ import annotations

import logging
import os
import time

from .. import records as R
from ..shm.signal import wait_for
from ..store.commitlog import CommitLog
from ..store.consume_queue_store import ConsumeQueueStore
from ..store.message_store import delay_levels_ms
from ..live.runtime import BrokerRuntime
from ..live.state import W_COMMITTED_POS, W_DISPATCHED_POS, W_WRITE_POS, BrokerState

log = logging.getLogger(__name__)

_W = R.STATE_WORD
W_SEQ, W_RECORDS, W_CQ_FLUSHED = _W["dispatch_seq"], _W["dispatched_records"], _W["cq_flushed_pos"]
W_ERROR_POS = _W["dispatch_error_pos"]
NO_ERROR = -1
DISPATCH_BATCH = 8192           # records per scan; the dispatcher publishes after each
IDLE_WAKE_S = 0.1


class Dispatcher:
    """The dispatcher's state and loop body (``run_once``), usable without spawning a process."""

    def __init__(self, rt: BrokerRuntime) -> None:
        self.rt = rt
        cfg = rt.config
        self.idle = cfg.broker.idle_strategy("dispatcher")
        self.flush_interval_s = cfg.store.flush_cq_interval_ms / 1000
        self.state = BrokerState.attach(rt.state_name)
        self.cl = CommitLog(rt.store_dir, self.state.commitlog_file_bytes, writable=False,
                            advice=cfg.store.commitlog_advice,
                            delay_levels_ms=delay_levels_ms(cfg.broker.message_delay_level))
        self.cl.mfq.refresh()
        self.cqs = ConsumeQueueStore(rt.store_dir, cfg.store, self.cl)
        self.retry_interval_s = cfg.store.dispatch_retry_interval_ms / 1000
        self._stalled_until = 0.0      # monotonic time of the next try while stalled (0: not stalled)
        self._fault = ""               # what stalled it, logged once per kind
        self._failing: set[str] = set()     # housekeeping that failed last time (see _try)
        self.state.w[W_ERROR_POS] = NO_ERROR
        self._recovered = self._guard(self._recover)[1]
        self._cl_min = self.cl.min_offset()
        self._next_flush_s = time.monotonic() + self.flush_interval_s
        self.state.set("dispatcher_pid", os.getpid())

    def _recover(self) -> None:
        dispatched = self.state.w[W_DISPATCHED_POS]
        for cq in self.cqs.all_consume_queues():
            cq.recover()
            cq.truncate_dirty(dispatched)
        start = dispatched
        index = self.cqs.index
        if index is not None and index.dropped_files:
            # Index files found damaged at open were deleted (a dispatcher killed while it created
            # one): what they held lies below dispatched_pos, so dispatch again from the end of the
            # index that is left — consume queues skip what they hold, the index re-adds the keys.
            start = max(min(dispatched, index.max_indexed_phys_offset()), self.cl.min_offset())
            if start < dispatched:
                log.warning("dispatcher: %d damaged index files deleted; re-indexing the commitlog from %d "
                            "(dispatched_pos %d)", index.dropped_files, start, dispatched)
        self.cqs.dispatched_phys = start

    # -- the hot path ---------------------------------------------------------------------------------
    def run_once(self) -> int:
        """Dispatch what the writer published since last time; returns the records dispatched."""
        w = self.state.w
        end = min(w[W_WRITE_POS], w[W_COMMITTED_POS])     # published and in the files
        start = self.cqs.dispatched_phys
        if end <= start or (self._stalled_until and time.monotonic() < self._stalled_until):
            return 0
        if not self._recovered:
            self._recovered = self._guard(self._recover)[1]
            if not self._recovered:
                return 0
        mfq = self.cl.mfq
        last = mfq.last()
        if last is None or end > last.file_end_offset or start < mfq.min_offset():
            mfq.refresh()
        done, ok = self._guard(self.cqs.redispatch, start, end, DISPATCH_BATCH)
        n = done[0] if ok else 0
        error = self.cqs.dispatch_error if ok else None
        if self.cqs.dispatched_phys != start:
            # Publish (entries are complete below it); never backwards while re-indexing below it.
            w[W_DISPATCHED_POS] = max(w[W_DISPATCHED_POS], self.cqs.dispatched_phys)
            w[W_RECORDS] += n
            w[W_SEQ] += 1
            # Consumers cannot tell us they wait (their mapping is read-only): always wake. A
            # FUTEX_WAKE nobody sleeps on costs about a microsecond, once per publish.
            self.state.dispatch_seq_word.wake()
        w[W_ERROR_POS] = error[0] if error is not None else NO_ERROR
        if error is not None:
            self._stall("record", f"a broken record at commitlog offset {error[0]}: {error[1]}")
        elif ok:
            self._resume()
        return n

    def _guard(self, fn, *args) -> tuple:
        """``(fn(*args), True)``; after an OSError (disk full, I/O error) ``(None, False)`` and dispatch
        stalls instead of the process ending."""
        try:
            return fn(*args), True
        except OSError as e:
            self._stall("disk", f"{fn.__name__}: {e}")
            return None, False

    def _stall(self, kind: str, what: str) -> None:
        self._stalled_until = time.monotonic() + self.retry_interval_s
        if not self._fault.startswith(kind):
            log.error("dispatcher: stalled by %s; retrying every %.1f s", what, self.retry_interval_s)
        self._fault = f"{kind}: {what}"

    def _resume(self) -> None:
        if self._fault:
            log.warning("dispatcher: dispatching again (was stalled by %s)", self._fault)
        self._fault = ""
        self._stalled_until = 0.0

    def wait(self, stop, timeout_s: float = IDLE_WAKE_S) -> bool:
        w = self.state.w
        if self._stalled_until:         # new records cannot help before the retry time
            timeout_s = min(timeout_s, max(self._stalled_until - time.monotonic(), 0.0))
            return wait_for(lambda: False, self.state.dispatch_wake, time.monotonic() + timeout_s,
                            flag=self.state.dispatcher_waiting, spin_s=0.0, stop=stop)
        return wait_for(lambda: min(w[W_WRITE_POS], w[W_COMMITTED_POS]) != self.cqs.dispatched_phys,
                        self.state.dispatch_wake, time.monotonic() + timeout_s,
                        flag=self.state.dispatcher_waiting, idle=self.idle, stop=stop)

    # -- housekeeping ---------------------------------------------------------------------------------
    def housekeeping(self, now_s: float) -> None:
        """Flush consume queues and index on their interval; drop files behind the commitlog."""
        self.state.set("dispatcher_heartbeat_ms", int(time.time() * 1000))
        if now_s >= self._next_flush_s:
            self._next_flush_s = now_s + self.flush_interval_s
            self._try("flushing consume queues", self.flush)
        self.cl.mfq.drop_below(self.state.consumed_below())
        first = self.cl.mfq.first()
        if first is not None and not os.path.exists(first.path):     # the writer deleted expired files
            self.cl.mfq.refresh()
            cl_min = self.cl.min_offset()
            if cl_min > self._cl_min and not self._try("deleting expired files", self.cqs.delete_expired, cl_min):
                return                  # tried again next time
            self._cl_min = cl_min

    def _try(self, what: str, fn, *args) -> bool:
        """Housekeeping that may fail on a full or failing disk: logged once per failing streak,
        tried again next time; dispatch goes on meanwhile."""
        try:
            fn(*args)
        except OSError as e:
            if what not in self._failing:
                log.error("dispatcher: %s failed (%s); tried again at its next turn", what, e)
            self._failing.add(what)
            return False
        if what in self._failing:
            log.warning("dispatcher: %s works again", what)
            self._failing.discard(what)
        return True

    def flush(self) -> None:
        """Make consume queues and index durable; publish how far (never past a failed flush)."""
        upto = self.cqs.dispatched_phys
        self.cqs.flush()
        self.state.w[W_CQ_FLUSHED] = upto

    def close(self) -> None:
        self.cqs.close()
        self.cl.close()
        self.state.close()


def run(rt: BrokerRuntime, stop) -> int:
    """The dispatcher process's entry point (spawned by the broker)."""
    if rt.config.broker.dispatcher_nice > 0:
        # On a small machine the dispatcher's per-message work would preempt the producer ↔ writer
        # ping-pong that acknowledges sends; under load it batches, so a lower priority costs little.
        os.nice(rt.config.broker.dispatcher_nice)
    d = Dispatcher(rt)
    log.info("dispatcher ready: dispatched_pos %d", d.cqs.dispatched_phys)
    next_housekeeping = 0.0
    try:
        while not stop.is_set():
            if not d.run_once():
                d.wait(stop)
            now = time.monotonic()
            if now >= next_housekeeping:
                d.housekeeping(now)
                next_housekeeping = now + IDLE_WAKE_S
        # The writer stops first: catch up with everything it published, then make it durable.
        while d.run_once():
            pass
        if not d._try("flushing consume queues", d.flush):
            log.error("dispatcher: consume queues not flushed at stop; the next start recovers them")
    finally:
        d.close()
    return 0
