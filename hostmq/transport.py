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

Replies to peers that have gone are dropped (ROUTER_MANDATORY off); sockets never linger on close.

Ownership: the process that binds an ``ipc://`` path owns its socket file and unlinks it on close if
the file is still the one it created. libzmq's bind silently replaces an existing file, so a caller
that must be the only server on a path (a broker) takes its lock *before* ``bind()`` (OS_NOTES 3).
"""
from __future__ import annotations

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
from .protocol.frames import Frame, decode, encode_response, peek_request_id

log = logging.getLogger(__name__)

MAX_BATCH = 256          # requests handled per poll_once before timers get their turn
SNDHWM = 100_000         # replies queued per peer before more are dropped (a peer that has stopped reading)
STOP_CHECK_MS = 50       # run() looks at its stop event at least this often


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
    """Who asked what: the peer's routing identity and the request id. Answered at most once."""

    __slots__ = ("identity", "request_id", "code", "answered")

    def __init__(self, identity: bytes, request_id: int, code: int) -> None:
        self.identity = identity
        self.request_id = request_id
        self.code = code
        self.answered = False

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
                 name: str = "server") -> None:
        self.address = address
        self.name = name
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
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        sock.setsockopt(zmq.SNDHWM, SNDHWM)     # a client may pipeline thousands of requests
        try:
            sock.bind(self.address)
        except zmq.ZMQError as e:
            sock.close(0)
            raise ConnectError(f"{self.name} cannot bind {self.address}: {e}") from None
        self._socket = sock
        self._poller.register(sock, zmq.POLLIN)
        if self.address.startswith("ipc://"):
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
        self._send(token.identity, frames)

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
            try:
                msg = self._socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            handled += 1
            self._handle(msg[0], msg[1:])
        return handled

    def _handle(self, identity: bytes, frames: list[bytes]) -> None:
        if not frames:          # a ROUTER never delivers this from a DEALER; nothing to answer it with
            log.debug("%s: dropped an empty message from %s", self.name, identity.hex())
            return
        try:
            frame = decode(frames)
            if frame.response:
                raise ProtocolError("expected a request, got a response")
        except ProtocolError as e:
            log.debug("%s: bad request from %s: %s", self.name, identity.hex(), e)
            self._send(identity, encode_response(ResponseCode.BAD_REQUEST, peek_request_id(frames[0]),
                                                 remark=_printable(str(e))))
            return
        token = ReplyToken(identity, frame.request_id, frame.code)
        result = self._call_handler(frame, token)
        if result is not DEFER:
            self.reply(token, result)

    def _call_handler(self, frame: Frame, token: ReplyToken) -> "Reply | _Defer":
        handler = self._handlers.get(frame.code)
        if handler is None:
            return Reply(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                         remark=f"{self.name} does not support request code {frame.code}")
        try:
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

    def _send(self, identity: bytes, frames: list[bytes]) -> None:
        if self._socket is None:        # a deferred reply after close(): nobody to send it to
            log.debug("%s: dropped a reply to %s after close", self.name, identity.hex())
            return
        try:
            self._socket.send_multipart([identity, *frames], zmq.NOBLOCK)
        except zmq.Again:       # the peer's queue is full: it is not reading, so it would not see this
            log.warning("%s: dropped a reply to %s (peer not reading)", self.name, identity.hex())

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
