"""The writer's side of the session table (``broker.session_server`` writes it): attaching producers'
rings, draining a closing one, marking it drained, detaching (part of :class:`~hostmq.broker.writer.Writer`,
kept apart only for size).

A ring is opened through the broker's own descriptor (``/proc/BROKER_PID/fd/FD``, the slot says
which) and mapped only if it is a sealed ring of the registered generation. The writer owns the
attach table: ``attached[slot]`` is the generation it serves, 0 for none, and ``~generation`` once a
CLOSING slot has been drained — only then may the session server free it.
"""
from __future__ import annotations

import logging
import os
import time
from collections import deque
from typing import NamedTuple

import numpy as np

from .. import records as R
from ..errors import RingCorruptError, SegmentError
from ..ingress import step
from ..ingress.ring import IngressRing
from ..live.runtime import MAX_RING_DATA_BYTES
from ..live.state import W_SESSIONS_VERSION, W_WRITE_POS, open_broker_fd

log = logging.getLogger(__name__)


class _Attached(NamedTuple):
    slot: int
    generation: int
    ring: IngressRing


class RingSessions:
    """Session-table methods of the writer (see the module docstring)."""

    def _sync_sessions(self) -> None:
        """Follow the session table: attach ACTIVE rings; append what a CLOSING ring published (even
        one never attached: a producer killed right after its first frame), then mark the slot
        drained (``attached = ~generation``) so the broker may free it; forget FREE slots."""
        st = self.state
        self._sessions_seen = st.w[W_SESSIONS_VERSION]
        slots = set(st.active_slots()) | set(self.rings) | set(np.flatnonzero(st.attached).tolist())
        for slot in sorted(slots):
            state, gen, *_ = st.slot(slot)
            a = self.rings.get(slot)
            if a is not None and (a.generation != gen or state == R.SLOT_FREE):
                self._detach(a)
                a = None
            if state == R.SLOT_ACTIVE:
                if a is None:
                    self._attach(slot, gen)
            elif state == R.SLOT_CLOSING:
                if st.attached[slot] == ~gen:
                    continue                        # drained already
                if a is None:
                    a = self._attach(slot, gen)
                if a is not None:
                    self._drain(a)
                    self._detach(a)
                st.attached[slot] = ~gen            # nothing of it is left to append
            else:
                st.attached[slot] = 0

    def _attach(self, slot: int, gen: int) -> _Attached | None:
        st = self.state
        _, _, _, fd, name = st.slot(slot)
        try:
            own = open_broker_fd(st.broker_pid, fd)
        except OSError as e:                # the session ended meanwhile (the broker closed fd)
            log.debug("writer: session %d (%s) is gone: %s", slot, name, e)
            st.attached[slot] = 0
            return None
        try:
            # The producer may have rewritten its header or cursors since it registered: such a
            # ring is marked dropped (its producer woken) rather than left unserved and unanswered.
            ring = IngressRing.from_fd(own, name, drop_corrupt=True)
        except (SegmentError, RingCorruptError) as e:
            log.warning("writer: cannot attach session %d (%s): %s", slot, name, e)
            st.attached[slot] = 0
            return None
        finally:
            os.close(own)
        bad = ("it was dropped before" if ring.dropped else
               "it is not the ring registered" if ring.segment.generation != gen or ring.capacity > MAX_RING_DATA_BYTES
               else "")
        if bad:
            log.warning("writer: not serving session %d (%s): %s", slot, name, bad)
            ring.mark_dropped()
            ring.close()
            st.attached[slot] = 0
            return None
        a = _Attached(slot, gen, ring)
        self.rings[slot] = a
        st.attached[slot] = gen
        self._rebuild_lists()
        return a

    def _resume_staged(self, a: _Attached) -> None:
        """Completions a predecessor staged but did not publish: now (ASYNC), or after a flush
        (SYNC_FLUSH) and a slave's ack (SYNC_MASTER)."""
        ring = a.ring
        if not step.unreleased(ring):
            return
        if self.sync or self.sync_master:
            self._add_pending(a, ring.published_position, ring.staged_position, ring.handed_position,
                              self.state.w[W_WRITE_POS], self.sync, self.sync_master)
        else:
            self._complete(a, ring.staged_position, ring.handed_position)

    def _detach(self, a: _Attached, keep_attached: bool = False) -> None:
        self.rings.pop(a.slot, None)
        a.ring.close()
        if not keep_attached:
            self.state.attached[a.slot] = 0
        self.pending = deque(p for p in self.pending if p.slot != a.slot)
        self._rebuild_lists()

    def _rebuild_lists(self) -> None:
        self._serving = list(self.rings.values())
        self._flags = [self.state.writer_waiting] + [a.ring.writer_waiting for a in self._serving]

    def _drain(self, a: _Attached) -> None:
        """Append whatever a closing session published (a dead producer's last frames)."""
        for _ in range(1000):
            if not a.ring.has_frames() or a.ring.dropped:
                break
            self._serve(a)
        deadline = time.monotonic() + self.sync_timeout_s
        while self.pending and any(p.slot == a.slot for p in self.pending) and time.monotonic() < deadline:
            self._publish_synced(time.monotonic())
            if self.pending:
                time.sleep(0.0005)
