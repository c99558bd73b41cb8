"""Replication trust (issue 27): the attacks of ``hostmq/faults/attacks_ha.py`` run against a real
SYNC_MASTER and its slave — a forged master while the master is down, a relay between them, frames
injected mid-stream, connections squatting the slave slots — and each fails: no acknowledged
message is lost, nothing forged is stored, and once the real slave is connected SYNC sends get
SEND_OK again. Also: a broker with no slave opens no TCP port; a NameServer refuses an old epoch."""
from __future__ import annotations

import glob
import os
import signal
import socket

import psutil
import pytest

import hostmq
from hostmq import Message
from hostmq.live.group import live_state
from hostmq.faults.attacks_ha import ForgedMaster, Relay, SlotSquatter
from hostmq.root import RootPaths
from tests.e2e.conftest import SendsUntilStopped, commitlogs_identical, consume_bodies
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(300)
SYNC = {"role": "SYNC_MASTER", "ha_sync_timeout_ms": 700}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _word(root: str, instance: str, word: str) -> int:
    st = live_state(root, instance)
    if st is None:
        return -1
    try:
        return int(st.get(word))
    finally:
        st.close()


def _slave_connected(root: str) -> bool:
    return _word(root, "broker-a", "ha_slaves") == 1 and _word(root, "broker-a.1", "replica_connected") == 1


def _send(root: str, topic: str, bodies: range) -> list[hostmq.SendStatus]:
    with hostmq.Producer(root, retries=0) as p:
        return [p.send(Message(topic, b"%08d" % i), timeout=5.0).status for i in bodies]


def _serving_again(root: str, topic: str, start: int) -> None:
    """The cluster keeps serving: with the real slave connected a SYNC send gets SEND_OK."""
    wait_until(lambda: _slave_connected(root), 60, "the real slave to connect")
    assert _send(root, topic, range(start, start + 5)) == [hostmq.SendStatus.SEND_OK] * 5


def test_a_forged_master_cannot_cut_or_feed_a_slave(cluster):
    """The issue's attack 1: the master is down; a process without the secret binds its replication
    address and answers the slave's HELLO with WELCOME truncate_to=0 and forged records."""
    port = _free_port()
    c = cluster(slaves=1, broker={**SYNC, "ha_listen": f"tcp://127.0.0.1:{port}"})
    wait_until(lambda: _slave_connected(c.root), 60, "the slave to connect")
    assert _send(c.root, "acked", range(50)) == [hostmq.SendStatus.SEND_OK] * 50
    held = _word(c.root, "broker-a.1", "write_pos")
    c.signal_group("broker-a", signal.SIGKILL)
    c.processes["broker-a"].wait(30)
    forger = ForgedMaster(f"tcp://127.0.0.1:{port}").start()
    try:
        wait_until(lambda: forger.report.hellos >= 2, 60, "the slave to ask the forged master twice")
    finally:
        report = forger.stop()
    assert report.welcomes_sent >= 2 and report.data_bytes_sent > 0
    assert report.reports_after_welcome == 0            # the slave acted on nothing the forger sent
    store = RootPaths(c.root).store_dir("broker-a.1")
    assert _word(c.root, "broker-a.1", "write_pos") == held
    assert not glob.glob(os.path.join(store, "cut-*.bin")) and not os.path.exists(os.path.join(store, "truncate_to"))
    assert "did not prove this root's ha.secret" in c.log_tail("broker-a.1", 400)
    c.start_broker("broker-a")
    _serving_again(c.root, "acked", 50)
    commitlogs_identical(c.root)
    assert sorted(consume_bodies(c.root, "acked", 55, "g-forged", linger_s=0.5)) == [b"%08d" % i for i in range(55)]


def test_a_relay_between_the_real_master_and_the_real_slave_is_refused(cluster):
    """The issue's relay: the slave dials a process that passes the real master's challenge to it and
    its answer back. The slave's proof names the endpoint it reached: the master refuses it, so the
    relay never sees a WELCOME and its forged REPORT never makes a SYNC_MASTER answer SEND_OK."""
    master, relay_port = _free_port(), _free_port()
    c = cluster(slaves=1, broker={**SYNC, "ha_listen": f"tcp://127.0.0.1:{master}",
                                  "ha_master": f"tcp://127.0.0.1:{relay_port}"})
    relay = Relay(f"tcp://127.0.0.1:{relay_port}", f"tcp://127.0.0.1:{master}", inject="report").start()
    try:
        wait_until(lambda: relay.report.connections >= 2, 60, "the slave to connect through the relay twice")
        wait_until(lambda: "a relay in between" in c.log_tail("broker-a", 400), 30, "the master's refusal")
        statuses = _send(c.root, "relayed", range(10))
    finally:
        report = relay.stop()
    assert report.welcomes_passed == 0 and _word(c.root, "broker-a", "ha_slaves") == 0
    assert hostmq.SendStatus.SEND_OK not in statuses        # no slave holds them: none is acknowledged as if one did
    c.stop()
    c = cluster(slaves=1, broker={**SYNC, "ha_listen": f"tcp://127.0.0.1:{master}"})    # the slave dials the master
    _serving_again(c.root, "relayed", 10)
    assert sorted(consume_bodies(c.root, "relayed", 15, "g-relay")) == [b"%08d" % i for i in range(15)]


@pytest.mark.parametrize("inject", ["data", "report", "replay"])
def test_a_frame_injected_mid_stream_ends_the_link_and_nothing_forged_is_kept(cluster, inject):
    """A link through NAT or a forwarder (``[ha] bind_endpoint = false``): the handshake passes the
    forwarder, but a frame it adds — forged DATA to the slave, a REPORT of everything streamed or a
    replayed REPORT to the master — fails its MAC and the receiver drops the link."""
    master, relay_port = _free_port(), _free_port()
    c = cluster(slaves=1, broker={**SYNC, "ha_listen": f"tcp://127.0.0.1:{master}",
                                  "ha_master": f"tcp://127.0.0.1:{relay_port}"}, ha={"bind_endpoint": False})
    relay = Relay(f"tcp://127.0.0.1:{relay_port}", f"tcp://127.0.0.1:{master}", inject=inject).start()
    sender = SendsUntilStopped(c.root, "injected")
    try:
        wait_until(lambda: relay.report.injected >= 1, 60, "the relay to inject a frame")
        side = "broker-a.1" if inject == "data" else "broker-a"
        wait_until(lambda: "fails its MAC" in c.log_tail(side, 400), 30, "the receiver to refuse the frame")
    finally:
        relay.stop()
    relay = Relay(f"tcp://127.0.0.1:{relay_port}", f"tcp://127.0.0.1:{master}").start()    # a plain forwarder
    try:
        wait_until(lambda: _slave_connected(c.root), 60, "the slave to reconnect through the forwarder")
        wait_until(lambda: len(sender.acked) > 20, 60, "SEND_OK again")
    finally:
        sender.stop()
        relay_report = relay.stop()
    assert relay_report.welcomes_passed >= 1 and sender.error is None
    wait_until(lambda: _word(c.root, "broker-a.1", "write_pos") == _word(c.root, "broker-a", "write_pos"), 60,
               "the slave to catch up")
    commitlogs_identical(c.root)                    # nothing forged on the slave, nothing missing
    acked = {b for b, _ in sender.acked}
    assert acked <= set(consume_bodies(c.root, "injected", len(sender.answered), "g-inject"))


def test_slot_squatters_do_not_keep_the_slave_out(cluster):
    """The issue's attack 3: 16 connections trickling a HELLO one byte at a time. Each is closed at the
    HELLO deadline (and the oldest when the unauthenticated pool is full); the slave reconnects among
    them and SYNC sends get SEND_OK."""
    port = _free_port()
    c = cluster(slaves=1, broker={**SYNC, "ha_listen": f"tcp://127.0.0.1:{port}"}, ha={"handshake_timeout_s": 1.0})
    wait_until(lambda: _slave_connected(c.root), 60, "the slave to connect")
    squatter = SlotSquatter(f"tcp://127.0.0.1:{port}", connections=16, trickle_s=0.2).start()
    try:
        wait_until(lambda: squatter.report.opened >= 16, 30, "the squatter's connections")
        os.kill(_word(c.root, "broker-a.1", "writer_pid"), signal.SIGKILL)     # the slave must connect anew
        wait_until(lambda: squatter.report.closed_by_master >= 16, 60, "the master to close the squatters")
        _serving_again(c.root, "squatted", 0)
    finally:
        report = squatter.stop()
    assert report.closed_by_master >= 16
    assert report.longest_held_s < 30               # the squatters held their slots for 30 s and more
    log = c.log_tail("broker-a", 2000)
    assert "no complete, proven HELLO within 1 s" in log or "the oldest goes" in log


def test_a_broker_without_a_slave_opens_no_tcp_port(cluster):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        row = next(r for r in a.brokers() if r["name"] == "broker-a")
    assert row["ha_address"] == ""
    procs = [psutil.Process(c.pid("broker-a"))]
    procs += procs[0].children(recursive=True)
    listening = [(p.pid, conn.laddr) for p in procs for conn in p.net_connections(kind="inet")
                 if conn.status == psutil.CONN_LISTEN]
    assert listening == []


def test_a_namesrv_refuses_a_registration_of_an_older_epoch(cluster):
    from hostmq.remoting import RemotingClient
    from hostmq.errors import FencedError
    from hostmq.protocol.codes import RequestCode
    from hostmq.root import ipc_address
    c = cluster()
    fields = {"cluster": "DefaultCluster", "broker_name": "broker-z", "broker_id": 0, "address": "ipc:///nowhere",
              "ha_address": "", "data_version": 1, "topics": {}}
    with RemotingClient(ipc_address(RootPaths(c.root).namesrv_socket(0)), timeout_s=5.0) as client:
        client.request(RequestCode.REGISTER_BROKER, {**fields, "epoch": 2})
        with pytest.raises(FencedError, match="epoch 2 registered before"):
            client.request(RequestCode.REGISTER_BROKER, {**fields, "epoch": 1})
    assert "refused a registration" in c.log_tail("namesrv-0", 100)


def test_a_running_master_opens_its_port_when_a_slave_is_made_on_its_root(cluster):
    """README's steps on one root: a master started alone (no port), then ``hostmq broker ROOT --name
    broker-a --id 1``: the master starts its listener, registers it, and the slave replicates."""
    c = cluster()
    assert _send(c.root, "later", range(20)) == [hostmq.SendStatus.SEND_OK] * 20
    c.slaves.append("broker-a.1")               # the fixture's leak check covers it too
    c.start_broker("broker-a.1")
    wait_until(lambda: _slave_connected(c.root), 60, "the slave to connect to the master that had no port")
    wait_until(lambda: _word(c.root, "broker-a.1", "write_pos") == _word(c.root, "broker-a", "write_pos"), 60,
               "the slave to catch up")
    assert "replication listener started" in c.log_tail("broker-a", 400)
    commitlogs_identical(c.root)
