"""Control path over real sockets: hostmq.transport.Server ⇄ hostmq.remoting.RemotingClient.

Every server, client, raw socket, context and process is made by a fixture factory that closes it;
``no_leaks`` fails a test that leaves a thread or child process behind. Waits are on conditions with
deadlines, never bare sleeps.
"""
from __future__ import annotations

import concurrent.futures
import logging
import multiprocessing
import os
import re
import socket
import threading
import time

import orjson
import pytest
import zmq

from hostmq.remoting import RemotingClient
from hostmq.errors import (BrokerBusyError, ConnectError, HostMQError, NoRouteError, ProtocolError, RemoteError,
                           PermissionDeniedError, SendTimeout, StoreFullError, ValidationError)
from hostmq.protocol import (MAX_HEADER_BYTES, MAX_REQUEST_FRAMES, RequestCode, ResponseCode, decode,
                             encode_request, encode_response)
from hostmq.root import ipc_address
from hostmq.protocol.permissions import ControlPolicy, PeerCred
from hostmq.transport import DEFER, Reply, ReplyToken, Server, ServerLimits
from tests.conftest import wait_until
from tests.conftest import Running
from zmq.utils.garbage import GarbageCollectorThread

pytestmark = pytest.mark.timeout(60)

PING = RequestCode.PING
WAIT_S = 10.0          # generous deadline for anything that should happen "soon" on a loaded machine


def echo(frame, token):
    return Reply(fields={"code": frame.code, "f": frame.fields}, bodies=frame.bodies)


# --- fixtures ------------------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def no_leaks():
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + WAIT_S
    for t in set(threading.enumerate()) - before:
        t.join(max(0.0, deadline - time.monotonic()))
    # pyzmq's one garbage-collector thread (zero-copy sends of tracked replies) lives for the process.
    left = [t.name for t in set(threading.enumerate()) - before
            if t.is_alive() and not isinstance(t, GarbageCollectorThread)]
    assert not left, f"threads left running: {left}"
    assert not multiprocessing.active_children(), "child processes left running"


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    still_open = [s for s in context._sockets if not s.closed]
    context.destroy(linger=0)
    assert not still_open, f"sockets left open: {still_open}"


@pytest.fixture
def sock_path(tmp_path):
    return str(tmp_path / "s.sock")


@pytest.fixture
def serve(ctx, sock_path):
    """``serve(handlers, path=None, name="test", start=True)`` → Running server, stopped at teardown."""
    running: list[Running] = []

    def _serve(handlers, *, path=None, name="test", start=True, limits=None, policy=None) -> Running:
        path = path or sock_path
        server = Server(ipc_address(path), handlers, context=ctx, name=name, limits=limits or ServerLimits(),
                        policy=policy)
        server.bind()
        r = Running(server, path)
        running.append(r)
        return r.start() if start else r

    yield _serve
    for r in running:
        r.stop()


@pytest.fixture
def connect(ctx):
    """``connect(address, **kw)`` → RemotingClient on the test's context, closed at teardown."""
    clients: list[RemotingClient] = []

    def _connect(address, **kw) -> RemotingClient:
        kw.setdefault("context", ctx)
        c = RemotingClient(address, **kw)
        clients.append(c)
        return c

    yield _connect
    for c in clients:
        c.close()


@pytest.fixture
def raw_socket(ctx):
    """``raw_socket(kind, address, bind=False)`` → a plain zmq socket (linger 0), closed at teardown."""
    socks: list[zmq.Socket] = []

    def _raw(kind, address, bind=False) -> zmq.Socket:
        s = ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        (s.bind if bind else s.connect)(address)
        socks.append(s)
        return s

    yield _raw
    for s in socks:
        s.close(0)


def _serve_in_child(address: str, stop, ready, tag: str) -> None:
    """Target of a spawned server process: an echo server that also says who it is."""
    def who(frame, token):
        return Reply(fields={"pid": os.getpid(), "tag": tag, "f": frame.fields}, bodies=frame.bodies)

    server = Server(address, {PING: who}, name=f"echo-{tag}")
    try:
        server.bind()
        ready.set()
        server.run(stop)
    finally:
        server.close()


@pytest.fixture
def spawn_server():
    """``spawn_server(address, tag)`` → (process, stop event) of a server in a spawned process."""
    mp = multiprocessing.get_context("spawn")
    procs = []

    def _spawn(address, tag):
        stop, ready = mp.Event(), mp.Event()
        p = mp.Process(target=_serve_in_child, args=(address, stop, ready, tag), name=f"server-{tag}")
        p.start()
        procs.append(p)
        assert ready.wait(30), "spawned server did not bind"
        return p, stop

    yield _spawn
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(WAIT_S)


def recv_within(sock: zmq.Socket, timeout_s: float = WAIT_S) -> list[bytes]:
    assert sock.poll(int(timeout_s * 1000)), "no answer within the deadline"
    return sock.recv_multipart()


def request_until_ok(client: RemotingClient, code=PING, fields=None, deadline_s: float = WAIT_S):
    """Retry a request that may be lost while a connection is re-established."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return client.request(code, fields, timeout_s=0.5)
        except SendTimeout:
            if time.monotonic() > deadline:
                raise


# --- request / response ----------------------------------------------------------------------------

def test_request_response(serve, connect):
    c = connect(serve({PING: echo}).address)
    got = c.request(PING, {"a": [1, "x", None], "b": {"c": 2.5}}, [b"\x00\xff" * 100, b""])
    assert got.response and got.code == ResponseCode.SUCCESS and got.request_id > 0
    assert got.fields == {"code": PING, "f": {"a": [1, "x", None], "b": {"c": 2.5}}}
    assert got.bodies == (b"\x00\xff" * 100, b"")
    assert c.request(PING).fields == {"code": PING, "f": {}}


def test_default_context_client(serve):
    with RemotingClient(serve({PING: echo}).address) as c:
        assert c.request(PING, {"x": 1}).fields["f"] == {"x": 1}
    assert c.closed


def test_unknown_code_is_not_supported(serve, connect):
    c = connect(serve({PING: echo}, name="namesrv").address)
    with pytest.raises(RemoteError) as err:
        c.request(777)
    assert err.value.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and "777" in err.value.remark
    raw = c.request_raw(RequestCode.PULL_MESSAGE)
    assert raw.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert raw.remark == "namesrv does not support request code 11"
    assert c.request(PING).code == ResponseCode.SUCCESS


@pytest.mark.parametrize("exc,code,client_error", [
    (ValidationError("topic 'a b' is not valid"), ResponseCode.MESSAGE_ILLEGAL, ValidationError),
    (NoRouteError("no route for topic orders"), ResponseCode.TOPIC_NOT_EXIST, NoRouteError),
    (BrokerBusyError("ingress ring full"), ResponseCode.SYSTEM_BUSY, BrokerBusyError),
    (StoreFullError("disk 93% full"), ResponseCode.SYSTEM_BUSY, BrokerBusyError),
    (ProtocolError("field topic must be str"), ResponseCode.BAD_REQUEST, RemoteError),
    (HostMQError("something else"), ResponseCode.SYSTEM_ERROR, RemoteError),
])
def test_handler_hostmq_errors_become_mapped_responses(serve, connect, exc, code, client_error):
    def fail(frame, token):
        raise exc

    c = connect(serve({RequestCode.SEND_MESSAGE: fail, PING: echo}).address)
    raw = c.request_raw(RequestCode.SEND_MESSAGE)
    assert (raw.code, raw.remark) == (code, str(exc))
    with pytest.raises(client_error, match=re.escape(str(exc))) as err:
        c.request(RequestCode.SEND_MESSAGE)
    if client_error is RemoteError:
        assert err.value.code == code
    assert c.request(PING).code == ResponseCode.SUCCESS


def test_handler_bug_is_a_logged_system_error_and_the_server_keeps_serving(serve, connect, caplog):
    def boom(frame, token):
        raise RuntimeError("boom")

    c = connect(serve({RequestCode.SEND_MESSAGE: boom, PING: echo}).address)
    with caplog.at_level(logging.ERROR, logger="hostmq.transport"):
        with pytest.raises(RemoteError, match="RuntimeError: boom") as err:
            c.request(RequestCode.SEND_MESSAGE)
    assert err.value.code == ResponseCode.SYSTEM_ERROR
    logged = [r for r in caplog.records if r.name == "hostmq.transport" and r.exc_info]
    assert logged and "SEND_MESSAGE" in logged[0].getMessage()
    assert c.request(PING, {"still": "alive"}).fields["f"] == {"still": "alive"}


@pytest.mark.parametrize("result,remark", [
    (None, "handler returned no reply"),
    ("a string", "handler returned no reply"),
    (Reply(fields={"raw": b"bytes are not JSON"}), "could not encode its reply"),
    (Reply(remark="\udcff undecodable path"), "could not encode its reply"),
])
def test_handler_returning_junk_is_a_system_error(serve, connect, caplog, result, remark):
    c = connect(serve({RequestCode.SEND_MESSAGE: lambda f, t: result, PING: echo}).address)
    with caplog.at_level(logging.ERROR, logger="hostmq.transport"):
        raw = c.request_raw(RequestCode.SEND_MESSAGE)
    assert raw.code == ResponseCode.SYSTEM_ERROR and remark in raw.remark
    assert c.request(PING).code == ResponseCode.SUCCESS


def test_an_exception_with_an_undecodable_message_still_gets_its_code(serve, connect):
    def fail(frame, token):
        raise ValidationError("bad file name b'\udcff'")

    c = connect(serve({RequestCode.SEND_MESSAGE: fail}).address)
    with pytest.raises(ValidationError, match="bad file name"):
        c.request(RequestCode.SEND_MESSAGE)


def test_bad_fields_fail_in_the_caller_before_sending(serve, connect):
    c = connect(serve({PING: echo}).address)
    with pytest.raises(ProtocolError, match="JSON"):
        c.request(PING, {"body": b"not JSON"})
    with pytest.raises(ProtocolError):
        c.request(PING, bodies=b"a single bytes object")
    assert c.request(PING).code == ResponseCode.SUCCESS


# --- malformed traffic from a raw DEALER -------------------------------------------------------------

_BAD_VERSION = orjson.dumps({"v": 2, "code": 902, "id": 77, "resp": False, "remark": "", "f": {}})


@pytest.mark.parametrize("frames,request_id,why", [
    ([b"\x00garbage\xff"], 0, "not valid JSON"),
    ([b""], 0, "not valid JSON"),
    ([b"", b"", b""], 0, "not valid JSON"),
    ([b"not json at all"], 0, "not valid JSON"),
    ([b"[1, 2, 3]"], 0, "must be a JSON object"),
    ([b'{"v": 1, "id": 5}'], 5, "lacks key"),
    ([b"{}", b"a body"], 0, "lacks key"),
    ([_BAD_VERSION], 77, "protocol version 2 is not supported"),
    ([b" " * MAX_HEADER_BYTES], 0, "not valid JSON"),
    ([b"{}"] + [b"b"] * MAX_REQUEST_FRAMES, 0, "at most 64 frames"),
    ([orjson.dumps({"v": 1, "code": "10", "id": 6, "resp": False, "remark": "", "f": {}})], 6, "'code'"),
    (encode_response(0, 9), 9, "expected a request, got a response"),
])
def test_malformed_requests_get_bad_request_and_the_server_keeps_serving(serve, connect, raw_socket,
                                                                          frames, request_id, why):
    running = serve({PING: echo})
    dealer = raw_socket(zmq.DEALER, running.address)
    dealer.send_multipart(frames)
    answer = decode(recv_within(dealer))
    assert answer.response and answer.code == ResponseCode.BAD_REQUEST
    assert answer.request_id == request_id and why in answer.remark
    dealer.send_multipart(encode_request(PING, 123, {"after": "garbage"}))
    good = decode(recv_within(dealer))
    assert (good.code, good.request_id, good.fields["f"]) == (ResponseCode.SUCCESS, 123, {"after": "garbage"})
    assert connect(running.address).request(PING).code == ResponseCode.SUCCESS


def test_a_flood_of_garbage_mixed_with_requests(serve, raw_socket):
    dealer = raw_socket(zmq.DEALER, serve({PING: echo}).address)
    for i in range(1, 301):
        dealer.send_multipart([b"\xff" * i] if i % 3 else encode_request(PING, i))
    answers = [decode(recv_within(dealer)) for _ in range(300)]
    assert sorted(a.request_id for a in answers if a.code == ResponseCode.SUCCESS) == list(range(3, 301, 3))
    assert sum(a.code == ResponseCode.BAD_REQUEST for a in answers) == 200


# --- per-peer bounds --------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [MAX_HEADER_BYTES + 1, 64 << 20])
def test_an_oversized_frame_drops_the_connection_and_gets_no_answer(serve, raw_socket, size):
    """libzmq refuses the frame as its header arrives (ZMQ_MAXMSGSIZE); the DEALER reconnects, and the
    only answers it ever sees are to its later PINGs."""
    running = serve({PING: echo})
    dealer = raw_socket(zmq.DEALER, running.address)
    dealer.send_multipart([b"x" * size])
    answers, deadline, rid = [], time.monotonic() + WAIT_S, 0
    while not any(a.code == ResponseCode.SUCCESS for a in answers):     # a PING may die with the connection
        assert time.monotonic() < deadline, "the server stopped answering"
        rid += 1
        dealer.send_multipart(encode_request(PING, rid))
        if dealer.poll(500):
            answers.append(decode(dealer.recv_multipart()))
    while dealer.poll(100):
        answers.append(decode(dealer.recv_multipart()))
    assert all(a.code == ResponseCode.SUCCESS and a.request_id > 0 for a in answers), answers


def test_a_peer_that_never_reads_holds_bounded_reply_bytes_and_others_are_served(serve, connect, ctx, caplog):
    """Past its unsent-bytes limit a client gets SYSTEM_BUSY instead of more large replies; past sndhwm
    its replies are dropped; a well-behaved client still gets large replies."""
    limits = ServerLimits(sndhwm=64, peer_unsent_bytes=1 << 20, total_unsent_bytes=4 << 20)
    body = b"z" * (64 << 10)
    handled = []
    # The last frame is small: a reply is tracked by its last frame, whatever its size.
    running = serve({PING: lambda f, t: handled.append(1) or Reply(bodies=[body, b"end"])}, limits=limits)
    lazy = ctx.socket(zmq.DEALER)
    lazy.setsockopt(zmq.LINGER, 0)
    lazy.setsockopt(zmq.RCVHWM, 1)          # its own libzmq buffers almost nothing for it
    lazy.setsockopt(zmq.RCVBUF, 4096)
    lazy.connect(running.address)
    try:
        for i in range(1, 401):
            lazy.send_multipart(encode_request(PING, i))
        wait_until(lambda: len(handled) >= 400, WAIT_S, "400 requests handled")
        server = running.server
        assert server.busy_replies > 0 and server.dropped_replies > 0
        assert server.unsent_reply_bytes <= limits.peer_unsent_bytes
        good = connect(running.address).request(PING)
        assert good.bodies == (body, b"end")
        got = []
        while lazy.poll(1000):
            got.append(decode(lazy.recv_multipart()).code)
        assert {ResponseCode.SUCCESS, ResponseCode.SYSTEM_BUSY} == set(got)
        assert len(got) + server.dropped_replies == 400
    finally:
        lazy.close(0)
    wait_until(lambda: running.server.unsent_reply_bytes == 0, WAIT_S, "written replies to be forgotten")


# --- deferred replies (long polling) -----------------------------------------------------------------

def test_deferred_replies_answered_from_a_timer(serve, connect):
    held = []
    running = serve({RequestCode.PULL_MESSAGE: lambda f, t: held.append((t, f.fields["n"])) or DEFER,
                     PING: echo}, start=False)
    server = running.server

    def answer_held():
        while held:
            token, n = held.pop()
            server.reply(token, Reply(fields={"n": n}))
            server.reply(token, Reply(fields={"n": -1}))       # a second answer is dropped

    server.add_timer(0.005, answer_held)
    running.start()
    c = connect(running.address)
    futures = [c.request_async(RequestCode.PULL_MESSAGE, {"n": i}) for i in range(50)]
    assert [f.result(WAIT_S).fields["n"] for f in futures] == list(range(50))
    assert c.request(PING, {"x": 1}).fields["f"] == {"x": 1}


def test_deferred_reply_from_another_thread(serve, connect):
    arrived = threading.Event()
    tokens = []

    def hold(frame, token):
        tokens.append(token)
        arrived.set()
        return DEFER

    running = serve({RequestCode.PULL_MESSAGE: hold})
    c = connect(running.address)
    future = c.request_async(RequestCode.PULL_MESSAGE, {"queue": 3})
    assert arrived.wait(WAIT_S) and not future.done()
    running.server.call_soon_threadsafe(
        lambda: running.server.reply(tokens[0], Reply(code=ResponseCode.PULL_NOT_FOUND, remark="nothing new")))
    with pytest.raises(RemoteError, match="nothing new") as err:
        future.result(WAIT_S)
    assert err.value.code == ResponseCode.PULL_NOT_FOUND


def test_timers_run_and_a_failing_timer_is_logged_and_kept(serve, caplog):
    ticks, failures, done = [], [], threading.Event()

    def tick():
        ticks.append(time.monotonic())
        if len(ticks) >= 5 and len(failures) >= 3:
            done.set()

    def fail_three_times():
        if len(failures) < 3:
            failures.append(1)
            raise RuntimeError("timer bug")

    running = serve({PING: echo}, start=False)
    added = time.monotonic()
    running.server.add_timer(0.01, tick)
    running.server.add_timer(0.01, fail_three_times)
    with pytest.raises(ValueError):
        running.server.add_timer(0, tick)
    with caplog.at_level(logging.ERROR, logger="hostmq.transport"):
        running.start()
        assert done.wait(WAIT_S)
    assert ticks[0] >= added + 0.01, "the first run is one interval after add_timer"
    logged = [r for r in caplog.records if r.exc_info and "timer" in r.getMessage()]
    assert len(logged) == 3 and "timer bug" in str(logged[0].exc_info[1])


# --- concurrency -----------------------------------------------------------------------------------------

def test_8_threads_x_200_requests_share_one_client(serve, connect):
    c = connect(serve({PING: echo}).address)

    def worker(t: int) -> int:
        for j in range(200):
            got = c.request(PING, {"t": t, "j": j}, [f"{t}:{j}".encode()])
            assert got.fields["f"] == {"t": t, "j": j} and got.bodies == (f"{t}:{j}".encode(),)
        return t

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert sorted(pool.map(worker, range(8))) == list(range(8))


def test_thousands_of_requests_in_flight_at_once(serve, connect):
    c = connect(serve({PING: echo}).address)
    futures = [c.request_async(PING, {"i": i}, timeout_s=WAIT_S * 2) for i in range(3000)]
    assert [f.result(WAIT_S * 3).fields["f"]["i"] for f in futures] == list(range(3000))


def test_a_waiting_caller_uses_its_own_socket_unless_async_requests_are_in_flight(serve, connect):
    """``request`` skips the I/O thread (its thread's own connection) — except while requests made with
    ``request_async`` are unanswered: then it queues behind them, so it never overtakes one."""
    seen, held, arrived = [], [], threading.Event()

    def record(frame, token):
        seen.append((frame.code, token.identity))
        if frame.code == RequestCode.PULL_MESSAGE:
            held.append(token)
            arrived.set()
            return DEFER
        return echo(frame, token)

    running = serve({PING: record, RequestCode.PULL_MESSAGE: record})
    c = connect(running.address)
    c.request(PING)
    other = threading.Thread(target=c.request, args=(PING,))
    other.start()
    other.join(WAIT_S)
    assert seen[0][1] != seen[1][1], "two calling threads share a connection"
    future = c.request_async(RequestCode.PULL_MESSAGE)
    assert arrived.wait(WAIT_S)
    answered = []
    t = threading.Thread(target=lambda: answered.append(c.request(PING)))
    t.start()
    wait_until(lambda: len(seen) == 4, WAIT_S, "the PING behind the held pull")
    assert seen[3][1] == seen[2][1] != seen[0][1], "the PING did not go the async request's way"
    running.server.call_soon_threadsafe(lambda: running.server.reply(held[0], Reply(fields={})))
    assert future.result(WAIT_S).code == ResponseCode.SUCCESS
    t.join(WAIT_S)
    assert answered and answered[0].code == ResponseCode.SUCCESS
    c.request(PING)
    assert seen[-1][1] == seen[0][1], "back on the thread's own connection once nothing is in flight"


def test_close_ends_a_wait_on_a_threads_own_socket(serve, connect):
    arrived = threading.Event()
    running = serve({RequestCode.PULL_MESSAGE: lambda f, t: arrived.set() or DEFER})
    c = connect(running.address)
    errors = []

    def wait_forever():
        try:
            c.request(RequestCode.PULL_MESSAGE, timeout_s=600)
        except HostMQError as e:
            errors.append(e)
    t = threading.Thread(target=wait_forever)
    t.start()
    assert arrived.wait(WAIT_S)
    c.close()
    t.join(WAIT_S)
    assert not t.is_alive() and isinstance(errors[0], ConnectError)


# --- timeouts, closing -----------------------------------------------------------------------------------

def test_no_answer_is_send_timeout_and_a_late_answer_is_dropped(serve, connect):
    held, arrived = [], threading.Event()
    running = serve({RequestCode.PULL_MESSAGE: lambda f, t: held.append(t) or arrived.set() or DEFER,
                     PING: echo})
    c = connect(running.address, timeout_s=0.2)
    start = time.monotonic()
    with pytest.raises(SendTimeout, match=re.escape(f"no answer from {running.address} to PULL_MESSAGE(11) "
                                                    "within 0.2 s")):
        c.request(RequestCode.PULL_MESSAGE)
    assert 0.2 <= time.monotonic() - start < 0.2 + WAIT_S
    assert arrived.wait(WAIT_S)
    running.server.call_soon_threadsafe(lambda: running.server.reply(held[0], Reply(fields={"late": True})))
    assert c.request(PING, {"mine": 1}, timeout_s=WAIT_S).fields["f"] == {"mine": 1}
    with pytest.raises(SendTimeout, match="within 0.05 s"):
        c.request_raw(RequestCode.PULL_MESSAGE, timeout_s=0.05)
    assert isinstance(SendTimeout("x"), TimeoutError)


def test_close_fails_pending_requests_and_refuses_new_ones(serve, connect):
    arrived = threading.Event()
    running = serve({RequestCode.PULL_MESSAGE: lambda f, t: arrived.set() or DEFER})
    c = connect(running.address)
    future = c.request_async(RequestCode.PULL_MESSAGE)
    assert arrived.wait(WAIT_S)
    c.close()
    assert isinstance(future.exception(WAIT_S), ConnectError)
    with pytest.raises(ConnectError, match="closed"):
        c.request(PING)
    c.close()       # idempotent


def test_close_from_a_future_callback(serve, ctx):
    c = RemotingClient(serve({PING: echo}).address, context=ctx)
    done = threading.Event()
    future = c.request_async(PING)
    future.add_done_callback(lambda f: (c.close(), done.set()))
    assert done.wait(WAIT_S) and c.closed
    c.close()


# --- connecting and reconnecting -------------------------------------------------------------------------

def test_connect_to_a_missing_socket_is_connect_error(ctx, sock_path):
    with pytest.raises(ConnectError, match=f"nothing listening at {re.escape(sock_path)}$"):
        RemotingClient(ipc_address(sock_path), context=ctx)


def test_connect_to_a_stale_socket_file_is_connect_error(ctx, sock_path):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(sock_path)               # a file nobody listens on: what a killed server leaves
    with pytest.raises(ConnectError, match="stale socket file"):
        RemotingClient(ipc_address(sock_path), context=ctx)


def test_server_bind_failure_is_connect_error(ctx, tmp_path):
    server = Server(ipc_address(str(tmp_path / "no-such-dir" / "s.sock")), {}, context=ctx)
    with pytest.raises(ConnectError, match="cannot bind"):
        server.bind()
    server.close()


def test_server_restart_client_recovers(serve, connect, sock_path):
    first = serve({PING: lambda f, t: Reply(fields={"server": 1})}, name="first")
    c = connect(first.address)
    assert c.request(PING).fields == {"server": 1}
    first.stop()
    assert not os.path.exists(sock_path), "a cleanly closed server removes its socket file"
    with pytest.raises(SendTimeout, match="nothing listening"):
        c.request(PING, timeout_s=0.2)
    serve({PING: lambda f, t: Reply(fields={"server": 2})}, name="second")
    assert request_until_ok(c).fields == {"server": 2}
    assert c.request(PING).fields == {"server": 2}


def test_poll_once_drives_the_server_without_threads(ctx, raw_socket, sock_path):
    server = Server(ipc_address(sock_path), {PING: echo}, context=ctx)
    with pytest.raises(RuntimeError):
        server.poll_once(0)
    server.bind()
    dealer = raw_socket(zmq.DEALER, server.address)
    dealer.send_multipart(encode_request(PING, 5, {"a": 1}))
    dealer.send_multipart([b"junk"])
    handled, deadline = 0, time.monotonic() + WAIT_S
    while handled < 2 and time.monotonic() < deadline:
        handled += server.poll_once(100)
    assert handled == 2
    answers = [decode(recv_within(dealer)) for _ in range(2)]
    assert [(a.request_id, a.code) for a in answers] == [(5, ResponseCode.SUCCESS), (0, ResponseCode.BAD_REQUEST)]
    assert server.poll_once(0) == 0
    server.close()
    server.close()
    assert not os.path.exists(sock_path)
    server.reply(ReplyToken(b"gone", 6, PING), Reply())        # a deferred answer after close is dropped
    server.call_soon_threadsafe(lambda: None)


def test_server_with_its_own_context(connect, sock_path):
    with Server(ipc_address(sock_path), {PING: echo}) as server:
        server.bind()
        stop = threading.Event()
        t = threading.Thread(target=server.run, args=(stop,))
        t.start()
        try:
            assert connect(server.address).request(PING, {"own": True}).fields["f"] == {"own": True}
        finally:
            stop.set()
            t.join(WAIT_S)


def test_client_survives_garbage_and_unasked_requests_from_a_server(ctx, connect, raw_socket, sock_path):
    router = raw_socket(zmq.ROUTER, ipc_address(sock_path), bind=True)
    c = connect(router.getsockopt_string(zmq.LAST_ENDPOINT), timeout_s=WAIT_S)

    f1 = c.request_async(PING)
    identity, frame0 = recv_within(router)
    rid = decode([frame0]).request_id
    router.send_multipart([identity, encode_request(RequestCode.CHECK_TRANSACTION_STATE, 99)[0]])
    refused = decode(recv_within(router)[1:])
    assert refused.response and refused.request_id == 99
    assert refused.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    router.send_multipart([identity, b"garbage without an id"])
    router.send_multipart([identity, *encode_response(0, 123456789)])          # nobody asked
    router.send_multipart([identity, orjson.dumps({"v": 9, "id": rid})])        # bad, but has f1's id
    with pytest.raises(ProtocolError, match="bad response"):
        f1.result(WAIT_S)

    f2 = c.request_async(PING)
    identity, frame0 = recv_within(router)
    router.send_multipart([identity, *encode_response(0, decode([frame0]).request_id, {"ok": 1})])
    assert f2.result(WAIT_S).fields == {"ok": 1}


# --- a server in another process -------------------------------------------------------------------------

def test_server_in_a_spawned_process_killed_and_restarted(spawn_server, connect, ctx, sock_path):
    address = ipc_address(sock_path)
    proc, _ = spawn_server(address, "a")
    c = connect(address)
    got = c.request(PING, {"x": 1}, [b"\x00body"])
    assert got.fields == {"pid": proc.pid, "tag": "a", "f": {"x": 1}} and got.bodies == (b"\x00body",)

    proc.kill()
    proc.join(WAIT_S)
    with pytest.raises(ConnectError, match="stale socket file"):
        RemotingClient(address, context=ctx)
    with pytest.raises(SendTimeout):
        c.request(PING, timeout_s=0.2)

    proc2, stop2 = spawn_server(address, "b")
    assert request_until_ok(c).fields["pid"] == proc2.pid
    stop2.set()
    proc2.join(WAIT_S)
    assert proc2.exitcode == 0 and not os.path.exists(sock_path)


# --- peer credentials and the owner-only policy (issue 27) ------------------------------------------

def test_every_request_carries_the_kernels_credentials_of_its_peer(serve, connect):
    seen = []

    def who(frame, token):
        seen.append(token.peer)
        return Reply()
    c = connect(serve({PING: who}).address)
    c.request(PING)
    assert seen == [PeerCred(os.geteuid(), os.getegid(), os.getpid())]


def test_a_policy_refuses_admin_codes_to_non_owners_before_the_handler_runs(serve, connect):
    ran = []
    create = RequestCode.UPDATE_AND_CREATE_TOPIC
    handlers = {PING: echo, create: lambda f, t: ran.append(f.code) or Reply()}
    stranger = ControlPolicy(frozenset({os.geteuid() + 1}), where="/srv/mq")     # we are not an owner
    r = serve(handlers, policy=stranger)
    c = connect(r.address)
    with pytest.raises(PermissionDeniedError, match=rf"UPDATE_AND_CREATE_TOPIC\(17\).*uid {os.geteuid()}"):
        c.request(create, {"topic": "t"})
    assert c.request(PING).code == ResponseCode.SUCCESS            # what members may do is served
    assert ran == [] and r.server.stats()["refused_requests"] == 1


def test_an_owner_is_served_admin_codes(serve, connect, sock_path):
    create = RequestCode.UPDATE_AND_CREATE_TOPIC
    r = serve({create: lambda f, t: Reply(fields={"ok": 1})}, policy=ControlPolicy(frozenset({os.geteuid()})))
    assert connect(r.address).request(create).fields == {"ok": 1}


def test_batch_hooks_run_after_each_batch_and_a_failing_one_is_kept(serve, connect):
    order = []

    def handler(frame, token):
        order.append("handler")
        return Reply()
    r = serve({PING: handler}, start=False)
    r.server.add_batch_hook(lambda: 1 / 0)            # logged; the loop and the next hook go on
    r.server.add_batch_hook(lambda: order.append("hook"))
    r.start()
    c = connect(r.address)
    for _ in range(3):
        assert c.request(PING).code == ResponseCode.SUCCESS
        wait_until(lambda: order[-1:] == ["hook"], WAIT_S, "the batch hook")
    assert order == ["handler", "hook"] * 3
