"""A real NameServer process: registration, routes, expiry, bad input, clean stop."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import zmq

from hostmq.remoting import RemotingClient
from hostmq.errors import HostMQError, NoRouteError, ValidationError
from hostmq.protocol.codes import RequestCode, ResponseCode
from hostmq.protocol.frames import decode, encode_request
from hostmq.root import RootPaths, ipc_address
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(60)
C = RequestCode


def start_namesrv(root, index=0):
    proc = subprocess.Popen([sys.executable, "-m", "hostmq.cli.main", "namesrv", str(root), "--index", str(index)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    sock = RootPaths(str(root)).namesrv_socket(index)
    wait_until(lambda: os.path.exists(sock) or proc.poll() is not None, what="namesrv socket")
    return proc, sock


@pytest.fixture
def namesrv(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "hostmq.toml").write_text("[namesrv]\nscan_interval_s = 0.1\nbroker_expiry_s = 0.8\n")
    procs, clients = [], []

    def _start(index=0):
        proc, sock = start_namesrv(root, index)
        procs.append(proc)
        client = RemotingClient(ipc_address(sock), timeout_s=5.0)
        clients.append(client)
        return proc, sock, client

    yield root, _start
    for c in clients:
        c.close()
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        p.wait(10)
        p.stdout.close()


def register(client, name="broker-a", broker_id=0, address="ipc:///x/a.sock", topics=None, version=1):
    return client.request(C.REGISTER_BROKER, {
        "cluster": "c1", "broker_name": name, "broker_id": broker_id, "address": address,
        "ha_address": "", "data_version": version,
        "topics": topics if topics is not None else {"orders": {"read_queues": 4, "write_queues": 4}}})


def test_register_route_expire_and_reregister(namesrv):
    _, start = namesrv
    _, _, client = start()
    register(client)
    register(client, "broker-b", address="ipc:///x/b.sock", topics={"orders": {"read_queues": 2, "write_queues": 2}})
    route = client.request(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"}).fields
    assert sorted(q["broker_name"] for q in route["queue_datas"]) == ["broker-a", "broker-b"]
    info = client.request(C.GET_BROKER_CLUSTER_INFO).fields
    assert sorted(info["clusters"]["c1"]) == ["broker-a", "broker-b"]
    # Only broker-a keeps registering: broker-b expires after 0.8 s of silence.
    deadline = time.monotonic() + 10
    while True:
        register(client)
        names = [q["broker_name"] for q in client.request(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"}).fields["queue_datas"]]
        if names == ["broker-a"]:
            break
        assert time.monotonic() < deadline, "broker-b never expired"
        time.sleep(0.05)
    register(client, "broker-b", address="ipc:///x/b.sock", topics={"orders": {"read_queues": 2, "write_queues": 2}})
    names = [q["broker_name"] for q in client.request(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"}).fields["queue_datas"]]
    assert names == ["broker-a", "broker-b"]
    # Everyone silent: every route goes.
    wait_until(lambda: _no_route(client, "orders"), what="all brokers to expire")


def _no_route(client, topic) -> bool:
    try:
        client.request(C.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        return False
    except NoRouteError:
        return True


def test_bad_input_gets_errors_and_the_server_keeps_serving(namesrv):
    _, start = namesrv
    proc, sock, client = start()
    with pytest.raises(ValidationError):
        register(client, broker_id="zero")
    with pytest.raises(ValidationError):
        register(client, topics={"bad topic!": {}})
    with pytest.raises(HostMQError):
        client.request(12345)
    raw = client.request_raw(9999)
    assert raw.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.RCVTIMEO, 5000)
    dealer.connect(ipc_address(sock))
    try:
        for junk in ([b"not json"], [b"{}"], [b"\xff" * 100], [b'{"v": 99, "code": 105, "id": 1}'], [b"", b""]):
            dealer.send_multipart(junk)
            reply = decode(dealer.recv_multipart())
            assert reply.response and reply.code == ResponseCode.BAD_REQUEST
        dealer.send_multipart(encode_request(C.PING, 7))
        assert decode(dealer.recv_multipart()).code == ResponseCode.SUCCESS
    finally:
        dealer.close()
        ctx.term()
    assert proc.poll() is None
    register(client)
    assert client.request(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"}).fields["queue_datas"]


def test_kv_config_survives_a_restart(namesrv):
    root, start = namesrv
    proc, _, client = start()
    client.request(C.PUT_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "orders", "value": "broker-a:4"})
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    _, _, client2 = start()
    got = client2.request(C.GET_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "orders"}).fields
    assert got["value"] == "broker-a:4"


def test_two_nameservers_are_independent_and_a_duplicate_is_refused(namesrv):
    root, start = namesrv
    _, sock0, c0 = start(0)
    _, sock1, c1 = start(1)
    register(c0)
    assert not _no_route(c0, "orders") and _no_route(c1, "orders")
    dup = subprocess.run([sys.executable, "-m", "hostmq.cli.main", "namesrv", str(root)],
                         capture_output=True, text=True, timeout=30)
    assert dup.returncode != 0 and "another NameServer" in dup.stderr
    assert os.path.exists(sock0)                       # the running one still owns its socket
    c0.request(C.PING)


def test_sigterm_stops_cleanly_and_removes_the_socket(namesrv):
    _, start = namesrv
    proc, sock, client = start()
    client.request(C.PING)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    assert not os.path.exists(sock)
