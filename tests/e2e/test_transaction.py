"""Transactional messages end to end: committed messages are delivered once, rolled-back ones never;
UNKNOWN, a raising local transaction and a producer killed mid-transaction are resolved by the
broker's check-back (by any producer of the group); a transaction nobody resolves is given up after
``transaction_check_max`` checks; bad input gets typed errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

import hostmq
from hostmq import ConsumeFrom, Message
from hostmq import TransactionState as TS
from hostmq import records as R
from hostmq.errors import RemoteError, ValidationError
from hostmq.protocol.codes import RequestCode
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(180)
FAST = {"broker": {"transaction_check_interval_s": 0.3, "transaction_timeout_s": 0.5}}


def tx_stats(root: str) -> dict:
    with hostmq.Admin(root) as a:
        return a.brokers()[0]["transactions"]


def consume(root: str, topic: str, expect: int, expression: str = "*", timeout_s: float = 20.0) -> list:
    got: list = []
    with hostmq.PullConsumer(root, group=f"g-{os.urandom(3).hex()}",
                             consume_from=ConsumeFrom.FIRST_OFFSET) as c:
        c.subscribe(topic, expression)
        wait_until(lambda: got.extend(c.poll(0.3)) or len(got) >= expect, timeout_s, f"{expect} messages")
        got.extend(c.poll(0.5))             # and nothing more arrives in the meantime
    return got


class Checker:
    def __init__(self, answers: dict[bytes, TS] | None = None) -> None:
        self.answers = answers or {}
        self.seen: list[hostmq.MessageExt] = []
        self.lock = threading.Lock()

    def __call__(self, m: hostmq.MessageExt) -> TS:
        with self.lock:
            self.seen.append(m)
        return self.answers.get(m.body, TS.UNKNOWN)

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [m.body for m in self.seen]


# Halves first checked back after 6 s: a local transaction done at once is ended without asking the
# broker (no END_TRANSACTION); with FAST's 0.5 s every end asks.
UNASKED = {"broker": {"transaction_check_interval_s": 0.3, "transaction_timeout_s": 6.0}}


@pytest.mark.parametrize("config, unasked", [(FAST, 0), (UNASKED, 3)], ids=["asking", "unasked"])
def test_commit_is_delivered_once_and_rollback_never(cluster, config, unasked):
    c = cluster(**config)
    with hostmq.Admin(c.root) as a:
        a.create_topic("orders", queues=2)
    checker = Checker()
    with hostmq.TransactionProducer(c.root, group="tx", checker=checker) as tp:
        r1 = tp.send_in_transaction(Message("orders", b"c1", tags="A"), local=lambda m, arg: arg, arg=TS.COMMIT)
        r2 = tp.send_in_transaction(Message("orders", b"r1", tags="A"), local=lambda m, arg: TS.ROLLBACK)
        r3 = tp.send_in_transaction(Message("orders", b"c2", tags="B", keys="k-2"), local=lambda m, arg: TS.COMMIT)
        assert [r.local_transaction_state for r in (r1, r2, r3)] == [TS.COMMIT, TS.ROLLBACK, TS.COMMIT]
        assert tp.unasked_ends == unasked
        assert all(r.status == hostmq.SendStatus.SEND_OK and r.queue.topic == "orders" for r in (r1, r2, r3))
        got = consume(c.root, "orders", 2, "A || B")
        assert sorted(m.body for m in got) == [b"c1", b"c2"]
        by_body = {m.body: m for m in got}
        assert by_body[b"c1"].unique_id == r1.transaction_id and by_body[b"c2"].keys == ("k-2",)
        assert all(m.sys_flag & R.SYSFLAG_TX_MASK == R.SYSFLAG_TX_COMMIT for m in got)
        assert all(R.PROP_TRANSACTION_PREPARED not in m.properties for m in got)
        assert [m.body for m in consume(c.root, "orders", 1, "A")] == [b"c1"]
        wait_until(lambda: tx_stats(c.root)["half_offset"] == 3, 10, "the walk past all three halves")
        with hostmq.Admin(c.root) as a:                          # the committed message by its key
            assert [m.body for m in a.query_by_key("orders", "k-2")] == [b"c2"]
    assert checker.bodies() == []                                # nothing was left to check


def test_unknown_and_failing_local_transactions_are_resolved_by_check_back(cluster):
    c = cluster(**FAST)
    with hostmq.Admin(c.root) as a:
        a.create_topic("orders", queues=2)
    checker = Checker({b"later-commit": TS.COMMIT, b"later-rollback": TS.ROLLBACK})

    def boom(m, arg):
        raise RuntimeError("the database is down")
    with hostmq.TransactionProducer(c.root, group="tx", checker=checker) as tp:
        r1 = tp.send_in_transaction(Message("orders", b"later-commit"), local=lambda m, arg: TS.UNKNOWN)
        r2 = tp.send_in_transaction(Message("orders", b"later-rollback"), local=boom)
        r3 = tp.send_in_transaction(Message("orders", b"not-a-state"), local=lambda m, arg: "COMMIT")
        assert [r.local_transaction_state for r in (r1, r2, r3)] == [TS.UNKNOWN] * 3
        got = consume(c.root, "orders", 1)
        assert [m.body for m in got] == [b"later-commit"]
        wait_until(lambda: {b"later-rollback", b"not-a-state"} <= set(checker.bodies()), 10, "the other checks")
        seen = {m.body: m for m in checker.seen}
        assert (seen[b"later-commit"].topic, seen[b"later-commit"].queue) == ("orders", r1.queue)
        assert seen[b"later-commit"].unique_id == r1.transaction_id
        wait_until(lambda: tx_stats(c.root)["half_offset"] == 2, 10, "both resolved halves passed")
    assert [m.body for m in consume(c.root, "orders", 1)] == [b"later-commit"]      # once, never twice


KILLED = r"""
import os, signal, sys
import hostmq
from hostmq import Message
def die(m, arg):
    print("half stored", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
tp = hostmq.TransactionProducer(sys.argv[1], group="tx", checker=lambda m: hostmq.TransactionState.UNKNOWN)
tp.send_in_transaction(Message("orders", b"orphan"), local=die)
"""


def test_a_producer_killed_mid_transaction_is_resolved_by_another_of_its_group(cluster):
    c = cluster(**FAST)
    with hostmq.Admin(c.root) as a:
        a.create_topic("orders", queues=1)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(__file__)))}
    p = subprocess.run([sys.executable, "-c", KILLED, c.root], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == -9 and "half stored" in p.stdout, p.stderr
    checker = Checker({b"orphan": TS.COMMIT})
    with hostmq.TransactionProducer(c.root, group="tx", checker=checker):
        got = consume(c.root, "orders", 1)
    assert [m.body for m in got] == [b"orphan"] and b"orphan" in checker.bodies()


def test_a_transaction_nobody_resolves_is_given_up_after_check_max(cluster):
    c = cluster(broker={**FAST["broker"], "transaction_check_max": 2})
    with hostmq.Admin(c.root) as a:
        a.create_topic("orders", queues=1)
    checker = Checker()
    with hostmq.TransactionProducer(c.root, group="tx", checker=checker) as tp:
        tp.send_in_transaction(Message("orders", b"undecided"), local=lambda m, arg: TS.UNKNOWN)
        wait_until(lambda: tx_stats(c.root)["given_up_total"] == 1, 15, "the half given up")
        stats = tx_stats(c.root)
        assert stats["half_offset"] == 1 and stats["checks_total"] == 2
        assert 1 <= len(checker.bodies()) <= 2                       # checks handed out, at most two
    with open(os.path.join(c.root, "logs", "broker-a.log")) as f:
        assert "given up after 2 checks" in f.read()
    out = subprocess.run([sys.executable, "-m", "hostmq.cli.main", "status", c.root, "--json"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["brokers"][0]["transactions"]["given_up_total"] == 1
    with hostmq.PullConsumer(c.root, group="g", consume_from=ConsumeFrom.FIRST_OFFSET) as pc:
        pc.subscribe("orders", "*")
        assert pc.poll(1.0) == []


def test_check_progress_survives_a_broker_restart(cluster):
    c = cluster(**FAST)
    with hostmq.Admin(c.root) as a:
        a.create_topic("orders", queues=1)
    with hostmq.TransactionProducer(c.root, group="tx", checker=Checker({b"first": TS.COMMIT})) as tp:
        tp.send_in_transaction(Message("orders", b"first"), local=lambda m, arg: TS.UNKNOWN)
        tp.send_in_transaction(Message("orders", b"done"), local=lambda m, arg: TS.ROLLBACK)
        wait_until(lambda: tx_stats(c.root)["half_offset"] == 2, 15, "both resolved")
    c.stop()
    c.start()
    checker = Checker({b"after": TS.COMMIT})
    with hostmq.TransactionProducer(c.root, group="tx", checker=checker) as tp:
        tp.send_in_transaction(Message("orders", b"after"), local=lambda m, arg: TS.UNKNOWN)
        wait_until(lambda: b"after" in checker.bodies(), 15, "the new half checked")
    assert checker.bodies() == [b"after"]                # nothing resolved before the restart came back
    assert sorted(m.body for m in consume(c.root, "orders", 2)) == [b"after", b"first"]


def test_bad_transaction_input_gets_typed_errors_and_the_broker_keeps_serving(cluster):
    c = cluster(**FAST)
    with pytest.raises(ValidationError, match="checker"):
        hostmq.TransactionProducer(c.root, group="tx")
    with hostmq.TransactionProducer(c.root, group="tx", checker=Checker()) as tp:
        with pytest.raises(ValidationError, match="local"):
            tp.send_in_transaction(Message("orders", b"x"), local=None)
        with pytest.raises(ValidationError, match="delay"):
            tp.send_in_transaction(Message("orders", b"x", delay_level=2), local=lambda m, a: TS.COMMIT)
        with pytest.raises(ValidationError):
            tp.send_in_transaction(Message("orders", b""), local=lambda m, a: TS.COMMIT)
        inst = tp.instance
        address = inst.broker_address("broker-a")
        with pytest.raises(ValidationError, match="transaction state"):
            inst.broker_request(address, RequestCode.END_TRANSACTION,
                                {"group": "tx", "queue_offset": 0, "phys_offset": 0, "state": "MAYBE"})
        with pytest.raises(RemoteError, match="queue_offset must be int"):
            inst.broker_request(address, RequestCode.END_TRANSACTION,
                                {"group": "tx", "queue_offset": "zero", "phys_offset": 0, "state": "COMMIT"})
        with pytest.raises(ValidationError, match="max_count"):
            inst.broker_request(address, RequestCode.CHECK_TRANSACTION_STATE, {"group": "tx", "max_count": 0})
        r = tp.send_in_transaction(Message("orders", b"fine"), local=lambda m, a: TS.COMMIT)
        assert r.local_transaction_state == TS.COMMIT
    assert [m.body for m in consume(c.root, "orders", 1)] == [b"fine"]
