"""Consumers of a SYNC_MASTER read only what an in-sync slave acknowledged (fault run
599c713, trial 485): a consumer had read records the slave did not hold yet, the master was killed,
the slave promoted, and the consumer's position lay past the new master's end — RocketMQ's offset
correction sent it back to the queue's first offset. With no slave connected they read what the master
stored. ``BrokerState.consumer_readable_pos``, ``confirmed_pos``."""
from __future__ import annotations

import signal

import pytest

import hostmq
from hostmq import Message
from hostmq.live.group import live_state
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(180)
SYNC = {"role": "SYNC_MASTER", "ha_sync_timeout_ms": 700}


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
        assert [p.send(Message("confirmed", b"on-two-%d" % i), timeout=5.0).status for i in range(5)] == \
            [hostmq.SendStatus.SEND_OK] * 5
        with hostmq.PullConsumer(c.root, group="g-confirmed", auto_commit=False,
                                 consume_from=hostmq.ConsumeFrom.FIRST_OFFSET) as con:
            con.subscribe("confirmed", "*")
            got: list[bytes] = []
            wait_until(lambda: got.extend(m.body for m in con.poll(0.2)) or len(got) >= 5, 30, "the acked five")
            assert sorted(got) == [b"on-two-%d" % i for i in range(5)]
            c.signal_group("broker-a.1", signal.SIGSTOP)        # connected, but acknowledges nothing more
            try:
                status = p.send(Message("confirmed", b"on-one"), timeout=5.0).status
                assert status == hostmq.SendStatus.FLUSH_SLAVE_TIMEOUT      # stored on the master only
                write_pos, replicated, slaves = _words(c.root, "broker-a", "write_pos", "replicated_pos", "ha_slaves")
                assert replicated < write_pos and slaves == 1
                for _ in range(5):      # the master has it; while the slave is connected no consumer sees it
                    polled = con.poll(0.2)
                    if _words(c.root, "broker-a", "ha_slaves") != (1,):
                        break           # the master gave the frozen slave up (ha_housekeeping_s): not this test
                    assert polled == [], "a consumer read a record no slave holds"
            finally:
                c.signal_group("broker-a.1", signal.SIGCONT)
            wait_until(lambda: got.extend(m.body for m in con.poll(0.2)) or b"on-one" in got, 30,
                       "the record once the slave holds it")
            assert got.count(b"on-one") == 1
            c.signal_group("broker-a.1", signal.SIGKILL)        # no slave left: the master confirms alone
            c.processes["broker-a.1"].wait(30)
            wait_until(lambda: _words(c.root, "broker-a", "ha_slaves") == (0,), 30, "the master to see it gone")
            assert p.send(Message("confirmed", b"alone"), timeout=5.0).status == \
                hostmq.SendStatus.SLAVE_NOT_AVAILABLE
            wait_until(lambda: got.extend(m.body for m in con.poll(0.2)) or b"alone" in got, 30,
                       "a record stored while no slave is connected")
