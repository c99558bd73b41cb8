"""The broker's scheduler child: delivers delay messages when they are due (RocketMQ
``ScheduleMessageService``; the pure parts are in ``schedule.py``).

It reads the schedule topic's consume queues (one per delay level; the tag code of an entry is its
due time) through a read-only store view, and delivers each due message to its real topic and
queue through an ingress ring of its own broker — as a producer would, so the writer stays the
only appender. Each level's next offset goes to ``config/delayOffset.json`` every second and at
stop, with the commitlog's write position at that moment (a scheduler that finds no position saved
saves the one it started at). Exactly once across crashes: on start, a
due message at or past the saved offsets that was stored before this start may have been delivered
just before the crash; it is skipped if a record of its real topic with its unique id and its
reconsume count (a retry's earlier rounds share the id) is stored — found through the real topic's
index, or else in the commitlog written since the offsets were saved (every delivery of an entry
past them lies there; scanned once per start, and without it a miss of the index, which is derived
data, would deliver the message twice). "Stored before this start" includes what a killed scheduler
left published in its ring: the writer appends that as it drains the dead session, so a new
scheduler first waits until the writer has let go of every session of the previous one
(``_wait_previous_sessions``).
"""
from __future__ import annotations

import logging
import os
import time

from .. import records as R
from ..ingress.session import ProducerSession, Waiter
from ..errors import ConnectError, HostMQError, NoRouteError, ValidationError
from ..message import MessageQueue
from ..store.commitlog import SCHEDULE_TOPIC
from ..store.dispatch import stored_unique_ids
from ..store.index import IndexReader
from ..store.message_store import delay_levels_ms
from ..store.readonly import StoreReader
from ..live.runtime import BrokerRuntime
from ..semantics.schedule import DelayOffsets, corrected_due_ms, timeup_record
from ..live.state import W_DISPATCHED_POS, W_WRITE_POS, BrokerState

log = logging.getLogger(__name__)

TICK_S = 0.1                    # RocketMQ checks each level every 100 ms
PERSIST_INTERVAL_S = 1.0
SEND_TIMEOUT_S = 10.0
RING_BYTES = 1 << 20
LOG_MISSING = 10                # checked due messages not found delivered: this many logged at INFO per start
_RECONSUME = R.HEADER_INDEX["reconsume_times"]
SCAN_MAX_BYTES = 1 << 30        # the start's commitlog scan covers at most this much (else the index alone)


class Scheduler:
    def __init__(self, rt: BrokerRuntime, state: BrokerState, session: ProducerSession) -> None:
        self.rt, self.state, self.session = rt, state, session
        cfg = rt.config
        self.delays_ms = list(delay_levels_ms(cfg.broker.message_delay_level))
        self.levels = len(self.delays_ms)
        self.reader = StoreReader(rt.store_dir, cfg.store, broker=rt.name, scan_queues=False,
                                  limit_phys=state.readable_pos)
        self.offsets = DelayOffsets(rt.config_file("delayOffset.json"))
        self.index = IndexReader(rt.store_dir, cfg.store.index_slots, cfg.store.index_entries) \
            if cfg.store.message_index_enable else None
        # Entries stored before this start may have been delivered by a scheduler that died before
        # it saved its offsets: check those against the real topics' index.
        self.check_below = {lvl: self.reader.refresh_queue(SCHEDULE_TOPIC, lvl - 1) for lvl in self.levels_range()}
        self.stored_end = int(state.w[W_WRITE_POS])     # what was stored before this start ends here
        self._since_saved: dict[tuple[str, str], list[int]] | None = None
        self._scanned = False
        self._saved_from = self.offsets.write_pos       # previous schedulers' deliveries lie past it
        if self._saved_from is None:
            # No position saved (no file: this store's first scheduler, which may start after delay
            # messages were stored; or an older version's file): what earlier schedulers delivered only
            # the index can find, but all this one delivers lies past this start's end — saved now as
            # the position, so that a successor's scan finds it even if this one dies before its first
            # periodic save (without it, a crash then doubled every delivery when the index was off).
            self._saved_from = self.stored_end
        self.persist()
        self.delivered = self.skipped = 0
        self.not_again = self._not_again_logged = 0     # due messages found delivered before a restart
        self.checked_missing = 0                         # checked ones not found: delivered now

    def levels_range(self):
        return range(1, self.levels + 1)

    def run_once(self, now_ms: int) -> float:
        """Deliver what is due; seconds until the next due message (at most TICK_S)."""
        wait_ms = TICK_S * 1000
        for level in self.levels_range():
            qid = level - 1
            end = self.reader.refresh_queue(SCHEDULE_TOPIC, qid)
            off = self.offsets.get(level)
            if off >= end:
                continue
            cq = self.reader.queues.get((SCHEDULE_TOPIC, qid))
            off = max(off, cq.min_offset())
            while off < end:
                entry = cq.entry(off)
                if entry is None:
                    break
                phys, size, due_ms = entry
                due_ms = corrected_due_ms(due_ms, now_ms, self.delays_ms[qid])
                if due_ms > now_ms:
                    wait_ms = min(wait_ms, due_ms - now_ms)
                    break
                self._deliver(level, off, phys)
                off += 1
                self.offsets.set(level, off)
        self.state.set("delayed_delivered", self.delivered)
        self.state.set("delayed_skipped", self.skipped)
        if self.not_again > self._not_again_logged:      # one line per round, not one per message
            log.info("scheduler: %d due messages were delivered before the restart; not again (each at DEBUG)",
                     self.not_again - self._not_again_logged)
            self._not_again_logged = self.not_again
        return max(0.001, wait_ms / 1000)

    def _deliver(self, level: int, off: int, phys: int) -> None:
        try:
            raw = self.reader.commitlog.record_at(phys)
            topic, qid, rec, uniq = timeup_record(raw, self.session.store_host)
        except (HostMQError, ValueError) as e:
            log.error("scheduler: schedule record at %d (level %d, offset %d) is unusable, skipped: %s",
                      phys, level, off, e)
            self.skipped += 1
            return
        if off < self.check_below[level] and uniq:
            found, why = self._already_stored(topic, uniq, R.MSG_HEADER.unpack_from(raw, 0)[_RECONSUME])
            if found:
                log.debug("scheduler: %s was delivered before the restart; not again", uniq)
                self.not_again += 1
                return
            # Stored before this start and not found delivered: delivered now. What the check saw
            # goes to the log for whoever reads a duplicate (the first few at INFO, per start).
            self.checked_missing += 1
            log.log(logging.INFO if self.checked_missing <= LOG_MISSING else logging.DEBUG,
                    "scheduler: %s (level %d offset %d) was not delivered before the restart (index: %s); "
                    "delivering it", uniq, level, off, why)
        mq = MessageQueue(topic, self.rt.name, qid)
        try:        # broker busy or stopping raises on: the supervisor restarts us
            self.session.send(R.FRAME_MESSAGE, rec, 1, Waiter(mq), time.monotonic() + SEND_TIMEOUT_S)
        except (ValidationError, NoRouteError) as e:
            # The real topic or queue is gone (RocketMQ drops such a message too): say so, go on.
            log.error("scheduler: cannot deliver %s to %s: %s", uniq, mq, e)
            self.skipped += 1
            return
        self.delivered += 1

    def _already_stored(self, topic: str, uniq: str, reconsume_times: int) -> tuple[bool, str]:
        """Whether the real copy of ``uniq`` (this round of it: ``reconsume_times``) is stored — by the
        index, else by the commitlog written since the offsets were saved; if not, what was seen."""
        seen = []
        if self.index is not None:
            for phys in self.index.query(topic, uniq, 8):
                why = self._is_copy(phys, topic, uniq, reconsume_times)
                if not why:
                    return True, ""
                seen.append(f"{phys}: {why}")
        why = "; ".join(seen) or ("no entry" if self.index is not None else "no index")
        since = self._stored_since_saved()
        if since is None:
            return False, why + "; no commitlog scan"
        for phys in since.get((topic, uniq), ()):
            if not self._is_copy(phys, topic, uniq, reconsume_times):
                if self.index is not None:
                    # The index is derived data, and a query is a superset; it must not miss a copy.
                    log.warning("scheduler: %s of %s was delivered before the restart at %d; the index did not "
                                "find it (%s; %s), the commitlog scan did", uniq, topic, phys, why,
                                self.index.explain(topic, uniq))
                return True, ""
        return False, why + f"; not in the commitlog from {self._saved_from}"

    def _is_copy(self, phys: int, topic: str, uniq: str, reconsume_times: int) -> str:
        """'' if the record at ``phys`` is that copy, else why not."""
        try:
            m = self.reader.view(self.reader.commitlog.msg_id(phys))
        except (HostMQError, ValueError) as e:
            return str(e)
        if m.topic != topic or m.unique_id != uniq:
            return "another message"
        if m.reconsume_times != reconsume_times:
            return f"another round (reconsume count {m.reconsume_times})"
        return ""

    def _stored_since_saved(self) -> dict[tuple[str, str], list[int]] | None:
        """``(topic, unique id) → phys offsets`` of the records stored from the saved offsets' write
        position (this start's end where none was saved) to this start's end, scanned at the first
        need; None where the range is over SCAN_MAX_BYTES."""
        if self._scanned:
            return self._since_saved
        self._scanned = True
        start = self._saved_from
        cl = self.reader.commitlog
        cl.mfq.refresh()
        start = max(start, cl.min_offset())
        if self.stored_end - start > SCAN_MAX_BYTES:
            log.warning("scheduler: %d bytes were stored since the delay offsets were saved; past the %d a "
                        "start scans, only the index tells what was delivered", self.stored_end - start,
                        SCAN_MAX_BYTES)
            return None
        self._since_saved = stored_unique_ids(cl, start, self.stored_end)
        return self._since_saved

    def persist(self) -> None:
        """Save the offsets with a position every delivery of an entry at or past them lies after:
        the write position now once they are past all that was stored before this start (then only
        this scheduler delivers those entries, from now on); until then, the one saved before."""
        mine = all(self.offsets.get(lvl) >= self.check_below[lvl] for lvl in self.levels_range())
        self.offsets.persist(int(self.state.w[W_WRITE_POS]) if mine else self._saved_from)

    def close(self) -> None:
        self.persist()
        if self.index is not None:
            self.index.close()
        self.reader.close()


def _wait_running(state: BrokerState, stop) -> bool:
    while not stop.is_set():
        if state.get("broker_state") == R.BROKER_RUNNING:
            return True
        stop.wait(0.02)
    return False


def _sessions_of(state: BrokerState, pid: int) -> list[int]:
    """Session slots the writer still holds for process ``pid`` — a scheduler before this one. Once
    that process is gone (the supervisor reaps a child before it starts the next), every slot of its
    pid counts; should the pid be alive again, reused, only the closing ones (a new owner's open
    session is not ours to wait for)."""
    if pid <= 0 or pid == os.getpid():
        return []
    reused = os.path.exists(f"/proc/{pid}")
    held = []
    for slot in state.active_slots():
        st, _gen, owner, _fd, _name = state.slot(slot)
        if owner == pid and (st == R.SLOT_CLOSING or not reused):
            held.append(slot)
    return held


def _wait_previous_sessions(state: BrokerState, pid: int, stop) -> bool:
    """A scheduler killed while it delivered may have left a published frame in its ring; the
    writer appends it only as it drains that closed session — possibly after this start. Until the
    writer has let go of the ring, the index cannot say whether that message was delivered: wait."""
    since = time.monotonic()
    said = False
    while _sessions_of(state, pid):
        if stop.is_set():
            return False
        if not said and time.monotonic() - since >= 1.0:
            log.info("scheduler: waiting for the writer to append what the previous scheduler (pid %d) "
                     "left in its ring", pid)
            said = True
        stop.wait(0.01)
    return not stop.is_set()


def run(rt: BrokerRuntime, stop) -> int:
    """The scheduler process's entry point (spawned by the broker)."""
    state = BrokerState.attach(rt.state_name)
    previous = int(state.get("scheduler_pid"))
    state.set("scheduler_pid", os.getpid())
    session = sched = None
    try:
        if not _wait_running(state, stop):
            return 0
        if not _wait_previous_sessions(state, previous, stop):
            return 0
        # Records the writer published before we started must be dispatched (and indexed) before
        # the index can tell whether a due message was delivered already.
        target = state.w[W_WRITE_POS]
        while state.w[W_DISPATCHED_POS] < target and not stop.is_set():
            stop.wait(0.01)
        session = ProducerSession(rt, rt.name, rt.address, data_bytes=RING_BYTES, completion_entries=256,
                                  spin_s=0.0)
        sched = Scheduler(rt, state, session)
        log.info("scheduler ready: %d levels, offsets %s", sched.levels, sched.offsets.offsets)
        next_persist = time.monotonic() + PERSIST_INTERVAL_S
        while not stop.is_set():
            wait_s = sched.run_once(int(time.time() * 1000))
            state.set("scheduler_heartbeat_ms", int(time.time() * 1000))
            if time.monotonic() >= next_persist:
                sched.persist()
                next_persist = time.monotonic() + PERSIST_INTERVAL_S
            stop.wait(wait_s)
    finally:
        if sched is not None:
            sched.close()
        if session is not None:
            if stop.is_set() and session.broken is None:
                # The broker is stopping and no longer answers requests: skip the goodbye.
                session.broken = ConnectError("broker stopping")
            session.close(1.0)
        state.close()
    return 0
