"""Delivery one hop after the writer (issue 16): a consumer reads a stored message and is woken for it
by the writer's publication, without waiting for the dispatcher — here the dispatcher is stopped."""
from __future__ import annotations

import os
import signal
import threading

import pytest

import hostmq
from hostmq import ConsumeFrom, Message
from hostmq.client import pull_consumer
from hostmq.live.state import BrokerState
from hostmq.root import shm_name
from hostmq.store import read_check
from tests.e2e.conftest import consume_bodies
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(120)


class StoppedDispatcher:
    """SIGSTOP the broker's dispatcher for the block (SIGCONT always)."""

    def __init__(self, root: str, broker: str = "broker-a") -> None:
        self.st = BrokerState.attach(shm_name(root, broker, "state"), readonly=True)
        self.pid = int(self.st.get("dispatcher_pid"))

    def dispatched(self) -> int:
        return int(self.st.get("dispatched_pos"))

    def __enter__(self) -> "StoppedDispatcher":
        os.kill(self.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc) -> None:
        os.kill(self.pid, signal.SIGCONT)
        self.st.close()


@pytest.mark.parametrize("shape", ["poll", "poll_batch"])
def test_a_waiting_consumer_is_woken_by_the_writer_and_reads_what_the_dispatcher_has_not_seen(cluster, shape):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        q0, q1 = a.create_topic("fast", queues=2)
    with hostmq.Producer(c.root) as p, \
            hostmq.PullConsumer(c.root, group="g", consume_from=ConsumeFrom.FIRST_OFFSET) as pc:
        p.send(Message("fast", b"before"), queue=q0)
        pc.subscribe("fast", "*")
        wait_until(lambda: [m.body for m in pc.poll(0.2)] == [b"before"], 10, "the first message")
        with StoppedDispatcher(c.root) as d:
            dispatched = d.dispatched()
            got, stats = [], pc.wait_stats

            def poll():
                if shape == "poll":
                    got.extend(m.body for m in pc.poll(30))
                else:
                    got.extend(bytes(b) for b in pc.poll_batch(30).bodies)
            t = threading.Thread(target=poll)
            t.start()
            wait_until(lambda: stats.blocked and stats.slices, 10, "the consumer to sleep")
            woken_before = stats.wakeups
            r = p.send(Message("fast", b"after"), queue=q1)
            t.join(30)
            assert not t.is_alive()
            assert got == [b"after"] and r.queue_offset == 0
            assert d.dispatched() == dispatched            # the dispatcher never ran meanwhile
            # Its sleep ended because a wake word changed; with the dispatcher stopped, only the
            # writer changes one (no dispatch_seq bump, no flush under ASYNC_FLUSH).
            assert stats.wakeups > woken_before
    # Once dispatched, the same messages come from the consume queues, once each.
    assert sorted(consume_bodies(c.root, "fast", 2, "other", linger_s=0.3)) == [b"after", b"before"]


def test_many_messages_past_the_dispatcher_are_read_exactly_once_in_order(cluster):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        queues = a.create_topic("many", queues=3)
    sent = {q.queue_id: [] for q in queues}
    with hostmq.Producer(c.root) as p, \
            hostmq.PullConsumer(c.root, group="g", consume_from=ConsumeFrom.FIRST_OFFSET,
                                max_poll_records=50) as pc:
        pc.subscribe("many", "*")
        got = {q.queue_id: [] for q in queues}

        def drain(expect: int) -> None:
            def more():
                for m in pc.poll(0.2):
                    got[m.queue_id].append(m.body)
                return sum(map(len, got.values())) >= expect
            wait_until(more, 30, f"{expect} messages")

        with StoppedDispatcher(c.root):
            for i in range(600):
                body = b"m%d" % i
                qid = i % 3
                p.send(Message("many", body), queue=queues[qid])
                sent[qid].append(body)
            drain(300)              # half read from the tail while the dispatcher is stopped
        drain(600)                  # the rest as the dispatcher catches up (tail and queues meet)
        assert got == sent
        assert pc.poll(0.3) == []


@pytest.mark.parametrize("shape", ["poll", "poll_batch"])
def test_a_consumer_ahead_of_the_dispatcher_is_not_rewound_while_its_broker_is_down(cluster, shape):
    """A consumer reads past what the dispatcher has put in the consume queues; the whole broker is
    then killed. While it is down the consumer reads the store directly (its consume queue ends
    where the dead dispatcher stopped, short of the consumer's position), and after the restart
    from the recovered queues: neither view may send it back to the start of the queue (a
    position past a view's end is only ahead of that view — RocketMQ's lagging slave)."""
    c = cluster()
    with hostmq.Admin(c.root) as a:
        q, = a.create_topic("ahead", queues=1)
    got = []

    def read(timeout_s: float) -> list[bytes]:
        if shape == "poll":
            return [m.body for m in pc.poll(timeout_s)]
        return [bytes(b) for b in pc.poll_batch(timeout_s).bodies]

    def drain(expect: list[bytes]) -> None:
        got.clear()
        wait_until(lambda: got.extend(read(0.2)) or len(got) >= len(expect), 30, f"{len(expect)} messages")
        assert got == expect

    with hostmq.Producer(c.root) as p, \
            hostmq.PullConsumer(c.root, group="g", consume_from=ConsumeFrom.FIRST_OFFSET) as pc:
        pc.subscribe("ahead", "*")
        first = [b"a%d" % i for i in range(20)]
        for body in first:
            p.send(Message("ahead", body), queue=q)
        drain(first)
        d = StoppedDispatcher(c.root)
        try:
            wait_until(lambda: d.dispatched() == d.st.stored_pos(), 10, "the first 20 in the consume queue")
            os.kill(d.pid, signal.SIGSTOP)
            dispatched = d.dispatched()
            second = [b"b%d" % i for i in range(10)]
            for body in second:
                p.send(Message("ahead", body), queue=q)
            drain(second)                           # from the tail: the consume queue holds 20
            assert d.dispatched() == dispatched
        finally:
            c.signal_group("broker-a", signal.SIGKILL)
            c.processes["broker-a"].wait(30)
            d.st.close()
        got.clear()
        # Down: the consumer reopens a view of the stopped store, whose consume queue ends at 20
        # (before, that view answered OFFSET_OVERFLOW_BADLY and sent the consumer back to offset 0).
        wait_until(lambda: got.extend(read(0.1)) or not pc.views["broker-a"].live, 30, "a view of the stopped store")
        for _ in range(5):
            got.extend(read(0.1))
        assert got == []
        c.start_broker("broker-a")
        third = [b"c%d" % i for i in range(5)]
        with hostmq.Producer(c.root) as p2:         # the first one's session died with the broker
            for body in third:
                p2.send(Message("ahead", body), queue=q)
        drain(third)
        assert read(0.3) == []


def counted_tail_rounds(monkeypatch) -> list[int]:
    """The queue ids a tailing consumer's rounds read (not skipped) from now on, on either path: the
    native ``tail_poll`` (``_read.c``) and its spec ``pull_consumer.tail_round``."""
    reads: list[int] = []

    def counting(fn):
        def call(*a):
            t = fn(*a)
            if t is not False and t is not None:
                reads.append(a[9])              # queue_id
            return t
        return call
    monkeypatch.setattr(pull_consumer, "tail_round", counting(pull_consumer.tail_round))
    native = read_check.NATIVE
    if native is not None and hasattr(native, "tail_poll"):
        class Counted:                          # the module, its tail_poll counted
            tail_poll = staticmethod(counting(native.tail_poll))

            def __getattr__(self, name):
                return getattr(native, name)
        monkeypatch.setattr(read_check, "NATIVE", Counted())
    return reads


def test_a_consumer_of_many_queues_reads_only_the_queue_whose_wake_word_moved(cluster, monkeypatch):
    """A tailing consumer skips a queue whose wake word and readable position are unchanged since
    it last read it (``BrokerView.quiet_words``): with the dispatcher stopped (the readable position
    frozen) each message, sent to one of eight queues while the consumer is caught up on all, still
    arrives — the writer's wake word of its queue moved — and the poll that returns it reads that
    queue's tail alone, not the seven others whose words did not move."""
    c = cluster()
    with hostmq.Admin(c.root) as a:
        queues = a.create_topic("eight", queues=8)
    with hostmq.Producer(c.root) as p, \
            hostmq.PullConsumer(c.root, group="g", consume_from=ConsumeFrom.FIRST_OFFSET) as pc:
        pc.assign(queues)
        for q in queues:
            p.send(Message("eight", b"first-%d" % q.queue_id), queue=q)
        got: list[bytes] = []
        wait_until(lambda: got.extend(m.body for m in pc.poll(0.2)) or len(got) >= 8, 30, "the first eight")
        reads = counted_tail_rounds(monkeypatch)
        with StoppedDispatcher(c.root) as d:
            wait_until(lambda: not pc.poll(0.05), 10, "a poll with nothing new")   # every queue read since
            dispatched = d.dispatched()
            for i, q in enumerate(queues * 2):
                body = b"m%d" % i
                p.send(Message("eight", body), queue=q)
                reads.clear()
                out: list = []
                wait_until(lambda: out.extend(pc.poll(0.2)) or out, 10, f"message {i} on queue {q.queue_id}")
                assert [(m.queue_id, m.body) for m in out] == [(q.queue_id, body)]
                assert reads == [q.queue_id]
            assert d.dispatched() == dispatched            # nothing came through the consume queues


@pytest.mark.skipif(read_check.NATIVE is None, reason="the native read side is not built")
def test_a_consumer_of_one_queue_reads_as_it_wakes_in_one_native_call(cluster, monkeypatch):
    """The woken round (``PullConsumer._woken_round``, ``_read.woken_poll``): a consumer that slept
    reads the queue whose wake word moved, with the broker's ends, in one native call as it wakes —
    every message sent while it slept came that way, in order: of one queue, then of two (the other
    queue's round reads nothing); with a filter it runs the general round (nothing prepared)."""
    rounds = []
    real = read_check.NATIVE.woken_poll

    def woken_poll(f, pos, seen, max_count, out):
        t = real(f, pos, seen, max_count, out)
        rounds.append((pos, t[2] if t else None))
        return t
    monkeypatch.setattr(read_check.NATIVE, "woken_poll", woken_poll)
    c = cluster()
    with hostmq.Admin(c.root) as a:
        q0, q1 = a.create_topic("one", queues=2)
    with hostmq.Producer(c.root) as p, \
            hostmq.PullConsumer(c.root, group="g", consume_from=ConsumeFrom.FIRST_OFFSET) as pc:
        pc.assign([q0])
        p.send(Message("one", b"before"), queue=q0)
        wait_until(lambda: [m.body for m in pc.poll(0.2)] == [b"before"], 10, "the first message")
        stats = pc.wait_stats
        for i in range(5):
            got: list[bytes] = []
            blocked = stats.blocked
            t = threading.Thread(target=lambda: got.extend(m.body for m in pc.poll(30)))
            t.start()
            wait_until(lambda: stats.blocked > blocked, 10, "the consumer to sleep")
            p.send(Message("one", b"m%d" % i), queue=q0)
            t.join(30)
            assert not t.is_alive() and got == [b"m%d" % i]
            assert (i + 1, i + 2) in rounds         # read by the woken round: from offset i + 1 to i + 2
        assert pc._woken is not None and [mq for mq, _ in pc._woken] == [q0]

        def sleep_then_send(q, body):
            got: list[bytes] = []
            blocked = stats.blocked
            t = threading.Thread(target=lambda: got.extend(m.body for m in pc.poll(30)))
            t.start()
            wait_until(lambda: stats.blocked > blocked, 10, "the consumer to sleep")
            p.send(Message("one", body), queue=q)
            t.join(30)
            assert not t.is_alive()
            return got
        pc.assign([q0, q1])
        assert pc.poll(0.05) == []                  # (slept once: the round is prepared before each sleep)
        assert pc._woken is not None and sorted(mq for mq, _ in pc._woken) == [q0, q1]
        rounds.clear()
        assert sleep_then_send(q1, b"q1-0") == [b"q1-0"]
        assert (0, 1) in rounds                     # q1 read from 0 to 1 by its woken round
        assert sleep_then_send(q0, b"q0-6") == [b"q0-6"]
        assert (6, 7) in rounds
        pc.assign([q0], "tagA")
        assert pc.poll(0.05) == []
        assert pc._woken is None
