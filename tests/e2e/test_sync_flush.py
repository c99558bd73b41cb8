"""SYNC_FLUSH: a send is acknowledged only once the flusher's group commit made it durable;
ASYNC_FLUSH acknowledges after the append. Real broker processes; the flushed position is read from
the broker's state segment."""
from __future__ import annotations

import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import hostmq
from hostmq import Message
from hostmq.live.state import W_FLUSHED_POS, BrokerState
from hostmq.root import shm_name
from tests.conftest import wait_until
from tests.e2e.test_faults import Load, check_exactly_once, stored

pytestmark = pytest.mark.timeout(240)
SYNC = {"flush_disk_type": "SYNC_FLUSH"}
# ASYNC_FLUSH that will not flush during the test: the acknowledgement cannot be waiting for a flush.
LAZY_ASYNC = {"flush_disk_type": "ASYNC_FLUSH", "flush_interval_ms": 600_000, "flush_thorough_interval_ms": 600_000}


def phys_of(r: hostmq.SendResult) -> int:
    return int(r.msg_id[-16:], 16)          # message id = store host + commitlog offset


class State:
    def __init__(self, root: str, broker: str = "broker-a") -> None:
        self.st = BrokerState.attach(shm_name(root, broker, "state"), readonly=True)

    def flushed(self) -> int:
        return int(self.st.w[W_FLUSHED_POS])

    def flush_count(self) -> int:
        return int(self.st.get("flush_count"))

    def close(self) -> None:
        self.st.close()


class SyncLoad(Load):
    """``Load`` that also reads the broker's flushed position in each acknowledgement's callback,
    until ``detach()`` (before the broker goes away)."""

    def __init__(self, root: str, topic: str) -> None:
        self.state: State | None = State(root)
        self.lock = threading.Lock()
        self.flushed_at_ack: dict[int, int] = {}
        super().__init__(root, topic)

    def _done(self, i: int, f) -> None:
        with self.lock:
            if self.state is not None and f.exception() is None:
                self.flushed_at_ack[i] = self.state.flushed()
        super()._done(i, f)

    def detach(self) -> None:
        with self.lock:
            if self.state is not None:
                self.state.close()
                self.state = None


def test_sync_flush_acknowledges_only_what_is_on_disk_and_commits_in_groups(cluster):
    c = cluster(store=SYNC)
    st = State(c.root)
    try:
        with hostmq.Producer(c.root) as p, hostmq.Admin(c.root) as a:
            a.create_topic("sf", queues=2)

            def check_durable_at_ack(acks) -> None:
                """Each (result, flushed position read right after its acknowledgement): the whole
                record was durable when the sender learned it was stored."""
                for r, flushed in acks:
                    assert r.status == hostmq.SendStatus.SEND_OK, r
                    m = a.view_message(r.msg_id)
                    end = m.commitlog_offset + m.store_size
                    assert flushed >= end, f"acknowledged {r.msg_id} ending at {end} with only {flushed} flushed"

            # One sender, one message at a time.
            acks = []
            for i in range(100):
                r = p.send(Message("sf", b"one-%d" % i))
                acks.append((r, st.flushed()))                # read at once after the acknowledgement
            check_durable_at_ack(acks)

            # Group commit: concurrent senders share fsyncs.
            flushes_before = st.flush_count()

            def send(i: int):
                r = p.send(Message("sf", b"many-%d" % i))
                return r, st.flushed()                       # read at once after the acknowledgement

            with ThreadPoolExecutor(8) as ex:
                acks = list(ex.map(send, range(400)))
            flushes = st.flush_count() - flushes_before
            check_durable_at_ack(acks)
            assert 0 < flushes < len(acks), f"{flushes} flushes for {len(acks)} concurrent sends"

            # Async sends under SYNC_FLUSH: the flushed position is read in the completion callback.
            flushes_before = st.flush_count()
            lock = threading.Lock()
            acks = []

            def on_ack(f) -> None:
                flushed = st.flushed()
                with lock:
                    acks.append((f.result(), flushed))

            futs = [p.send_async(Message("sf", b"async-%d" % i), callback=on_ack) for i in range(200)]
            for f in futs:
                f.result(30)
            wait_until(lambda: len(acks) == len(futs), 10, "every completion callback")
            flushes = st.flush_count() - flushes_before
            check_durable_at_ack(acks)
            assert 0 < flushes < len(futs), f"{flushes} flushes for {len(futs)} pipelined sends"
    finally:
        st.close()


def test_async_flush_acknowledges_before_the_flush(cluster):
    c = cluster(store=LAZY_ASYNC)
    st = State(c.root)
    try:
        with hostmq.Producer(c.root) as p, hostmq.Admin(c.root) as a:
            flushed_at_start, flushes_at_start = st.flushed(), st.flush_count()
            results = []
            for i in range(50):
                r = p.send(Message("af", b"m%d" % i))
                assert a.view_message(r.msg_id).body == b"m%d" % i      # found at once, dispatched or not
                results.append(r)
            assert all(r.status == hostmq.SendStatus.SEND_OK for r in results)
            assert st.flushed() == flushed_at_start <= phys_of(results[0])       # acked, none of it flushed
            assert st.flush_count() == flushes_at_start
    finally:
        st.close()


def test_sync_flush_broker_killed_then_restarted_keeps_every_acknowledged_message(cluster):
    c = cluster(store=SYNC)
    with hostmq.Admin(c.root) as a:
        a.create_topic("sfcrash", queues=4)
    load = SyncLoad(c.root, "sfcrash")
    with load:
        try:
            wait_until(lambda: len(load.acked) >= 1500, 60, "1500 acknowledgements")
            c.signal_group("broker-a", signal.SIGKILL)
        finally:
            load.detach()
        acked_then = dict(load.acked)
        late = [(i, r.msg_id, load.flushed_at_ack.get(i)) for i, r in acked_then.items()
                if i in load.flushed_at_ack and phys_of(r) >= load.flushed_at_ack[i]]
        assert len(load.flushed_at_ack) >= 1500, len(load.flushed_at_ack)
        assert not late, f"{len(late)} messages acknowledged beyond the flushed position: {late[:3]}"
        c.processes["broker-a"].wait(30)
        acked_before = dict(load.acked)
        c.start_broker("broker-a")
        wait_until(lambda: len(load.acked) >= len(acked_before) + 500, 60, "sends after the restart")
    counts = stored(c.root, "sfcrash")
    assert set(acked_before) <= set(load.acked)
    check_exactly_once(counts, load.acked)


def test_sync_flush_held_back_answers_flush_disk_timeout_then_recovers(cluster):
    """The ack waits for the fsync: with the flusher stopped (SIGSTOP) a SYNC_FLUSH send is stored but
    answered FLUSH_DISK_TIMEOUT after ``sync_flush_timeout_ms``; once it runs again, sends are SEND_OK
    and only acknowledged when flushed."""
    import os
    import time
    c = cluster(store={**SYNC, "sync_flush_timeout_ms": 500})
    with hostmq.Admin(c.root) as a:
        flusher = a.brokers()[0]["pids"]["flusher"]
    st = State(c.root)
    try:
        with hostmq.Producer(c.root) as p:
            p.send(Message("held", b"warm-up"))
            before = st.flushed()
            os.kill(flusher, signal.SIGSTOP)
            try:
                t0 = time.monotonic()
                r = p.send(Message("held", b"held back"), timeout=10)
                waited = time.monotonic() - t0
                assert r.status == hostmq.SendStatus.FLUSH_DISK_TIMEOUT, r
                assert waited >= 0.45 and st.flushed() == before < phys_of(r) + 1
            finally:
                os.kill(flusher, signal.SIGCONT)
            r2 = p.send(Message("held", b"after"))
            assert r2.status == hostmq.SendStatus.SEND_OK and st.flushed() > phys_of(r2)
        with hostmq.PullConsumer(c.root, group="held-g", consume_from=hostmq.ConsumeFrom.FIRST_OFFSET) as pc:
            pc.subscribe("held")
            got = []
            wait_until(lambda: got.extend(m.body for m in pc.poll(0.2)) or len(got) >= 3, 20, "the three messages")
            assert sorted(got) == sorted([b"warm-up", b"held back", b"after"])     # the timed-out one is stored
    finally:
        st.close()
