"""Queue allocation within a consumer group (RocketMQ's strategies), as exact tables."""
from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings, strategies as st

import hostmq
from hostmq import MessageQueue
from hostmq.client.rebalance import md5_hash, rocketmq_name
from hostmq.errors import ValidationError

pytestmark = pytest.mark.timeout(60)


def qs(n: int, topic: str = "T", brokers=("broker-a",)) -> list[MessageQueue]:
    per = n // len(brokers)
    return [MessageQueue(topic, b, q) for b in brokers for q in range(per)]


def ids(share):
    return [q.queue_id for q in share]


CIDS = ["c0", "c1", "c2", "c3"]


# Worked by hand from AllocateMessageQueueAveragely: 10 queues / 4 consumers → 3, 3, 2, 2 in blocks.
@pytest.mark.parametrize("cid,expect", [("c0", [0, 1, 2]), ("c1", [3, 4, 5]), ("c2", [6, 7]), ("c3", [8, 9])])
def test_average_10_queues_4_consumers(cid, expect):
    assert ids(hostmq.allocate("average", cid, qs(10), CIDS)) == expect


# 3 queues / 5 consumers: the first three get one each, the last two nothing.
@pytest.mark.parametrize("cid,expect", [("c0", [0]), ("c1", [1]), ("c2", [2]), ("c3", []), ("c4", [])])
def test_average_3_queues_5_consumers(cid, expect):
    assert ids(hostmq.allocate("average", cid, qs(3), ["c0", "c1", "c2", "c3", "c4"])) == expect


# AveragelyByCircle: queue i to consumer i mod 4.
@pytest.mark.parametrize("cid,expect", [("c0", [0, 4, 8]), ("c1", [1, 5, 9]), ("c2", [2, 6]), ("c3", [3, 7])])
def test_circle_10_queues_4_consumers(cid, expect):
    assert ids(hostmq.allocate("circle", cid, qs(10), CIDS)) == expect


def test_inputs_are_sorted_first_so_every_member_agrees():
    queues = qs(8, brokers=("broker-b", "broker-a"))
    a = hostmq.allocate("average", "c1", list(reversed(queues)), ["c3", "c1", "c0", "c2"])
    b = hostmq.allocate("average", "c1", queues, CIDS)
    assert a == b == sorted(queues)[2:4]        # broker-a's queues sort first


def test_a_consumer_outside_the_group_gets_nothing_and_bad_input_is_refused():
    assert hostmq.allocate("average", "stranger", qs(4), CIDS) == []
    assert hostmq.allocate("average", "c0", [], CIDS) == []
    with pytest.raises(ValidationError, match="unknown allocation strategy"):
        hostmq.allocate("random", "c0", qs(4), CIDS)
    with pytest.raises(ValidationError):
        hostmq.allocate("average", "", qs(4), CIDS)
    with pytest.raises(ValidationError):
        hostmq.allocate("average", "c0", ["T#0"], CIDS)


def test_a_callable_strategy_is_used_and_checked():
    def first_two(cid, mqs, cids):
        return mqs[:2] if cid == cids[0] else []
    assert ids(hostmq.allocate(first_two, "c0", qs(4), CIDS)) == [0, 1]
    assert hostmq.allocate(first_two, "c1", qs(4), CIDS) == []
    with pytest.raises(ValidationError, match="not given"):
        hostmq.allocate(lambda cid, mqs, cids: [MessageQueue("other", "b", 0)], "c0", qs(4), CIDS)


def test_md5_hash_is_rocketmqs():
    # ConsistentHashRouter.MD5Hash: the first four digest bytes as an unsigned big-endian number.
    d = hashlib.md5(b"c0-3").digest()
    assert md5_hash("c0-3") == (d[0] << 24) | (d[1] << 16) | (d[2] << 8) | d[3]
    assert rocketmq_name(MessageQueue("T", "broker-a", 7)) == "MessageQueue [topic=T, brokerName=broker-a, queueId=7]"


def ring_owner(mq: MessageQueue, cids) -> str:
    """Reference: walk a ring of (hash, consumer) points clockwise from the queue's hash."""
    points = sorted((md5_hash(f"{c}-{r}"), c) for c in cids for r in range(10))
    h = md5_hash(rocketmq_name(mq))
    for p, c in points:
        if p >= h:
            return c
    return points[0][1]


def test_consistent_hash_matches_a_ring_walk():
    queues = qs(16, brokers=("broker-a", "broker-b"))
    for cid in CIDS:
        assert hostmq.allocate("consistent_hash", cid, queues, CIDS) == [q for q in sorted(queues)
                                                                        if ring_owner(q, CIDS) == cid]


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 40), st.integers(1, 9), st.sampled_from(["average", "circle", "consistent_hash"]))
def test_every_strategy_partitions_the_queues(n_queues, n_consumers, strategy):
    queues = qs(n_queues)
    cids = [f"10.0.0.1@{i}" for i in range(n_consumers)]
    shares = [hostmq.allocate(strategy, c, queues, cids) for c in cids]
    flat = [q for s in shares for q in s]
    assert sorted(flat) == sorted(queues)            # union = all, no queue twice
    if strategy != "consistent_hash":                # the averaging ones are balanced within one
        sizes = [len(s) for s in shares]
        assert max(sizes) - min(sizes) <= 1


@settings(max_examples=100, deadline=None)
@given(st.integers(4, 64), st.integers(2, 8), st.data())
def test_consistent_hash_moves_only_the_queues_of_a_consumer_that_joins_or_leaves(n_queues, n_consumers, data):
    queues = qs(n_queues)
    cids = [f"host@{i}" for i in range(n_consumers)]
    before = {c: set(hostmq.allocate("consistent_hash", c, queues, cids)) for c in cids}
    gone = data.draw(st.sampled_from(cids))
    rest = [c for c in cids if c != gone]
    after = {c: set(hostmq.allocate("consistent_hash", c, queues, rest)) for c in rest}
    for c in rest:                                   # everyone keeps what it had, plus some of gone's
        assert before[c] <= after[c] and after[c] - before[c] <= before[gone]
    joined = rest + [gone]
    again = {c: set(hostmq.allocate("consistent_hash", c, queues, joined)) for c in joined}
    assert again == before                           # joining is the exact inverse
