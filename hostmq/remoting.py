"""Client side of the control path: one zmq DEALER per server address, safe to share between threads.

::

    client = RemotingClient(ipc_address(paths.namesrv_socket()), timeout_s=3.0)
    frame = client.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"})   # SUCCESS Frame
    route = TopicRouteData.from_fields(frame.fields)
    client.close()

Threads: ``request_async`` encodes the request in the caller's thread (so bad fields raise
ProtocolError there), queues it and rings an eventfd; one I/O thread owns the DEALER, sends queued
requests, matches responses to futures by request id (a process-wide monotonic counter), and fails
requests whose deadline passed with SendTimeout. A response that arrives after its request timed out is
dropped. Future callbacks run on the I/O thread: keep them short.

``request`` and ``request_raw`` (a caller that waits anyway) skip that hand-off when nothing is in
flight through the I/O thread (so a request never overtakes an earlier ``request_async``): each calling
thread has a DEALER of its own (at most MAX_THREAD_SOCKETS per client; past that, the I/O thread's),
sends on it and reads the answer itself — two thread wake-ups fewer per round trip (issue 16: a PING costs one
zmq round trip, not three hops). Same rules: waits for a live connection until the deadline, drops
answers to requests that timed out, refuses requests from the server.

Connection: the constructor refuses an ``ipc://`` path nobody listens on (ConnectError) instead of
letting requests time out. After that zmq reconnects by itself every RECONNECT_IVL_MS, and with
``IMMEDIATE`` requests wait (until their deadline) for a live connection instead of being queued to a
dead one — so when a server restarts at the same address, later requests succeed; requests in flight
when it went away time out.

Errors of a non-SUCCESS response: MESSAGE_ILLEGAL → ValidationError, TOPIC_NOT_EXIST → NoRouteError,
SYSTEM_BUSY → BrokerBusyError, QUERY_NOT_FOUND → MessageNotFoundError, anything else → RemoteError(code,
remark). ``request_raw`` returns every response as a Frame (for codes that are outcomes, like
PULL_NOT_FOUND).
"""
from __future__ import annotations

import concurrent.futures
import heapq
import itertools
import logging
import os
import queue
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

import zmq

from .errors import ConnectError, ProtocolError, SendTimeout
from .locks import whereabouts
from .protocol.codes import ResponseCode, code_name, error_for_response
from .protocol.frames import (MAX_RESPONSE_HEADER_BYTES, Frame, decode, encode_request, encode_response,
                               peek_request_id)

log = logging.getLogger(__name__)

RECONNECT_IVL_MS = 50            # how soon zmq retries a lost or refused connection
MAX_THREAD_SOCKETS = 64          # calling threads with a socket of their own per client
CLOSE_CHECK_S = 0.1              # a thread waiting on its own socket notices close() this soon
RESULT_GRACE_S = 1.0             # a caller waits this much past the deadline before giving up on the I/O thread
_IPC = "ipc://"
_request_ids = itertools.count(1)    # next() on a count is atomic in CPython; 0 means "unknown id"


@dataclass(eq=False)
class _Request:
    request_id: int
    code: int
    frames: list[bytes]
    timeout_s: float
    deadline: float
    raw: bool
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


class RemotingClient:
    """Requests to one control address from any number of threads."""

    def __init__(self, address: str, *, timeout_s: float = 3.0, context: zmq.Context | None = None) -> None:
        self.address = address
        self.timeout_s = timeout_s
        _check_listening(address)
        self._context = zmq.Context.instance() if context is None else context
        self._queue: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._lock = threading.Lock()            # orders submissions against close()
        self._closed = False
        self._local = threading.local()
        self._thread_sockets: dict[int, _ThreadSocket] = {}       # thread ident → its own socket
        self._async_in_flight = 0        # requests through the I/O thread not answered yet
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            sock = self._connect()
        except BaseException:
            os.close(self._wake_fd)
            raise
        self._thread = threading.Thread(target=self._io_loop, args=(sock,), daemon=True,
                                        name=f"hostmq-remoting {address}")
        self._thread.start()

    # --- requests ----------------------------------------------------------------------------------

    def request(self, code: int, fields: dict | None = None, bodies: Sequence[bytes] = (),
                timeout_s: float | None = None) -> Frame:
        """The SUCCESS response to one request; the mapped error otherwise; SendTimeout if none came."""
        return self._request_sync(code, fields, bodies, timeout_s, False)

    def request_raw(self, code: int, fields: dict | None = None, bodies: Sequence[bytes] = (),
                    timeout_s: float | None = None) -> Frame:
        """The response to one request, whatever its code; SendTimeout if none came."""
        return self._request_sync(code, fields, bodies, timeout_s, True)

    def _request_sync(self, code: int, fields, bodies, timeout_s: float | None, raw: bool) -> Frame:
        ts = self._thread_socket() if not self._async_in_flight else None
        if ts is None:          # after async requests still in flight, or too many calling threads
            return self._wait(self.request_async(code, fields, bodies, timeout_s, raw=raw), timeout_s)
        timeout = self.timeout_s if timeout_s is None else timeout_s
        rid = next(_request_ids)
        frames = encode_request(code, rid, fields, bodies)
        deadline = time.monotonic() + timeout
        with ts.lock:
            sock = ts.sock
            while True:
                self._check_open()
                try:
                    sock.send_multipart(frames, zmq.NOBLOCK)
                    break
                except zmq.Again:         # no live connection yet (IMMEDIATE): wait for one
                    if not self._poll_one(sock, zmq.POLLOUT, deadline):
                        raise SendTimeout(_timeout_text(self.address, code, timeout)) from None
            while True:
                if not self._poll_one(sock, zmq.POLLIN, deadline):
                    raise SendTimeout(_timeout_text(self.address, code, timeout))
                msg = sock.recv_multipart(zmq.NOBLOCK)
                try:
                    frame = decode(msg, MAX_RESPONSE_HEADER_BYTES)
                except ProtocolError as e:
                    if peek_request_id(msg[0]) not in (rid, 0):
                        continue              # garbage answering an older request: not ours
                    log.warning("bad response from %s: %s", self.address, e)
                    raise ProtocolError(f"bad response from {self.address}: {e.why}") from None
                if not frame.response:
                    _refuse(sock, frame)
                elif frame.request_id != rid:
                    log.debug("dropped a response from %s to request %d (timed out)", self.address,
                              frame.request_id)
                elif raw or frame.code == ResponseCode.SUCCESS:
                    return frame
                else:
                    raise error_for_response(frame.code, frame.remark, self.address)

    def _check_open(self) -> None:
        if self._closed:
            raise ConnectError(f"client for {self.address} is closed")

    def _poll_one(self, sock: zmq.Socket, events: int, deadline: float) -> bool:
        """Wait for ``events`` on a thread's own socket until ``deadline`` (False), in slices that
        notice close() (ConnectError)."""
        while True:
            self._check_open()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if sock.poll(max(1, int(min(remaining, CLOSE_CHECK_S) * 1000) + 1), events):
                self._check_open()
                return True

    def _thread_socket(self) -> "_ThreadSocket | None":
        """This thread's own socket (made on first use); None past MAX_THREAD_SOCKETS."""
        ts = getattr(self._local, "ts", None)
        if ts is not None:
            return ts
        with self._lock:
            self._check_open()
            alive = {t.ident for t in threading.enumerate()}
            for ident in [i for i in self._thread_sockets if i not in alive]:   # threads that ended
                gone = self._thread_sockets.pop(ident)
                with gone.lock:
                    gone.sock.close(0)
            if len(self._thread_sockets) >= MAX_THREAD_SOCKETS:
                return None
            sock = self._connect()
            ts = self._thread_sockets[threading.get_ident()] = _ThreadSocket(sock)
        self._local.ts = ts
        return ts

    def request_async(self, code: int, fields: dict | None = None, bodies: Sequence[bytes] = (),
                      timeout_s: float | None = None, *, raw: bool = False) -> concurrent.futures.Future:
        """A Future of the response Frame, failing like :meth:`request` (or any code with ``raw=True``)."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        rid = next(_request_ids)
        req = _Request(rid, int(code), encode_request(code, rid, fields, bodies), timeout,
                       time.monotonic() + timeout, raw)
        with self._lock:
            if self._closed:
                raise ConnectError(f"client for {self.address} is closed")
            self._async_in_flight += 1
            self._queue.put(req)
            os.eventfd_write(self._wake_fd, 1)
        req.future.add_done_callback(self._async_done)
        return req.future

    def _async_done(self, _future) -> None:
        with self._lock:
            self._async_in_flight -= 1

    def close(self) -> None:
        """Stop the I/O thread and close the socket; requests still pending fail with ConnectError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.eventfd_write(self._wake_fd, 1)
            sockets, self._thread_sockets = list(self._thread_sockets.values()), {}
        for ts in sockets:      # a thread waiting on one lets go within CLOSE_CHECK_S
            with ts.lock:
                ts.sock.close(0)
        if threading.current_thread() is not self._thread:
            self._thread.join()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "RemotingClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _wait(self, future: concurrent.futures.Future, timeout_s: float | None) -> Frame:
        # The I/O thread enforces the deadline; the grace only guards against that thread being gone.
        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            return future.result(timeout + RESULT_GRACE_S)
        except concurrent.futures.TimeoutError:    # also catches SendTimeout: both are TimeoutError
            if future.done():
                raise
            raise SendTimeout(f"no answer from {self.address}: its I/O thread is not running") from None

    # --- the I/O thread ----------------------------------------------------------------------------

    def _connect(self) -> zmq.Socket:
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
        sock.setsockopt(zmq.RCVHWM, 0)      # the I/O thread always reads; never drop our own answers
        try:
            sock.connect(self.address)
        except zmq.ZMQError as e:
            sock.close(0)
            raise ConnectError(f"cannot connect to {self.address}: {e}") from None
        return sock

    def _io_loop(self, sock: zmq.Socket) -> None:
        loop = None
        try:
            loop = _IOLoop(self, sock)
            loop.run()
        except Exception:
            log.exception("remoting I/O thread for %s failed", self.address)
        finally:
            with self._lock:
                self._closed = True
                os.close(self._wake_fd)
            (loop or _IOLoop(self, None)).fail_all(ConnectError(f"client for {self.address} is closed"))
            sock.close(0)


class _IOLoop:
    """State of one client's I/O thread: requests in flight, their deadlines, and unsent requests."""

    def __init__(self, client: RemotingClient, sock: zmq.Socket | None) -> None:
        self.client = client
        self.sock = sock
        self.pending: dict[int, _Request] = {}
        self.deadlines: list[tuple[float, int]] = []     # heap; entries of answered requests linger
        self.unsent: deque[_Request] = deque()           # zmq refused them (no live peer yet: IMMEDIATE)
        self.poller = zmq.Poller()
        self.sock_events = zmq.POLLIN
        if sock is not None:            # None: only used to fail what is queued (fail_all)
            self.poller.register(client._wake_fd, zmq.POLLIN)
            self.poller.register(sock, self.sock_events)

    def run(self) -> None:
        while True:
            events = dict(self.poller.poll(self._wait_ms()))
            if self.client._wake_fd in events:
                try:
                    os.eventfd_read(self.client._wake_fd)
                except BlockingIOError:
                    pass
                if self.client._closed:
                    return
                self._take_new()
            if self.unsent:
                self._send_unsent()
            if events.get(self.sock, 0) & zmq.POLLIN:
                self._receive()
            self._expire()
            want = zmq.POLLIN | (zmq.POLLOUT if self.unsent else 0)
            if want != self.sock_events:
                self.sock_events = want
                self.poller.modify(self.sock, want)

    def fail_all(self, error: Exception) -> None:
        self._take_new()
        for req in self.pending.values():
            if not req.future.done():
                req.future.set_exception(error)
        self.pending.clear()

    def _wait_ms(self) -> int:
        while self.deadlines and self.deadlines[0][1] not in self.pending:
            heapq.heappop(self.deadlines)
        if not self.deadlines:
            return -1
        return max(0, int((self.deadlines[0][0] - time.monotonic()) * 1000) + 1)

    def _take_new(self) -> None:
        while True:
            try:
                req = self.client._queue.get_nowait()
            except queue.Empty:
                return
            if not req.future.set_running_or_notify_cancel():
                continue                          # cancelled before it was sent
            self.pending[req.request_id] = req
            heapq.heappush(self.deadlines, (req.deadline, req.request_id))
            self.unsent.append(req)

    def _send_unsent(self) -> None:
        while self.unsent:
            req = self.unsent[0]
            if req.request_id in self.pending:
                try:
                    self.sock.send_multipart(req.frames, zmq.NOBLOCK)
                except zmq.Again:
                    return
            self.unsent.popleft()

    def _receive(self) -> None:
        while True:
            try:
                msg = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._on_message(msg)

    def _on_message(self, msg: list[bytes]) -> None:
        address = self.client.address
        try:
            frame = decode(msg, MAX_RESPONSE_HEADER_BYTES)
        except ProtocolError as e:
            req = self.pending.pop(peek_request_id(msg[0]), None)
            log.warning("bad response from %s: %s", address, e)
            if req is not None:
                req.future.set_exception(ProtocolError(f"bad response from {address}: {e.why}"))
            return
        if not frame.response:     # the server asked us something: this client serves no requests
            self._refuse(frame)
            return
        req = self.pending.pop(frame.request_id, None)
        if req is None:
            log.debug("dropped a response from %s to request %d (timed out or unknown)", address,
                      frame.request_id)
        elif req.raw or frame.code == ResponseCode.SUCCESS:
            req.future.set_result(frame)
        else:
            req.future.set_exception(error_for_response(frame.code, frame.remark, address))

    def _refuse(self, frame: Frame) -> None:
        _refuse(self.sock, frame)

    def _expire(self) -> None:
        now = time.monotonic()
        while self.deadlines and self.deadlines[0][0] <= now:
            _, rid = heapq.heappop(self.deadlines)
            req = self.pending.pop(rid, None)
            if req is not None:
                req.future.set_exception(SendTimeout(_timeout_message(self.client.address, req)))


class _ThreadSocket:
    """A calling thread's own DEALER; ``lock`` is held while it is used (close() takes it too)."""

    __slots__ = ("sock", "lock")

    def __init__(self, sock: zmq.Socket) -> None:
        self.sock = sock
        self.lock = threading.Lock()


def _refuse(sock: zmq.Socket, frame: Frame) -> None:
    """Answer a request the server sent us: a client serves none."""
    answer = encode_response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, frame.request_id,
                             remark="this client serves no requests")
    try:
        sock.send_multipart(answer, zmq.NOBLOCK)
    except zmq.Again:
        pass


def _timeout_message(address: str, req: _Request) -> str:
    return _timeout_text(address, req.code, req.timeout_s)


def _timeout_text(address: str, code: int, timeout_s: float) -> str:
    text = f"no answer from {address} to {code_name(code)} within {timeout_s:g} s"
    if address.startswith(_IPC) and not os.path.exists(address[len(_IPC):]):
        text += f" (nothing listening at {address[len(_IPC):]}{_hint(address[len(_IPC):])})"
    return text


def listening(address: str) -> bool:
    """Whether something listens at ``address`` (always True for a non-ipc address)."""
    try:
        _check_listening(address)
    except ConnectError:
        return False
    return True


def _hint(path: str) -> str:
    """What to do about a server socket of a root that nothing listens at: for a broker's
    (``ROOT/brokers/INSTANCE/broker.sock``) where that broker is — the pid holding its lock, or how to
    start it (``locks.whereabouts``); for a NameServer's (``ROOT/namesrv*.sock``) how to start the
    cluster; "" for any other path."""
    d, name = os.path.split(path)
    if name == "broker.sock" and os.path.basename(os.path.dirname(d)) == "brokers":
        return f"; broker {os.path.basename(d)}: {whereabouts(os.path.dirname(os.path.dirname(d)), os.path.basename(d))}"
    if name.startswith("namesrv") and name.endswith(".sock"):
        return f"; no NameServer runs under {d}: start the cluster (`hostmq up {d}`)"
    return ""


def _check_listening(address: str) -> None:
    """ConnectError now if ``address`` is an ipc path with no listener (missing or stale socket file).

    zmq would connect lazily and let every request time out; a plain connect() tells at once.
    """
    if not address.startswith(_IPC):
        return
    path = address[len(_IPC):]
    if not os.path.exists(path):
        raise ConnectError(f"nothing listening at {path}{_hint(path)}")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        raise ConnectError(f"nothing listening at {path} (stale socket file: its server is gone){_hint(path)}") \
            from None
    except FileNotFoundError:
        raise ConnectError(f"nothing listening at {path}{_hint(path)}") from None
    except PermissionError:
        raise ConnectError(f"no permission to connect to {path} (is this user in the root's group?)") from None
    except socket.timeout:
        pass        # a listener with a full backlog is still a listener
    except OSError as e:
        raise ConnectError(f"cannot connect to {path}: {e.strerror or e}") from None
    finally:
        probe.close()
