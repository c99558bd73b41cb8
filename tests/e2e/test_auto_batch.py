"""Auto-batching of send_async (``Producer(auto_batch=True)``, RocketMQ 5's ProduceAccumulator): one
call per message, one frame per batch, and still one Future and one SendResult per message."""
from __future__ import annotations


import pytest

import hostmq
from hostmq import Message, SendStatus
from hostmq.client.accumulator import BatchConfig
from tests.e2e.conftest import check_results_name_their_messages, consume_all

pytestmark = pytest.mark.timeout(120)


def test_every_batched_message_gets_its_own_result_and_arrives_once(cluster):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        a.create_topic("ab", queues=3)
    n = 2000
    with hostmq.Producer(c.root, auto_batch=True, batch=BatchConfig(max_messages=64)) as p:
        futs = [p.send_async(Message("ab", b"m%05d" % i, tags="t", keys=["k%d" % i])) for i in range(n)]
        results = [f.result(30) for f in futs]
    by_body = check_results_name_their_messages(c.root, "ab", results)
    for i in range(n):
        m = by_body[b"m%05d" % i]
        assert m.keys == ("k%d" % i,) and m.tags == "t"


def test_a_lone_message_goes_out_after_the_delay_and_open_batches_at_shutdown(cluster):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        a.create_topic("lone", queues=2)
    with hostmq.Producer(c.root, auto_batch=True, batch=BatchConfig(max_messages=1000, max_delay_ms=5)) as p:
        assert p.send_async(Message("lone", b"alone")).result(10).status == SendStatus.SEND_OK
        held = [p.send_async(Message("lone", b"held %d" % i)) for i in range(10)]
    assert all(f.result(10).status == SendStatus.SEND_OK for f in held)      # shutdown sent them
    assert sorted(m.body for m in consume_all(c.root, "lone", 11)) == \
        sorted([b"alone"] + [b"held %d" % i for i in range(10)])


def test_pinned_delayed_and_large_messages_are_not_batched(cluster):
    c = cluster(broker={"message_delay_level": "1s 2s"})
    with hostmq.Admin(c.root) as a:
        q0, q1 = a.create_topic("mixed", queues=2)
    with hostmq.Producer(c.root, auto_batch=True, compress_over_bytes=64) as p:
        pinned = p.send_async(Message("mixed", b"pinned"), queue=q1)
        delayed = p.send_async(Message("mixed", b"delayed", delay_level=1))
        large = p.send_async(Message("mixed", b"L" * 5000))
        assert pinned.result(10).queue == q1
        assert delayed.result(10).status == SendStatus.SEND_OK and large.result(10).status == SendStatus.SEND_OK
        assert p._accumulator is None           # none of them went through a batch
    got = consume_all(c.root, "mixed", 3)
    assert sorted(m.body[:7] for m in got) == [b"LLLLLLL", b"delayed", b"pinned"]


def test_a_bad_message_raises_in_the_caller_and_batches_go_on(cluster):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        a.create_topic("bad", queues=1)
    with hostmq.Producer(c.root, auto_batch=True) as p:
        ok = p.send_async(Message("bad", b"fine"))
        with pytest.raises(hostmq.errors.ValidationError):
            p.send_async(Message("bad", b"x", properties={"": "empty key"}))
        assert p.send_async(Message("bad", b"fine too")).result(10).status == SendStatus.SEND_OK
        assert ok.result(10).status == SendStatus.SEND_OK


@pytest.mark.parametrize("bad", [{"max_messages": 0}, {"max_bytes": -1}, {"max_messages": True},
                                 {"max_delay_ms": -1}, {"max_delay_ms": "1"}])
def test_bad_batch_limits_are_refused(bad):
    with pytest.raises(hostmq.ValidationError, match="BatchConfig"):
        hostmq.BatchConfig(**bad)


def test_a_message_changed_after_send_async_changes_nothing_sent(cluster):
    """The batch is routed by its topic as it was at the call, not by the caller's message, which
    the caller may reuse (it once chose the queue from the changed topic, and the broker refused)."""
    c = cluster()
    with hostmq.Admin(c.root) as a:
        a.create_topic("kept", queues=1)
    with hostmq.Producer(c.root, auto_batch=True, batch=BatchConfig(max_messages=1000, max_delay_ms=60_000)) as p:
        m = Message("kept", b"original")
        f = p.send_async(m)
        m.topic, m.body = "other", b"changed"
        p.flush()
        assert f.result(10).status == SendStatus.SEND_OK and f.result().queue.topic == "kept"
    assert [m.body for m in consume_all(c.root, "kept", 1)] == [b"original"]
