"""hostmq.aio.PullConsumer against two real brokers: the sync consumer's guarantees
(tests/e2e/test_send_consume.py, test_groups.py) — every message once and in queue order, commit
and restart resumes, a group shares the queues without loss — plus what is asyncio's own: a
cancelled or broken-off ``async for`` loses nothing, ``close`` ends an ``async for`` elsewhere."""
from __future__ import annotations

import asyncio
import collections
import struct

import pytest

import hostmq
from hostmq import ConsumeFrom, Message, MessageQueue
from hostmq import aio
from tests.aio.conftest import eventually, run

pytestmark = pytest.mark.timeout(120)
BROKERS = 2
SEQ = struct.Struct(">q")
FAST = {"rebalance_interval_s": 1.0, "heartbeat_interval_s": 1.0}


async def send(root: str, topic: str, seqs, queue: MessageQueue | None = None) -> list[hostmq.SendResult]:
    async with aio.Producer(root) as p:
        return list(await asyncio.gather(*[p.send(Message(topic, SEQ.pack(i)), queue=queue) for i in seqs]))


async def max_offset(a: aio.Admin, mq: MessageQueue) -> int:
    for b in await a.brokers():
        for q in b.get("queues", []):
            if (q["topic"], b["name"], q["queue_id"]) == (mq.topic, mq.broker, mq.queue_id):
                return q["max_offset"]
    return -1


def test_two_brokers_every_message_once_and_in_queue_order(aio_cluster):
    root, n = aio_cluster.root, 4000

    async def main() -> None:
        async with aio.Admin(root) as a:
            queues = await a.create_topic("orders", queues=4)
        assert len(queues) == 8 and {q.broker for q in queues} == {"broker-a", "broker-b"}
        sent = {SEQ.unpack(r_body)[0]: r for r_body, r in zip((SEQ.pack(i) for i in range(n)),
                                                              await send(root, "orders", range(n)))}
        assert len({r.queue for r in sent.values()}) == 8
        got: dict[MessageQueue, list] = collections.defaultdict(list)
        async with aio.PullConsumer(root, group="order-reader", consume_from=ConsumeFrom.FIRST_OFFSET,
                                    max_poll_records=256) as c:
            c.subscribe("orders")
            k = 0
            async for m in c:
                got[m.queue].append(m)
                k += 1
                if k == n:
                    break
            assert await c.poll(0.3) == [], "more messages than were sent"
        seen: collections.Counter = collections.Counter()
        for q, msgs in got.items():
            assert [m.queue_offset for m in msgs] == list(range(len(msgs))), f"{q} not read in queue order"
            for m in msgs:
                i = SEQ.unpack_from(m.body)[0]
                seen[i] += 1
                assert (m.queue, m.queue_offset, m.msg_id) == (sent[i].queue, sent[i].queue_offset, sent[i].msg_id)
        assert len(seen) == n and set(seen.values()) == {1}
    run(main())


def test_offsets_seek_commit_and_a_restart_resumes(aio_cluster):
    root = aio_cluster.root

    async def main() -> None:
        async with aio.Admin(root) as a:
            queues = await a.create_topic("pos", queues=1, brokers="broker-a")
            mq = queues[0]
            await send(root, "pos", range(10), queue=mq)
            await eventually(lambda: _is(max_offset(a, mq), 10), 10, "the dispatcher to catch up")
            async with aio.PullConsumer(root, group="g1", consume_from=ConsumeFrom.LAST_OFFSET) as pc:
                pc.assign([mq])
                assert await pc.position(mq) == 10       # a new group starting at the end does not replay
                assert await pc.poll(0.05) == []
                waiting = asyncio.ensure_future(pc.__anext__())     # asleep on the dispatcher's word
                [r] = await send(root, "pos", [99], queue=mq)
                fresh = await asyncio.wait_for(waiting, 10)
                assert (fresh.msg_id, fresh.queue_offset) == (r.msg_id, 10)
                await pc.seek(mq, 3)
                assert [m.queue_offset for m in await pc.poll(1.0)] == list(range(3, 11))
                await pc.seek(mq, 5)
                await pc.commit()
                assert await pc.committed(mq) == 5
            async with aio.PullConsumer(root, group="g1") as pc2:     # resumes at the committed offset
                pc2.assign([mq])
                assert await pc2.position(mq) == 5
                assert [m.queue_offset for m in await pc2.poll(1.0)] == list(range(5, 11))
            async with aio.PullConsumer(root, group="g2", consume_from=ConsumeFrom.FIRST_OFFSET) as pc3:
                pc3.assign([mq])
                first = await pc3.poll(1.0)
                await pc3.seek_to_timestamp(first[5].store_timestamp_ms)
                assert await pc3.position(mq) <= 5
    run(main())


async def _is(value_coro, want) -> bool:
    return await value_coro == want


def test_what_an_async_for_did_not_receive_is_never_committed(aio_cluster):
    """Breaking off an ``async for`` mid-batch, or cancelling one that waits: the messages it did
    not receive come again — to the same consumer, and after a commit and restart."""
    root = aio_cluster.root

    async def main() -> None:
        async with aio.Admin(root) as a:
            mq = (await a.create_topic("held", queues=1, brokers="broker-b"))[0]
        async with aio.PullConsumer(root, group="held-g", consume_from=ConsumeFrom.FIRST_OFFSET) as c:
            c.assign([mq])
            waiter = asyncio.ensure_future(c.__anext__())
            await eventually(lambda: _true(c._inflight is not None), 10, "a poll on the worker")
            # nothing to read: the poll sleeps on the brokers' words; cancel the await
            waiter.cancel()
            await asyncio.gather(waiter, return_exceptions=True)
            await send(root, "held", range(10), queue=mq)
            first = []
            async for m in c:                        # the cancelled poll's batch is not lost
                first.append(SEQ.unpack_from(m.body)[0])
                if len(first) == 3:
                    break                            # 7 of the batch not received
            assert first == [0, 1, 2]
            await c.commit()
            assert await c.committed(mq) == 3
        async with aio.PullConsumer(root, group="held-g") as c2:
            c2.assign([mq])
            rest = [SEQ.unpack_from(m.body)[0] for m in await c2.poll(2.0)]
            assert rest == list(range(3, 10))
    run(main())


def test_close_ends_an_async_for_in_another_task(aio_cluster):
    root = aio_cluster.root

    async def main() -> None:
        async with aio.Admin(root) as a:
            await a.create_topic("quiet", queues=2)
        c = aio.PullConsumer(root, group="quiet-g")
        c.subscribe("quiet")
        got: list = []

        async def consume() -> str:
            async for m in c:
                got.append(m)
            return "ended"
        task = asyncio.ensure_future(consume())
        await eventually(lambda: _true(c._inflight is not None), 10, "the iteration to wait for messages")
        assert not task.done()
        await c.close()
        assert await asyncio.wait_for(task, 10) == "ended" and got == []
        with pytest.raises(hostmq.ValidationError, match="closed"):
            await c.poll(0.1)
    run(main())


def test_a_group_shares_every_message_once_and_a_leaver_hands_over(aio_cluster):
    root = aio_cluster.root

    async def main() -> None:
        async with aio.Admin(root) as a:
            queues = await a.create_topic("grp-t", queues=2)              # 4 queues over two brokers
        members = [aio.PullConsumer(root, group="grp", consume_from=ConsumeFrom.FIRST_OFFSET, **FAST)
                   for _ in range(2)]
        counts: collections.Counter = collections.Counter()
        by_member: list[set] = [set(), set()]

        async def consume(i: int) -> None:
            async for m in members[i]:
                counts[SEQ.unpack_from(m.body)[0]] += 1
                by_member[i].add(m.queue)
        for c in members:
            c.subscribe("grp-t")
        tasks = [asyncio.ensure_future(consume(i)) for i in range(2)]
        try:
            async def split() -> bool:
                a1, a2 = [set(await c.assignment()) for c in members]
                return len(a1) == len(a2) == 2 and a1 | a2 == set(queues)
            await eventually(split, 30, "the members to split the queues")
            await send(root, "grp-t", range(1000))
            await eventually(lambda: _true(len(counts) == 1000), 30, "every message")
            assert max(counts.values()) == 1 and all(by_member)
            await members[0].commit()
            await members[1].commit()
            await send(root, "grp-t", range(1000, 1400))
            await members[0].close()                      # commits, leaves: the other takes over
            await eventually(lambda: _true(len(counts) == 1400), 30, "the messages after the handover")
            assert set(await members[1].assignment()) == set(queues)
            assert max(counts.values()) == 1, "a clean handover re-delivers nothing"
        finally:
            for c in members:
                await c.close()
            await asyncio.gather(*tasks)
    run(main())


async def _true(v: bool) -> bool:
    return v


def test_sends_go_to_the_other_broker_while_one_is_stopped(aio_cluster):
    """The producer's retries (the sync producer's guarantee): a broker stops under a producer that
    has sessions with both; every send is still acknowledged, by the other broker, and a group
    reads them all. Last in the module: it stops and restarts broker-b."""
    root = aio_cluster.root

    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with aio.Admin(root) as a:
            queues = await a.create_topic("fail-t", queues=2)         # 4 queues over two brokers
        async with aio.Producer(root) as p:
            before = await send_with(p, "fail-t", range(40))
            assert {r.queue.broker for r in before} == {"broker-a", "broker-b"}
            assert await loop.run_in_executor(None, aio_cluster.stop_process, "broker-b") == 0
            after = [await p.send(Message("fail-t", SEQ.pack(i))) for i in range(40, 100)]
            assert {r.queue.broker for r in after} == {"broker-a"}
            fault = p.sync.fault.items.get("broker-b")          # a send failed there and was retried
            assert fault is not None and fault.latency_ms >= 30_000, fault
        await loop.run_in_executor(None, aio_cluster.start_broker, "broker-b")
        got: collections.Counter = collections.Counter()
        async with aio.PullConsumer(root, group="fail-g", consume_from=ConsumeFrom.FIRST_OFFSET) as c:
            c.assign(queues)
            async for m in c:
                got[SEQ.unpack_from(m.body)[0]] += 1
                if len(got) == 100:
                    break
        assert set(got) == set(range(100)) and max(got.values()) == 1
    try:
        run(main(), 90)
    finally:
        if aio_cluster.processes["broker-b"].poll() is not None:
            aio_cluster.start_broker("broker-b")


async def send_with(p: aio.Producer, topic: str, seqs) -> list[hostmq.SendResult]:
    return list(await asyncio.gather(*[p.send(Message(topic, SEQ.pack(i))) for i in seqs]))
