"""Producer sessions: the broker's side of ``session.sock`` (``protocol.session``), on its own thread.

A producer connects, sends ``open`` with its ingress ring — a memfd sealed against shrinking — and
gets a slot in the state segment's session table, where the writer picks it up (it opens the
broker's descriptor through ``/proc/BROKER_PID/fd/FD``). The connection *is* the session: when the
client closes it, or dies and the kernel closes it, the slot turns CLOSING, the writer appends what
was published and detaches, and the slot is freed and the descriptor closed.

What a client cannot do here, whatever it sends: name another process's ring (it can only pass a
descriptor it holds), register one ring twice (same inode), close another client's session (only its
own connection), claim another pid (``SO_PEERCRED`` is the kernel's word), hold more than
``broker.max_sessions_per_client`` slots or keep more than ``broker.max_session_connections``
connections open, or stall the thread (non-blocking sockets, bounded messages, handshake deadline).
Refusals are answered with a reason and counted in the state word ``sessions_refused``.

Ownership: this thread is the only writer of the session table and of ``sessions_version``.
"""
from __future__ import annotations

import logging
import os
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass

from .. import records as R
from ..access import secure_socket
from ..errors import BrokerBusyError, HostMQError, ProtocolError
from ..protocol import session as P
from ..shm.futex import FutexWord
from ..ingress.ring import IngressRing
from ..live.runtime import MAX_RING_DATA_BYTES, BrokerRuntime
from ..live.state import BrokerState

log = logging.getLogger(__name__)

TICK_S = 0.1                     # handshake deadlines and freeing detached slots are checked this often
_PEERCRED = struct.Struct("3i")  # pid, uid, gid


@dataclass
class _Conn:
    sock: socket.socket
    pid: int
    uid: int
    since_s: float
    slot: int = -1               # -1 until the session is open


@dataclass
class _Held:
    """A ring descriptor the broker holds for a slot (until the writer has let go of it)."""

    fd: int
    generation: int
    inode: tuple[int, int]
    pid: int


class SessionServer:
    def __init__(self, rt: BrokerRuntime, state: BrokerState, doorbell: FutexWord, doorbell_fd: int,
                 session_fields) -> None:
        self.rt, self.state, self.doorbell, self.doorbell_fd = rt, state, doorbell, doorbell_fd
        self.session_fields = session_fields        # () -> dict of what every session reply carries
        b = rt.config.broker
        self.max_per_client, self.max_connections = b.max_sessions_per_client, b.max_session_connections
        self.handshake_s = b.session_handshake_timeout_s
        self.path = rt.session_socket_path
        self.listener: socket.socket | None = None
        self.conns: dict[int, _Conn] = {}           # socket fd → connection
        self.held: dict[int, _Held] = {}            # slot → ring descriptor
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- life -----------------------------------------------------------------------------------------
    def bind(self) -> None:
        """Listen at ``session.sock`` (the caller holds the broker lock: an old file is ours to replace)."""
        if len(os.fsencode(self.path)) > 107:
            raise HostMQError(f"session socket path {self.path} is longer than 107 bytes; use a shorter root")
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        s.bind(self.path)
        secure_socket(self.path)                # owner and group connect (hostmq/access.py)
        s.listen(128)
        self.listener = s
        self._sel.register(s, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hostmq-sessions", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the thread, end every session (the writer is gone by now), unlink the socket file."""
        self._stop.set()
        os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(5.0)
        for c in list(self.conns.values()):
            self._drop(c)
        for h in self.held.values():
            os.close(h.fd)
        self.held.clear()
        if self.listener is not None:
            self.listener.close()
            self.listener = None
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        self._sel.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    # -- the loop -------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for key, _ in self._sel.select(TICK_S):
                    if key.fileobj is self.listener:
                        self._accept()
                    elif key.fileobj == self._wake_r:
                        os.read(self._wake_r, 64)
                    else:
                        self._readable(key.data)
                self._tick(time.monotonic())
            except Exception:                   # never let one bad turn end the sessions thread
                log.exception("session server: unexpected error")

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:                # EMFILE and friends: try again next turn
                log.warning("session server: accept failed: %s", e)
                return
            sock.setblocking(False)
            pid, uid, _ = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
            if len(self.conns) >= self.max_connections:
                self._refuse_conn(sock, "busy", f"{self.max_connections} session connections are open")
                continue
            c = _Conn(sock, pid, uid, time.monotonic())
            self.conns[sock.fileno()] = c
            self._sel.register(sock, selectors.EVENT_READ, c)

    def _readable(self, c: _Conn) -> None:
        try:
            msg, fds, flags, _ = socket.recv_fds(c.sock, P.MAX_MESSAGE_BYTES + 1, 1)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            msg, fds, flags = b"", [], 0
        kept = -1
        try:
            if not msg:                         # EOF: the client closed, or died
                self._drop(c)
                return
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                raise ProtocolError("session message too long, or more than one descriptor")
            req = P.decode_request(msg)
            if c.slot < 0 and isinstance(req, P.OpenSession) and len(fds) == 1:
                kept = fds[0] if self._open(c, req, fds[0]) else -1
            elif c.slot >= 0 and isinstance(req, P.CloseSession) and not fds:
                self._drop(c)
            else:
                raise ProtocolError("expected one 'open' with one descriptor, then at most a 'close'")
        except ProtocolError as e:
            self._refuse(c, "invalid", str(e))
        finally:
            for fd in fds:
                if fd != kept:
                    os.close(fd)

    # -- opening --------------------------------------------------------------------------------------
    def _open(self, c: _Conn, req: P.OpenSession, fd: int) -> bool:
        """Open a session for ``fd``; whether the broker keeps the descriptor."""
        st = self.state
        if st.get("broker_state") == R.BROKER_STOPPING:
            self._refuse(c, "stopping", f"broker {self.rt.name} is shutting down")
            return False
        mine = sum(1 for h in self.held.values() if h.pid == c.pid)
        if mine >= self.max_per_client:
            self._refuse(c, "busy", f"client pid {c.pid} already holds {mine} sessions "
                                    f"(broker.max_sessions_per_client = {self.max_per_client})")
            return False
        try:
            generation, inode = self._check_ring(fd, req.label)
        except HostMQError as e:
            self._refuse(c, "invalid", f"cannot use that ring: {e}")
            return False
        if any(h.inode == inode for h in self.held.values()):
            self._refuse(c, "invalid", "that ring is already registered with this broker")
            return False
        try:
            slot = st.open_slot(req.label, generation, c.pid, fd)
        except BrokerBusyError as e:
            self._refuse(c, "busy", str(e))
            return False
        self.held[slot] = _Held(fd, generation, inode, c.pid)
        c.slot = slot
        reply = P.encode_reply({"slot": slot, "generation": generation, **self.session_fields()})
        try:
            socket.send_fds(c.sock, [reply], [self.doorbell_fd])
        except OSError:                         # gone already: the next read sees EOF
            pass
        self.doorbell.post()                    # the writer attaches at once
        log.debug("producer session %d: ring %s of pid %d", slot, req.label, c.pid)
        return True

    @staticmethod
    def _check_ring(fd: int, label: str) -> tuple[int, tuple[int, int]]:
        st = os.fstat(fd)
        ring = IngressRing.from_fd(fd, label)    # SegmentError / RingCorruptError: refused
        try:
            if ring.capacity > MAX_RING_DATA_BYTES:
                raise ProtocolError(f"ring of {ring.capacity} bytes; at most {MAX_RING_DATA_BYTES}")
            generation = ring.segment.generation
            if not 0 < generation < 1 << 63:     # the client wrote it: it must fit the int64 tables
                raise ProtocolError(f"ring generation {generation} is not within 1..2**63-1")
            return generation, (st.st_dev, st.st_ino)
        finally:
            ring.close()

    # -- closing --------------------------------------------------------------------------------------
    def _drop(self, c: _Conn) -> None:
        """End a connection; its session (if open) turns CLOSING for the writer to drain."""
        self.conns.pop(c.sock.fileno(), None)
        try:
            self._sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()
        if c.slot >= 0 and c.slot in self.held:
            self.state.set_slot_state(c.slot, R.SLOT_CLOSING)
            self.doorbell.post()

    def _tick(self, now_s: float) -> None:
        for c in [c for c in self.conns.values() if c.slot < 0 and now_s - c.since_s > self.handshake_s]:
            self._refuse(c, "invalid", f"no session opened within {self.handshake_s:.0f} s")
        st = self.state
        for slot, h in list(self.held.items()):
            state, gen, *_ = st.slot(slot)
            # Free a closed session only once the writer has appended what it published (it marks
            # the slot with ~generation then): a ring is never let go with frames still in it.
            if state == R.SLOT_CLOSING and st.attached[slot] == ~h.generation:
                st.set_slot_state(slot, R.SLOT_FREE)
                os.close(h.fd)
                del self.held[slot]

    def _refuse(self, c: _Conn, error: str, message: str) -> None:
        log.debug("session refused for pid %d: %s", c.pid, message)
        self.state.bump("sessions_refused")
        try:
            c.sock.send(P.encode_refusal(error, message))
        except OSError:
            pass
        self._drop(c)

    def _refuse_conn(self, sock: socket.socket, error: str, message: str) -> None:
        self.state.bump("sessions_refused")
        try:
            sock.send(P.encode_refusal(error, message))
        except OSError:
            pass
        sock.close()
