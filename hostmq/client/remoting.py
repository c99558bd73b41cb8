"""Client side of the control path: one zmq DEALER per server address, safe to share between threads.

::

    client = RemotingClient(ipc_address(paths.namesrv_socket()), timeout_s=3.0)
    frame = client.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"})   # SUCCESS Frame
    route = TopicRouteData.from_fields(frame.fields)
    client.close()

Threads: callers never touch the socket. ``request_async`` encodes the request in the caller's thread
(so bad fields raise ProtocolError there), queues it and rings an eventfd; one I/O thread owns the DEALER,
sends queued requests, matches responses to futures by request id (a process-wide monotonic counter),
and fails requests whose deadline passed with SendTimeout. A response that arrives after its request
timed out is dropped. Future callbacks run on the I/O thread: keep them short.

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

from ..errors import ConnectError, ProtocolError, SendTimeout
from ..protocol.codes import ResponseCode, code_name, error_for_response
from ..protocol.frames import (MAX_RESPONSE_HEADER_BYTES, Frame, decode, encode_request, encode_response,
                               peek_request_id)

log = logging.getLogger(__name__)

RECONNECT_IVL_MS = 50            # how soon zmq retries a lost or refused connection
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
        return self._wait(self.request_async(code, fields, bodies, timeout_s), timeout_s)

    def request_raw(self, code: int, fields: dict | None = None, bodies: Sequence[bytes] = (),
                    timeout_s: float | None = None) -> Frame:
        """The response to one request, whatever its code; SendTimeout if none came."""
        return self._wait(self.request_async(code, fields, bodies, timeout_s, raw=True), timeout_s)

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
            self._queue.put(req)
            os.eventfd_write(self._wake_fd, 1)
        return req.future

    def close(self) -> None:
        """Stop the I/O thread and close the socket; requests still pending fail with ConnectError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.eventfd_write(self._wake_fd, 1)
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
        answer = encode_response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, frame.request_id,
                                 remark="this client serves no requests")
        try:
            self.sock.send_multipart(answer, zmq.NOBLOCK)
        except zmq.Again:
            pass

    def _expire(self) -> None:
        now = time.monotonic()
        while self.deadlines and self.deadlines[0][0] <= now:
            _, rid = heapq.heappop(self.deadlines)
            req = self.pending.pop(rid, None)
            if req is not None:
                req.future.set_exception(SendTimeout(_timeout_message(self.client.address, req)))


def _timeout_message(address: str, req: _Request) -> str:
    text = f"no answer from {address} to {code_name(req.code)} within {req.timeout_s:g} s"
    if address.startswith(_IPC) and not os.path.exists(address[len(_IPC):]):
        text += f" (nothing listening at {address[len(_IPC):]})"
    return text


def _check_listening(address: str) -> None:
    """ConnectError now if ``address`` is an ipc path with no listener (missing or stale socket file).

    zmq would connect lazily and let every request time out; a plain connect() tells at once.
    """
    if not address.startswith(_IPC):
        return
    path = address[len(_IPC):]
    if not os.path.exists(path):
        raise ConnectError(f"nothing listening at {path}")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        raise ConnectError(f"nothing listening at {path} (stale socket file: its server is gone)") from None
    except FileNotFoundError:
        raise ConnectError(f"nothing listening at {path}") from None
    except PermissionError:
        raise ConnectError(f"no permission to connect to {path} (is this user in the root's group?)") from None
    except socket.timeout:
        pass        # a listener with a full backlog is still a listener
    except OSError as e:
        raise ConnectError(f"cannot connect to {path}: {e.strerror or e}") from None
    finally:
        probe.close()
