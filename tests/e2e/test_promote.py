"""Promotion and rejoin (issue 18, part 6): ``hostmq ha promote`` turns a slave into the master of its
group — refused while the master runs — and the old master, started again, joins as a slave and cuts
what the new master never had (keeping the cut records in ``store/cut-FROM-TO.bin``)."""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys

import pytest

import hostmq
from hostmq import Message
from hostmq.root import RootPaths
from tests.e2e.conftest import SendsUntilStopped, commitlogs_identical, consume_bodies
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(240)


def _rows(root: str) -> dict[str, dict]:
    """Admin rows of broker-a's instances that answer, by instance."""
    with hostmq.Admin(root) as a:
        return {r["instance"]: r for r in a.brokers() if r["name"] == "broker-a" and r["alive"]}


def _caught_up(root: str, master: str, slave: str) -> bool:
    rows = _rows(root)
    return master in rows and slave in rows and rows[master]["id"] == 0 and \
        rows[slave]["state"]["write_pos"] == rows[master]["state"]["write_pos"] > 0


def test_promote_is_refused_while_the_master_runs_then_the_old_master_rejoins_as_a_slave(cluster):
    """SYNC_MASTER: every SEND_OK survives the master's crash, the promotion, further sends to the
    new master and the old master's return; the old master registers as slave id 1, catches up and
    its commitlog ends up the new master's byte for byte."""
    c = cluster(slaves=1, broker={"role": "SYNC_MASTER", "ha_sync_timeout_ms": 700})
    root = c.root
    wait_until(lambda: _rows(root)["broker-a"]["state"]["ha_slaves"] == 1, 30, "the slave to connect")
    sender = SendsUntilStopped(root, "promoted")
    try:
        wait_until(lambda: len(sender.acked) >= 300, 60, "acknowledged sends")
        with pytest.raises(hostmq.PromotionRefusedError, match="runs on this root"):
            with hostmq.Admin(root) as a:
                a.promote("broker-a", 1)
        c.signal_group("broker-a", signal.SIGKILL)
        c.processes["broker-a"].wait(30)
    finally:
        sender.stop()
    acked = [body for body, _ in sender.acked]
    # The command line, as an operator runs it.
    out = subprocess.run([sys.executable, "-m", "hostmq.cli.main", "ha", "promote", root, "--name", "broker-a",
                          "--id", "1"], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert '"demoted"' in out.stdout and "broker-a" in out.stdout
    rows = _rows(root)
    assert rows["broker-a.1"]["id"] == 0 and rows["broker-a.1"]["role"] == "ASYNC_MASTER"
    assert rows["broker-a.1"]["epoch"] == 1 and "scheduler" in rows["broker-a.1"]["pids"]
    with hostmq.Producer(root) as p:
        after = [b"%08d" % (10_000_000 + i) for i in range(500)]
        for i in range(0, 500, 100):
            assert p.send_batch([Message("promoted", b) for b in after[i:i + 100]]).status == \
                hostmq.SendStatus.SEND_OK
    c.start_broker("broker-a")                      # the old master: a slave now
    rows = _rows(root)
    assert rows["broker-a"]["id"] == 1 and rows["broker-a"]["role"] == "SLAVE"
    wait_until(lambda: _caught_up(root, "broker-a.1", "broker-a"), 60, "the old master to catch up as a slave")
    commitlogs_identical(root)
    bodies = consume_bodies(root, "promoted", len(acked) + 500, "g-promoted", linger_s=0.5)
    assert len(bodies) == len(set(bodies))          # nothing twice
    assert set(acked) | set(after) <= set(bodies)   # every acknowledged message


def test_an_async_master_that_held_more_cuts_it_when_it_rejoins_and_keeps_the_cut_records(cluster):
    """ASYNC_MASTER: messages only the old master had (its slave was frozen, then its replica killed
    with the bytes in its socket) are cut from the old master when it rejoins — kept in
    ``store/cut-*.bin`` — and the logs agree byte for byte afterwards."""
    c = cluster(slaves=1)
    root = c.root
    with hostmq.Producer(root) as p:
        p.send_batch([Message("diverged", b"a%07d" % i) for i in range(100)])
    wait_until(lambda: _caught_up(root, "broker-a", "broker-a.1"), 60, "the slave to catch up")
    slave_writer = _rows(root)["broker-a.1"]["pids"]["writer"]
    c.signal_group("broker-a.1", signal.SIGSTOP)
    try:
        with hostmq.Producer(root) as p:
            lost = [b"lost%04d" % i for i in range(200)]
            p.send_batch([Message("diverged", b) for b in lost])
        c.signal_group("broker-a", signal.SIGKILL)
        c.processes["broker-a"].wait(30)
        os.kill(slave_writer, signal.SIGKILL)       # what the master had sent dies in its socket
    finally:
        c.signal_group("broker-a.1", signal.SIGCONT)
    with hostmq.Admin(root) as a:
        promoted = a.promote("broker-a", 1)
    assert promoted["demoted"] == ["broker-a"] and promoted["epoch"] == 1
    with hostmq.Producer(root) as p:
        p.send_batch([Message("diverged", b"b%07d" % i) for i in range(300)])
    c.start_broker("broker-a")
    wait_until(lambda: _caught_up(root, "broker-a.1", "broker-a"), 90, "the old master to cut and catch up")
    commitlogs_identical(root)
    cut = glob.glob(os.path.join(RootPaths(root).store_dir("broker-a"), "cut-*.bin"))
    assert len(cut) == 1
    with open(cut[0], "rb") as f:
        kept = f.read()
    assert all(b in kept for b in lost)
    assert "cut the commitlog at" in c.log_tail("broker-a", 400)
    bodies = consume_bodies(root, "diverged", 400, "g-diverged", linger_s=0.5)
    assert sorted(bodies) == sorted([b"a%07d" % i for i in range(100)] + [b"b%07d" % i for i in range(300)])


def test_status_and_metrics_show_each_instance_role_and_replication_lag(cluster):
    from hostmq import metrics
    c = cluster(slaves=1)
    root = c.root
    with hostmq.Producer(root) as p:
        p.send_batch([Message("shown", b"x" * 100) for _ in range(100)])
    wait_until(lambda: _caught_up(root, "broker-a", "broker-a.1"), 60, "the slave to catch up")
    out = subprocess.run([sys.executable, "-m", "hostmq.cli.main", "status", root], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    lines = {ln.split()[0]: ln for ln in out.stdout.splitlines() if ln.startswith("broker-a")}
    assert "SLAVE" in lines["broker-a.1"] and " 0 B " in lines["broker-a.1"]
    assert "ASYNC_MASTER" in lines["broker-a"] and "1 slave(s)" in lines["broker-a"]
    samples = {(f.name, tuple(s.labels.values())): s.value for f in metrics.families(metrics.snapshot(root))
               for s in f.samples}
    assert samples[("hostmq_broker_is_slave", ("broker-a.1",))] == 1.0
    assert samples[("hostmq_broker_is_slave", ("broker-a",))] == 0.0
    assert samples[("hostmq_replication_lag_bytes", ("broker-a.1",))] == 0.0
    assert samples[("hostmq_replication_connected", ("broker-a.1",))] == 1.0
    assert samples[("hostmq_replication_connected", ("broker-a",))] == 1.0
