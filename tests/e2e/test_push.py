"""Push consumers with real broker processes: sharing, a killed member, a joining member,
broadcasting, where a new group starts, flow control and retry."""
from __future__ import annotations

import collections
import struct
import subprocess
import sys
import threading
import time

import pytest

import hostmq
from hostmq import ConsumeFrom, ConsumeResult, Message, MessageModel
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(300)
SEQ = struct.Struct(">q")
FAST = {"rebalance_interval_s": 1.0, "heartbeat_interval_s": 1.0, "auto_commit_interval_s": 0.2}


class Sink:
    """A listener that counts every sequence number it is given (thread-safe)."""

    def __init__(self) -> None:
        self.counts: collections.Counter = collections.Counter()
        self.lock = threading.Lock()

    def __call__(self, msgs) -> ConsumeResult:
        with self.lock:
            for m in msgs:
                self.counts[SEQ.unpack_from(m.body)[0]] += 1
        return ConsumeResult.SUCCESS

    def total(self) -> int:
        with self.lock:
            return len(self.counts)


def push(root: str, sink, topic: str, group: str = "push-g", **kw) -> hostmq.PushConsumer:
    kw.setdefault("consume_from", ConsumeFrom.FIRST_OFFSET)
    c = hostmq.PushConsumer(root, group=group, **{**FAST, **kw})
    c.subscribe(topic)
    c.register(sink)
    return c.start()


def send_batches(root: str, topic: str, seqs: range, batch: int = 100) -> None:
    with hostmq.Producer(root) as p:
        queues = p.instance.publish_queues(topic)
        for k, i in enumerate(range(seqs.start, seqs.stop, batch)):
            p.send_batch([Message(topic, SEQ.pack(j)) for j in range(i, min(i + batch, seqs.stop))],
                         queue=queues[k % len(queues)])


def mine(c, topic: str) -> list:
    return [q for q in c.assignment() if q.topic == topic]


def stable_split(consumers, queues, sizes) -> bool:
    got = [{q for q in c.assignment() if q.topic == queues[0].topic} for c in consumers]    # not %RETRY%
    return sorted(len(g) for g in got) == sorted(sizes) and set().union(*got) == set(queues) and \
        sum(len(g) for g in got) == len(queues)


def test_three_members_over_two_brokers_receive_100k_messages_once(cluster):
    c = cluster(brokers=2)
    with hostmq.Admin(c.root) as a:
        queues = a.create_topic("push-t", queues=6)                  # 12 queues
    sinks = [Sink() for _ in range(3)]
    consumers = [push(c.root, s, "push-t") for s in sinks]
    try:
        wait_until(lambda: stable_split(consumers, queues, [4, 4, 4]), 30, "an even split")
        send_batches(c.root, "push-t", range(100_000))
        wait_until(lambda: sum(s.total() for s in sinks) >= 100_000, 120, "100 000 messages", step_s=0.1)
        total: collections.Counter = collections.Counter()
        for s in sinks:
            total.update(s.counts)
        assert set(total) == set(range(100_000)) and max(total.values()) == 1
        assert all(s.total() > 0 for s in sinks)
    finally:
        for x in consumers:
            x.shutdown()


MEMBER = r"""
import struct, sys, threading
import hostmq
from hostmq import ConsumeFrom, ConsumeResult
SEQ = struct.Struct(">q")
out = threading.Lock()
def listener(msgs):
    line = " ".join(str(SEQ.unpack_from(m.body)[0]) for m in msgs) + "\n"
    with out:                      # listener threads run at once: one whole line at a time
        sys.stdout.write(line)
        sys.stdout.flush()
    return ConsumeResult.SUCCESS
c = hostmq.PushConsumer(sys.argv[1], group="push-kill", consume_from=ConsumeFrom.FIRST_OFFSET,
                        rebalance_interval_s=1.0, heartbeat_interval_s=1.0, auto_commit_interval_s=0.2)
c.subscribe("kill-push")
c.register(listener)
c.start()
print("started", flush=True)
sys.stdin.read()
"""


def test_a_killed_member_is_replaced_and_only_uncommitted_messages_come_twice(cluster):
    c = cluster(brokers=2)
    with hostmq.Admin(c.root) as a:
        queues = a.create_topic("kill-push", queues=2)
    child = subprocess.Popen([sys.executable, "-c", MEMBER, c.root], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    child_seen: collections.Counter = collections.Counter()
    reader = threading.Thread(target=lambda: [child_seen.update(int(x) for x in line.split() if x.isdigit())
                                              for line in iter(child.stdout.readline, "")], daemon=True)
    reader.start()
    sink = Sink()
    me = push(c.root, sink, "kill-push", group="push-kill")
    try:
        wait_until(lambda: len(mine(me, "kill-push")) == 2, 30, "the child to take half of the queues")
        sender = threading.Thread(target=send_batches, args=(c.root, "kill-push", range(20_000), 20))
        sender.start()
        wait_until(lambda: sum(child_seen.values()) >= 2000, 60, "the child to consume some")
        child.kill()                                       # SIGKILL: no commit, no goodbye
        child.wait(10)
        wait_until(lambda: len(mine(me, "kill-push")) == 4, 30, "its queues to move here")
        sender.join(60)
        wait_until(lambda: set(sink.counts) | set(child_seen) >= set(range(20_000)), 60, "every message")
        both = sink.counts + child_seen
        twice = {s for s, n in both.items() if n > 1}
        assert all(child_seen[s] >= 1 and sink.counts[s] >= 1 for s in twice), \
            "only what the killed member had taken may come again"
        assert max(sink.counts.values()) == 1
        print(f"re-delivered after the kill: {len(twice)} of {len(child_seen)} the child consumed")
    finally:
        me.shutdown()
        if child.poll() is None:
            child.kill()
        child.wait(10)
        reader.join(5)


def test_a_fourth_member_joining_mid_stream_takes_queues(cluster):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        queues = a.create_topic("join-t", queues=8)
    sinks = [Sink() for _ in range(4)]
    consumers = [push(c.root, s, "join-t", group="join-g") for s in sinks[:3]]
    try:
        wait_until(lambda: stable_split(consumers, queues, [3, 3, 2]), 30, "three members split")
        sender = threading.Thread(target=send_batches, args=(c.root, "join-t", range(30_000), 10))
        sender.start()
        wait_until(lambda: sum(s.total() for s in sinks) > 3000, 60, "the stream to run")
        consumers.append(push(c.root, sinks[3], "join-t", group="join-g"))
        wait_until(lambda: stable_split(consumers, queues, [2, 2, 2, 2]), 30, "four members split")
        sender.join(120)
        wait_until(lambda: len(set().union(*(s.counts for s in sinks))) == 30_000, 60, "every message")
        assert sinks[3].total() > 0
    finally:
        for x in consumers:
            x.shutdown()


def test_broadcasting_gives_every_member_everything_and_keeps_offsets_per_instance(cluster):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        a.create_topic("bc-t", queues=3)
    sinks = [Sink(), Sink()]
    consumers = [push(c.root, s, "bc-t", group="bc-g", model=MessageModel.BROADCASTING, instance_name=f"i{k}")
                 for k, s in enumerate(sinks)]
    try:
        send_batches(c.root, "bc-t", range(3000), 50)
        wait_until(lambda: all(s.total() == 3000 for s in sinks), 60, "both to get everything")
        assert all(max(s.counts.values()) == 1 for s in sinks)
    finally:
        for x in consumers:
            x.shutdown()
    # The same instance resumes from its own offsets: only new messages.
    send_batches(c.root, "bc-t", range(3000, 3300), 50)
    again = Sink()
    x = push(c.root, again, "bc-t", group="bc-g", model=MessageModel.BROADCASTING, instance_name="i0")
    try:
        wait_until(lambda: again.total() == 300, 30, "the new messages")
        time.sleep(0.5)                                     # nothing old arrives late (checked below)
        assert set(again.counts) == set(range(3000, 3300))
    finally:
        x.shutdown()


def test_where_a_new_group_starts_and_retry_of_a_failed_batch(cluster):
    c = cluster(broker={"message_delay_level": "1s 1s 1s 1s 1s"})      # retries after 1 s
    with hostmq.Admin(c.root) as a:
        a.create_topic("start-t", queues=2)
    send_batches(c.root, "start-t", range(100), 10)
    wait_until(lambda: _max_total(c.root, "start-t") == 100, 10, "dispatch")
    mid_ms = int(time.time() * 1000)
    time.sleep(0.05)
    send_batches(c.root, "start-t", range(100, 150), 10)
    wait_until(lambda: _max_total(c.root, "start-t") == 150, 10, "dispatch")

    last, ts = Sink(), Sink()
    x1 = push(c.root, last, "start-t", group="new-last", consume_from=ConsumeFrom.LAST_OFFSET)
    x2 = push(c.root, ts, "start-t", group="new-ts", consume_from=ConsumeFrom.TIMESTAMP, consume_timestamp_ms=mid_ms)
    try:
        wait_until(lambda: ts.total() == 50, 30, "messages after the timestamp")
        send_batches(c.root, "start-t", range(150, 160), 10)
        wait_until(lambda: last.total() == 10, 30, "only new messages for a new LAST_OFFSET group")
        assert set(last.counts) == set(range(150, 160))        # no history replayed
        assert set(ts.counts) >= set(range(100, 150)) and not set(ts.counts) & set(range(100))
    finally:
        x1.shutdown()
        x2.shutdown()

    failures = collections.Counter()

    def flaky(msgs):
        seq = SEQ.unpack_from(msgs[0].body)[0]
        failures[seq] += 1
        if failures[seq] < 3:
            raise RuntimeError("not yet")                    # an exception is RECONSUME_LATER
        return ConsumeResult.SUCCESS
    x3 = push(c.root, flaky, "start-t", group="flaky", retry_delay_s=0.05)
    try:
        wait_until(lambda: len(failures) == 160 and min(failures.values()) >= 3, 60, "every message on its 3rd try")
        assert max(failures.values()) == 3
    finally:
        x3.shutdown()


def _max_total(root: str, topic: str) -> int:
    """Messages of ``topic`` dispatched so far (the sum of its queues' max offsets)."""
    with hostmq.Admin(root) as a:
        return sum(q["max_offset"] for b in a.brokers() for q in b.get("queues", []) if q["topic"] == topic)


def test_flow_control_holds_at_most_the_threshold_per_queue(cluster):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        queues = a.create_topic("flow-t", queues=1)
    release = threading.Event()
    got = Sink()

    def slow(msgs):
        release.wait(60)
        return got(msgs)
    x = push(c.root, slow, "flow-t", group="flow-g", max_held_messages=50, pull_batch_size=16, threads=2)
    try:
        send_batches(c.root, "flow-t", range(2000), 100)
        held = lambda: x.queues.get(queues[0])                   # noqa: E731
        wait_until(lambda: held() and held().count >= 50, 30, "the hold to fill")
        peak = 0
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:                  # watch it while the listener is stuck
            peak = max(peak, held().count)
            time.sleep(0.01)
        assert 50 <= peak < 50 + 16, f"held {peak} messages with a threshold of 50 (+ one pull of 16)"
        assert x.pull.paused == set(queues)                  # the retry topic's queue is not held up
        release.set()
        wait_until(lambda: got.total() == 2000, 60, "everything once the listener is free")
        assert max(got.counts.values()) == 1
    finally:
        release.set()
        x.shutdown()


@pytest.mark.parametrize("expression", ["A", hostmq.SQL("kind = 'A'")], ids=["tag", "sql92"])
def test_messages_filtered_out_after_the_last_match_do_not_hold_back_the_offset(cluster, expression):
    """Issue 15, item 11: messages that do not match the subscription arrive after the matching ones
    were consumed; the group still commits past them (its lag reaches 0), as a pull consumer does."""
    c = cluster()
    with hostmq.Admin(c.root) as a:
        queues = a.create_topic("lag-t", queues=2)

    def send(seqs, kind):
        with hostmq.Producer(c.root) as p:
            for i in seqs:
                p.send(Message("lag-t", SEQ.pack(i), tags=kind, properties={"kind": kind}), queue=queues[i % 2])
    got = Sink()
    x = hostmq.PushConsumer(c.root, group="lag-g", consume_from=ConsumeFrom.FIRST_OFFSET, **FAST)
    x.subscribe("lag-t", expression)
    x.register(got)
    with x.start(), hostmq.Admin(c.root) as a:
        send(range(20), "A")
        wait_until(lambda: got.total() == 20, 30, "the matching messages")
        send(range(20, 40), "B")                            # 10 per queue, none of them matching

        def progress():
            rows = [r for r in a.consumer_progress("lag-g") if r["queue"].topic == "lag-t"]
            return rows if len(rows) == 2 and all(r["broker_offset"] == 20 for r in rows) else None
        rows = wait_until(progress, 30, "the group's progress on both queues")
        wait_until(lambda: all(r["lag"] == 0 for r in progress()), 30,
                   f"the lag to reach 0 (it was {[r['lag'] for r in rows]})")
    assert sorted(got.counts) == list(range(20)) and max(got.counts.values()) == 1


class ThreadLog:
    """A listener that notes the thread of each call and how many calls overlap (``delay_s`` each)."""

    def __init__(self, delay_s: float = 0.0, stop_on: int | None = None) -> None:
        self.delay_s, self.stop_on = delay_s, stop_on
        self.threads: list[str] = []
        self.running = self.most = 0
        self.lock = threading.Lock()
        self.consumer: hostmq.PushConsumer | None = None

    def __call__(self, msgs) -> ConsumeResult:
        with self.lock:
            self.threads.append(threading.current_thread().name)
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            if self.delay_s:
                time.sleep(self.delay_s)
            if self.stop_on is not None and SEQ.unpack_from(msgs[0].body)[0] == self.stop_on:
                self.consumer.shutdown()        # from inside the listener: must neither raise nor hang
        finally:
            with self.lock:
                self.running -= 1
        return ConsumeResult.SUCCESS


def test_a_fast_listener_runs_on_the_pull_thread_and_a_slow_one_keeps_the_pool(cluster):
    """Issue 29's hot path: one message fetched while the pool is idle is consumed on the pull thread
    (no thread hand-off); a listener whose calls mostly take over ``INLINE_MAX_S`` gets the pool back, so
    slow calls overlap again."""
    from hostmq.client.consume_service import INLINE_MAX_S
    c = cluster()
    with hostmq.Admin(c.root) as a:
        a.create_topic("inline-t", queues=1)
    fast, slow = ThreadLog(), ThreadLog(delay_s=max(0.05, 50 * INLINE_MAX_S))
    consumers = [push(c.root, fast, "inline-t", group="inline-fast", threads=4),
                 push(c.root, slow, "inline-t", group="inline-slow", threads=4)]
    try:
        with hostmq.Producer(c.root) as p:
            for i in range(20):                 # one at a time: each fetch finds one message
                p.send(Message("inline-t", SEQ.pack(i)))
                wait_until(lambda: len(fast.threads) > i, 30, f"message {i} at the fast listener")
            wait_until(lambda: len(slow.threads) >= 1, 30, "the slow listener's first call")
            for i in range(20, 40):             # the slow group's later fetches: pool threads, overlapping
                p.send(Message("inline-t", SEQ.pack(i)))
            wait_until(lambda: len(slow.threads) >= 40 and len(fast.threads) >= 40, 60, "40 calls each")
        assert sum(t.startswith("hostmq-pull") for t in fast.threads[:20]) >= 15, fast.threads[:20]
        assert consumers[0].service.inline_batches >= 15
        assert all(t.startswith("hostmq-consume") for t in slow.threads[2:]), slow.threads
        assert slow.most >= 2
    finally:
        for k in consumers:
            k.shutdown()


def test_a_listener_on_the_pull_thread_may_shut_its_consumer_down(cluster):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        a.create_topic("inline-stop", queues=1)
    log = ThreadLog(stop_on=3)
    consumer = log.consumer = push(c.root, log, "inline-stop", group="inline-stop-g")
    try:
        with hostmq.Producer(c.root) as p:
            for i in range(4):
                p.send(Message("inline-stop", SEQ.pack(i)))
                wait_until(lambda: len(log.threads) > i, 30, f"message {i}")
        wait_until(lambda: consumer.stopping.is_set() and not consumer._thread_alive(), 30, "the pull thread to end")
        assert consumer.error is None and log.threads[3].startswith("hostmq-pull")
    finally:
        consumer.shutdown()


def test_one_slow_call_does_not_send_a_fast_listener_to_the_pool(cluster):
    """A call that took long once (the listener lost its CPU for a time slice, say) does not move a
    fast listener off the pull thread: the rule counts slow calls among the last few."""
    c = cluster()
    with hostmq.Admin(c.root) as a:
        a.create_topic("inline-once", queues=1)
    log = ThreadLog()
    consumer = push(c.root, log, "inline-once", group="inline-once-g")
    try:
        with hostmq.Producer(c.root) as p:
            for i in range(12):
                log.delay_s = 0.02 if i == 2 else 0.0
                p.send(Message("inline-once", SEQ.pack(i)))
                wait_until(lambda: len(log.threads) > i, 30, f"message {i}")
        assert sum(t.startswith("hostmq-pull") for t in log.threads[3:]) >= 7, log.threads
    finally:
        consumer.shutdown()
