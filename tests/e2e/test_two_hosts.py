"""Replication across two hosts (issue 18): the master and the slave run in two network namespaces
joined by a veth pair — each "host" with its own root and NameServer — following docs/replication.md's steps for
two hosts ("Replication": on two hosts) command for command: the master's ``broker.ha_listen`` on
host A's address, root A's ``ha.secret`` copied to root B, the slave started on host B with
``--master tcp://A:10912``; the link cut mid-stream and back; the master's process group SIGKILLed,
``hostmq ha promote`` on host B, ``hostmq ha demote`` on host A and the old master started again
with ``--master tcp://B:10912``.

Servers are started as an operator on each host would, ``ip netns exec NS python -m
hostmq.cli.main ...`` (children inherit the namespace). Only TCP is namespaced: a root's Unix
sockets and shared memory are filesystem names, so this process's clients reach both roots, and
replication is the only traffic over the veth pair.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import orjson
import psutil
import pytest

import hostmq
from hostmq import Message
from hostmq.cluster import DIE_WITH_PARENT_ENV, clean_after_crash, dump_toml
from hostmq.config import Config
from hostmq.root import RootPaths
from hostmq.sdnotify import environment_without_notify
from hostmq.shm import unlink_semaphore, unlink_segment
from tests.conftest import wait_until
from tests.e2e.conftest import (TEST_CONFIG, SendsUntilStopped, commitlogs_identical, consume_bodies, leftovers,
                                merge)

pytestmark = pytest.mark.timeout(180)

PORT = 10912            # the documented port: both namespaces are new, so it is free in each
TOPIC = "two-hosts"
# the documented keys, plus the tests' small files and quick registration — and a replication connection
# silent for 2 s (not 20) is closed, so a cut link is noticed at both ends within the test.
HOST_CONFIG = merge(TEST_CONFIG, {"broker": {"ha_sync_timeout_ms": 700, "ha_heartbeat_interval_s": 0.5,
                                             "ha_housekeeping_s": 2.0}})
STEP_S = 0.1            # polls ask a root's NameServer and brokers: not too often on a busy 2-core VM


class Host:
    """One "host": a network namespace holding one end of the veth pair, a root, and the hostmq servers
    started in it (each the leader of its own process group, dying with this process)."""

    def __init__(self, ns: str, veth: str, address: str, root: str) -> None:
        self.ns, self.veth, self.address, self.root = ns, veth, address, root
        self.paths = RootPaths(root)
        self.processes: dict[str, subprocess.Popen] = {}
        self.instances: set[str] = set()
        os.makedirs(os.path.join(root, "logs"), exist_ok=True)
        self.env = {**environment_without_notify(), DIE_WITH_PARENT_ENV: "1",
                    "PYTHONPATH": os.pathsep.join(p for p in (_REPO, os.environ.get("PYTHONPATH")) if p)}

    def ip(self, *args: str) -> None:
        _ip("-n", self.ns, *args)

    def _command(self, *args: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns, sys.executable, "-m", "hostmq.cli.main", *args]

    def write_config(self, broker: dict, ha: dict | None = None) -> None:
        """``ROOT/hostmq.toml``, which every server of the root reads."""
        with open(self.paths.config_file, "w") as f:
            f.write(dump_toml(Config.from_dict(merge(HOST_CONFIG, {"broker": broker, "ha": ha or {}}))))

    def start(self, name: str, *args: str) -> None:
        """``hostmq ARGS`` in the background on this host; output in ``ROOT/logs/NAME.log``."""
        if name != "namesrv":
            self.instances.add(name)
        with open(self.log_path(name), "ab") as log:
            self.processes[name] = subprocess.Popen(self._command(*args), stdout=log, stderr=subprocess.STDOUT,
                                                    stdin=subprocess.DEVNULL, env=self.env, process_group=0)

    def hostmq(self, *args: str, timeout_s: float = 120.0) -> str:
        """``hostmq ARGS`` on this host, to its end; its output (the command must succeed)."""
        out = subprocess.run(self._command(*args), capture_output=True, text=True, env=self.env, timeout=timeout_s)
        assert out.returncode == 0, f"hostmq {' '.join(args)} exited with {out.returncode}: {out.stderr}"
        return out.stdout

    def kill_group(self, name: str) -> None:
        """SIGKILL a server and every process it started (a crash of the whole broker)."""
        p = self.processes[name]
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(30)

    def stop(self) -> dict[str, int]:
        """Stop every server still running (brokers first, SIGTERM, SIGKILL after 30 s); their exit
        codes. What a killed broker left is cleaned as LocalCluster does."""
        codes = {}
        for group in ([n for n in self.processes if n != "namesrv"], [n for n in self.processes if n == "namesrv"]):
            running = [n for n in group if self.processes[n].poll() is None]
            for n in running:
                self.processes[n].send_signal(signal.SIGTERM)
            for n in running:
                try:
                    codes[n] = self.processes[n].wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(self.processes[n].pid, signal.SIGKILL)
                    codes[n] = self.processes[n].wait(10)
        for instance in self.instances:
            clean_after_crash(self.root, instance)      # nothing to do unless one was killed for good
        return codes

    def log_path(self, name: str) -> str:
        return os.path.join(self.root, "logs", f"{name}.log")

    def log_text(self, name: str) -> str:
        try:
            with open(self.log_path(name), "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def log_tail(self, name: str, lines: int = 40) -> str:
        try:
            with open(self.log_path(name), "rb") as f:
                return b"".join(f.readlines()[-lines:]).decode("utf-8", "replace")
        except OSError:
            return ""

    def row(self, registered_id: int) -> dict:
        """The Admin row of the running broker-a registered under ``registered_id`` with this root's
        NameServer ({} while there is none)."""
        try:
            with hostmq.Admin(self.root) as a:
                rows = a.brokers()
        except hostmq.errors.HostMQError:
            return {}
        return next((r for r in rows if r["name"] == "broker-a" and r["id"] == registered_id and r["alive"]), {})

    def state(self, registered_id: int, word: str) -> int:
        """A word of that broker's state segment (-1 while it is not running)."""
        return self.row(registered_id).get("state", {}).get(word, -1)


_REPO = os.path.dirname(os.path.dirname(os.path.abspath(hostmq.__file__)))


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def two_hosts(tmp_path):
    """Hosts A (10.213.X.1) and B (10.213.X.2): two namespaces and a veth pair, named after this
    process. Torn down at the end whatever happened — every server stopped (or killed), and then
    nothing may be left: no process, socket file, shared-memory segment or semaphore."""
    pid = os.getpid()
    net = f"10.213.{pid % 250 + 1}"
    ns_a, ns_b = f"hostmq-a-{pid}", f"hostmq-b-{pid}"
    made: list[str] = []
    try:
        for ns in (ns_a, ns_b):
            _ip("netns", "add", ns)
            made.append(ns)
    except (OSError, subprocess.CalledProcessError) as e:
        for ns in made:
            _ip("netns", "del", ns)
        why = e.stderr.decode().strip() if isinstance(e, subprocess.CalledProcessError) else str(e)
        pytest.skip(f"cannot make network namespaces (needs root and iproute2): {why}")
    a = Host(ns_a, f"hmqa{pid}", f"{net}.1", str(tmp_path / "hostA"))
    b = Host(ns_b, f"hmqb{pid}", f"{net}.2", str(tmp_path / "hostB"))
    me = psutil.Process()
    older = {p.pid for p in me.children(recursive=True)}
    try:
        _ip("link", "add", a.veth, "netns", a.ns, "type", "veth", "peer", "name", b.veth, "netns", b.ns)
        for h in (a, b):
            h.ip("addr", "add", f"{h.address}/24", "dev", h.veth)
            h.ip("link", "set", h.veth, "up")
            h.ip("link", "set", "lo", "up")
        yield a, b
    finally:
        try:
            for h in (b, a):
                h.stop()
            for h in (a, b):
                for name in h.processes:
                    print(f"--- {h.ns} {name}.log\n{h.log_tail(name)}")
            wait_until(lambda: not [p for p in me.children(recursive=True) if p.pid not in older], 20,
                       "child processes to exit")
            socks = [os.path.join(d, f) for h in (a, b) for d, _, fs in os.walk(h.root) for f in fs
                     if f.endswith(".sock")]
            left = leftovers(a.root, a.instances or {"broker-a"}) + leftovers(b.root, b.instances or {"broker-a.1"})
            for n in left:
                unlink_semaphore(n[4:]) if n.startswith("sem:") else unlink_segment(n)
            assert not socks, f"socket files left behind: {socks}"
            assert not left, f"shared memory left behind: {left}"
        finally:
            for ns in made:
                _ip("netns", "del", ns)         # takes the veth pair with it


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_certs(folder) -> dict[str, dict[str, str]]:
    """A CA and a certificate for each host signed by it, with the ``openssl`` command (the
    ``cryptography`` package is not a dependency); ``{"A": {tls_cert, tls_key, tls_ca}, "B": …}``."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make the test's TLS certificates with")
    folder = str(folder)
    os.makedirs(folder, exist_ok=True)
    ca, ca_key = os.path.join(folder, "ca.pem"), os.path.join(folder, "ca.key")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=hostmq test CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    ext = os.path.join(folder, "leaf.ext")
    with open(ext, "w") as f:
        f.write("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n")
    out = {}
    for host in ("A", "B"):
        key, csr, cert = (os.path.join(folder, f"host{host}.{x}") for x in ("key", "csr", "pem"))
        _openssl("req", *ec, "-keyout", key, "-out", csr, "-subj", f"/CN=hostmq host {host}")
        _openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert,
                 "-days", "2", "-extfile", ext)
        out[host] = {"tls_cert": cert, "tls_key": key, "tls_ca": ca}
    return out


def _status_line(host: Host, instance: str) -> list[str]:
    """The instance's row of ``hostmq status`` on that host, split into words."""
    return next(line.split() for line in host.hostmq("status", host.root).splitlines()
                if line.startswith(instance + " "))


def _last_offset(log: str, before: str) -> int:
    """The number after the last ``before`` in a log."""
    return int(log.rsplit(before, 1)[1].split(";")[0].split()[0])


@pytest.mark.parametrize("tls", [False, True], ids=["authenticated", "tls"])
def test_a_slave_on_another_host_survives_a_cut_link_takes_over_and_the_old_master_rejoins_it(two_hosts, tmp_path,
                                                                                             tls):
    """Once as README shows it (every frame authenticated), once with mutual TLS between the hosts
    (``[ha] tls_*``, certificates from a CA the test makes)."""
    a, b = two_hosts
    master_ha, promoted_ha = f"tcp://{a.address}:{PORT}", f"tcp://{b.address}:{PORT}"
    certs = make_certs(tmp_path / "tls") if tls else {"A": {}, "B": {}}

    # Host A: a NameServer and the SYNC_MASTER, its replication listener on host A's address.
    a.write_config({"role": "SYNC_MASTER", "ha_listen": master_ha}, certs["A"])
    a.start("namesrv", "namesrv", a.root)
    a.start("broker-a", "broker", a.root, "--name", "broker-a")
    wait_until(lambda: a.row(0).get("ha_address") == master_ha, 60, "the master on host A", STEP_S)
    # Host B: the master root's secret, a NameServer and the slave — whose own ha_listen is where it
    # listens once promoted.
    shutil.copy2(a.paths.ha_secret, b.paths.ha_secret)     # scp -p
    b.write_config({"ha_listen": promoted_ha}, certs["B"])
    b.start("namesrv", "namesrv", b.root)
    b.start("broker-a.1", "broker", b.root, "--name", "broker-a", "--id", "1", "--master", master_ha)
    wait_until(lambda: a.state(0, "ha_slaves") == 1 and b.row(1).get("role") == "SLAVE", 60,
               "the slave on host B to connect and register", STEP_S)
    assert _status_line(a, "broker-a")[:6] == ["broker-a", "0", "SYNC_MASTER", "0", "1", "slave(s)"]
    assert _status_line(b, "broker-a.1")[:7] == ["broker-a.1", "1", "SLAVE", "0", "0", "B", "DefaultCluster"]

    # Sends go on while the link is cut — longer than the slave's reconnect attempts wait — and comes
    # back: the slave catches up byte for byte.
    sender = SendsUntilStopped(a.root, TOPIC)
    try:
        wait_until(lambda: len(sender.acked) >= 1000 or sender.error, 60, "SEND_OKs over the link")
        failed_connects = b.log_text("broker-a.1").count("cannot replicate from")
        down_at = len(sender.answered)
        a.ip("link", "set", a.veth, "down")
        wait_until(lambda: a.state(0, "ha_slaves") == 0 and b.state(1, "replica_connected") == 0,
                   30, "both ends to close the silent connection", STEP_S)
        cut_at = len(sender.answered)
        wait_until(lambda: len(sender.answered) >= cut_at + 200 or sender.error, 30, "sends while the link is down")
        wait_until(lambda: b.log_text("broker-a.1").count("cannot replicate from") > failed_connects, 30,
                   "a reconnect attempt to fail while the link is down", STEP_S)
        a.ip("link", "set", a.veth, "up")
        back_at = len(sender.acked)
        wait_until(lambda: len(sender.acked) >= back_at + 500 or sender.error, 60,
                   "SEND_OK again once the slave reconnected")
    finally:
        sender.stop()
    assert sender.error is None, sender.error
    statuses = [status for _, status in sender.answered]
    assert hostmq.SendStatus.FLUSH_SLAVE_TIMEOUT in statuses[down_at:cut_at]      # the slave is silent
    # (the send in flight when the master closed the connection may have either status)
    assert set(statuses[cut_at + 1:cut_at + 200]) == {hostmq.SendStatus.SLAVE_NOT_AVAILABLE}
    wait_until(lambda: b.state(1, "write_pos") == a.state(0, "write_pos") > 0, 60, "the slave to catch up", STEP_S)
    assert commitlogs_identical(a.root, "broker-a", "broker-a.1", root_b=b.root) >= 1
    # It went on from its own end: the offset the master streamed from is where the slave said it was.
    held = _last_offset(a.log_text("broker-a"), "holds the commitlog up to ")
    assert held == _last_offset(b.log_text("broker-a.1"), f"replicating from {master_ha} from offset ") > 0
    assert ("epoch 0, over TLS)" in b.log_text("broker-a.1")) == tls
    stored = [body for body, _ in sender.answered]      # each stored whatever its status: once, in order
    assert sorted(consume_bodies(a.root, TOPIC, len(stored), "g-host-a", linger_s=0.5)) == stored

    # The master's whole process group dies under load; the slave is promoted on host B.
    crash = SendsUntilStopped(a.root, TOPIC, start=len(stored))
    try:
        wait_until(lambda: len(crash.acked) >= 300 or crash.error, 60, "SEND_OKs before the crash")
        a.kill_group("broker-a")
    finally:
        crash.stop()
    acked = [body for body, _ in sender.acked + crash.acked]
    assert len(acked) >= 1800
    wait_until(lambda: b.state(1, "replica_connected") == 0, 30, "the slave to see its master gone", STEP_S)
    slave = _status_line(b, "broker-a.1")
    assert slave[:4] == ["broker-a.1", "1", "SLAVE", "0"] and slave[5:7] == ["B", "!"]    # "N B !": not connected
    promoted = orjson.loads(b.hostmq("ha", "promote", b.root, "--name", "broker-a", "--id", "1"))
    assert promoted["instance"] == "broker-a.1" and promoted["epoch"] == 1 and promoted["demoted"] == []
    new_master = b.row(0)
    assert new_master["instance"] == "broker-a.1" and new_master["role"] == "ASYNC_MASTER"
    assert new_master["ha_address"] == promoted_ha          # its own ha_listen, on host B's address
    # The epoch host A's demotion needs, as the operator reads it on host B.
    _, registered_id, role, epoch = _status_line(b, "broker-a.1")[:4]
    assert (registered_id, role, epoch) == ("0", "ASYNC_MASTER", "1")
    # Every SEND_OK is on host B exactly once: its log is a prefix of the master's, whose sends were
    # one at a time — bodies 0 … n-1, n past the last acknowledged one.
    last_acked = int(acked[-1])
    on_b = consume_bodies(b.root, TOPIC, last_acked + 1, "g-host-b", linger_s=1.0)
    assert sorted(int(body) for body in on_b) == list(range(len(on_b))) and len(on_b) > last_acked
    with hostmq.Producer(b.root) as p:
        after = [b"%08d" % (10_000_000 + i) for i in range(500)]
        for i in range(0, len(after), 100):
            assert p.send_batch([Message(TOPIC, body) for body in after[i:i + 100]]).status == \
                hostmq.SendStatus.SEND_OK

    # Host A: the old master is demoted to the new epoch and joins host B's master as its slave.
    a.hostmq("ha", "demote", a.root, "--name", "broker-a", "--epoch", epoch)
    a.start("broker-a", "broker", a.root, "--name", "broker-a", "--id", "0", "--master", promoted_ha)
    wait_until(lambda: a.row(1).get("role") == "SLAVE" and b.state(0, "ha_slaves") == 1, 60,
               "the old master to join host B's master as a slave", STEP_S)
    wait_until(lambda: a.state(1, "write_pos") == b.state(0, "write_pos") > 0, 60, "the old master to catch up", STEP_S)
    assert commitlogs_identical(b.root, "broker-a.1", "broker-a", root_b=a.root) >= 1
    assert _status_line(a, "broker-a")[:4] == ["broker-a", "1", "SLAVE", "1"]
    assert sorted(consume_bodies(b.root, TOPIC, len(on_b) + 500, "g-host-b2", linger_s=0.5)) == \
        sorted(on_b + after)
    codes = {**{f"A {n}": c for n, c in a.stop().items()}, **{f"B {n}": c for n, c in b.stop().items()}}
    assert set(codes.values()) == {0}, codes
