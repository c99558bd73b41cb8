"""What a :class:`hostmq.transport.Server` has queued for its peers but libzmq has not yet written:
tracked replies, counted per peer and in all against ``ServerLimits`` (see ``hostmq.transport``)."""
from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .transport import ServerLimits

SWEEP_INTERVAL_S = 1.0   # how often written replies are forgotten for peers that got no reply since


class Outbox:
    """Bytes of tracked replies that libzmq has not yet written to the kernel, per peer and in all.

    A reply of ``tracked_reply_bytes`` or more is sent with its last frame zero-copy and tracked;
    libzmq frees a message's frames in order once it has written them, so a done tracker means the
    whole reply left this process (or its peer went away).
    """

    def __init__(self, limits: ServerLimits) -> None:
        self.limits = limits
        self.peers: dict[bytes, deque] = {}          # identity -> deque of (tracker, nbytes), oldest first
        self.peer_bytes: dict[bytes, int] = {}
        self.total_bytes = 0
        self._swept = time.monotonic()

    def admits(self, identity: bytes, nbytes: int) -> bool:
        """Whether a tracked reply of ``nbytes`` may be queued for ``identity`` now."""
        self._reap(identity)
        if self.total_bytes + nbytes > self.limits.total_unsent_bytes:
            self.sweep()
        mine = self.peer_bytes.get(identity, 0)
        # A reply bigger than a limit still goes to a peer (or server) with nothing else unwritten.
        return ((mine == 0 or mine + nbytes <= self.limits.peer_unsent_bytes)
                and (self.total_bytes == 0 or self.total_bytes + nbytes <= self.limits.total_unsent_bytes))

    def add(self, identity: bytes, tracker, nbytes: int) -> None:
        self.peers.setdefault(identity, deque()).append((tracker, nbytes))
        self.peer_bytes[identity] = self.peer_bytes.get(identity, 0) + nbytes
        self.total_bytes += nbytes

    def sweep(self) -> None:
        """Forget written replies of every peer (peers with nothing left unwritten are dropped)."""
        self._swept = time.monotonic()
        for identity in list(self.peers):
            self._reap(identity)

    def maybe_sweep(self) -> None:
        if self.peers and time.monotonic() - self._swept >= SWEEP_INTERVAL_S:
            self.sweep()

    def _reap(self, identity: bytes) -> None:
        q = self.peers.get(identity)
        if q is None:
            return
        while q and q[0][0].done:
            _, nbytes = q.popleft()
            self.peer_bytes[identity] -= nbytes
            self.total_bytes -= nbytes
        if not q:
            del self.peers[identity]
            del self.peer_bytes[identity]
