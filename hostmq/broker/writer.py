"""The writer process: the only appender of the commitlog (docs/internals.md: processes, shared-memory rules).

It serves every producer session of its broker: it drains each ingress ring in batches — copying
the frames out of the ring first, so a producer cannot change what was checked — validates every
record (``validate``), appends the records, writes one completion per frame into the ring and wakes
the producer. It publishes ``write_pos`` in the broker state after each batch and wakes the
dispatcher. Rings are producers' sealed memfds; the writer opens the broker's descriptor of each
(``/proc/BROKER_PID/fd/FD``, the session table says which) and sleeps on the broker's doorbell. Under SYNC_FLUSH a batch's completions are published only once the flusher has
made the commitlog durable past it (group commit), or with FLUSH_DISK_TIMEOUT after
``sync_flush_timeout_ms``.

Files and words it writes: the commitlog files (creates, appends, zeroes a torn tail, deletes expired
ones), the writer lines of the broker state (``write_pos``, intent, …), the writer attach table, and
in each ring the writer-owned words and completion entries.

Exactly once across a writer crash: each batch goes through ``ingress.step.serve_once`` (copy,
intent, check + append, stage, publish ``write_pos``, journal) and ``step.release``; a restarted writer
zeroes the commitlog after the published ``write_pos`` (a torn batch can never be read or resurrected
by recovery), journals a batch that was published but not journalled (``step.resolve_intent``), and
rings resume from their journals — see that module for why no acknowledged message is lost or
duplicated. This module adds the policy around the step: refusals, wake-ups, group commit and
SYNC_MASTER waits, sessions, and file housekeeping.
"""
from __future__ import annotations

import logging
import os
import time
from collections import deque
from typing import NamedTuple

import numpy as np

from .. import records as R
from ..errors import RingCorruptError
from ..ingress import step
from ..ingress.step import I_PHYS, I_SLOT, I_VALID
from ..shm.signal import notify_if_waiting, wait_for
from ..store import cleanup
from ..store.commitlog import CommitLog
from ..store.queue_table import QueueTable
from ..store.message_store import delay_levels_ms
from ..store.readonly import queue_offsets_table
from ..store.transient_pool import TransientStorePool, salvage
from .refusals import WriteRefusals
from ..live.runtime import MAX_RING_DATA_BYTES, BrokerRuntime
from ..live.state import (W_COMMITTED_POS, W_FLUSHED_POS, W_SESSIONS_VERSION, W_TOPICS_VERSION, W_WRITE_POS,
                    BrokerState, open_doorbell)
from .topics import TopicTable, topics_path
from .writer_sessions import RingSessions, _Attached

log = logging.getLogger(__name__)

_W = R.STATE_WORD
W_LAST_TS, W_APPENDED = _W["last_store_ts_ms"], _W["appended_records"]
W_HEARTBEAT, W_FLUSH_REQ = _W["writer_heartbeat_ms"], _W["flush_request_pos"]
W_HA_SLAVES, W_REPLICATED, W_CONFIRMED = _W["ha_slaves"], _W["replicated_pos"], _W["confirmed_pos"]
W_FLUSH_ERROR = _W["flush_error"]
W_FENCED_EPOCH = _W["fenced_epoch"]
DISK_CHECK_INTERVAL_S = 10.0
IDLE_WAKE_S = 0.1                   # the loop runs its housekeeping at least this often
BUSY_WINDOW_S = 0.002               # "just worked": the longer busy spin applies this long after work
# The dispatcher is woken at most this often while consumers tail (they read new records from the
# commitlog, not from the consume queues). 5 ms, the broker's long-poll check interval, so a held
# remote pull waits no more than before for its answer; 1 ms cost a delivery 12-14 µs p50 on 2 vCPUs
# (each wake-up's Python round, 0.15-0.6 ms, held a CPU the delivery path then lacked:
# docs/performance.md "Issue 29, seventh part").
DISPATCH_WAKE_DELAY_S = 0.005
LOOP_SLICE_S = 0.05                 # the native loop hands back at least this often (stop, timers)


class _Pending(NamedTuple):
    """Completions of one batch waiting until the commitlog to ``phys_end`` is durable (SYNC_FLUSH)
    and/or acknowledged by a slave (SYNC_MASTER)."""

    slot: int
    generation: int
    cw_start: int
    cw_end: int
    data_end: int
    phys_end: int
    since_s: float
    flush: bool = True
    slave: bool = False


def writer_wakes_queues(store_config) -> bool:
    """Whether a batch is readable as soon as the writer publishes it (no transient store pool, no
    SYNC_FLUSH), so the writer wakes its queues' consumers itself (the broker says so in its state,
    ``queue_wakes``, for consumers to know what to sleep on)."""
    return store_config.flush_disk_type != "SYNC_FLUSH" and not store_config.transient_store_pool_enable


def torn_tail_bytes(config) -> int:
    """How far past ``write_pos`` a killed writer may have written: one ring batch plus one frame."""
    return config.broker.writer_batch_bytes + MAX_RING_DATA_BYTES // 2 + 4096


class Writer(RingSessions):
    """The writer's state and loop body (``run_once``), usable without spawning a process."""

    def __init__(self, rt: BrokerRuntime) -> None:
        self.rt = rt
        cfg = rt.config
        self.limits = step.Limits(cfg.store.max_message_bytes, cfg.store.max_properties_bytes,
                                  cfg.broker.writer_batch_bytes)
        self.idle = cfg.broker.idle_strategy("writer")          # sleep: no spin at all (docs/tuning.md)
        self.busy_idle = self.idle.with_budget(max(self.idle.spin_us, cfg.broker.writer_busy_spin_s * 1e6))
        self.last_work_s = 0.0
        self.sync_timeout_s = cfg.store.sync_flush_timeout_ms / 1000
        # SYNC_MASTER (RocketMQ handleHA): a send is answered once a slave acknowledged its bytes —
        # one ack covers every send below it — or FLUSH_SLAVE_TIMEOUT; SLAVE_NOT_AVAILABLE at once when
        # no slave is connected or it is too far behind. Either way the message is stored.
        self.sync_master = cfg.broker.role == "SYNC_MASTER"
        self.slave_timeout_s = cfg.broker.ha_sync_timeout_ms / 1000
        self.max_gap_bytes = cfg.broker.ha_max_gap_bytes
        self.state = BrokerState.attach(rt.state_name)
        st = self.state
        self.sync = st.sync_flush
        # Transient store pool (ASYNC_FLUSH only, as in RocketMQ): buffers the broker created.
        self.pool = TransientStorePool(st.commitlog_file_bytes, cfg.store.transient_store_pool_size,
                                       segment_names=rt.pool_names(cfg.store.transient_store_pool_size)) \
            if cfg.store.transient_store_pool_enable and not self.sync else None
        self.commit_interval_s = cfg.store.commit_interval_ms / 1000
        self.commit_least_pages = cfg.store.commit_least_pages
        self._next_commit_s = 0.0
        self.cl = CommitLog(rt.store_dir, st.commitlog_file_bytes, store_host=st.store_host,
                            warm=cfg.store.warm_mapped_file, advice=cfg.store.commitlog_advice,
                            preallocate_at=cfg.store.preallocate_at_ratio if cfg.store.preallocate_next_file else None,
                            lock_head=cfg.store.mlock_commitlog_head, pool=self.pool,
                            delay_levels_ms=delay_levels_ms(cfg.broker.message_delay_level))
        self.cl.on_commit = self._committed
        self.cl.mfq.load()
        self.doorbell_segment, self.doorbell = open_doorbell(st)
        self._doorbell_words = self.doorbell_segment.array(np.int64, 1)     # the native loop sleeps on it
        self.topics = TopicTable(topics_path(rt.config_dir))
        self._queues: dict[bytes, int] = {}
        self._topics_seen = -1
        self._sessions_seen = -1
        self.rings: dict[int, _Attached] = {}
        self._serving: list[_Attached] = []
        self._flags: list = []
        self.pending: deque[_Pending] = deque()
        self.refusals = WriteRefusals()
        self._next_disk_check_s = 0.0
        # Consumers read records past dispatched_pos from the commitlog (store/tail.py): wake the
        # ones sleeping on a queue as soon as a batch for it is readable — at once unless a pool
        # (readable at the commit: the dispatcher wakes them) or SYNC_FLUSH (the flusher does).
        self.wake_queues = st.queue_wakes and self.pool is None and not self.sync
        self._woken: set[int] = set()      # queue wake words of the batch being appended
        self._step_started_ns = 0           # when _serve's step began (step.stamp_wake)
        # What the native step may follow a batch with in the same call (step.Follow), when nothing
        # else must come first: no pool, ASYNC_FLUSH, not a SYNC_MASTER, nothing pending (checked per
        # batch with the replication process, which wants to hear of each append).
        self._follow = step.follow_of(True, st.queue_wake if self.wake_queues else None, True) \
            if self.pool is None and not self.sync and not self.sync_master else None
        self._dispatch_due_s = 0.0          # monotonic time of a deferred dispatcher wake-up (0: none)
        self._recover()
        st.set("writer_pid", os.getpid())

    # -- start-up -------------------------------------------------------------------------------------
    def _recover(self) -> None:
        """Cut the commitlog back to the published ``write_pos``, rebuild the queue offsets, resolve
        an intent left by a killed predecessor, and pick up every session."""
        st = self.state
        write_pos = self._salvage(st.w[W_WRITE_POS])
        self._truncate_after(write_pos)
        st.w[W_COMMITTED_POS] = write_pos
        self.cl.last_store_ts_ms = st.w[W_LAST_TS]
        table = queue_offsets_table(self.rt.store_dir, self.rt.config.store, self.cl,
                                    self.state.w[_W["dispatched_pos"]], write_pos)
        # The native step reads and updates the queue offsets of the writable topics in place.
        self.cl.topic_queue_table = QueueTable(table) if step.USE_NATIVE else table
        self._load_topics()
        self._sync_sessions()
        if st.w[I_VALID] and write_pos > st.w[I_PHYS]:
            # Its batch was published; the store time words after write_pos may not have been: the
            # next store time must not go below the batch's (a wall clock stepped back meanwhile).
            # ``appended_records`` (a metric) may miss that batch: adding it again could count it twice.
            for r in self.cl.records_between(st.w[I_PHYS], write_pos):
                self.cl.last_store_ts_ms = max(self.cl.last_store_ts_ms, r.store_ts_ms)
            st.w[W_LAST_TS] = self.cl.last_store_ts_ms
        if st.w[I_VALID]:
            a = self.rings.get(st.w[I_SLOT])
            if a is not None and step.resolve_intent(st.w, a.slot, a.generation, a.ring):
                log.info("writer: batch of slot %d was published before the last writer died; journalled it",
                         a.slot)
                self._detach(a, keep_attached=True)
                self._attach(a.slot, a.generation)
            st.w[I_VALID] = 0
        for a in list(self.rings.values()):
            self._resume_staged(a)

    def _salvage(self, write_pos: int) -> int:
        """Pool: commit what a killed predecessor left in the pool (``transient_pool.salvage``)."""
        if self.pool is None:
            return write_pos
        end = salvage(self.pool, self.cl.mfq, self.state.w[W_COMMITTED_POS], write_pos)
        self.state.w[W_WRITE_POS] = end
        return end

    def _committed(self, phys_end: int) -> None:
        """The commit step moved appended bytes to the file: readers may have them."""
        self.state.w[W_COMMITTED_POS] = phys_end
        notify_if_waiting(self.state.dispatcher_waiting, self.state.dispatch_wake)
        if self._ha_wants_batches():
            self.state.ha_wake.post()           # the ha process streams committed bytes to the slaves

    def commit_due(self, now_s: float) -> None:
        """Commit everything appended at least every ``commit_interval_ms`` (RocketMQ
        CommitRealTimeService; between times ``_serve`` commits once ``commit_least_pages`` wait)."""
        if self.pool is not None and now_s >= self._next_commit_s:
            self._next_commit_s = now_s + self.commit_interval_s
            self.cl.commit(0)

    def _truncate_after(self, write_pos: int) -> None:
        """Delete files after the one holding ``write_pos`` and zero what a torn batch may have left."""
        self.cl.continue_at(write_pos, torn_tail_bytes(self.rt.config))

    def _load_topics(self) -> None:
        self._topics_seen = self.state.w[W_TOPICS_VERSION]
        try:
            self.topics.load()
        except Exception:
            log.exception("writer: cannot reload topics; keeping the previous table")
        self._queues = {n.encode(): self.topics.writable_queues(n) for n in self.topics.topics}
        if isinstance(self.cl.topic_queue_table, QueueTable):
            self.cl.topic_queue_table.set_topics(self._queues)

    # -- the hot path ---------------------------------------------------------------------------------
    def run_once(self) -> int:
        """Serve every ring once; returns the frames handled."""
        w = self.state.w
        if w[W_SESSIONS_VERSION] != self._sessions_seen:
            self._sync_sessions()
        if w[W_TOPICS_VERSION] != self._topics_seen:
            self._load_topics()
        n = 0
        for a in self._serving:
            if a.ring.has_frames():
                n += self._serve(a)
        if self.pending:
            self._publish_synced(time.monotonic())
        return n

    def loop_ready(self) -> bool:
        """Whether the native loop (:meth:`serve_loop`) may serve now: every batch would be followed in
        the native call (``_follow``: no pool, ASYNC_FLUSH, not a SYNC_MASTER), nothing is pending,
        no replication follows the appends, writes are not refused, sessions and topics are current."""
        if self._follow is None or self.pending or not step.loop_allowed(self.cl, self._queues):
            return False
        w = self.state.w
        return w[W_SESSIONS_VERSION] == self._sessions_seen and w[W_TOPICS_VERSION] == self._topics_seen \
            and not w[W_FENCED_EPOCH] and not self._ha_wants_batches() \
            and not self.refusals.status(time.monotonic(), w[W_FLUSH_ERROR])

    def serve_loop(self, until_s: float) -> int:
        """The loop body in C until ``until_s`` or something for Python (``step.serve_loop``: serve,
        follow, wait — what ``run_once`` and ``wait`` do in this case); a ring it hands back is served
        here. Returns the frames handled."""
        r = step.serve_loop(self._serving, self.state.w, self._doorbell_words, self.state.queue_wake, self.cl,
                            self.limits, sessions_seen=self._sessions_seen, topics_seen=self._topics_seen,
                            until_s=until_s, dispatch_due_s=self._dispatch_due_s,
                            dispatch_delay_s=DISPATCH_WAKE_DELAY_S, idle=self.idle, busy_idle=self.busy_idle,
                            busy_window_s=BUSY_WINDOW_S, last_work_s=self.last_work_s)
        self._dispatch_due_s, self.last_work_s = r.dispatch_due_s, r.last_work_s
        n = r.frames
        if r.exit == step.LoopExit.FALLBACK:
            n += self._serve(self._serving[r.ring])
        return n

    def _serve(self, a: _Attached) -> int:
        """One step of the batch protocol over ``a``'s ring (``ingress.step.serve_once``), then the
        writer's policy: wake consumers, answer at once or after the group commit / a slave's ack."""
        ring = a.ring
        refusal = self.refusals.status(time.monotonic(), self.state.w[W_FLUSH_ERROR])
        if self.state.w[W_FENCED_EPOCH]:
            refusal = R.COMPLETION_NOT_MASTER   # a newer master serves this name (broker/fencing.py)
        follow = self._follow if self._follow is not None and not self.pending and not self._ha_wants_batches() \
            else None
        self._step_started_ns = time.monotonic_ns()
        try:
            b = step.serve_once(ring, a.slot, a.generation, self.state.w, self.cl, self.limits, self._queues,
                                int(time.time() * 1000), refusal=refusal, io_failed=self._io_failed,
                                woken=self._woken if self.wake_queues else None, on_publish=self._published,
                                follow=follow)
        except RingCorruptError as e:
            log.warning("writer: dropping session %d: %s", a.slot, e)
            ring.mark_dropped()
            self._detach(a, keep_attached=False)
            return 0
        if b is None:
            return 0
        self.last_work_s = time.monotonic()
        if b.appended and self.refusals.io_succeeded():
            log.warning("writer: appends succeed again; writes accepted")
        w = self.state.w
        if self._woken:         # consumers first: delivery is what waits longest on this hand-off
            self._wake_queues()
        need_slave = False
        if self.sync_master and b.appended:
            if w[W_HA_SLAVES] and b.phys_end - w[W_REPLICATED] <= self.max_gap_bytes:
                need_slave = True
            else:
                ring.restatus(b.cw_start, b.cw_end, R.COMPLETION_SLAVE_NOT_AVAILABLE)
        need_flush = self.sync and b.appended > 0
        if need_flush or need_slave or self.pending:      # behind a waiting batch: answered in order
            self._add_pending(a, b.cw_start, b.cw_end, b.data_end, b.phys_end, need_flush, need_slave)
        elif not b.followed & step.FOLLOW_RELEASE:        # (else the step answered already)
            step.release(ring, b.cw_end, b.data_end)
        if b.appended:
            self._wake_dispatcher(self.last_work_s)
        return b.frames

    def _published(self, end: int, appended: int) -> None:
        """Right after a batch's ``write_pos`` is published: readable now without a pool (and a
        replication process streams it), else at the pool's next commit."""
        if self.pool is None:
            self.state.w[W_COMMITTED_POS] = end
            if appended and self._ha_wants_batches():
                self.state.ha_wake.post()   # stream it to the slaves (or confirm it to consumers)
        elif appended:
            self.cl.commit(self.commit_least_pages)           # publishes committed_pos if it moved

    def _ha_wants_batches(self) -> bool:
        """Whether the replication process follows the appends: a slave is connected, or it confirms
        what consumers may read (a SYNC_MASTER: ``confirmed_pos`` >= 0)."""
        w = self.state.w
        return bool(w[W_HA_SLAVES]) or w[W_CONFIRMED] >= 0

    def _wake_dispatcher(self, now_s: float) -> None:
        """Wake the dispatcher for what was appended — at once when consumers wait for it (a pool,
        SYNC_FLUSH), else at most every ``DISPATCH_WAKE_DELAY_S``: consumers read the records from
        the tail meanwhile, and a wake-up per message would cost this process a syscall and the
        machine a context switch per message."""
        if not self.wake_queues:
            notify_if_waiting(self.state.dispatcher_waiting, self.state.dispatch_wake)
        elif not self._dispatch_due_s:
            self._dispatch_due_s = now_s + DISPATCH_WAKE_DELAY_S

    def wake_dispatcher_due(self, now_s: float) -> None:
        """The deferred dispatcher wake-up (called from the loop)."""
        if self._dispatch_due_s and now_s >= self._dispatch_due_s:
            self._dispatch_due_s = 0.0
            notify_if_waiting(self.state.dispatcher_waiting, self.state.dispatch_wake)

    def _wake_queues(self) -> None:
        """Consumers of the queues the batch appended to may read it now (after ``write_pos``)."""
        st = self.state
        qw, words = st.queue_wake, st.queue_wake_words
        for b in self._woken:
            qw[b] += 1
        step.stamp_wake(st.w, self._step_started_ns)
        for b in self._woken:
            words[b].wake()
        self._woken.clear()

    def _io_failed(self, e: OSError, frame_start: int) -> int:
        """An append failed in the OS: undo its partial bytes, refuse writes for a while; the status."""
        self.cl.rollback(frame_start)
        status, first = self.refusals.io_failed(e.errno, time.monotonic())
        if first:
            log.error("writer: cannot append to the commitlog (%s); writes refused, retried every %.0f s",
                      os.strerror(e.errno or 0), self.refusals.retry_s)
        return status

    def _complete(self, a: _Attached, cw_end: int, data_end: int) -> None:
        step.release(a.ring, cw_end, data_end)

    def _add_pending(self, a: _Attached, cw_start: int, cw_end: int, data_end: int, phys_end: int,
                     flush: bool, slave: bool) -> None:
        self.pending.append(_Pending(a.slot, a.generation, cw_start, cw_end, data_end, phys_end, time.monotonic(),
                                     flush, slave))
        if flush:
            w = self.state.w
            if phys_end > w[W_FLUSH_REQ]:
                w[W_FLUSH_REQ] = phys_end
            notify_if_waiting(self.state.flusher_waiting, self.state.flush_wake)

    def _publish_synced(self, now_s: float) -> None:
        """Answer the pending batches whose wait is over, in order: durable (SYNC_FLUSH) and
        acknowledged by a slave (SYNC_MASTER), or out of time (a timeout status, stored anyway)."""
        failed = self.state.w[W_FLUSH_ERROR] != 0       # the flusher will never get there (fsyncgate)
        while self.pending:
            p = self.pending[0]
            unflushed, unreplicated = self._unmet(p)
            flush_late = failed or now_s - p.since_s >= self.sync_timeout_s
            slave_late = now_s - p.since_s >= self.slave_timeout_s
            if (unflushed and not flush_late) or (unreplicated and not slave_late):
                break
            self.pending.popleft()
            a = self.rings.get(p.slot)
            if a is None or a.generation != p.generation:
                continue
            if unflushed:
                a.ring.restatus(p.cw_start, p.cw_end, R.COMPLETION_FLUSH_DISK_TIMEOUT)
            elif unreplicated:
                a.ring.restatus(p.cw_start, p.cw_end, R.COMPLETION_FLUSH_SLAVE_TIMEOUT)
            self._complete(a, p.cw_end, p.data_end)

    def _unmet(self, p: _Pending) -> tuple[bool, bool]:
        """What ``p`` still waits for: (the flusher to reach its end, a slave to acknowledge it)."""
        w = self.state.w
        return p.flush and p.phys_end > w[W_FLUSHED_POS], p.slave and p.phys_end > w[W_REPLICATED]

    # -- waiting and housekeeping ---------------------------------------------------------------------
    def _ready(self) -> bool:
        w = self.state.w
        if w[W_SESSIONS_VERSION] != self._sessions_seen or w[W_TOPICS_VERSION] != self._topics_seen:
            return True
        if self.pending:
            unflushed, unreplicated = self._unmet(self.pending[0])
            if not (unflushed and not w[W_FLUSH_ERROR]) and not unreplicated:
                return True
        for a in self._serving:
            if a.ring.has_frames():
                return True
        return False

    def wait(self, stop, timeout_s: float = IDLE_WAKE_S) -> bool:
        now = time.monotonic()
        deadline = now + timeout_s
        if self.pending:        # a group commit may time out: wake for it
            p = self.pending[0]
            deadline = min(deadline, p.since_s + min(self.sync_timeout_s if p.flush else float("inf"),
                                                     self.slave_timeout_s if p.slave else float("inf")))
        if self.pool is not None and self.cl.uncommitted_bytes():      # ... and so may the commit step
            deadline = min(deadline, max(now, self._next_commit_s))
        if self._dispatch_due_s:                                        # ... and a deferred wake-up
            deadline = min(deadline, self._dispatch_due_s)
        # Right after work the next frame is likely close (a sync producer's turnaround): spin longer
        # then, and only the configured minimum when the writer has been idle (docs/internals.md fact 15).
        idle = self.busy_idle if now - self.last_work_s < BUSY_WINDOW_S else self.idle
        return wait_for(self._ready, self.doorbell, deadline, flag=self._flags, idle=idle, stop=stop)

    def housekeeping(self, now_s: float) -> None:
        self.state.w[W_HEARTBEAT] = int(time.time() * 1000)
        self.cl.mfq.drop_below(self.state.consumed_below())
        if now_s >= self._next_disk_check_s:
            self._next_disk_check_s = now_s + DISK_CHECK_INTERVAL_S
            self._check_disk()

    def _check_disk(self) -> None:
        """Delete expired commitlog files (only what the dispatcher has covered) and refuse writes
        when the disk is too full (RocketMQ CleanCommitLogService + the disk-full check)."""
        cfg = self.rt.config.store
        now_ms = time.time() * 1000
        try:
            ratio = cleanup.disk_used_ratio(self.rt.store_dir)
        except OSError:
            return
        d = cleanup.decide(time.localtime().tm_hour, ratio, cfg.delete_when, cfg.disk_max_used_ratio,
                           cfg.disk_force_clean_ratio, cfg.disk_refuse_ratio)
        if d.delete_expired or d.force:
            gone = cleanup.delete_expired_commitlog(self.cl.mfq, cfg, self.state.w[_W["dispatched_pos"]], now_ms,
                                                    d.force)
            if gone:
                log.info("writer: deleted expired commitlog files %s", gone)
        refuse = ratio > cfg.disk_refuse_ratio
        if self.refusals.disk_ratio(refuse):
            log.warning("writer: disk %.0f%% full: writes %s", ratio * 100, "refused" if refuse else "accepted again")

    def drain_all(self, timeout_s: float) -> None:
        """At stop: append everything producers published, wait for pending group commits."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.run_once() and not self.pending:
                break
            if self.pending and not self.run_once():
                time.sleep(0.0005)
        self.cl.commit(0)           # the dispatcher stops after us: let it cover everything
        self.wake_dispatcher_due(float("inf"))

    def close(self) -> None:
        for a in list(self.rings.values()):
            a.ring.close()
        self.rings.clear()
        self._serving, self._flags = [], []
        self.cl.close()
        if self.pool is not None:
            self.pool.close()
        self.doorbell = self._doorbell_words = None
        self.doorbell_segment.close()
        self._follow = None                 # holds a view of the state's wake words
        self.state.close()


def run(rt: BrokerRuntime, stop) -> int:
    """The writer process's entry point (spawned by the broker)."""
    w = Writer(rt)
    log.info("writer ready: write_pos %d, %d sessions", w.state.get("write_pos"), len(w.rings))
    next_housekeeping = 0.0
    try:
        while not stop.is_set():
            if w.loop_ready():
                w.serve_loop(min(next_housekeeping, time.monotonic() + LOOP_SLICE_S))
            elif not w.run_once():
                w.wait(stop)
            now = time.monotonic()
            w.commit_due(now)
            w.wake_dispatcher_due(now)
            if now >= next_housekeeping:
                w.housekeeping(now)
                next_housekeeping = now + IDLE_WAKE_S
        w.drain_all(rt.config.store.sync_flush_timeout_ms / 1000 + 1.0)
    finally:
        w.close()
    return 0
