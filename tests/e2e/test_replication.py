"""Master → slave replication (issue 18, first part): a slave on the same root (``NAME.1``) gets the
master's commitlog byte for byte, catches up from its own offset after a restart, resumes after the
connection is cut, and follows a master whose replication process moved to another port."""
from __future__ import annotations

import os
import signal

import pytest

import hostmq
from hostmq import Message
from hostmq.protocol.codes import RequestCode
from hostmq.root import RootPaths
from hostmq.store import MessageStore
from tests.e2e.conftest import SendsUntilStopped, commitlogs_identical, consume_bodies
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(240)


def _rows(root: str) -> dict[int, dict]:
    with hostmq.Admin(root) as a:
        return {r["id"]: r for r in a.brokers() if r["name"] == "broker-a"}


def _caught_up(root: str) -> bool:
    rows = _rows(root)
    return 1 in rows and rows[1]["alive"] and rows[0]["alive"] and \
        rows[1]["state"]["write_pos"] == rows[0]["state"]["write_pos"] > 0


def _send(root: str, topic: str, n: int, start: int = 0) -> None:
    with hostmq.Producer(root) as p:
        for i in range(start, start + n, 100):
            p.send_batch([Message(topic, b"%08d" % j + b"." * 92) for j in range(i, min(i + 100, start + n))])


def test_the_slaves_commitlog_is_the_masters_byte_for_byte(cluster):
    c = cluster(slaves=1)
    rows = _rows(c.root)
    assert rows[0]["role"] == "ASYNC_MASTER" and rows[0]["ha_address"].startswith("tcp://127.0.0.1:")
    assert rows[1]["role"] == "SLAVE" and "scheduler" not in rows[1]["pids"]
    _send(c.root, "replicated", 100_000)
    wait_until(lambda: _caught_up(c.root), 120, "the slave to catch up")
    assert commitlogs_identical(c.root) >= 4           # 4 MiB files in tests: several files rolled over
    assert _rows(c.root)[1]["lag_bytes"] == 0
    # The slave's own dispatcher built its consume queues and index from what it got (its topic
    # table comes with the metadata sync, a later part).
    wait_until(lambda: (lambda st: st["dispatched_pos"] == st["write_pos"])(_rows(c.root)[1]["state"]), 60,
               "the slave's dispatcher")
    assert _rows(c.root)[1]["state"]["dispatched_records"] == 100_000


def test_a_killed_slave_catches_up_from_its_own_offset(cluster):
    c = cluster(slaves=1)
    _send(c.root, "again", 20_000)
    wait_until(lambda: _caught_up(c.root), 60, "the slave to catch up")
    held = _rows(c.root)[1]["state"]["write_pos"]
    c.signal_group("broker-a.1", signal.SIGKILL)
    c.processes["broker-a.1"].wait(30)
    _send(c.root, "again", 20_000, start=20_000)
    c.start_broker("broker-a.1")
    wait_until(lambda: _caught_up(c.root), 60, "the restarted slave to catch up")
    master_log = c.log_tail("broker-a", 400)
    resumed = [int(line.split("holds the commitlog up to ")[1].split(";")[0])
               for line in master_log.splitlines() if "holds the commitlog up to " in line]
    assert resumed[-1] >= held > 0                       # not from the start again
    commitlogs_identical(c.root)


def test_replication_resumes_after_the_connection_is_cut(cluster):
    """Kill the TCP peer on either side mid-stream: the slave's writer (its supervisor restarts it) and
    then the master's replication process (it comes back on another port, registered anew)."""
    c = cluster(slaves=1)
    root = c.root
    _send(root, "cut", 10_000)
    slave_writer = _rows(root)[1]["pids"]["writer"]
    os.kill(slave_writer, signal.SIGKILL)
    _send(root, "cut", 10_000, start=10_000)
    wait_until(lambda: _caught_up(root), 60, "the slave to catch up after its writer was killed")
    old_ha = _rows(root)[0]["ha_address"]
    os.kill(_rows(root)[0]["pids"]["ha"], signal.SIGKILL)
    wait_until(lambda: _rows(root)[0]["ha_address"] not in ("", old_ha), 30, "the master's new HA address")
    _send(root, "cut", 10_000, start=20_000)
    wait_until(lambda: _caught_up(root), 60, "the slave to catch up after the master's HA process was killed")
    commitlogs_identical(root)
    bodies = consume_bodies(root, "cut", 30_000, "g-cut")
    assert sorted(int(b[:8]) for b in bodies) == list(range(30_000))


def test_a_slave_refuses_producers_and_registers_under_its_id(cluster):
    c = cluster(slaves=1)
    paths = RootPaths(c.root)
    assert not os.path.exists(paths.broker_session_socket("broker-a.1"))
    with hostmq.Admin(c.root) as a:
        a.create_topic("only-master", queues=2)
        ids = sorted(r["id"] for r in a.brokers() if r["name"] == "broker-a")
    assert ids == [0, 1]
    with hostmq.Producer(c.root) as p:
        results = [p.send(Message("only-master", b"x")) for _ in range(20)]
    assert all(r.status == hostmq.SendStatus.SEND_OK for r in results)
    # Every send went to the master: the slave has the messages only by replication.
    wait_until(lambda: _caught_up(c.root), 60, "the slave to catch up")
    commitlogs_identical(c.root)


# -- SYNC_MASTER ------------------------------------------------------------------------------------
SYNC = {"role": "SYNC_MASTER", "ha_sync_timeout_ms": 700}


def _slave_connected(root: str) -> bool:
    return _rows(root)[0]["state"]["ha_slaves"] == 1


def _sync_cluster(cluster):
    c = cluster(slaves=1, broker=SYNC)
    wait_until(lambda: _slave_connected(c.root), 30, "the slave to connect")
    return c


def test_sync_master_answers_send_ok_only_once_a_slave_has_the_bytes(cluster):
    c = _sync_cluster(cluster)
    root = c.root
    with hostmq.Producer(root) as p:
        for i in range(200):
            r = p.send(Message("synced", b"s%d" % i))
            assert r.status == hostmq.SendStatus.SEND_OK
            phys = hostmq.records.decode_msg_id(r.msg_id)[1]
            if i % 50 == 0:     # answered after the ack: the slave holds the record already (no waiting)
                assert _rows(root)[1]["state"]["write_pos"] > phys
        batch = p.send_batch([Message("synced", b"b%d" % i) for i in range(100)])
        assert batch.status == hostmq.SendStatus.SEND_OK


def test_sync_master_without_a_slave_says_slave_not_available_and_keeps_the_message(cluster):
    c = cluster(broker=SYNC)
    with hostmq.Producer(c.root) as p:
        r = p.send(Message("lonely", b"stored anyway"))
    assert r.status == hostmq.SendStatus.SLAVE_NOT_AVAILABLE
    assert consume_bodies(c.root, "lonely", 1, "g-lonely") == [b"stored anyway"]


def test_a_stopped_slave_times_sync_sends_out_and_they_recover_when_it_runs(cluster):
    c = _sync_cluster(cluster)
    root = c.root
    with hostmq.Producer(root) as p:
        assert p.send(Message("stall", b"before")).status == hostmq.SendStatus.SEND_OK
        c.signal_group("broker-a.1", signal.SIGSTOP)
        try:
            r = p.send(Message("stall", b"while stopped"))
            assert r.status == hostmq.SendStatus.FLUSH_SLAVE_TIMEOUT
        finally:
            c.signal_group("broker-a.1", signal.SIGCONT)
        wait_until(lambda: p.send(Message("stall", b"after")).status == hostmq.SendStatus.SEND_OK, 30,
                   "SEND_OK once the slave runs")
    assert {b"before", b"while stopped", b"after"} <= set(consume_bodies(root, "stall", 3, "g-stall"))


def test_every_send_ok_of_a_sync_master_killed_under_load_is_on_the_slave(cluster):
    c = _sync_cluster(cluster)
    root = c.root
    sender = SendsUntilStopped(root, "killed")
    try:
        wait_until(lambda: len(sender.acked) >= 300, 60, "acknowledged sends")
        c.signal_group("broker-a", signal.SIGKILL)
        c.processes["broker-a"].wait(30)
    finally:
        sender.stop()
    acked = [msg_id for _, msg_id in sender.acked]
    assert c.stop_process("broker-a.1") == 0
    store = MessageStore(RootPaths(root).store_dir("broker-a.1"))
    try:
        missing = [m for m in acked if store.view(m).msg_id != m]
    finally:
        store.close()
    assert not missing and len(acked) >= 300


def test_the_replication_port_streams_nothing_to_whoever_lacks_the_roots_secret(cluster):
    """The listener is a TCP port every local user can reach; the stream is every stored message."""
    import socket
    import stat as st_mod

    from hostmq.protocol import ha as P
    c = cluster(broker={"ha_listen": "tcp://127.0.0.1:0"})     # no slave: it listens because it is told to
    _send(c.root, "secret", 100)
    host, port = _rows(c.root)[0]["ha_address"][len("tcp://"):].rsplit(":", 1)
    mode = os.stat(RootPaths(c.root).ha_secret).st_mode
    assert st_mod.S_IMODE(mode) & 0o077 == 0          # owner-only: group members produce and consume
    with socket.create_connection((host, int(port)), timeout=10) as s:
        reader = P.FrameReader(P.MASTER_KINDS)
        frames = wait_until(lambda: reader.feed(s.recv(4096)), 10, "the challenge")
        assert frames[0].kind == P.CHALLENGE and len(frames[0].body) == P.CHALLENGE_BYTES
        from hostmq.protocol import ha_auth as A
        nonce, ep = os.urandom(32), f"{host}:{port}"
        s.sendall(P.Hello(0, 4 << 20, (), nonce, 0, ep,
                          A.proof(b"a guess", A.SLAVE_LABEL, frames[0].body, nonce, "broker-a", 0, ep)).encode())
        got = b""
        while True:
            data = s.recv(65536)
            if not data:
                break
            got += data
    assert got == b""                       # closed without a WELCOME or a byte of data
    wait_until(lambda: "authentication failed" in c.log_tail("broker-a", 100), 10, "the refusal in the log")
    with socket.create_connection((host, int(port)), timeout=10) as s:     # before proving the secret,
        s.sendall(P.HEADER.pack(P.OFFSETS, 0, P.MAX_OFFSETS_BYTES))        # nothing but a HELLO is read
        wait_until(lambda: s.recv(65536) == b"", 10, "the connection closed")
    wait_until(lambda: "kind 8 is not expected" in c.log_tail("broker-a", 100), 10, "the refusal in the log")


def test_topics_and_consumer_offsets_reach_the_slave(cluster):
    from hostmq.broker.offsets import parse_offset_table
    from hostmq.jsonfile import read_json
    c = cluster(slaves=1, broker={"ha_meta_interval_s": 0.5, "offset_persist_interval_s": 0.5})
    root = c.root
    with hostmq.Admin(root) as a:
        a.create_topic("meta-t", queues=3)
    _send(root, "meta-t", 300)
    assert len(consume_bodies(root, "meta-t", 300, "g-meta")) == 300      # commits at close
    wait_until(lambda: "meta-t" in _rows(root)[1].get("topics", {}), 30, "the topic on the slave")
    slave_queues = [q for q in _rows(root)[1]["queues"] if q["topic"] == "meta-t"]
    assert len(slave_queues) == 3
    wait_until(lambda: sum(q["max_offset"] for q in _rows(root)[1]["queues"] if q["topic"] == "meta-t") == 300,
               30, "the slave's queues to hold every message")
    paths = RootPaths(root)

    def offsets(instance: str) -> dict:
        data = read_json(os.path.join(paths.config_dir(instance), "consumerOffset.json"), default={})
        return {k: v for k, v in parse_offset_table(data).items() if k[0] == "g-meta"}
    wait_until(lambda: offsets("broker-a") and offsets("broker-a.1") == offsets("broker-a"), 30,
               "the group's offsets on the slave")
    assert sum(offsets("broker-a.1").values()) == 300


@pytest.mark.timeout(300)
def test_the_replication_bench_runs_and_reports_every_row(tmp_path):
    import subprocess
    import sys
    script = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "replication_bench.py")
    out = tmp_path / "rep"
    r = subprocess.run([sys.executable, script, "--messages", "3000", "--sends", "100", "--out", str(out)],
                       capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stderr[-3000:]
    report = (out / "report.md").read_text()
    for row in ("ASYNC_MASTER, no slave (baseline)", "ASYNC_MASTER + slave", "SYNC_MASTER + slave",
                "SYNC_MASTER + slave, SYNC_FLUSH"):
        assert f"| {row} |" in report
    assert "SEND_OK 100" in report and "slave caught up after s" in report


def _group_offsets(root: str, instance: str, group: str, section: str = "offset_table") -> dict:
    from hostmq.broker.offsets import OFFSETS_FILE, parse_offset_table
    from hostmq.jsonfile import read_json
    data = read_json(os.path.join(RootPaths(root).config_dir(instance), OFFSETS_FILE), default={})
    return {k: v for k, v in parse_offset_table(data, section).items() if k[0] == group}


def test_consumers_read_from_the_slave_while_the_master_is_down_and_their_offsets_come_back(cluster):
    """A SYNC_MASTER's process group is SIGKILLed: a running consumer goes on with the slave (no
    acknowledged message lost, none twice), another group consumes there and closes; the master
    restarts, the first consumer is back on it, and the second group's offsets committed on the
    slave are the master's again (a new member of that group reads nothing twice)."""
    c = cluster(slaves=1, broker={**SYNC, "ha_meta_interval_s": 0.5, "offset_persist_interval_s": 0.5})
    root = c.root
    wait_until(lambda: _slave_connected(root), 30, "the slave to connect")
    with hostmq.Admin(root) as a:
        a.create_topic("outage", queues=2)
    wait_until(lambda: "outage" in _rows(root)[1].get("topics", {}), 30, "the topic on the slave")
    with hostmq.Producer(root) as p:
        acked = [p.send(Message("outage", b"m%05d" % i)) for i in range(600)]
    assert all(r.status == hostmq.SendStatus.SEND_OK for r in acked)
    live = hostmq.PullConsumer(root, group="g-live", consume_from=hostmq.ConsumeFrom.FIRST_OFFSET)
    try:
        live.subscribe("outage", "*")
        got = []
        wait_until(lambda: got.extend(m.body for m in live.poll(timeout=0.2)) or len(got) >= 300, 30,
                   "the first half")
        live.commit()
        c.signal_group("broker-a", signal.SIGKILL)
        c.processes["broker-a"].wait(30)
        live.refresh_brokers()
        assert live.views["broker-a"].instance == "broker-a.1"
        wait_until(lambda: got.extend(m.body for m in live.poll(timeout=0.2)) or len(got) >= 600, 60,
                   "the rest, from the slave")
        assert sorted(got) == [b"m%05d" % i for i in range(600)]
        live.commit()                           # the master is down: the slave takes it
        wait_until(lambda: sum(_group_offsets(root, "broker-a.1", "g-live", "slave_commits").values()) == 600,
                   30, "the slave to keep the live group's commit")
        away = consume_bodies(root, "outage", 600, "g-away")        # commits on the slave as it closes
        assert sorted(away) == sorted(got)
        wait_until(lambda: sum(_group_offsets(root, "broker-a.1", "g-away", "slave_commits").values()) == 600,
                   30, "the slave to keep the offsets committed on it")
        with pytest.raises(hostmq.NotMasterError):
            with hostmq.Admin(root) as a:
                slave_addr = next(r["address"] for r in a.brokers() if r["id"] == 1)
                a.instance.broker_request(slave_addr, RequestCode.UPDATE_AND_CREATE_TOPIC,
                                          {"topic": "nope", "read_queues": 1, "write_queues": 1, "perm": 6,
                                           "order": False})
        c.start_broker("broker-a")
        wait_until(lambda: sum(_group_offsets(root, "broker-a", "g-away").values()) == 600, 60,
                   "the offsets committed on the slave to reach the master")
        with hostmq.Producer(root) as p:
            assert p.send(Message("outage", b"after")).status == hostmq.SendStatus.SEND_OK
        more = []
        wait_until(lambda: more.extend(m.body for m in live.poll(timeout=0.2)) or more, 60, "a message after")
        assert more == [b"after"] and live.views["broker-a"].instance == "broker-a"
    finally:
        live.close()
    assert consume_bodies(root, "outage", 1, "g-away", linger_s=1.0) == [b"after"]
    wait_until(lambda: not _group_offsets(root, "broker-a.1", "g-away", "slave_commits"), 30,
               "the slave to learn that its master has them")
