"""``broker.slave_read_enable`` (issue 18): a consumer that lags far behind a running master reads
those messages from its slave (RocketMQ's suggestPullingFromSlave), back from the master once it is
within the bound — positions carry over both ways, nothing is read twice or skipped — and from the
master alone when the slave is gone."""
from __future__ import annotations

import contextlib
import signal

import psutil
import pytest

import hostmq
from hostmq import Message
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(180)

TOPIC = "lagging"
BOUND_BYTES = 512 << 10    # the slave-read bound the test's ratio of this machine's RAM comes to
TOTAL = 12_000              # ~2.5 MB of records: most of a new group's backlog lies beyond the bound


def _ratio() -> float:
    return BOUND_BYTES * 100 / psutil.virtual_memory().total


def _rows(root: str) -> dict[int, dict]:
    with hostmq.Admin(root) as a:
        return {r["id"]: r for r in a.brokers() if r["name"] == "broker-a"}


def _slave_dispatched(root: str) -> bool:
    rows = _rows(root)
    if 1 not in rows or not rows[1]["alive"]:
        return False
    m, s = rows[0]["state"], rows[1]["state"]
    return s["write_pos"] == m["write_pos"] > 0 and s["dispatched_pos"] == s["write_pos"]


def _fill(root: str) -> None:
    with hostmq.Admin(root) as a:
        a.create_topic(TOPIC, queues=2)
    with hostmq.Producer(root) as p:
        for i in range(0, TOTAL, 200):
            rs = p.send_batch([Message(TOPIC, b"%06d" % j + b"." * 94) for j in range(i, i + 200)])
            assert rs.status == hostmq.SendStatus.SEND_OK
    wait_until(lambda: _slave_dispatched(root), 90, "the slave to hold and dispatch everything")


def _consume(pc: hostmq.PullConsumer, want: int, got: list) -> None:
    wait_until(lambda: got.extend(pc.poll(timeout=0.2)) or len(got) >= want, 60, f"{want} messages")


def _check(got: list) -> None:
    """Every message once, and each queue read in order from its first offset, no gap (the master's
    and the slave's reader hand positions to each other)."""
    assert sorted(m.body for m in got) == [b"%06d" % i + b"." * 94 for i in range(TOTAL)]
    for q in {m.queue_id for m in got}:
        offsets = [m.queue_offset for m in got if m.queue_id == q]
        assert offsets == list(range(len(offsets)))


@contextlib.contextmanager
def _new_group(root: str, group: str):
    """A new group's consumer of the topic from its first offset, closed at the end."""
    pc = hostmq.PullConsumer(root, group=group, consume_from=hostmq.ConsumeFrom.FIRST_OFFSET)
    try:
        pc.subscribe(TOPIC, "*")
        yield pc
    finally:
        pc.close()


def test_a_lagging_consumer_reads_from_the_slave_and_returns_to_the_master(cluster):
    c = cluster(slaves=1, broker={"slave_read_enable": True, "access_message_in_memory_max_ratio": _ratio()})
    assert abs(_published_bound(c.root) - BOUND_BYTES) <= BOUND_BYTES // 100
    _fill(c.root)
    with _new_group(c.root, "g-lag") as pc:
        got: list = []
        _consume(pc, TOTAL, got)
        _check(got)
        # What lay beyond the bound came from the slave, the last 512 KiB from the master.
        assert 0 < pc.slave_reads.messages < TOTAL
        assert pc.slave_reads.on_slave == set() and pc.views["broker-a"].instance == "broker-a"
        assert "broker-a" in pc.slave_reads.views


def test_with_the_slave_gone_a_lagging_consumer_reads_the_master(cluster):
    c = cluster(slaves=1, broker={"slave_read_enable": True, "access_message_in_memory_max_ratio": _ratio()})
    _fill(c.root)
    with _new_group(c.root, "g-gone") as pc:
        got: list = []
        _consume(pc, 2_000, got)
        assert pc.slave_reads.messages > 0
        c.signal_group("broker-a.1", signal.SIGKILL)
        c.processes["broker-a.1"].wait(30)
        pc.refresh_brokers()
        assert pc.slave_reads.views == {}
        before = pc.slave_reads.messages
        _consume(pc, TOTAL, got)
        _check(got)
        assert pc.slave_reads.messages == before       # the rest from the master


def test_without_slave_read_enable_a_lagging_consumer_stays_on_the_master(cluster):
    c = cluster(slaves=1, broker={"access_message_in_memory_max_ratio": _ratio()})
    assert _published_bound(c.root) == 0
    _fill(c.root)
    with _new_group(c.root, "g-off") as pc:
        got: list = []
        _consume(pc, TOTAL, got)
        _check(got)
        assert pc.slave_reads.messages == 0 and pc.slave_reads.views == {}


def _published_bound(root: str) -> int:
    """The bound the running master published in its state."""
    from hostmq.live.group import running_master
    found = running_master(root, "broker-a")
    assert found is not None
    try:
        return found[1].slave_read_lag_bytes
    finally:
        found[1].close()
