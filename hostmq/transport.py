"""Server side of the control path: one zmq ROUTER socket, a handler table, timers (the only server zmq code).

A process that serves control requests (NameServer, broker) builds a :class:`Server` with a table
``{RequestCode: handler}`` and runs its loop on one thread::

    server = Server(ipc_address(paths.namesrv_socket()), {RequestCode.PING: ping}, name="namesrv")
    server.bind()
    server.add_timer(10.0, scan_not_active_brokers)
    server.run(stop_event)          # or call server.poll_once(timeout_ms) from your own loop
    server.close()

``handler(frame, token)`` returns a :class:`Reply`, or :data:`DEFER` to answer later with
``server.reply(token, Reply(...))`` from the same thread (long polling: keep the token, answer from a
timer or a ``call_soon_threadsafe`` callback). Everything that goes wrong with one request becomes a
response, never a crash of the loop:

    malformed frames (not JSON, wrong keys/types/version, too big, a response) → BAD_REQUEST + the reason
    unknown code                                  → REQUEST_CODE_NOT_SUPPORTED
    handler raises HostMQError                    → its mapped code (protocol.codes.response_code_for)
    handler raises anything else / returns junk   → SYSTEM_ERROR, logged with traceback

Replies to peers that have gone are dropped; sockets never linger on close.

Who is asking (issue 27): every request carries the peer's credentials as the kernel reported them
when it connected — for ``ipc://`` libzmq reads SO_PEERCRED and puts ``…:uid:gid:pid`` in each
message's ``Peer-Address`` property — as ``token.peer`` (:class:`~hostmq.protocol.permissions.PeerCred`,
None where the transport has none). A server built with a ``policy``
(:class:`~hostmq.protocol.permissions.ControlPolicy`) answers an administration code from a peer
that is not an owner with PERMISSION_DENIED before any handler runs.

Batches: the loop takes up to MAX_BATCH requests at a time and then runs the *batch hooks*
(:meth:`Server.add_batch_hook`), so a handler can leave a costly commit (rewriting ``topics.json``,
re-registering) to one hook call per batch — returning DEFER and answering once it is done.

Bounds on what one peer (one zmq connection) can make the server hold (:class:`ServerLimits`):

    a request frame over MAX_REQUEST_FRAME_BYTES (1 MiB)   libzmq drops the connection before buffering it
                                                           (ZMQ_MAXMSGSIZE); the client reconnects
    more than MAX_REQUEST_FRAMES frames                    BAD_REQUEST
    requests not yet read by the loop                      ≤ ``rcvhwm`` per peer; then libzmq stops reading
                                                           that peer (back-pressure, nothing is lost)
    replies of ≥ ``tracked_reply_bytes`` not yet written   ≤ ``peer_unsent_bytes`` per peer (one reply of any
      to the kernel (zero-copy, tracked)                   size when it has none) and ``total_unsent_bytes``
                                                           in all; past that the reply is replaced by
                                                           SYSTEM_BUSY (BrokerBusyError at the client)
    smaller replies not yet written                        ≤ ``sndhwm`` per peer; a peer past it is not
                                                           reading, and further replies to it are dropped

So a peer that never reads costs at most about ``sndhwm × tracked_reply_bytes + peer_unsent_bytes``
plus one reply, and one that floods requests ``rcvhwm × MAX_REQUEST_FRAME_BYTES``. Each handler bounds
the size of its own replies (frame 0 ≤ MAX_HEADER_BYTES; message bodies per its config). Not
bounded here: libzmq assembles a multipart message whole before delivering it and ZMQ_MAXMSGSIZE
applies per frame, so a peer sending one message of very many ≤ 1 MiB frames is buffered until it
ends (a libzmq limit; the number of connections is bounded by the process's file descriptors).

Ownership: the process that binds an ``ipc://`` path owns its socket file and unlinks it on close if
the file is still the one it created. libzmq's bind silently replaces an existing file, so a caller
that must be the only server on a path (a broker) takes its lock *before* ``bind()`` (docs/internals.md fact 3).
"""
from __future__ import annotations

import errno
import logging
import math
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import zmq

from .errors import ConnectError, HostMQError, ProtocolError
from .protocol.codes import ResponseCode, code_name, response_code_for
from .protocol.frames import (MAX_REQUEST_FRAME_BYTES, MAX_REQUEST_FRAMES, Frame, decode, encode_response,
                              peek_request_id)
from .protocol.permissions import ControlPolicy, PeerCred
from .transport_outbox import Outbox

log = logging.getLogger(__name__)

MAX_BATCH = 256          # requests handled per poll_once before timers get their turn
STOP_CHECK_MS = 50       # run() looks at its stop event at least this often


@dataclass(frozen=True)
class ServerLimits:
    """What one peer may make a Server hold (see the module docstring); defaults in brackets."""

    max_request_frame_bytes: int = MAX_REQUEST_FRAME_BYTES   # ZMQ_MAXMSGSIZE [1 MiB]
    rcvhwm: int = 32                     # requests queued per peer before libzmq stops reading it [32]
    sndhwm: int = 4096                   # replies queued per peer; more are dropped (ROUTER_MANDATORY) [4096]
    tracked_reply_bytes: int = 4096      # replies this big or bigger are tracked until written [4 KiB]
    peer_unsent_bytes: int = 16 << 20    # tracked bytes one peer may have unwritten [16 MiB]
    total_unsent_bytes: int = 128 << 20  # tracked bytes all peers together may have unwritten [128 MiB]


DEFAULT_LIMITS = ServerLimits()


@dataclass(frozen=True)
class Reply:
    """What a handler answers: a response code, fields, raw body frames, and a remark for errors."""

    code: int = ResponseCode.SUCCESS
    fields: dict | None = None
    bodies: Sequence[bytes] = ()
    remark: str = ""


class _Defer:
    def __repr__(self) -> str:
        return "DEFER"


DEFER = _Defer()
"""Returned by a handler that will answer later with ``Server.reply(token, ...)``."""


class ReplyToken:
    """Who asked what: the peer's routing identity, its kernel credentials (``peer``, None when the
    transport has none) and the request id. Answered at most once."""

    __slots__ = ("identity", "request_id", "code", "answered", "peer")

    def __init__(self, identity: bytes, request_id: int, code: int, peer: PeerCred | None = None) -> None:
        self.identity = identity
        self.request_id = request_id
        self.code = code
        self.answered = False
        self.peer = peer

    def __repr__(self) -> str:
        return f"ReplyToken({self.identity.hex()}, id={self.request_id}, {code_name(self.code)})"


Handler = Callable[[Frame, ReplyToken], "Reply | _Defer"]


@dataclass
class _Timer:
    interval_s: float
    fn: Callable[[], object]
    due: float


class Server:
    """A ROUTER socket serving a handler table; single-threaded except :meth:`call_soon_threadsafe`."""

    def __init__(self, address: str, handlers: Mapping[int, Handler], *, context: zmq.Context | None = None,
                 name: str = "server", limits: ServerLimits = DEFAULT_LIMITS,
                 policy: ControlPolicy | None = None) -> None:
        self.address = address
        self.name = name
        self.limits = limits
        self.policy = policy            # None: every code from every peer (tests, tools)
        self.refused = 0                # requests refused by the policy
        self._batch_hooks: list[Callable[[], object]] = []
        self._outbox = Outbox(limits)
        self.requests_handled = 0       # messages taken off the socket (malformed ones included)
        self.dropped_replies = 0        # replies dropped because their peer had stopped reading
        self.busy_replies = 0           # replies replaced by SYSTEM_BUSY (the peer's unsent bytes were full)
        self._handlers = dict(handlers)
        self._own_context = context is None
        self._context = zmq.Context() if context is None else context
        self._socket: zmq.Socket | None = None
        self._poller = zmq.Poller()
        self._timers: list[_Timer] = []
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._wake_lock = threading.Lock()      # orders call_soon_threadsafe against close (fd reuse)
        self._bound_file: tuple[str, int, int] | None = None
        self._poller.register(self._wake_fd, zmq.POLLIN)
        self.closed = False

    # --- lifecycle ---------------------------------------------------------------------------------

    def bind(self) -> None:
        """Create the ROUTER socket and bind it; ConnectError if the address cannot be bound."""
        if self._socket is not None or self.closed:
            raise RuntimeError(f"{self.name}: bind() called twice or after close()")
        sock = self._context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        # Mandatory: a reply to a peer whose queue is full raises Again instead of vanishing unseen,
        # and one to a peer that has gone raises EHOSTUNREACH (both are dropped, see _send).
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.SNDHWM, self.limits.sndhwm)
        sock.setsockopt(zmq.RCVHWM, self.limits.rcvhwm)
        sock.setsockopt(zmq.MAXMSGSIZE, self.limits.max_request_frame_bytes)
        # pyzmq copies a frame below its copy threshold even when told not to, and then reports it as
        # written at once: tracked replies (the only copy=False sends) must always go zero-copy.
        sock.copy_threshold = 0
        try:
            sock.bind(self.address)
        except zmq.ZMQError as e:
            sock.close(0)
            raise ConnectError(f"{self.name} cannot bind {self.address}: {e}") from None
        self._socket = sock
        self._poller.register(sock, zmq.POLLIN)
        if self.address.startswith("ipc://"):
            from .access import secure_socket
            secure_socket(self.address[len("ipc://"):])        # owner and group connect (hostmq/access.py)
            st = os.stat(self.address[len("ipc://"):])
            self._bound_file = (self.address[len("ipc://"):], st.st_dev, st.st_ino)
        log.debug("%s listening at %s", self.name, self.address)

    def close(self) -> None:
        """Close the socket (no linger), unlink our ipc file, terminate the context if we made it."""
        with self._wake_lock:
            if self.closed:
                return
            self.closed = True
            os.close(self._wake_fd)
        if self._socket is not None:
            self._socket.close(0)
            self._socket = None
        if self._bound_file is not None:
            _unlink_if_same(*self._bound_file)
        if self._own_context:
            self._context.term()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def stats(self) -> dict[str, int]:
        """Counters an operator (``hostmq status``) and tests read: requests handled, replies dropped
        or replaced by SYSTEM_BUSY, tracked reply bytes not yet written."""
        return {"requests_handled": self.requests_handled, "dropped_replies": self.dropped_replies,
                "busy_replies": self.busy_replies, "unsent_reply_bytes": self._outbox.total_bytes,
                "refused_requests": self.refused}

    @property
    def unsent_reply_bytes(self) -> int:
        """Bytes of tracked replies libzmq had not yet written at the last look (any thread may read)."""
        return self._outbox.total_bytes

    # --- the loop ----------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Serve requests and run timers until ``stop`` (threading or multiprocessing Event) is set."""
        while not stop.is_set():
            self.poll_once(STOP_CHECK_MS)

    def poll_once(self, timeout_ms: int) -> int:
        """Wait ≤ ``timeout_ms`` (shortened to the next timer) and handle what is waiting.

        Handles up to MAX_BATCH requests, then callbacks from :meth:`call_soon_threadsafe`, then due
        timers. Returns the number of requests handled (malformed ones included).
        """
        if self._socket is None:
            raise RuntimeError(f"{self.name}: poll_once() before bind() or after close()")
        wait_ms = max(0, timeout_ms)
        if self._timers:
            next_due = min(t.due for t in self._timers)
            wait_ms = max(0, min(wait_ms, math.ceil((next_due - time.monotonic()) * 1000)))
        events = dict(self._poller.poll(wait_ms))
        handled = self._drain_socket() if events.get(self._socket) else 0
        if self._wake_fd in events:
            self._run_calls()
        self._run_due_timers()
        self._outbox.maybe_sweep()
        return handled

    def reply(self, token: ReplyToken, reply: Reply) -> None:
        """Answer ``token``'s request (a second answer to the same token is dropped)."""
        if token.answered:
            log.debug("%s: dropped a second reply to %r", self.name, token)
            return
        token.answered = True
        try:
            frames = encode_response(reply.code, token.request_id, reply.fields, reply.bodies, reply.remark)
        except ProtocolError as e:
            log.error("%s: cannot encode the reply to %r: %s", self.name, token, e)
            frames = encode_response(ResponseCode.SYSTEM_ERROR, token.request_id,
                                     remark=_printable(f"{self.name} could not encode its reply: {e}"))
        nbytes = sum(len(f) for f in frames)
        if nbytes < self.limits.tracked_reply_bytes:
            self._send(token.identity, frames)
        elif self._outbox.admits(token.identity, nbytes):
            self._send(token.identity, frames, nbytes)
        else:
            self.busy_replies += 1
            unsent = self._outbox.peer_bytes.get(token.identity, 0)
            self._send(token.identity, encode_response(
                ResponseCode.SYSTEM_BUSY, token.request_id,
                remark=f"{self.name}: a {nbytes}-byte reply would exceed the unsent reply bytes allowed "
                       f"(this client has {unsent} bytes of replies not yet read; limit "
                       f"{self.limits.peer_unsent_bytes} per client, {self.limits.total_unsent_bytes} in all)"))

    def add_batch_hook(self, fn: Callable[[], object]) -> None:
        """Run ``fn()`` after each batch of requests (a failing hook is logged and kept)."""
        self._batch_hooks.append(fn)

    def add_timer(self, interval_s: float, fn: Callable[[], object]) -> None:
        """Run ``fn()`` every ``interval_s`` from the loop (first run one interval from now)."""
        if not interval_s > 0:
            raise ValueError(f"timer interval must be > 0 s, got {interval_s}")
        self._timers.append(_Timer(interval_s, fn, time.monotonic() + interval_s))

    def call_soon_threadsafe(self, fn: Callable[[], object]) -> None:
        """Run ``fn()`` on the loop's thread at its next turn (wakes a waiting poll); from any thread.

        Dropped silently once the server is closed.
        """
        with self._wake_lock:
            if self.closed:
                return
            self._calls.put(fn)
            os.eventfd_write(self._wake_fd, 1)

    # --- internals ---------------------------------------------------------------------------------

    def _drain_socket(self) -> int:
        handled = 0
        while handled < MAX_BATCH:
            # Asked rather than found by a failing recv: building zmq.Again costs more than the
            # round's other Python (about 5 µs of a PING's 28 on 2 vCPUs).
            if handled and not self._socket.get(zmq.EVENTS) & zmq.POLLIN:
                break
            try:
                # The identity frame copy=False: its properties carry the peer's credentials.
                first = self._socket.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            frames = self._socket.recv_multipart() if first.more else []
            handled += 1
            self.requests_handled += 1
            self._handle(first.bytes, frames, _peer_of(first))
        for hook in self._batch_hooks:
            self._run_guarded(hook, "batch hook")
        return handled

    def _handle(self, identity: bytes, frames: list[bytes], peer: PeerCred | None = None) -> None:
        if not frames:          # a ROUTER never delivers this from a DEALER; nothing to answer it with
            log.debug("%s: dropped an empty message from %s", self.name, identity.hex())
            return
        try:
            if len(frames) > MAX_REQUEST_FRAMES:
                raise ProtocolError(f"a request has at most {MAX_REQUEST_FRAMES} frames, got {len(frames)}")
            frame = decode(frames)
            if frame.response:
                raise ProtocolError("expected a request, got a response")
        except ProtocolError as e:
            log.debug("%s: bad request from %s: %s", self.name, identity.hex(), e)
            self._send(identity, encode_response(ResponseCode.BAD_REQUEST, peek_request_id(frames[0]),
                                                 remark=_printable(str(e))))
            return
        token = ReplyToken(identity, frame.request_id, frame.code, peer)
        result = self._call_handler(frame, token)
        if result is not DEFER:
            self.reply(token, result)

    def _call_handler(self, frame: Frame, token: ReplyToken) -> "Reply | _Defer":
        handler = self._handlers.get(frame.code)
        if handler is None:
            return Reply(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                         remark=f"{self.name} does not support request code {frame.code}")
        try:
            if self.policy is not None:
                self._check_policy(frame.code, token.peer)
            result = handler(frame, token)
        except HostMQError as e:
            return Reply(response_code_for(e), remark=_printable(str(e)))
        except Exception as e:
            log.exception("%s: handler for %s failed", self.name, code_name(frame.code))
            return Reply(ResponseCode.SYSTEM_ERROR, remark=_printable(f"{type(e).__name__}: {e}"))
        if result is DEFER or isinstance(result, Reply):
            return result
        log.error("%s: handler for %s returned %r, not a Reply or DEFER", self.name, code_name(frame.code),
                  type(result).__name__)
        return Reply(ResponseCode.SYSTEM_ERROR, remark=f"{self.name}: handler returned no reply")

    def _check_policy(self, code: int, peer: PeerCred | None) -> None:
        try:
            self.policy.check(code, peer, self.name)
        except HostMQError:
            self.refused += 1
            if self.refused & (self.refused - 1) == 0:          # 1st, 2nd, 4th, 8th, ...
                log.warning("%s: refused %s from %s (%d refused so far)", self.name, code_name(code),
                            "unknown uid" if peer is None else f"uid {peer.uid} pid {peer.pid}", self.refused)
            raise

    def _send(self, identity: bytes, frames: list[bytes], tracked_bytes: int = 0) -> None:
        """Queue one reply; with ``tracked_bytes`` its last frame goes zero-copy and is tracked."""
        if self._socket is None:        # a deferred reply after close(): nobody to send it to
            log.debug("%s: dropped a reply to %s after close", self.name, identity.hex())
            return
        try:
            if not tracked_bytes:
                self._socket.send_multipart([identity, *frames], zmq.NOBLOCK)
                return
            # Only the identity frame can fail (ROUTER checks the peer's queue there), so the rest
            # of the message always follows it.
            self._socket.send_multipart([identity, *frames[:-1]], zmq.NOBLOCK | zmq.SNDMORE)
            tracker = self._socket.send(frames[-1], zmq.NOBLOCK, copy=False, track=True)
            self._outbox.add(identity, tracker, tracked_bytes)
        except zmq.Again:       # the peer's queue is full: it is not reading, so it would not see this
            self.dropped_replies += 1
            if self.dropped_replies & (self.dropped_replies - 1) == 0:      # 1st, 2nd, 4th, 8th, ...
                log.warning("%s: dropped a reply to %s (peer not reading; %d dropped so far)", self.name,
                            identity.hex(), self.dropped_replies)
        except zmq.ZMQError as e:
            if e.errno != errno.EHOSTUNREACH:
                raise
            log.debug("%s: dropped a reply to %s (peer gone)", self.name, identity.hex())

    def _run_calls(self) -> None:
        try:
            os.eventfd_read(self._wake_fd)
        except BlockingIOError:
            pass
        while True:
            try:
                fn = self._calls.get_nowait()
            except queue.Empty:
                return
            self._run_guarded(fn, "callback")

    def _run_due_timers(self) -> None:
        for t in self._timers:
            if t.due <= time.monotonic():
                self._run_guarded(t.fn, "timer")
                t.due += t.interval_s
                now = time.monotonic()
                if t.due <= now:        # fell behind: skip the missed runs rather than burst
                    t.due = now + t.interval_s

    def _run_guarded(self, fn: Callable[[], object], what: str) -> None:
        try:
            fn()
        except Exception:
            log.exception("%s: %s %r failed", self.name, what, fn)


def _peer_of(frame: zmq.Frame) -> PeerCred | None:
    try:
        return PeerCred.parse(frame.get("Peer-Address"))
    except zmq.ZMQError:        # no such property (a transport that reports no peer)
        return None


def _printable(text: str) -> str:
    """``text`` with anything orjson refuses (lone surrogates from undecodable paths) escaped."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _unlink_if_same(path: str, dev: int, ino: int) -> None:
    """Remove the socket file we bound unless another server has since replaced it."""
    try:
        st = os.stat(path)
        if (st.st_dev, st.st_ino) == (dev, ino):
            os.unlink(path)
    except FileNotFoundError:
        pass
