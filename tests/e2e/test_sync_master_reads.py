"""Consumers of a SYNC_MASTER read only what an in-sync slave acknowledged (fault run 599c713, trial
485): a consumer had read records the slave did not hold yet, the master was killed, the slave
promoted, and the consumer's position lay past the new master's end — RocketMQ's offset correction
sent it back to the queue's first offset. A slave that stays silent longer than a send waits for it
(``ha_sync_timeout_ms``) leaves the in-sync set, as its producers are told FLUSH_SLAVE_TIMEOUT; with
no slave connected consumers read what the master stored. ``BrokerState.consumer_readable_pos``,
``confirmed_pos``."""
from __future__ import annotations

import signal
import time

import pytest

import hostmq
from hostmq import Message
from hostmq.live.group import live_state
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(180)
SYNC = {"role": "SYNC_MASTER", "ha_sync_timeout_ms": 3000}


def _words(root: str, instance: str, *names: str) -> tuple[int, ...]:
    st = live_state(root, instance)
    assert st is not None, f"{instance} is not running"
    try:
        return tuple(int(st.get(n)) for n in names)
    finally:
        st.close()


def test_a_sync_master_shows_consumers_only_what_its_slave_holds(cluster):
    c = cluster(slaves=1, broker=SYNC)
    wait_until(lambda: _words(c.root, "broker-a", "ha_slaves") == (1,), 60, "the slave to connect")
    with hostmq.Producer(c.root, retries=0) as p:
        assert [p.send(Message("confirmed", b"on-two-%d" % i), timeout=10.0).status for i in range(5)] == \
            [hostmq.SendStatus.SEND_OK] * 5
        with hostmq.PullConsumer(c.root, group="g-confirmed", auto_commit=False,
                                 consume_from=hostmq.ConsumeFrom.FIRST_OFFSET) as con:
            con.subscribe("confirmed", "*")
            got: list[bytes] = []
            wait_until(lambda: got.extend(m.body for m in con.poll(0.2)) or len(got) >= 5, 30, "the acked five")
            assert sorted(got) == [b"on-two-%d" % i for i in range(5)]

            # 1. The slave is connected but acknowledges nothing: while its producer still waits
            # for the ack, the message is on the master only and no consumer sees it.
            c.signal_group("broker-a.1", signal.SIGSTOP)
            try:
                t0 = time.monotonic()
                fut = p.send_async(Message("confirmed", b"on-one"), timeout=10.0)
                wait_until(lambda: _words(c.root, "broker-a", "write_pos")[0] >
                           _words(c.root, "broker-a", "replicated_pos")[0], 10, "the record on the master")
                while not fut.done() and time.monotonic() - t0 < 1.5:      # half the sync timeout
                    polled = con.poll(0.1)
                    assert polled == [] or fut.done(), "a consumer read a record no slave holds"
                # 2. Silent past the sync timeout: the producer is told FLUSH_SLAVE_TIMEOUT and the
                # slave leaves the in-sync set — consumers are not held up by a frozen slave.
                assert fut.result(10).status == hostmq.SendStatus.FLUSH_SLAVE_TIMEOUT
                assert _words(c.root, "broker-a", "ha_slaves") == (1,)        # still connected
                wait_until(lambda: got.extend(m.body for m in con.poll(0.2)) or b"on-one" in got, 30,
                           "the record once the slave is out of sync")
            finally:
                c.signal_group("broker-a.1", signal.SIGCONT)
            assert p.send(Message("confirmed", b"in-sync-again"), timeout=10.0).status == hostmq.SendStatus.SEND_OK
            wait_until(lambda: got.extend(m.body for m in con.poll(0.2)) or b"in-sync-again" in got, 30,
                       "a record the slave acknowledged")

            # 3. No slave at all: the master confirms alone.
            c.signal_group("broker-a.1", signal.SIGKILL)
            c.processes["broker-a.1"].wait(30)
            wait_until(lambda: _words(c.root, "broker-a", "ha_slaves") == (0,), 30, "the master to see it gone")
            assert p.send(Message("confirmed", b"alone"), timeout=10.0).status == hostmq.SendStatus.SLAVE_NOT_AVAILABLE
            wait_until(lambda: got.extend(m.body for m in con.poll(0.2)) or b"alone" in got, 30,
                       "a record stored while no slave is connected")
            assert sorted(got) == sorted([b"on-two-%d" % i for i in range(5)] + [b"on-one", b"in-sync-again", b"alone"])
