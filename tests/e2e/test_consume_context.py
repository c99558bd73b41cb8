"""Consume contexts and the pull consumer's hooks with real broker processes: a listener taking a
context sees its queue and sends a message straight to the DLQ by its delay level; ``on_assign`` /
``on_revoke`` follow a rebalance; ``commit_position`` says what ``commit`` stores."""
from __future__ import annotations

import threading

import pytest

import hostmq
from hostmq import ConsumeFrom, ConsumeResult, Message
from tests.conftest import wait_until
from tests.e2e.test_push import FAST

pytestmark = pytest.mark.timeout(180)


def dead_letters(root: str, group: str) -> list[hostmq.MessageExt]:
    with hostmq.Admin(root) as a:
        def route():
            try:
                return a.route(f"%DLQ%{group}")
            except hostmq.NoRouteError:
                return None
        dlq = wait_until(route, 30, "the DLQ topic")
    with hostmq.PullConsumer(root, group="dlq-reader", consume_from=ConsumeFrom.FIRST_OFFSET) as pc:
        pc.assign(dlq)
        return wait_until(lambda: pc.poll(0.2), 30, "the dead letter")


def test_a_context_listener_sees_its_queue_and_sends_straight_to_the_dlq(cluster):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        queues = a.create_topic("cx", queues=2)
    calls: list[tuple[bytes, hostmq.MessageQueue]] = []
    lock = threading.Lock()

    def listener(msgs, ctx):
        with lock:
            calls.extend((m.body, ctx.message_queue) for m in msgs)
        if msgs[0].body == b"poison":
            ctx.delay_level_when_next_consume = -1          # no retries: to the DLQ at once
            return ConsumeResult.RECONSUME_LATER
        return ConsumeResult.SUCCESS

    x = hostmq.PushConsumer(c.root, group="cx-g", consume_from=ConsumeFrom.FIRST_OFFSET, **FAST)
    x.subscribe("cx")
    x.register(listener)
    x.start()
    try:
        with hostmq.Producer(c.root) as p:
            sent = {body: p.send(Message("cx", body)).queue for body in (b"poison", b"fine")}
        dead = dead_letters(c.root, "cx-g")
        assert [m.body for m in dead] == [b"poison"] and dead[0].reconsume_times == 1
        wait_until(lambda: len(calls) >= 2, 30, "both messages")
        with lock:
            assert sorted(calls) == sorted(sent.items())       # each seen once, with the queue it came from
        assert set(sent.values()) <= set(queues)
    finally:
        x.shutdown()


def test_pull_consumer_hooks_are_constructor_callbacks(cluster):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        queues = a.create_topic("hk", queues=4)
    events: list[tuple[str, str, list]] = []

    def hooks(name: str) -> dict:
        return {"on_assign": lambda qs: events.append((name, "+", sorted(qs))),
                "on_revoke": lambda qs: events.append((name, "-", sorted(qs)))}
    opts = {"rebalance_interval_s": 1.0, "heartbeat_interval_s": 1.0, "auto_commit": False}
    with hostmq.PullConsumer(c.root, group="hk-g", **opts, **hooks("a")) as first:
        first.subscribe("hk")
        assert events == [("a", "+", sorted(queues))]
        with hostmq.PullConsumer(c.root, group="hk-g", **opts, **hooks("b")) as second:
            second.subscribe("hk")
            wait_until(lambda: first.poll(0.1) == [] and len(first.assignment()) == 2, 30, "the first to give half")
            second.poll(0.1)
            revoked = [qs for who, sign, qs in events if (who, sign) == ("a", "-")]
            gained = [q for who, sign, qs in events if (who, sign) == ("b", "+") for q in qs]
            assert revoked == [sorted(set(queues) - set(first.assignment()))]
            assert sorted(gained) == sorted(second.assignment()) == revoked[0]

    mq = queues[0]
    with hostmq.Producer(c.root) as p:
        for i in range(10):
            p.send(Message("hk", b"m%d" % i), queue=mq)
    with hostmq.PullConsumer(c.root, group="cp-g", auto_commit=False, consume_from=ConsumeFrom.FIRST_OFFSET,
                             commit_position=lambda q: 7 if q == mq else None) as pc:
        pc.assign(queues)
        pc.commit()
        assert pc.committed(mq) == 7 and all(pc.committed(q) is None for q in queues[1:])
    with pytest.raises(hostmq.ValidationError):
        hostmq.PullConsumer(c.root, group="cp-g", on_revoke="no")
