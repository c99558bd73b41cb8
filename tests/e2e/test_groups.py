"""Consumer groups with real broker processes: membership, rebalance, handover, filters."""
from __future__ import annotations

import collections
import signal
import struct
import subprocess
import sys
import threading
import time

import pytest

import hostmq
from hostmq import ConsumeFrom, Message, MessageQueue
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(240)
SEQ = struct.Struct(">q")
FAST = {"rebalance_interval_s": 1.0, "heartbeat_interval_s": 1.0}


def consumer(root: str, group: str = "grp", **kw) -> hostmq.PullConsumer:
    return hostmq.PullConsumer(root, group=group, consume_from=ConsumeFrom.FIRST_OFFSET, **{**FAST, **kw})


def send(root: str, topic: str, seqs, **props) -> None:
    with hostmq.Producer(root) as p:
        for i in seqs:
            p.send(Message(topic, SEQ.pack(i), properties={k: v(i) for k, v in props.items()} or None))


def drain(consumers, counts: collections.Counter, until) -> None:
    """Poll every consumer in turn until ``until()`` holds (the polls also drive rebalancing)."""
    def step():
        for c in consumers:
            for m in c.poll(0.05):
                counts[SEQ.unpack_from(m.body)[0]] += 1
        return until()
    wait_until(step, 60, "the consumers to get there", step_s=0)


def test_two_members_share_the_queues_and_a_leaver_hands_over_without_loss(cluster):
    c = cluster(brokers=2)
    with hostmq.Admin(c.root) as a:
        queues = a.create_topic("grp-t", queues=4)               # 8 queues over two brokers
    c1, c2 = consumer(c.root), consumer(c.root)
    counts: collections.Counter = collections.Counter()
    try:
        c1.subscribe("grp-t")
        c2.subscribe("grp-t")

        def split():
            a1, a2 = set(c1.assignment()), set(c2.assignment())
            return len(a1) == len(a2) == 4 and a1 | a2 == set(queues)
        drain([c1, c2], counts, split)
        send(c.root, "grp-t", range(2000))
        drain([c1, c2], counts, lambda: len(counts) == 2000)
        assert set(counts) == set(range(2000)) and max(counts.values()) == 1
        c1.commit()
        c2.commit()

        send(c.root, "grp-t", range(2000, 2600))
        c1.close()                                            # commits, unregisters: c2 takes over
        drain([c2], counts, lambda: set(c2.assignment()) == set(queues) and len(counts) == 2600)
        assert set(counts) == set(range(2600))
        assert max(counts.values()) == 1, "a clean handover re-delivers nothing"
    finally:
        c1.close()
        c2.close()


MEMBER = """
import sys, time
import hostmq
from hostmq import ConsumeFrom
with hostmq.PullConsumer(sys.argv[1], group="grp", consume_from=ConsumeFrom.FIRST_OFFSET,
                         rebalance_interval_s=1.0, heartbeat_interval_s=1.0) as pc:
    pc.subscribe("kill-t")
    while True:
        pc.poll(0.1)
        print(",".join(sorted(map(str, pc.assignment()))), flush=True)
"""


def test_a_killed_member_loses_its_queues_at_the_next_rebalance(cluster):
    c = cluster(brokers=2)
    with hostmq.Admin(c.root) as a:
        queues = a.create_topic("kill-t", queues=2)
    proc = subprocess.Popen([sys.executable, "-c", MEMBER, c.root], stdout=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    me = consumer(c.root)
    counts: collections.Counter = collections.Counter()
    try:
        me.subscribe("kill-t")

        def split():
            child = lines[-1].strip().split(",") if lines and lines[-1].strip() else []
            return len(me.assignment()) == 2 and len(child) == 2 and \
                not set(map(str, me.assignment())) & set(child)
        drain([me], counts, split)
        proc.send_signal(signal.SIGKILL)              # no goodbye: the broker sees its pid gone
        proc.wait(10)
        drain([me], counts, lambda: set(me.assignment()) == set(queues))
        send(c.root, "kill-t", range(500))
        drain([me], counts, lambda: len(counts) == 500)
        assert set(counts) == set(range(500)) and max(counts.values()) == 1
    finally:
        me.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        reader.join(5)


def test_a_joining_member_takes_queues_and_subscriptions_filter(cluster):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        queues = a.create_topic("flt", queues=4)
    first = consumer(c.root, group="g-tags")
    try:
        first.subscribe("flt")
        drain([first], collections.Counter(), lambda: set(first.assignment()) == set(queues))
        second = consumer(c.root, group="g-tags")
        try:
            second.subscribe("flt")
            drain([first, second], collections.Counter(),
                  lambda: len(first.assignment()) == 2 and len(second.assignment()) == 2)
        finally:
            second.close()
    finally:
        first.close()

    with hostmq.Producer(c.root) as p:
        for i in range(200):
            p.send(Message("flt", SEQ.pack(i), tags="even" if i % 2 == 0 else "odd",
                           properties={"n": str(i), "region": "eu" if i % 3 == 0 else "us"}))
    cases = {"g-even": ("even", {i for i in range(200) if i % 2 == 0}),
             "g-sql": (hostmq.SQL("region = 'eu' AND n >= 100"), {i for i in range(100, 200) if i % 3 == 0}),
             "g-sql-tags": (hostmq.SQL("TAGS = 'odd' AND n < 10"), {1, 3, 5, 7, 9})}
    for group, (expr, expect) in cases.items():
        pc = consumer(c.root, group=group)
        try:
            pc.subscribe("flt", expr)
            got: collections.Counter = collections.Counter()
            drain([pc], got, lambda: set(pc.assignment()) == set(queues) and
                  all(pc.position(q) >= 50 for q in queues))          # every message looked at
            assert set(got) == expect and max(got.values()) == 1, group
        finally:
            pc.close()


def test_assign_and_subscribe_do_not_mix(cluster):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        queues = a.create_topic("mix", queues=1)
    with consumer(c.root) as pc:
        pc.assign(queues)
        with pytest.raises(hostmq.ValidationError, match="cannot be mixed"):
            pc.subscribe("mix")
    with consumer(c.root) as pc:
        pc.subscribe("mix")
        with pytest.raises(hostmq.ValidationError, match="cannot be mixed"):
            pc.assign([MessageQueue("mix", "broker-a", 0)])
        with pytest.raises(hostmq.FilterSyntaxError):
            pc.subscribe("mix", hostmq.SQL("a = "))


def test_a_pull_that_finds_nothing_is_held_and_answered_on_arrival(cluster):
    """The broker's long poll (remote clients): held up to suspend_ms, answered when the message lands."""
    from hostmq.client.instance import ClientInstance
    from hostmq.protocol.codes import RequestCode, ResponseCode

    c = cluster()
    with hostmq.Admin(c.root) as a:
        a.create_topic("lp", queues=1)
    inst = ClientInstance(c.root)
    try:
        addr = inst.broker_address("broker-a")
        t0 = time.monotonic()
        f = inst.broker_request(addr, RequestCode.PULL_MESSAGE, {"topic": "lp", "queue_id": 0, "offset": 0,
                                                                  "suspend_ms": 400, "local": False},
                                raw=True, timeout_s=10)
        held_s = time.monotonic() - t0
        assert f.code == ResponseCode.PULL_NOT_FOUND and held_s >= 0.35, (f.code, held_s)

        answer = {}

        def pull():
            t = time.monotonic()
            answer["frame"] = inst.broker_request(addr, RequestCode.PULL_MESSAGE,
                                                  {"topic": "lp", "queue_id": 0, "offset": 0, "suspend_ms": 10_000,
                                                   "local": False}, raw=True, timeout_s=20)
            answer["s"] = time.monotonic() - t
        th = threading.Thread(target=pull)
        th.start()
        wait_until(lambda: inst.broker_request(addr, RequestCode.GET_BROKER_RUNTIME_INFO, {}, raw=True, timeout_s=10)
                   .fields["control"]["held_pulls"] == 1, 15, "the broker to hold the pull")
        assert th.is_alive() and "frame" not in answer      # held: nothing to answer yet
        send(c.root, "lp", [7])
        th.join(15)
        f = answer["frame"]
        assert f.code == ResponseCode.SUCCESS and f.fields["count"] == 1 and len(f.bodies) == 1
        assert answer["s"] < 5.0, "answered on arrival, not at the end of the hold"
        assert SEQ.unpack_from(hostmq.MessageExt(f.bodies[0]).body)[0] == 7
    finally:
        inst.close()
