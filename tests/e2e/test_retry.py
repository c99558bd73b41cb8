"""Retries through %RETRY%<group> with growing back-off, dead letters in %DLQ%<group>, and resending
them with `hostmq dlq resend` — real broker processes, a short delay-level table."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import hostmq
from hostmq import ConsumeFrom, ConsumeResult, Message
from hostmq import records as R
from hostmq.live.state import BrokerState
from hostmq.root import RootPaths, shm_name
from hostmq.store.commitlog import SCHEDULE_TOPIC
from hostmq.store.readonly import StoreReader
from tests.conftest import wait_until
from tests.e2e.test_push import FAST

pytestmark = pytest.mark.timeout(240)
LEVELS = {"broker": {"message_delay_level": "1s 1s 1s 2s 3s"}}     # retries use levels 3, 4, 5…


class Recorder:
    """A listener that fails each message whose body starts with ``prefix`` ``fails`` times (then
    succeeds), recording every call."""

    def __init__(self, fails: int, prefix: bytes = b"") -> None:
        self.fails, self.prefix = fails, prefix
        self.calls: dict[bytes, list[tuple[float, int, str]]] = {}
        self.lock = threading.Lock()

    def __call__(self, msgs):
        m = msgs[0]
        with self.lock:
            seen = self.calls.setdefault(m.body, [])
            seen.append((time.monotonic(), m.reconsume_times, m.topic))
            failing = m.body.startswith(self.prefix) and len(seen) <= self.fails
            return ConsumeResult.RECONSUME_LATER if failing else ConsumeResult.SUCCESS


def consumer(root: str, group: str, listener, **kw) -> hostmq.PushConsumer:
    c = hostmq.PushConsumer(root, group=group, consume_from=ConsumeFrom.FIRST_OFFSET, **{**FAST, **kw})
    c.subscribe("rt")
    c.register(listener)
    return c.start()


def test_a_message_failed_twice_comes_back_twice_with_growing_delays(cluster):
    c = cluster(**LEVELS)
    with hostmq.Admin(c.root) as a:
        a.create_topic("rt", queues=2)
    rec = Recorder(fails=2, prefix=b"flaky")
    x = consumer(c.root, "rt-g", rec)
    try:
        with hostmq.Producer(c.root) as p:
            p.send(Message("rt", b"flaky", tags="t"))
            p.send(Message("rt", b"fine"))
        wait_until(lambda: len(rec.calls.get(b"flaky", [])) == 3, 30, "the third delivery")
        time.sleep(1.5)                                       # and no fourth
        calls = rec.calls[b"flaky"]
        assert len(calls) == 3 and len(rec.calls[b"fine"]) == 1
        assert [r for _, r, _ in calls] == [0, 1, 2]          # reconsume counts
        assert {t for _, _, t in calls} == {"rt"}             # shown under the original topic
        gap1, gap2 = calls[1][0] - calls[0][0], calls[2][0] - calls[1][0]
        assert 0.95 <= gap1 < 2.5 and 1.95 <= gap2 < 3.5 and gap2 > gap1, (gap1, gap2)
    finally:
        x.shutdown()


def test_a_message_that_always_fails_goes_to_the_dlq_and_can_be_resent(cluster):
    c = cluster(**LEVELS)
    with hostmq.Admin(c.root) as a:
        a.create_topic("rt", queues=1)
    rec = Recorder(fails=10 ** 6)
    x = consumer(c.root, "dead-g", rec, max_reconsume_times=2)
    with hostmq.Producer(c.root) as p:
        original = p.send(Message("rt", b"poison", tags="bad", keys=["order-7"], properties={"region": "eu"}))
    try:
        with hostmq.Admin(c.root) as a:
            def in_dlq():
                try:
                    return a.route("%DLQ%dead-g")
                except hostmq.NoRouteError:
                    return None
            dlq = wait_until(in_dlq, 30, "the DLQ topic")
        with hostmq.PullConsumer(c.root, group="dlq-reader", consume_from=ConsumeFrom.FIRST_OFFSET) as pc:
            pc.assign(dlq)
            dead = wait_until(lambda: pc.poll(0.2), 30, "the dead letter")
        assert len(dead) == 1 and dead[0].body == b"poison" and dead[0].reconsume_times == 3
        assert dead[0].properties[R.PROP_RETRY_TOPIC] == "rt"
        assert dead[0].properties[R.PROP_ORIGIN_MSG_ID] == original.msg_id
        assert len(rec.calls[b"poison"]) == 3                 # the first delivery and 2 retries
        time.sleep(1.0)
        assert len(rec.calls[b"poison"]) == 3                 # nothing after the DLQ
    finally:
        x.shutdown()

    with hostmq.PullConsumer(c.root, group="watch", consume_from=ConsumeFrom.LAST_OFFSET) as watch:
        watch.subscribe("rt")
        watch.poll(0.2)
        for args in (["--id", dead[0].msg_id], []):
            r = subprocess.run([sys.executable, "-m", "hostmq.cli.main", "dlq", "resend", c.root, "--group", "dead-g",
                                *args], capture_output=True, text=True, timeout=60)
            assert r.returncode == 0 and "resent" in r.stdout, r.stderr
            again = wait_until(lambda: watch.poll(0.2), 30, "the resent message")
            assert [(m.body, m.tags, m.keys, m.properties.get("region"), m.reconsume_times) for m in again] == \
                [(b"poison", "bad", ("order-7",), "eu", 0)]
        r = subprocess.run([sys.executable, "-m", "hostmq.cli.main", "dlq", "resend", c.root, "--group", "dead-g"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "0 dead letters resent" in r.stdout    # progress is kept


def test_a_retry_pending_when_the_scheduler_restarts_is_not_taken_for_its_earlier_round(cluster):
    """A retry's rounds share the message's unique id and its %RETRY% topic. A scheduler restarted
    while round 2 waits in the schedule topic checks whether round 2 was delivered before the
    restart; the round-1 copy in %RETRY%rt-g must not count (its reconsume count is 1, not 2) — it
    did, and round 2 was never delivered."""
    c = cluster(**LEVELS)
    with hostmq.Admin(c.root) as a:
        a.create_topic("rt", queues=2)
    rec = Recorder(fails=2, prefix=b"flaky")
    x = consumer(c.root, "rt-g", rec)
    st = BrokerState.attach(shm_name(c.root, "broker-a", "state"), readonly=True)
    reader = StoreReader(RootPaths(c.root).store_dir("broker-a"), c.config.store, broker="broker-a",
                         scan_queues=False, limit_phys=lambda: int(st.get("dispatched_pos")))
    try:
        with hostmq.Producer(c.root) as p:
            p.send(Message("rt", b"flaky"))
        wait_until(lambda: len(rec.calls.get(b"flaky", [])) == 2, 30, "the second delivery (round 1)")
        # Round 2 is sent back at level 4 (queue 3 of the schedule topic, 2 s): kill the scheduler
        # while it waits there; the next one starts from offsets saved before it was stored.
        wait_until(lambda: reader.refresh_queue(SCHEDULE_TOPIC, 3) >= 1, 10, "round 2 in the schedule topic")
        os.kill(int(st.get("scheduler_pid")), signal.SIGKILL)
        wait_until(lambda: len(rec.calls.get(b"flaky", [])) == 3, 30, "the third delivery (round 2)")
        assert [r for _, r, _ in rec.calls[b"flaky"]] == [0, 1, 2]
    finally:
        reader.close()
        st.close()
        x.shutdown()
