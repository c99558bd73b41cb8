"""Producer sessions and consumer waiters in the broker's state segment (the control loop's side).

A producer registers the ingress ring it created (OPEN_PRODUCER_SESSION), a consumer its wake-up word
(OPEN_WAITER); the rows go into the state segment's tables, where the writer and the dispatcher pick
them up. A session whose client process died is closed by :meth:`SessionTables.reap` (a timer): the
writer drains and detaches, then the row is freed and the ring unlinked. At stop,
:meth:`SessionTables.unlink_dead` unlinks what clients that died since the last reap left.
"""
from __future__ import annotations

import logging

from .. import records as R
from ..errors import NoRouteError, SegmentError, ValidationError
from ..protocol.frames import Frame
from ..protocol.messages import CloseSessionRequest, OpenSessionRequest
from ..root import shm_name
from ..shm.ring import IngressRing
from ..shm.segment import info_owner_alive, read_info, unlink_semaphore, unlink_segment
from ..transport import Reply
from .runtime import MAX_RING_DATA_BYTES, BrokerRuntime
from .state import BrokerState

log = logging.getLogger(__name__)


def check_running(state: BrokerState, broker: str) -> None:
    if state.get("broker_state") == R.BROKER_STOPPING:
        raise NoRouteError(f"broker {broker} is shutting down")


class SessionTables:
    def __init__(self, rt: BrokerRuntime, state: BrokerState, delay_levels: int) -> None:
        self.rt, self.state, self.delay_levels = rt, state, delay_levels

    def _check_name(self, name: str, kind: str) -> None:
        # Rings are per broker; a consumer's waiter is per root (one word, registered with every broker).
        prefix = self.rt.shm(kind, "") if kind == "ring" else shm_name(self.rt.root, "", kind, "")
        if not name.startswith(prefix) or not name[len(prefix):].replace("-", "").isalnum():
            raise ValidationError(f"segment name {name!r} must be {prefix}<id> (letters, digits, '-')")

    def open_session(self, frame: Frame, token=None) -> Reply:
        req = OpenSessionRequest.from_fields(frame.fields)
        self._check_name(req.name, "ring")
        check_running(self.state, self.rt.name)
        try:
            ring = IngressRing.attach(req.name)
        except (SegmentError, Exception) as e:
            raise ValidationError(f"cannot use ring {req.name}: {e}") from None
        try:
            info = ring.segment.info()
            if ring.capacity > MAX_RING_DATA_BYTES:
                raise ValidationError(f"ring of {ring.capacity} bytes; at most {MAX_RING_DATA_BYTES}")
            if info.owner_pid != req.pid:
                raise ValidationError(f"ring {req.name} belongs to pid {info.owner_pid}, not {req.pid}")
        finally:
            ring.close()
        slot = self.state.open_slot("sessions", req.name, info.generation, req.pid)
        log.info("producer session %d: ring %s of pid %d", slot, req.name, req.pid)
        return Reply(fields=self._session_fields(slot, info.generation))

    def _session_fields(self, slot: int, generation: int) -> dict:
        st = self.state
        return {"slot": slot, "generation": generation, "state_name": st.name,
                "state_generation": st.generation, "writer_signal": self.rt.writer_signal,
                "store_host": st.store_host.hex(), "sync_flush": st.sync_flush,
                "max_message_bytes": self.rt.config.store.max_message_bytes,
                "max_properties_bytes": self.rt.config.store.max_properties_bytes,
                "delay_levels": self.delay_levels}

    def close_session(self, frame: Frame, token=None) -> Reply:
        return self._close("sessions", CloseSessionRequest.from_fields(frame.fields))

    def open_waiter(self, frame: Frame, token=None) -> Reply:
        req = OpenSessionRequest.from_fields(frame.fields)
        self._check_name(req.name, "wait")
        try:
            info = read_info(req.name)
        except SegmentError as e:
            raise ValidationError(f"cannot use waiter {req.name}: {e}") from None
        if info.kind != R.WAITER_KIND or info.owner_pid != req.pid:
            raise ValidationError(f"{req.name} is not a waiter of pid {req.pid}")
        slot = self.state.open_slot("waiters", req.name, info.generation, req.pid)
        return Reply(fields={"slot": slot, "generation": info.generation, "state_name": self.state.name,
                             "state_generation": self.state.generation})

    def close_waiter(self, frame: Frame, token=None) -> Reply:
        return self._close("waiters", CloseSessionRequest.from_fields(frame.fields))

    def _close(self, table: str, req: CloseSessionRequest) -> Reply:
        slots = self.state.session_slots if table == "sessions" else self.state.waiter_slots
        if not 0 <= req.slot < slots:
            raise ValidationError(f"no {table} slot {req.slot}")
        state, gen, _, _ = self.state.slot(table, req.slot)
        if state != R.SLOT_ACTIVE or gen != req.generation:
            return Reply(fields={"closed": False})
        if table == "sessions":
            self.state.set_slot_state(table, req.slot, R.SLOT_CLOSING)
        else:
            self.state.set_slot_state(table, req.slot, R.SLOT_FREE)
        return Reply(fields={"closed": True})

    def reap(self) -> None:
        """Close sessions and waiters of dead clients; free rows the writer has let go."""
        st = self.state
        for table in ("sessions", "waiters"):
            for slot in st.active_slots(table):
                state, gen, pid, name = st.slot(table, slot)
                if state == R.SLOT_ACTIVE and not _segment_owner_alive(name, pid):
                    log.info("%s %d: client pid %d is gone; closing", table, slot, pid)
                    if table == "waiters":
                        st.set_slot_state(table, slot, R.SLOT_FREE)
                        _unlink(name)
                        continue
                    st.set_slot_state(table, slot, R.SLOT_CLOSING)
                elif state == R.SLOT_CLOSING and st.attached[slot] != gen:
                    if not _segment_owner_alive(name, pid):
                        _unlink(name)
                    st.set_slot_state(table, slot, R.SLOT_FREE)

    def unlink_dead(self) -> None:
        """At stop (the writer is gone): unlink the rings and words of clients that died since the
        last reap — nobody else would."""
        for table in ("sessions", "waiters"):
            for slot in self.state.active_slots(table):
                _, _, pid, name = self.state.slot(table, slot)
                if not _segment_owner_alive(name, pid):
                    _unlink(name)


def _segment_owner_alive(name: str, pid: int) -> bool:
    try:
        return info_owner_alive(read_info(name))
    except SegmentError:
        return False


def _unlink(name: str) -> None:
    unlink_segment(name)
    unlink_semaphore(name)
