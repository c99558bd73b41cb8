"""Which queues of a topic each consumer of a group reads (RocketMQ ``AllocateMessageQueueStrategy``), pure.

Every member computes its own share from the same inputs — all queues of the topic and all consumer
ids of the group — so the shares never overlap and together cover every queue. Inputs are sorted
first (as RocketMQ's ``RebalanceImpl`` does) so the result does not depend on the order a broker
listed them in.

* ``average`` (``AllocateMessageQueueAveragely``): contiguous blocks; the first ``len(queues) %
  len(consumers)`` consumers get one queue more.
* ``circle`` (``AllocateMessageQueueAveragelyByCircle``): queue *i* goes to consumer *i mod n*.
* ``consistent_hash`` (``AllocateMessageQueueConsistentHash``): each consumer is placed on an MD5 ring
  with 10 virtual nodes (``"<id>-<replica>"``); a queue goes to the first node at or after the hash of
  its RocketMQ name (``MessageQueue [topic=…, brokerName=…, queueId=…]``), so adding or removing a
  consumer moves only the queues of that consumer.

A callable ``fn(consumer_id, queues, consumer_ids) -> list[MessageQueue]`` may be given instead of a
name; its answer is checked to be a subset of ``queues``.
"""
from __future__ import annotations

import bisect
import hashlib
from typing import Callable, Sequence, Union

from ..errors import ValidationError
from ..message import MessageQueue

VIRTUAL_NODES = 10
Strategy = Union[str, Callable[[str, list, list], list]]


def allocate(strategy: Strategy, consumer_id: str, queues: Sequence[MessageQueue],
             consumer_ids: Sequence[str]) -> list[MessageQueue]:
    """The queues ``consumer_id`` reads; [] if it is not one of ``consumer_ids``."""
    if not isinstance(consumer_id, str) or not consumer_id:
        raise ValidationError(f"consumer_id must be a non-empty string, got {consumer_id!r}")
    if queues is None or consumer_ids is None:      # RocketMQ: IllegalArgumentException
        raise ValidationError("queues and consumer_ids must be sequences, not None")
    for q in queues:
        if not isinstance(q, MessageQueue):
            raise ValidationError(f"queues must be MessageQueue objects, got {q!r}")
    mqs = sorted(set(queues))
    cids = sorted(set(consumer_ids))
    if consumer_id not in cids or not mqs:
        return []
    if callable(strategy):
        got = list(strategy(consumer_id, mqs, cids))
        stray = [q for q in got if q not in set(mqs)]
        if stray:
            raise ValidationError(f"allocation strategy returned queues it was not given: {stray[:3]}")
        return got
    fn = STRATEGIES.get(strategy)
    if fn is None:
        raise ValidationError(f"unknown allocation strategy {strategy!r}; use one of {sorted(STRATEGIES)} "
                              f"or a callable")
    return fn(consumer_id, mqs, cids)


def average(consumer_id: str, mqs: list[MessageQueue], cids: list[str]) -> list[MessageQueue]:
    index, n, m = cids.index(consumer_id), len(cids), len(mqs)
    mod = m % n
    if m <= n:
        size = 1
    else:
        size = m // n + 1 if mod > 0 and index < mod else m // n
    start = index * size if mod > 0 and index < mod else index * size + mod
    return [mqs[(start + i) % m] for i in range(min(size, m - start))]


def circle(consumer_id: str, mqs: list[MessageQueue], cids: list[str]) -> list[MessageQueue]:
    index, n = cids.index(consumer_id), len(cids)
    return [mqs[i] for i in range(index, len(mqs)) if i % n == index]


def md5_hash(key: str) -> int:
    """RocketMQ ``ConsistentHashRouter.MD5Hash``: the first 4 bytes of the MD5 digest, big-endian."""
    return int.from_bytes(hashlib.md5(key.encode("utf-8")).digest()[:4], "big")


def rocketmq_name(mq: MessageQueue) -> str:
    """``MessageQueue.toString()`` in RocketMQ, the key a queue is hashed by."""
    return f"MessageQueue [topic={mq.topic}, brokerName={mq.broker}, queueId={mq.queue_id}]"


def consistent_hash(consumer_id: str, mqs: list[MessageQueue], cids: list[str],
                    virtual_nodes: int = VIRTUAL_NODES) -> list[MessageQueue]:
    ring: dict[int, str] = {}
    for cid in cids:                        # a later node with the same hash replaces it (a TreeMap put)
        for replica in range(virtual_nodes):
            ring[md5_hash(f"{cid}-{replica}")] = cid
    points = sorted(ring)
    out = []
    for mq in mqs:
        i = bisect.bisect_left(points, md5_hash(rocketmq_name(mq)))
        if ring[points[i % len(points)]] == consumer_id:
            out.append(mq)
    return out


STRATEGIES: dict[str, Callable[[str, list, list], list]] = {
    "average": average, "circle": circle, "consistent_hash": consistent_hash,
}
