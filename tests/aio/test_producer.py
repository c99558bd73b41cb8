"""hostmq.aio.Producer and Admin against a real cluster: the sync producer's send modes and results
(tests/e2e/test_send_consume.py), many concurrent sends, cancelled sends, bad input."""
from __future__ import annotations

import asyncio
import collections
import gc
import os

import pytest

import hostmq
from hostmq import ConsumeFrom, Message, MessageQueue, SendStatus
from hostmq import aio
from tests.aio.conftest import client_threads, eventually, run
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(120)


async def read_all(root: str, queues: list[MessageQueue], expect: int, group: str,
                   timeout_s: float = 30.0) -> dict[MessageQueue, list[hostmq.MessageExt]]:
    """Every message of ``queues`` from the first offset, by queue, through the asyncio consumer;
    fails if more than ``expect`` arrive."""
    got: dict[MessageQueue, list] = collections.defaultdict(list)
    async with aio.PullConsumer(root, group=group, consume_from=ConsumeFrom.FIRST_OFFSET, auto_commit=False,
                                max_poll_records=512) as c:
        c.assign(queues)
        async with asyncio.timeout(timeout_s):
            n = 0
            async for m in c:
                got[m.queue].append(m)
                n += 1
                if n == expect:
                    break
        assert await c.poll(0.3) == [], "more messages than were sent"
    return got


async def read_until_end(root: str, queues: list[MessageQueue], group: str) -> dict:
    """Every message of ``queues`` up to an ``end`` message in each, by queue."""
    got: dict[MessageQueue, list] = collections.defaultdict(list)
    async with aio.PullConsumer(root, group=group, consume_from=ConsumeFrom.FIRST_OFFSET, auto_commit=False) as c:
        c.assign(queues)
        ended = set()
        async with asyncio.timeout(30):
            async for m in c:
                if m.body == b"end":
                    ended.add(m.queue)
                    if ended == set(queues):
                        break
                else:
                    got[m.queue].append(m)
    return got


def test_every_send_mode_and_admin(aio_cluster):
    root = aio_cluster.root

    async def main() -> None:
        async with aio.Producer(root, group="pg") as p, aio.Admin(root) as a:
            r1 = await p.send(Message("modes", b"sync", tags="a", keys=["x"], properties={"region": "eu"}))
            assert r1.status == SendStatus.SEND_OK and r1.queue.topic == "modes"      # auto-created topic
            queues = await a.publish_route("modes")
            assert len(queues) == 4
            rb = await p.send_batch([Message("modes", b"b%d" % i) for i in range(5)], queue=queues[2])
            assert rb.queue == queues[2] and len(rb.msg_id.split(",")) == 5
            rq = await p.send(Message("modes", b"explicit"), queue=queues[3])
            assert rq.queue == queues[3]
            rs = await p.send(Message("modes", b"selected"), selector=lambda qs, m, arg: qs[arg], arg=1)
            assert rs.queue == queues[1]
            keyed = {(await p.send(Message("modes", b"k%d" % i), sharding_key="order-42")).queue for i in range(6)}
            assert len(keyed) == 1
            big = bytes(range(256)) * 64                      # 16 KiB, compressible: stored compressed
            rbig = await p.send(Message("modes", big))
            got = await read_all(root, queues, 1 + 5 + 1 + 1 + 6 + 1, "modes-reader")
            bodies = {bytes(m.body): m for ms in got.values() for m in ms}
            assert {b"sync", b"explicit", b"selected", big} | {b"b%d" % i for i in range(5)} <= set(bodies)
            m1 = bodies[b"sync"]
            assert m1.tags == "a" and m1.keys == ("x",) and m1.properties["region"] == "eu"
            assert m1.msg_id == r1.msg_id and m1.queue_offset == r1.queue_offset
            assert bodies[big].sys_flag & 1 and len(bodies[big].raw) < len(big)
            batch = [m for m in got[queues[2]] if m.body.startswith(b"b")]
            assert [m.msg_id for m in batch] == rb.msg_id.split(",")
            assert [m.queue_offset for m in batch] == list(range(rb.queue_offset, rb.queue_offset + 5))
            assert (await a.view_message(rbig.msg_id)).body == big
            loop = asyncio.get_running_loop()
            # the key index is built by the dispatcher, after the send returned
            found = await loop.run_in_executor(None, wait_until, lambda: a.sync.query_by_key("modes", "x"), 10,
                                               "the key in the index")
            assert [m.msg_id for m in found] == [r1.msg_id]
            assert [m.msg_id for m in await a.query_by_key("modes", "x")] == [r1.msg_id]
    run(main())


def test_admin_topics_brokers_progress_and_delete(aio_cluster):
    root = aio_cluster.root

    async def main() -> None:
        async with aio.Admin(root) as a:
            queues = await a.create_topic("adm", queues=3)
            assert [q.queue_id for q in queues] == [0, 1, 2] and await a.route("adm") == queues
            assert "adm" in await a.topics()
            rows = await a.brokers()
            assert [(r["name"], r["id"], r["alive"]) for r in rows] == [("broker-a", 0, True)]
            async with aio.Producer(root) as p:
                for i in range(6):
                    await p.send(Message("adm", b"x%d" % i), queue=queues[i % 3])
            async with aio.PullConsumer(root, group="adm-g", consume_from=ConsumeFrom.FIRST_OFFSET) as c:
                c.subscribe("adm")
                n = 0
                async for _ in c:
                    n += 1
                    if n == 6:
                        break
                await c.commit()

            async def progress() -> dict:
                rows = await a.consumer_progress("adm-g")
                return {r["queue"]: (r["broker_offset"], r["consumer_offset"], r["lag"]) for r in rows
                        if r["queue"].topic == "adm"}
            # the broker's figures follow its dispatcher
            await eventually(lambda: _equal(progress, {q: (2, 2, 0) for q in queues}), 10, "the group's progress")
            reset = await a.reset_offset("adm-g", "adm", 0)
            assert reset == {q: 0 for q in queues}
            assert await a.delete_topic("adm") is True
            assert "adm" not in await a.topics()
    run(main())


async def _equal(get, want) -> bool:
    return await get() == want


def test_thousands_of_concurrent_sends_each_get_their_own_result(aio_cluster):
    root = aio_cluster.root
    n = 3000

    async def main() -> None:
        async with aio.Admin(root) as a:
            queues = await a.create_topic("many", queues=4)
        async with aio.Producer(root) as p:
            first = await p.send(Message("many", b"first"))
            threads = sorted(client_threads())      # the worker, the session's completion reader, remoting
            results = await asyncio.gather(*[p.send(Message("many", b"%d" % i)) for i in range(n)])
            assert sorted(client_threads()) == threads, "a thread per send"
        assert {r.status for r in results} == {SendStatus.SEND_OK}
        assert len({r.msg_id for r in results}) == n
        assert len({(r.queue, r.queue_offset) for r in results}) == n
        got = await read_all(root, queues, n + 1, "many-reader")
        assert first.msg_id in {m.msg_id for ms in got.values() for m in ms}
        by_id = {m.msg_id: m for ms in got.values() for m in ms}
        for i, r in enumerate(results):
            m = by_id[r.msg_id]
            assert m.body == b"%d" % i and (m.queue, m.queue_offset) == (r.queue, r.queue_offset)
    run(main())


def test_a_full_ring_holds_sends_back_and_loses_none(aio_cluster):
    """A small ring fills under many concurrent sends: the sends that find it full wait for room on
    the producer's worker (back-pressure), none is lost or stored twice."""
    root, n = aio_cluster.root, 1500

    async def main() -> None:
        async with aio.Admin(root) as a:
            queues = await a.create_topic("full", queues=2)
        async with aio.Producer(root, ring_bytes=1 << 16, completion_entries=16) as p:
            results = await asyncio.gather(*[p.send(Message("full", b"%06d" % i + b"." * 1000)) for i in range(n)])
            assert p._handed > 0, "the ring never filled: the test proves nothing"
        assert {r.status for r in results} == {SendStatus.SEND_OK}
        got = await read_all(root, queues, n, "full-reader")
        bodies = collections.Counter(bytes(m.body[:6]) for ms in got.values() for m in ms)
        assert set(bodies) == {b"%06d" % i for i in range(n)} and max(bodies.values()) == 1
    run(main())


def test_cancelled_sends_leave_the_session_usable(aio_cluster):
    """Sends cancelled while in flight: their frames complete on the broker's side as usual (the
    session's pending table empties), later sends are unaffected, nothing is stored twice."""
    root = aio_cluster.root

    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with aio.Admin(root) as a:
            queues = await a.create_topic("cancel", queues=2)
        async with aio.Producer(root) as p:
            await p.send(Message("cancel", b"warm-up"))    # the route is cached, the session open
            session = p.sync.cached_session("broker-a")
            published = session._seq
            tasks = [asyncio.ensure_future(p.send(Message("cancel", b"c%d" % i))) for i in range(400)]
            await asyncio.sleep(0)                  # every send has published its frame and waits
            assert session._seq - published == 400, "the sends did not publish on the loop"
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            assert all(t.cancelled() for t in tasks)
            after = await asyncio.gather(*[p.send(Message("cancel", b"a%d" % i)) for i in range(200)])
            assert {r.status for r in after} == {SendStatus.SEND_OK}
            await loop.run_in_executor(None, wait_until, lambda: not session.pending and not session.async_pending,
                                       10, "the cancelled sends' completions")
            assert session.broken is None
            # how many cancelled sends were stored is unknown: a last message per queue ends the reading
            for q in queues:
                await p.send(Message("cancel", b"end"), queue=q)
        got = await read_until_end(root, queues, "cancel-reader")
        bodies = collections.Counter(bytes(m.body) for ms in got.values() for m in ms)
        assert max(bodies.values()) == 1, "a message stored twice"
        assert {b"warm-up"} | {b"a%d" % i for i in range(200)} <= set(bodies)
        assert set(bodies) <= {b"warm-up"} | {b"a%d" % i for i in range(200)} | {b"c%d" % i for i in range(400)}
    run(main())


def test_bad_input_gets_a_typed_error_and_nothing_is_sent(aio_cluster):
    root = aio_cluster.root

    async def main() -> None:
        async with aio.Producer(root) as p:
            with pytest.raises(hostmq.ValidationError):
                await p.send(Message("bad", b""))
            with pytest.raises(hostmq.ValidationError):
                await p.send("not a message")                       # type: ignore[arg-type]
            with pytest.raises(hostmq.ValidationError, match="system topic"):
                await p.send(Message("SCHEDULE_TOPIC_XXXX", b"x"))
            with pytest.raises(hostmq.ValidationError, match="one topic"):
                await p.send_batch([Message("bad", b"1"), Message("other", b"2")])
            with pytest.raises(hostmq.ValidationError, match="delay"):
                await p.send_batch([Message("bad", b"1", delay_level=2)])
            with pytest.raises(hostmq.ValidationError):
                await p.send_batch([])
        with pytest.raises(hostmq.ValidationError, match="closed"):
            await p.send(Message("bad", b"after close"))
        async with aio.Admin(root) as a:
            assert "bad" not in await a.topics()
            with pytest.raises(hostmq.ValidationError):
                await a.create_topic("bad topic!")
    run(main())


def test_closed_clients_leave_no_descriptor_behind(aio_cluster):
    """Every client opened and closed: the process holds the same descriptors as before (sockets,
    ring memfds, store maps' files) — and, checked after every test, no client thread."""
    root = aio_cluster.root

    async def cycle() -> None:
        got = asyncio.Event()

        async def listener(msgs: list) -> hostmq.ConsumeResult:
            got.set()
            return hostmq.ConsumeResult.SUCCESS
        async with aio.Admin(root) as a:
            await a.create_topic("life", queues=2)
        async with aio.Producer(root) as p:
            await p.send(Message("life", b"x"))
        async with aio.PullConsumer(root, group="life-pull", consume_from=ConsumeFrom.FIRST_OFFSET) as c:
            c.subscribe("life")
            assert await c.poll(5.0)
        push = aio.PushConsumer(root, group="life-push", consume_from=ConsumeFrom.FIRST_OFFSET)
        push.subscribe("life")
        push.register(listener)
        async with push:
            await asyncio.wait_for(got.wait(), 20)

    def fds() -> collections.Counter:
        gc.collect()            # what earlier tests' objects held until collected is not ours
        out: collections.Counter = collections.Counter()
        for fd in os.listdir("/proc/self/fd"):
            try:
                out[os.readlink(f"/proc/self/fd/{fd}")] += 1
            except OSError:     # the listing's own descriptor
                pass
        return out
    run(cycle())                # the first opens what a process keeps (pyzmq's context, imports)
    before = fds()
    run(cycle())
    after = fds()
    assert (after - before, before - after) == (collections.Counter(), collections.Counter())
