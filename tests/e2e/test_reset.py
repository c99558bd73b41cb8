"""Backtracking: a group's offsets reset to a timestamp reach running consumers without a restart."""
from __future__ import annotations

import collections
import struct
import subprocess
import sys
import time

import pytest

import hostmq
from hostmq import ConsumeFrom, Message
from hostmq.client.offset_store import BrokerOffsets
from tests.conftest import wait_until
from tests.e2e.test_push import FAST, Sink, push

pytestmark = pytest.mark.timeout(240)
SEQ = struct.Struct(">q")


def send_with_mark(root: str, topic: str, n: int) -> int:
    """Send ``n`` numbered messages; the store time between the two halves (ms)."""
    with hostmq.Producer(root) as p:
        for i in range(n // 2):
            p.send(Message(topic, SEQ.pack(i)))
        time.sleep(0.02)
        mid_ms = int(time.time() * 1000)
        time.sleep(0.02)
        for i in range(n // 2, n):
            p.send(Message(topic, SEQ.pack(i)))
    return mid_ms


def test_a_running_pull_consumer_rereads_from_the_reset_point(cluster):
    c = cluster(brokers=2)
    with hostmq.Admin(c.root) as a:
        queues = a.create_topic("bt", queues=2)
    mid_ms = send_with_mark(c.root, "bt", 1000)
    got: collections.Counter = collections.Counter()
    with hostmq.PullConsumer(c.root, group="bt-g", consume_from=ConsumeFrom.FIRST_OFFSET,
                             rebalance_interval_s=1.0, heartbeat_interval_s=1.0, auto_commit_interval_s=0.1) as pc:
        pc.subscribe("bt")

        def drain(pred):
            def step():
                for m in pc.poll(0.05):
                    got[SEQ.unpack_from(m.body)[0]] += 1
                return pred()
            wait_until(step, 60, "messages", step_s=0)
        drain(lambda: len(got) == 1000)
        pc.commit()
        with hostmq.Admin(c.root) as a:
            moved = a.reset_offset("bt-g", "bt", mid_ms)
            assert set(moved) == set(queues) and sum(moved.values()) == 500
        drain(lambda: sum(got.values()) == 1500)          # no restart: the same consumer reads again
        again = {s for s, n in got.items() if n == 2}
        assert again == set(range(500, 1000)) and max(got.values()) == 2
        pc.commit()
        with hostmq.Admin(c.root) as a:
            assert all(r["consumer_offset"] == r["broker_offset"] for r in a.consumer_progress("bt-g"))


def test_a_running_push_consumer_rereads_and_stale_commits_are_refused(cluster):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        queues = a.create_topic("btp", queues=2)
    mid_ms = send_with_mark(c.root, "btp", 600)
    sink = Sink()
    x = push(c.root, sink, "btp", group="btp-g")
    try:
        wait_until(lambda: sink.total() == 600, 60, "everything once")
        with hostmq.Admin(c.root) as a:
            a.reset_offset("btp-g", "btp", mid_ms)
        wait_until(lambda: sum(sink.counts.values()) == 900, 60, "the second half again")
        assert {s for s, n in sink.counts.items() if n == 2} == set(range(300, 600))
        # A member that has not seen the reset cannot undo it with its old position.
        with hostmq.Admin(c.root) as a:
            a.reset_offset("btp-g", "btp", 0)
            store = BrokerOffsets(a.instance, "btp-g")
            assert store.store(queues[0], 300, reset_version=0) is False
            assert store.query(queues[0]) == 0
            assert store.store(queues[0], 300, reset_version=None) is True    # a client that does not say
    finally:
        x.shutdown()


def test_offsets_reset_from_the_command_line(cluster):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        a.create_topic("btc", queues=1)
    mid_ms = send_with_mark(c.root, "btc", 10)
    r = subprocess.run([sys.executable, "-m", "hostmq.cli.main", "offsets", "reset", c.root, "--group", "cli-g",
                        "--topic", "btc", "--timestamp", str(mid_ms)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "btc@broker-a#0" in r.stdout and " 5" in r.stdout
    with hostmq.PullConsumer(c.root, group="cli-g", **{k: v for k, v in FAST.items() if k != "auto_commit_interval_s"}) as pc:
        pc.subscribe("btc")
        got = wait_until(lambda: pc.poll(0.2), 30, "the messages after the reset point")
        assert [SEQ.unpack_from(m.body)[0] for m in got] == list(range(5, 10))
    r = subprocess.run([sys.executable, "-m", "hostmq.cli.main", "offsets", "reset", c.root, "--group", "cli-g",
                        "--topic", "btc", "--timestamp", "yesterday"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "neither milliseconds nor an ISO time" in r.stderr
