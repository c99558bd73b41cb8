"""Transient store pool in a broker: sends are acknowledged from the pool buffer, the commit step
moves them to the commitlog file (and so to consumers), and a killed writer's successor commits
what was acknowledged but not committed yet."""
from __future__ import annotations

import os
import signal

import pytest

import hostmq
from hostmq import ConsumeFrom, Message
from hostmq.live.state import BrokerState
from hostmq.root import shm_name
from tests.conftest import wait_until
from tests.e2e.test_faults import writer_pid

pytestmark = pytest.mark.timeout(180)
POOL = {"transient_store_pool_enable": True, "commit_interval_ms": 600_000}


def commitlog_bytes(root: str) -> bytes:
    d = os.path.join(root, "brokers", "broker-a", "store", "commitlog")
    out = b""
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:          # the file, not a map of it
            out += f.read()
    return out


def positions(root: str) -> tuple[int, int]:
    st = BrokerState.attach(shm_name(root, "broker-a", "state"), readonly=True)
    try:
        return int(st.get("write_pos")), int(st.get("committed_pos"))
    finally:
        st.close()


def consume_all(root: str, topic: str, expect: int, timeout_s: float = 20.0) -> list[bytes]:
    got: list[bytes] = []
    with hostmq.PullConsumer(root, group=f"g-{os.getpid()}-{len(got)}-{topic}", auto_commit=False,
                             consume_from=ConsumeFrom.FIRST_OFFSET) as c:
        c.subscribe(topic, "*")
        wait_until(lambda: got.extend(m.body for m in c.poll(0.3)) or len(got) >= expect, timeout_s,
                   f"{expect} messages of {topic}")
    return got


def test_acknowledged_from_the_pool_visible_only_after_the_commit_step(cluster):
    c = cluster(store={**POOL, "commit_least_pages": 64})       # commit once 256 KiB wait
    with hostmq.Admin(c.root) as a:
        a.create_topic("pool", queues=1)
    with hostmq.Producer(c.root) as p:
        for i in range(10):
            assert p.send(Message("pool", b"held-%03d" % i)).status == hostmq.SendStatus.SEND_OK
        write_pos, committed = positions(c.root)
        assert committed < write_pos
        assert b"held-000" not in commitlog_bytes(c.root)
        with hostmq.PullConsumer(c.root, group="early", consume_from=ConsumeFrom.FIRST_OFFSET) as early:
            early.subscribe("pool", "*")
            assert early.poll(0.5) == []                     # not committed: not dispatched
        for i in range(300):                                 # ~300 KiB more: the commit step runs
            p.send(Message("pool", b"fill-%03d" % i + b"." * 1000))
    wait_until(lambda: positions(c.root)[1] >= positions(c.root)[0] - 64 * 4096, 10, "the commit")
    data = commitlog_bytes(c.root)
    assert all(b"held-%03d" % i in data for i in range(10))
    got = consume_all(c.root, "pool", 10)
    assert got[:10] == [b"held-%03d" % i for i in range(10)]


def test_the_commit_interval_commits_a_trickle(cluster):
    c = cluster(store={**POOL, "commit_interval_ms": 300, "commit_least_pages": 100_000})
    with hostmq.Admin(c.root) as a:
        a.create_topic("trickle", queues=1)
    with hostmq.Producer(c.root) as p:
        p.send(Message("trickle", b"one small message"))
    wait_until(lambda: b"one small message" in commitlog_bytes(c.root), 10, "the timed commit")
    assert consume_all(c.root, "trickle", 1) == [b"one small message"]
    write_pos, committed = positions(c.root)
    assert committed == write_pos


def test_a_killed_writer_loses_nothing_acknowledged_from_the_pool(cluster):
    c = cluster(store={**POOL, "commit_least_pages": 100_000})        # nothing commits by itself
    with hostmq.Admin(c.root) as a:
        a.create_topic("salvage", queues=2)
    sent = [b"acked-%04d" % i for i in range(200)]
    with hostmq.Producer(c.root) as p:
        for body in sent:
            assert p.send(Message("salvage", body)).status == hostmq.SendStatus.SEND_OK
        assert b"acked-0000" not in commitlog_bytes(c.root)
        old = writer_pid(c.root)
        os.kill(old, signal.SIGKILL)
        wait_until(lambda: writer_pid(c.root) not in (old, 0), 30, "a new writer")
        assert all(body in commitlog_bytes(c.root) for body in sent)     # committed by the successor
        after = [b"after-%04d" % i for i in range(50)]
        for body in after:
            assert p.send(Message("salvage", body)).status == hostmq.SendStatus.SEND_OK
    c.stop()                                     # a clean stop commits the rest
    assert all(body in commitlog_bytes(c.root) for body in after)
    c.start()
    got = consume_all(c.root, "salvage", 250)
    assert sorted(got) == sorted(sent + after)
