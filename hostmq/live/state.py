"""The broker state segment: positions, pids, waiting flags, futex words and the session table that
the broker's processes share (layout and ownership: ``records.BROKER_STATE``).

Created by the broker process (owner) before it starts its children; the writer, dispatcher and
flusher attach read-write and store only into their own lines; clients attach read-only to watch
positions (a consumer sleeps on the futexes of ``dispatch_seq`` and of its queues' wake words) and
liveness (``broker_pid``).

Word access is ``state.w[W_WRITE_POS]`` (an aligned native int64, docs/internals.md fact 14); the hot loops use
the ``W_*`` constants directly. Tables are numpy views of ``records.STATE_SLOT`` rows.
"""
from __future__ import annotations

import os
import time

import numpy as np
import psutil

from .. import records as R
from ..errors import BrokerBusyError, SegmentError
from ..shm.futex import FutexWord
from ..shm.segment import Segment, info_owner_alive
from ..shm.signal import Flag

_W = R.STATE_WORD
W_WRITE_POS = _W["write_pos"]
W_COMMITTED_POS = _W["committed_pos"]
W_CONSUMED_BELOW_POS = _W["consumed_below_pos"]
W_DISPATCHED_POS = _W["dispatched_pos"]
W_FLUSHED_POS = _W["flushed_pos"]
W_BROKER_STATE = _W["broker_state"]
W_SESSIONS_VERSION = _W["sessions_version"]
W_TOPICS_VERSION = _W["topics_version"]
W_DISPATCH_SEQ = _W["dispatch_seq"]
W_CONFIRMED_POS = _W["confirmed_pos"]
W_FLUSH_REQUEST_POS = _W["flush_request_pos"]


class BrokerState:
    """A mapped broker state segment."""

    def __init__(self, segment: Segment) -> None:
        self.segment = segment
        self.name = segment.name
        self.w = segment.buf[:R.BROKER_STATE.itemsize].cast("q")
        hdr = segment.array(R.BROKER_STATE, count=1)[0]
        self.session_slots = int(hdr["session_slots"])
        self.doorbell_fd = int(hdr["doorbell_fd"])
        self.broker_pid = int(hdr["broker_pid"])
        self.store_host = bytes(hdr["store_host"]).ljust(8, b"\0")
        self.commitlog_file_bytes = int(hdr["commitlog_file_bytes"])
        self.consume_queue_file_entries = int(hdr["consume_queue_file_entries"])
        self.index_slots, self.index_entries = int(hdr["index_slots"]), int(hdr["index_entries"])
        self.sync_flush = int(hdr["flush_disk_type"]) == R.FLUSH_SYNC
        self.queue_wakes = bool(hdr["queue_wakes"])     # the writer wakes queue words (writer.wake_queues)
        self.is_slave = int(hdr["role"]) == R.ROLE_SLAVE       # live/role.py: what it plays in its group
        self.role_epoch = int(hdr["role_epoch"])
        self.slave_read_lag_bytes = int(hdr["slave_read_lag_bytes"])   # 0: consumers never sent to a slave
        self._shown_end = 0         # the highest consumer bound this mapping returned (it never goes back)
        sess, attach, histogram, wake, total = R.broker_state_bytes(self.session_slots)
        if total > segment.size or self.session_slots < 1:
            raise SegmentError(self.name, "broker state tables do not fit the segment")
        self.sessions = segment.array(R.STATE_SLOT, self.session_slots, sess)
        self.attached = segment.array(np.int64, self.session_slots, attach)
        self.flush_histogram = segment.array(np.int64, R.FLUSH_HISTOGRAM_BUCKETS, histogram)
        self.queue_wake = segment.array(np.int64, R.QUEUE_WAKE_WORDS, wake)
        self.queue_wake_words = [FutexWord(self.queue_wake, i) for i in range(R.QUEUE_WAKE_WORDS)]
        self.writer_waiting = Flag(self.w, _W["writer_waiting"])
        self.dispatcher_waiting = Flag(self.w, _W["dispatcher_waiting"])
        self.flusher_waiting = Flag(self.w, _W["flusher_waiting"])
        words = segment.array(np.int64, R.BROKER_STATE.itemsize // 8)
        # Futex words (hostmq.shm.futex): the writer wakes dispatcher and flusher through its own words;
        # consumers sleep on dispatch_seq, which the dispatcher changes with every publish.
        self.dispatch_wake = FutexWord(words, _W["dispatch_wake"])
        self.flush_wake = FutexWord(words, _W["flush_wake"])
        self.ha_wake = FutexWord(words, _W["ha_wake"])             # the writer → the ha process
        self.dispatch_seq_word = FutexWord(words, W_DISPATCH_SEQ)
        self.flush_count_word = FutexWord(words, _W["flush_count"])    # the flusher wakes it per flush
        self.confirm_wake_word = FutexWord(words, _W["confirm_wake"])   # the ha process, as confirmed_pos moves

    @classmethod
    def create(cls, name: str, *, store_host: bytes, commitlog_file_bytes: int, consume_queue_file_entries: int,
               index_slots: int, index_entries: int, sync_flush: bool, start_pos: int, last_store_ts_ms: int,
               session_slots: int = R.DEFAULT_SESSION_SLOTS, doorbell_fd: int = -1,
               queue_wakes: bool = False, slave: bool = False, role_epoch: int = 0,
               registered_id: int = 0, slave_read_lag_bytes: int = 0) -> "BrokerState":
        """Create the segment (this process owns it) with every position at ``start_pos``."""
        *_, total = R.broker_state_bytes(session_slots)

        def init(seg: Segment) -> None:
            h = seg.array(R.BROKER_STATE, count=1)
            h[0]["flush_disk_type"] = R.FLUSH_SYNC if sync_flush else R.FLUSH_ASYNC
            h[0]["session_slots"] = session_slots
            h[0]["doorbell_fd"] = doorbell_fd
            h[0]["broker_pid"] = os.getpid()
            h[0]["store_host"] = store_host
            h[0]["commitlog_file_bytes"] = commitlog_file_bytes
            h[0]["consume_queue_file_entries"] = consume_queue_file_entries
            h[0]["index_slots"], h[0]["index_entries"] = index_slots, index_entries
            h[0]["queue_wakes"] = int(queue_wakes)
            h[0]["role"] = R.ROLE_SLAVE if slave else R.ROLE_MASTER
            h[0]["role_epoch"], h[0]["registered_id"] = role_epoch, registered_id
            h[0]["slave_read_lag_bytes"] = slave_read_lag_bytes
            h[0]["confirmed_pos"] = -1                    # no replication process confirms yet
            h[0]["started_ms"] = int(time.time() * 1000)
            for pos in ("write_pos", "dispatched_pos", "flushed_pos", "cq_flushed_pos", "flush_request_pos",
                        "committed_pos"):
                h[0][pos] = start_pos
            h[0]["last_store_ts_ms"] = last_store_ts_ms
            h[0]["dispatch_error_pos"] = -1               # no broken record (the dispatcher's NO_ERROR)
            h[0]["broker_state"] = R.BROKER_STARTING

        return cls(Segment.create(name, total, R.BROKER_STATE_KIND, R.BROKER_STATE_VERSION, init=init))

    @classmethod
    def attach(cls, name: str, readonly: bool = False) -> "BrokerState":
        seg = Segment.attach(name, R.BROKER_STATE_KIND, R.BROKER_STATE_VERSION, readonly=readonly)
        try:
            return cls(seg)
        except BaseException:
            seg.close()
            raise

    # -- words ----------------------------------------------------------------------------------------
    def get(self, field: str) -> int:
        return self.w[_W[field]]

    def set(self, field: str, value: int) -> None:
        self.w[_W[field]] = value

    def bump(self, field: str) -> int:
        """Add one to a version word (its owner only)."""
        v = self.w[_W[field]] + 1
        self.w[_W[field]] = v
        return v

    def snapshot(self) -> dict[str, int]:
        """Every word as a dict, and the flush latency histogram (for status output)."""
        out: dict = {name: (self.store_host.hex() if name == "store_host" else int(self.w[i]))
                     for name, i in _W.items()}
        out["flush_histogram"] = [int(c) for c in self.flush_histogram]
        return out

    @property
    def generation(self) -> int:
        return self.segment.generation

    def owner_alive(self) -> bool:
        """Whether the broker process that created this segment still runs."""
        try:
            return info_owner_alive(self.segment.info())
        except SegmentError:
            return False

    def gone(self) -> bool:
        """Whether the run that created this segment is over: its process died, or it stopped — a
        broker that changes role starts a new run (a new segment) in the same process."""
        return self.w[_W["broker_state"]] == R.BROKER_STOPPED or not self.owner_alive()

    def stored_pos(self) -> int:
        """End of the records a sender has been (or may be) told are stored: everything the writer
        published, and under SYNC_FLUSH only what is flushed — what a view by message id may read,
        before the dispatcher has indexed it."""
        w = self.w
        end = min(w[W_WRITE_POS], w[W_COMMITTED_POS])
        return min(end, w[W_FLUSHED_POS]) if self.sync_flush else end

    def consumed_below(self) -> int:
        """Commitlog offset every consumer group has read past (0: not published, see config
        ``madvise_dontneed_consumed``)."""
        return int(self.w[W_CONSUMED_BELOW_POS])

    def committed_end(self) -> int:
        """End of the published records that are in the commitlog files (transient store pool)."""
        w = self.w
        return min(w[W_WRITE_POS], w[W_COMMITTED_POS])

    def readable_pos(self) -> int:
        """How far consumers may read: dispatched, and under SYNC_FLUSH also flushed
        (docs/internals.md: shared-memory rules)."""
        w = self.w
        d = w[W_DISPATCHED_POS]
        return min(d, w[W_FLUSHED_POS]) if self.sync_flush else d

    def consumer_readable_pos(self) -> int:
        """How far consumers may read (``readable_pos``), and on a SYNC_MASTER no further than its
        replication process confirmed (``confirmed_pos``: what an in-sync slave acknowledged — RocketMQ
        5's confirm offset): what a consumer saw is on two stores, so a failover to that slave cuts
        nothing it read — otherwise its position would lie past the new master's end, where RocketMQ's
        correction sends it back to the queue's first offset. With no slave in sync the replication
        process confirms the master's own end (the in-sync set shrank to it)."""
        return self._consumer_bound(self.readable_pos())

    def consumer_stored_pos(self) -> int:
        """``stored_pos`` under the same bound: how far a tailing consumer reads past the dispatcher."""
        return self._consumer_bound(self.stored_pos())

    def consumer_ends(self) -> tuple[int, int]:
        """(``consumer_stored_pos()``, ``consumer_readable_pos()``), read in that order in one call — a
        tailing consumer's poll round reads both. Without SYNC_FLUSH and while ``confirmed_pos`` does
        not bound reads (the common case) written out: the same words in the same order (the stored
        ends, the bound, the dispatched end, the bound), without the calls — a woken consumer pays
        about a µs for each."""
        w = self.w
        if self.sync_flush:
            stored = self._consumer_bound(self.stored_pos())
            return stored, self._consumer_bound(self.readable_pos())
        stored = w[W_WRITE_POS]
        committed = w[W_COMMITTED_POS]
        if committed < stored:
            stored = committed
        if w[W_CONFIRMED_POS] >= 0:
            stored = self._consumer_bound(stored)
        elif stored > self._shown_end:
            self._shown_end = stored
        readable = w[W_DISPATCHED_POS]
        if w[W_CONFIRMED_POS] >= 0:
            return stored, self._consumer_bound(readable)
        if readable > self._shown_end:
            self._shown_end = readable
        return stored, readable

    def confirms(self) -> bool:
        """Whether a replication process bounds what consumers read (``confirmed_pos``)."""
        return self.w[W_CONFIRMED_POS] >= 0

    def _consumer_bound(self, end: int) -> int:
        confirmed = self.w[W_CONFIRMED_POS]
        if confirmed >= 0:
            # Never below what this mapping showed before: a replication process that starts again
            # confirms from the end it reads, which readers may have passed meanwhile.
            end = min(end, max(confirmed, self._shown_end))
        if end > self._shown_end:
            self._shown_end = end
        return end

    # -- the session table (written by the broker's session server) ------------------------------------
    def open_slot(self, name: str, generation: int, owner_pid: int, fd: int) -> int:
        """Record a producer's ring (held as descriptor ``fd`` by the broker) in a free row; its index.

        A row is reusable only once the writer has detached from its last ring.
        """
        rows = self.sessions
        raw = name.encode("ascii", "replace")[:R.STATE_SLOT_NAME_BYTES]
        free = (rows["state"] == R.SLOT_FREE) & (self.attached == 0)
        idx = np.flatnonzero(free)
        if not len(idx):
            raise BrokerBusyError(f"all {len(rows)} producer session slots of this broker are in use")
        i = int(idx[0])
        rows[i]["name"] = raw
        rows[i]["generation"] = generation
        rows[i]["owner_pid"] = owner_pid
        rows[i]["fd"] = fd
        rows[i]["state"] = R.SLOT_ACTIVE        # last: the row is complete when a reader sees ACTIVE
        self.bump("sessions_version")
        return i

    def set_slot_state(self, slot: int, state: int) -> None:
        self.sessions[slot]["state"] = state
        self.bump("sessions_version")

    def slot(self, slot: int) -> tuple[int, int, int, int, str]:
        """``(state, generation, owner_pid, fd, name)`` of one row."""
        r = self.sessions[slot]
        return (int(r["state"]), int(r["generation"]), int(r["owner_pid"]), int(r["fd"]),
                bytes(r["name"]).decode("ascii", "replace"))

    def active_slots(self) -> list[int]:
        return np.flatnonzero(self.sessions["state"] != R.SLOT_FREE).tolist()

    # -- life -------------------------------------------------------------------------------------------
    def close(self) -> None:
        if self.segment.closed:
            return
        self.sessions = self.attached = self.flush_histogram = self.queue_wake = None
        self.dispatch_wake = self.flush_wake = self.dispatch_seq_word = self.flush_count_word = None
        self.ha_wake = self.confirm_wake_word = None
        self.queue_wake_words = []
        for f in (self.writer_waiting, self.dispatcher_waiting, self.flusher_waiting):
            f.release()
        self.w.release()
        self.segment.close()

    def unlink(self) -> None:
        self.segment.unlink()


def pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def open_broker_fd(broker_pid: int, fd: int) -> int:
    """A descriptor of what the broker process holds as ``fd`` (a producer's ring, the doorbell)."""
    return os.open(f"/proc/{broker_pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)


def open_doorbell(state: BrokerState) -> tuple[Segment, FutexWord]:
    """Map the broker's doorbell memfd; the writer sleeps on its word, the flusher rings it."""
    fd = open_broker_fd(state.broker_pid, state.doorbell_fd)
    try:
        seg = Segment.from_fd(fd, R.DOORBELL_KIND, R.DOORBELL_VERSION, name="doorbell")
    finally:
        os.close(fd)
    return seg, FutexWord(seg.array(np.int64, 1), R.DOORBELL_WRITER_WORD)
