"""hostmq.aio.PushConsumer with ``async def`` listeners against a real broker: the sync push
consumer's guarantees (tests/e2e/test_push.py, test_retry.py) — a group's members get every message
once, RECONSUME_LATER and exceptions go through %RETRY%<group> and come back, a message that keeps
failing ends in %DLQ%<group>, close commits and a restart resumes without replays."""
from __future__ import annotations

import asyncio
import collections
import struct

import pytest

import hostmq
from hostmq import ConsumeFrom, ConsumeResult, Message, MessageExt
from hostmq import aio
from hostmq import records as R
from hostmq.client.consume_service import ConsumeConcurrentlyContext
from tests.aio.conftest import eventually, run

pytestmark = pytest.mark.timeout(120)
CONFIG = {"broker": {"message_delay_level": "1s 1s 1s 1s 1s"}}      # retries come back after 1 s
SEQ = struct.Struct(">q")
FAST = {"rebalance_interval_s": 1.0, "heartbeat_interval_s": 1.0, "auto_commit_interval_s": 0.2}


class Sink:
    """An async listener that counts every sequence number it is given."""

    def __init__(self) -> None:
        self.counts: collections.Counter = collections.Counter()

    async def __call__(self, msgs: list[MessageExt]) -> ConsumeResult:
        await asyncio.sleep(0)                  # a real coroutine: other listeners run meanwhile
        for m in msgs:
            self.counts[SEQ.unpack_from(m.body)[0]] += 1
        return ConsumeResult.SUCCESS


def push(root: str, listener, topic: str, group: str, **kw) -> aio.PushConsumer:
    kw.setdefault("consume_from", ConsumeFrom.FIRST_OFFSET)
    c = aio.PushConsumer(root, group=group, **{**FAST, **kw})
    c.subscribe(topic)
    c.register(listener)
    return c


async def send(root: str, topic: str, seqs) -> None:
    async with aio.Producer(root) as p:
        await asyncio.gather(*[p.send(Message(topic, SEQ.pack(i))) for i in seqs])


async def _true(v: bool) -> bool:
    return v


async def dlq_queues(admin, group: str):
    """The queues of ``group``'s DLQ topic, once the broker created it (30 s at most)."""
    async def route():
        try:
            return await admin.route(f"%DLQ%{group}")
        except hostmq.NoRouteError:
            return None
    return await eventually(route, 30, f"the DLQ topic of {group}")


def test_two_members_receive_every_message_once(aio_cluster):
    root = aio_cluster.root

    async def main() -> None:
        async with aio.Admin(root) as a:
            queues = await a.create_topic("push-t", queues=4)
        sinks = [Sink(), Sink()]
        members = [push(root, s, "push-t", "push-g", batch_size=4) for s in sinks]
        async with members[0], members[1]:
            def split() -> bool:
                got = [{q for q in c.assignment() if q.topic == "push-t"} for c in members]
                return len(got[0]) == len(got[1]) == 2 and got[0] | got[1] == set(queues)
            await eventually(lambda: _true(split()), 30, "the members to split the queues")
            await send(root, "push-t", range(2000))
            await eventually(lambda: _true(len(sinks[0].counts) + len(sinks[1].counts) >= 2000), 30,
                             "every message")
            total = sinks[0].counts + sinks[1].counts
            assert set(total) == set(range(2000)) and max(total.values()) == 1
            assert sinks[0].counts and sinks[1].counts
    run(main())


def test_reconsume_later_and_exceptions_go_through_the_retry_topic(aio_cluster):
    root = aio_cluster.root
    calls: dict[bytes, list[tuple[int, str]]] = collections.defaultdict(list)

    async def listener(msgs: list[MessageExt]) -> ConsumeResult:
        m = msgs[0]
        calls[m.body].append((m.reconsume_times, m.topic))
        if len(calls[m.body]) == 1 and m.body == b"later":
            return ConsumeResult.RECONSUME_LATER
        if len(calls[m.body]) == 1 and m.body == b"boom":
            raise RuntimeError("not yet")           # an exception counts as RECONSUME_LATER
        if len(calls[m.body]) == 1 and m.body == b"odd":
            return "yes"                            # not a ConsumeResult: RECONSUME_LATER too
        return ConsumeResult.SUCCESS

    async def main() -> None:
        async with aio.Admin(root) as a:
            await a.create_topic("rt", queues=2)
        async with push(root, listener, "rt", "rt-g"):
            async with aio.Producer(root) as p:
                for body in (b"later", b"boom", b"odd", b"fine"):
                    await p.send(Message("rt", body))
            await eventually(lambda: _true(all(len(calls[b]) == 2 for b in (b"later", b"boom", b"odd"))), 30,
                             "the second deliveries")
        for b in (b"later", b"boom", b"odd"):
            assert calls[b] == [(0, "rt"), (1, "rt")]      # back once, shown under the original topic
        assert calls[b"fine"] == [(0, "rt")]
        async with aio.Admin(root) as a:
            lag = {r["queue"].topic: r["lag"] for r in await a.consumer_progress("rt-g")}
        assert "%RETRY%rt-g" in lag
    run(main())


def test_a_message_that_always_fails_goes_to_the_dlq(aio_cluster):
    root = aio_cluster.root
    seen: list[int] = []

    async def never(msgs: list[MessageExt]) -> ConsumeResult:
        seen.append(msgs[0].reconsume_times)
        return ConsumeResult.RECONSUME_LATER

    async def main() -> None:
        async with aio.Admin(root) as a:
            await a.create_topic("poison-t", queues=1)
            async with push(root, never, "poison-t", "dead-g", max_reconsume_times=1):
                async with aio.Producer(root) as p:
                    original = await p.send(Message("poison-t", b"poison", keys=["order-7"]))
                queues = await dlq_queues(a, "dead-g")
            async with aio.PullConsumer(root, group="dlq-reader", consume_from=ConsumeFrom.FIRST_OFFSET) as pc:
                pc.assign(queues)
                dead = await asyncio.wait_for(pc.__anext__(), 30)
        assert dead.body == b"poison" and dead.keys == ("order-7",)
        assert dead.properties[R.PROP_ORIGIN_MSG_ID] == original.msg_id
        assert seen == [0, 1]                       # the first delivery and one retry
    run(main())


def test_a_context_listener_sees_its_queue_and_its_delay_level_sends_to_the_dlq(aio_cluster):
    root = aio_cluster.root
    seen: list[tuple[int, hostmq.MessageQueue]] = []

    async def listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeResult:
        seen.append((msgs[0].reconsume_times, ctx.message_queue))
        ctx.delay_level_when_next_consume = -1          # no retries: to the DLQ at once
        return ConsumeResult.RECONSUME_LATER

    async def main() -> None:
        async with aio.Admin(root) as a:
            await a.create_topic("ctx-t", queues=1)
            async with push(root, listener, "ctx-t", "ctx-g", max_reconsume_times=5):
                async with aio.Producer(root) as p:
                    sent = await p.send(Message("ctx-t", b"poison"))
                queues = await dlq_queues(a, "ctx-g")
            async with aio.PullConsumer(root, group="dlq-reader", consume_from=ConsumeFrom.FIRST_OFFSET) as pc:
                pc.assign(queues)
                dead = await asyncio.wait_for(pc.__anext__(), 30)
        assert dead.body == b"poison"
        assert seen == [(0, sent.queue)]            # once, with its queue; no retry before the DLQ
    run(main())


def test_close_commits_and_a_restart_resumes_without_replay(aio_cluster):
    root = aio_cluster.root

    async def main() -> None:
        async with aio.Admin(root) as a:
            await a.create_topic("resume-t", queues=2)
        first, again = Sink(), Sink()
        async with push(root, first, "resume-t", "resume-g"):
            await send(root, "resume-t", range(300))
            await eventually(lambda: _true(len(first.counts) == 300), 30, "the first messages")
        await send(root, "resume-t", range(300, 400))        # while no member runs
        async with push(root, again, "resume-t", "resume-g"):
            await eventually(lambda: _true(len(again.counts) == 100), 30, "the messages sent meanwhile")
            async with aio.Admin(root) as a:
                await eventually(lambda: _no_lag(a, "resume-g", "resume-t"), 15, "the commits")
        assert set(again.counts) == set(range(300, 400)) and max(again.counts.values()) == 1
        assert max(first.counts.values()) == 1
    run(main())


async def _no_lag(a: aio.Admin, group: str, topic: str) -> bool:
    rows = [r for r in await a.consumer_progress(group) if r["queue"].topic == topic]
    return bool(rows) and all(r["lag"] == 0 for r in rows)


def test_a_listener_may_close_its_own_consumer(aio_cluster):
    root = aio_cluster.root

    async def main() -> None:
        async with aio.Admin(root) as a:
            await a.create_topic("stop-t", queues=1)
        closed = asyncio.Event()

        async def stop_on_first(msgs: list[MessageExt]) -> ConsumeResult:
            await consumer.close()          # its own batch is not committed: delivered again later
            closed.set()
            return ConsumeResult.SUCCESS
        consumer = push(root, stop_on_first, "stop-t", "stop-g")
        await consumer.start()
        await send(root, "stop-t", [1])
        await asyncio.wait_for(closed.wait(), 30)
        assert consumer.closed and consumer.sync._thread is None
    run(main())


def test_an_orderly_listener_keeps_queue_order_retries_in_place_then_dead_letters(aio_cluster):
    """The sync orderly tests (tests/e2e/test_orderly.py) with an ``async def`` listener that yields
    to the loop mid-batch: per key the order holds, a failing message is retried in place (its
    queue suspended), one that keeps failing goes to the DLQ and its queue goes on."""
    root = aio_cluster.root
    keys, per_key = [f"key-{k}" for k in range(4)], 50
    calls: dict[str, list[int]] = collections.defaultdict(list)
    flaky_fails = [2]

    async def listener(msgs: list[MessageExt]) -> ConsumeResult:
        for m in msgs:
            key, seq = m.body.decode().split(":")
            calls[key].append(int(seq))
            await asyncio.sleep(0)          # other queues' tasks run meanwhile
            if (key, seq) == ("key-0", "20"):
                return ConsumeResult.RECONSUME_LATER                  # always: to the DLQ
            if (key, seq) == ("key-1", "10") and flaky_fails[0]:
                flaky_fails[0] -= 1
                return ConsumeResult.RECONSUME_LATER                  # twice, then fine
        return ConsumeResult.SUCCESS

    async def main() -> None:
        async with aio.Admin(root) as a:
            await a.create_topic("ord-t", queues=2)
        x = aio.PushConsumer(root, group="ord-g", consume_from=ConsumeFrom.FIRST_OFFSET, max_reconsume_times=2,
                             retry_delay_s=0.1, **FAST)
        x.subscribe("ord-t")
        x.register(listener, orderly=True)
        async with x:
            async with aio.Producer(root) as p:
                for seq in range(per_key):
                    for key in keys:
                        await p.send(Message("ord-t", f"{key}:{seq}".encode()), sharding_key=key)
            await eventually(lambda: _true(all(len(set(calls[k])) == per_key for k in keys)), 30, "every message")
        for key in keys:
            collapsed = [s for i, s in enumerate(calls[key]) if i == 0 or calls[key][i - 1] != s]
            assert collapsed == list(range(per_key)), f"{key} out of order"
        assert calls["key-1"].count(10) == 3 and calls["key-0"].count(20) == 3     # 1 + 2 retries each
        assert all(calls[k].count(s) == 1 for k in ("key-2", "key-3") for s in range(per_key))
        async with aio.Admin(root) as a:
            queues = await dlq_queues(a, "ord-g")
        async with aio.PullConsumer(root, group="ord-dlq", consume_from=ConsumeFrom.FIRST_OFFSET) as pc:
            pc.assign(queues)
            dead = await asyncio.wait_for(pc.__anext__(), 30)
        assert dead.body == b"key-0:20"
    run(main())


def test_bad_options_get_typed_errors(aio_cluster):
    with pytest.raises(hostmq.ValidationError, match="CLUSTERING"):
        aio.PushConsumer(aio_cluster.root, group="o", model=hostmq.MessageModel.BROADCASTING).register(
            Sink(), orderly=True)
    with pytest.raises(hostmq.ValidationError, match="concurrency"):
        aio.PushConsumer(aio_cluster.root, group="o", concurrency=0)

    async def main() -> None:
        c = aio.PushConsumer(aio_cluster.root, group="o")
        with pytest.raises(hostmq.ValidationError, match="subscribe"):
            await c.start()
        await c.close()
    run(main())
