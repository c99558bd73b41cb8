"""A broker whose every mlock is refused (RLIMIT_MEMLOCK 64 KiB, no CAP_IPC_LOCK) with the transient
store pool and the locked commitlog head switched on: it logs how to allow locking, and still stores
and delivers every message."""
from __future__ import annotations

import os

import pytest

from tests.e2e.conftest import leftovers
from tests.store.test_mlock import run_without_mlock

pytestmark = pytest.mark.timeout(120)

SCRIPT = r"""
import sys, time
import hostmq
from hostmq import ConsumeFrom, LocalCluster, Message
from tests.e2e.conftest import TEST_CONFIG, merge
cfg = merge(TEST_CONFIG, {"store": {"transient_store_pool_enable": True, "commit_interval_ms": 50,
                                    "mlock_commitlog_head": True}})
with LocalCluster(sys.argv[1], config=cfg) as c:
    with hostmq.Admin(c.root) as a:
        a.create_topic("locked", queues=2)
    with hostmq.Producer(c.root) as p:
        ok = sum(p.send(Message("locked", b"m-%04d" % i + b"." * 900)).status == hostmq.SendStatus.SEND_OK
                 for i in range(300))
    got = []
    with hostmq.PullConsumer(c.root, group="g", consume_from=ConsumeFrom.FIRST_OFFSET) as con:
        con.subscribe("locked", "*")
        deadline = time.monotonic() + 30
        while len(got) < 300 and time.monotonic() < deadline:
            got += [m.body[:6] for m in con.poll(0.3)]
print(ok, len(got), sorted(got) == [b"m-%04d" % i for i in range(300)])
"""


def test_a_broker_with_mlock_refused_warns_and_serves(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    p = run_without_mlock(SCRIPT, str(root))
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["300", "300", "True"], (p.stdout, p.stderr[-3000:])
    with open(os.path.join(root, "logs", "broker-a.log")) as f:
        log = f.read()
    assert "mlock of" in log and "RLIMIT_MEMLOCK is 65536 bytes" in log, log[-3000:]
    assert leftovers(str(root), ["broker-a"]) == []
