"""A broker, producer and consumers configured with spinning idle strategies deliver every message
(issue 29 item 4; the strategies' own behaviour is tests/shm/test_idle.py). No timing is asserted."""
from __future__ import annotations

import struct
import threading

import pytest

import hostmq
from hostmq import ConsumeFrom, ConsumeResult, Message, SendStatus
from hostmq.waiting import IdleStrategy
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(180)
SEQ = struct.Struct(">q")
SPIN = {"broker": {"writer_idle": "spin:100", "dispatcher_idle": "spin", "flusher_idle": "backoff"}}


def test_spinning_producer_and_consumers_deliver_every_message(cluster):
    c = cluster(**SPIN)
    n = 200
    with hostmq.Admin(c.root) as admin:
        admin.create_topic("idle-t", queues=2)
    got: list[int] = []
    lock = threading.Lock()

    def listener(msgs, context):
        with lock:
            got.extend(SEQ.unpack_from(m.body)[0] for m in msgs)
        return ConsumeResult.SUCCESS
    push = hostmq.PushConsumer(c.root, group="idle-push", consume_from=ConsumeFrom.FIRST_OFFSET, idle="backoff:50")
    push.subscribe("idle-t")
    push.register(listener)
    with hostmq.Producer(c.root, group="idle-pg", idle="spin:200") as p, \
            hostmq.PullConsumer(c.root, group="idle-pull", consume_from=ConsumeFrom.FIRST_OFFSET,
                                idle=IdleStrategy("spin", 100.0)) as pc, push.start():
        assert p.idle == IdleStrategy("spin", 200.0) and pc.idle.kind == "spin"
        pc.subscribe("idle-t")
        pulled: list[int] = []
        for i in range(n):
            assert p.send(Message("idle-t", SEQ.pack(i))).status == SendStatus.SEND_OK
            pulled += [SEQ.unpack_from(m.body)[0] for m in pc.poll(0)]

        def all_pulled():
            pulled.extend(SEQ.unpack_from(m.body)[0] for m in pc.poll(0.2))
            return len(pulled) >= n
        wait_until(all_pulled, 30, f"{n} pulled messages", step_s=0)
        assert sorted(pulled) == list(range(n))
        wait_until(lambda: len(got) >= n, 30, f"{n} pushed messages")
        with lock:
            assert sorted(got) == list(range(n))
        assert pc.wait_stats.calls > 0
