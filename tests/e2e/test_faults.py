"""Crashes and outages with real processes: no acknowledged message is lost or stored twice."""
from __future__ import annotations

import collections
import os
import signal
import struct
import threading
import time

import pytest

import hostmq
from hostmq import ConsumeFrom, Message
from hostmq.errors import HostMQError, NoRouteError
from hostmq.protocol.codes import RequestCode
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(240)
SEQ = struct.Struct(">q")


class Load:
    """Async sends of numbered messages from a thread, at most ``window`` in flight; records which
    were acknowledged (and how) and which failed."""

    def __init__(self, root: str, topic: str, window: int = 200) -> None:
        self.producer = hostmq.Producer(root, send_timeout_s=10.0).start()
        self.topic = topic
        self.window = threading.Semaphore(window)
        self.acked: dict[int, hostmq.SendResult] = {}
        self.failed: dict[int, Exception] = {}
        self.sent = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _done(self, i: int, f) -> None:
        e = f.exception()
        if e is None:
            self.acked[i] = f.result()
        else:
            self.failed[i] = e
        self.window.release()

    def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            if not self.window.acquire(timeout=0.1):
                continue
            try:
                self.producer.send_async(Message(self.topic, SEQ.pack(i) + b"." * 40),
                                         callback=lambda f, i=i: self._done(i, f))
            except HostMQError as e:
                self.failed[i] = e
                self.window.release()
                time.sleep(0.01)
            i += 1
            self.sent = i

    def __enter__(self) -> "Load":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(30)
        wait_until(lambda: len(self.acked) + len(self.failed) >= self.sent, 30, "in-flight sends to finish")
        self.producer.shutdown()


def stored(root: str, topic: str) -> collections.Counter:
    """How often each sequence number is stored in the topic (read from the first offset)."""
    with hostmq.Admin(root) as a:
        queues = a.route(topic)
    counts: collections.Counter = collections.Counter()
    with hostmq.PullConsumer(root, group=f"check-{time.time_ns()}", consume_from=ConsumeFrom.FIRST_OFFSET,
                             auto_commit=False, max_poll_records=4096) as c:
        c.assign(queues)
        while True:
            msgs = c.poll(0.5)
            if not msgs:
                break
            for m in msgs:
                counts[SEQ.unpack_from(m.body)[0]] += 1
    return counts


def check_exactly_once(counts: collections.Counter, acked: dict) -> None:
    missing = [i for i in acked if counts[i] != 1]
    assert not missing, f"acknowledged messages stored {[(i, counts[i]) for i in missing[:10]]} times"
    twice = [i for i, n in counts.items() if n > 1]
    assert not twice, f"messages stored more than once: {twice[:10]}"


def writer_pid(root: str) -> int:
    with hostmq.Admin(root) as a:
        return a.brokers()[0]["pids"]["writer"]


def test_writer_killed_under_load_is_restarted_and_nothing_is_lost_or_doubled(cluster):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        a.create_topic("load", queues=4)
    with Load(c.root, "load") as load:
        wait_until(lambda: len(load.acked) >= 3000, 60, "3000 acknowledgements")
        old = writer_pid(c.root)
        os.kill(old, signal.SIGKILL)
        wait_until(lambda: writer_pid(c.root) not in (old, 0), 30, "a new writer")
        after = len(load.acked)
        wait_until(lambda: len(load.acked) >= after + 3000, 60, "3000 more acknowledgements")
    assert not load.failed, f"sends failed across a writer restart: {list(load.failed.items())[:3]}"
    counts = stored(c.root, "load")
    check_exactly_once(counts, load.acked)
    assert set(counts) <= set(range(load.sent))


def test_whole_broker_killed_then_restarted_recovers_every_acknowledged_message(cluster):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        a.create_topic("crash", queues=4)
    with Load(c.root, "crash") as load:
        wait_until(lambda: len(load.acked) >= 3000, 60, "3000 acknowledgements")
        c.signal_group("broker-a", signal.SIGKILL)         # broker and children die at once
        c.processes["broker-a"].wait(30)
        acked_before = dict(load.acked)
        c.start_broker("broker-a")
        wait_until(lambda: len(load.acked) >= len(acked_before) + 1000, 60, "sends after the restart")
    assert "abnormal recovery" in c.log_tail("broker-a", 200)
    counts = stored(c.root, "crash")
    check_exactly_once(counts, load.acked)


def test_broker_down_producer_retries_on_the_other_broker(cluster):
    c = cluster(brokers=2)
    with hostmq.Admin(c.root) as a:
        a.create_topic("ha", queues=4)
    with hostmq.Producer(c.root) as p:
        first = [p.send(Message("ha", b"before %d" % i)) for i in range(40)]
        assert {r.queue.broker for r in first} == {"broker-a", "broker-b"}
        c.signal_group("broker-b", signal.SIGKILL)
        c.processes["broker-b"].wait(30)
        after = [p.send(Message("ha", b"after %d" % i)) for i in range(40)]   # none may raise
        assert {r.queue.broker for r in after} == {"broker-a"}
    # Once the route expires, the NameServer serves broker-a only.
    with hostmq.Admin(c.root) as a:
        wait_until(lambda: {q.broker for q in a.route("ha")} == {"broker-a"}, 15, "broker-b to expire")


def test_nameserver_expires_a_silent_broker_and_it_registers_again(cluster):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        a.create_topic("reg", queues=2)
        c.signal_group("broker-a", signal.SIGSTOP)          # silent: no registration
        try:
            wait_until(lambda: _no_route(a, "reg"), 15, "the route to expire")
        finally:
            c.signal_group("broker-a", signal.SIGCONT)
        wait_until(lambda: not _no_route(a, "reg"), 15, "the broker to register again")
        # A restarted NameServer learns the routes again from the next registration.
        assert c.stop_process("namesrv-0") == 0
        c.start_namesrv(0)
        wait_until(lambda: not _no_route(a, "reg"), 15, "re-registration with the new NameServer")
        assert len(a.route("reg")) == 2
        f = a.instance.namesrv_request(RequestCode.GET_BROKER_CLUSTER_INFO).fields
        assert list(f["brokers"]) == ["broker-a"]


def _no_route(admin, topic: str) -> bool:
    try:
        admin.route(topic)
        return False
    except NoRouteError:
        return True
