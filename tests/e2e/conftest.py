"""Fixtures for tests with real processes: clusters under a fresh root, and leak checks.

``cluster`` is a factory ``cluster(brokers=1, namesrvs=1, **config_overrides) -> LocalCluster`` (started).
At teardown every cluster is stopped, and the test fails if anything is left behind: a child process
of the test, a socket file under the root, or a shared-memory segment or semaphore with the root's
names (every broker's prefix and the root-level prefix of consumers' wake-up words).
"""
from __future__ import annotations

import os
import time

import pytest

from hostmq import LocalCluster
from tests.conftest import TEST_CONFIG, child_pids, leftovers, merge, stop_and_check, wait_until

__all__ = ["TEST_CONFIG", "leftovers", "merge"]     # where many tests import them from


def sessions_settled(admin) -> int:
    """The broker's open session count once its own scheduler holds its session (the scheduler opens
    it after the broker runs, so on a loaded machine a count read earlier may still grow by one)."""
    wait_until(lambda: admin.brokers()[0]["state"].get("scheduler_heartbeat_ms", 0) > 0, 15,
               "the scheduler's session")
    return admin.brokers()[0]["sessions"]


def consume_all(root: str, topic: str, expect: int) -> list:
    """The messages a new group ``g-<topic>`` reads from the first offset of ``topic`` until ``expect``
    arrived (60 s at most), and any more one more poll finds."""
    import hostmq
    got: list = []
    with hostmq.PullConsumer(root, group="g-" + topic, consume_from=hostmq.ConsumeFrom.FIRST_OFFSET) as c:
        c.subscribe(topic, "*")
        wait_until(lambda: got.extend(c.poll(0.3)) or len(got) >= expect, 60, f"{expect} messages")
        got.extend(c.poll(0.3))
    return got


def check_results_name_their_messages(root: str, topic: str, results: list) -> dict:
    """``results`` — one SendResult per message of ``topic``, whose bodies are ``b"m%05d" % i`` — are
    all SEND_OK with their own message id, every queue's offsets are taken once and none skipped, and
    each result names the stored message with its body (id, queue, offset). The stored messages by
    body."""
    import collections
    from hostmq import SendStatus
    n = len(results)
    assert all(r.status == SendStatus.SEND_OK for r in results)
    assert len({r.msg_id for r in results}) == n and all("," not in r.msg_id for r in results)
    per_queue = collections.defaultdict(list)
    for r in results:
        per_queue[r.queue.queue_id].append(r.queue_offset)
    for offs in per_queue.values():
        assert sorted(offs) == list(range(len(offs)))
    got = consume_all(root, topic, n)
    assert sorted(m.body for m in got) == [b"m%05d" % i for i in range(n)]
    by_body = {m.body: m for m in got}
    for i, r in enumerate(results):
        m = by_body[b"m%05d" % i]
        assert (m.msg_id, m.queue_id, m.queue_offset) == (r.msg_id, r.queue.queue_id, r.queue_offset)
    return by_body


def consume_bodies(root: str, topic: str, expect: int, group: str, linger_s: float = 0.0) -> list[bytes]:
    """Bodies a new group reads from the first offset of ``topic`` until ``expect`` arrived (30 s at
    most), then ``linger_s`` more so that anything stored that should not be shows up too."""
    import hostmq
    pc = hostmq.PullConsumer(root, group=group, consume_from=hostmq.ConsumeFrom.FIRST_OFFSET)
    try:
        pc.subscribe(topic, "*")
        got = []
        deadline = time.monotonic() + 30
        while len(got) < expect and time.monotonic() < deadline:
            got += [m.body for m in pc.poll(timeout=0.5)]
        end = time.monotonic() + linger_s
        while time.monotonic() < end:
            got += [m.body for m in pc.poll(timeout=0.2)]
        return got
    finally:
        pc.close()


@pytest.fixture
def cluster(root):
    made: list[LocalCluster] = []
    older = child_pids()        # processes an earlier test left on purpose (multiprocessing's resource tracker)

    def _make(brokers: int = 1, namesrvs: int = 1, slaves: int = 0, **overrides) -> LocalCluster:
        c = LocalCluster(root, brokers=brokers, namesrvs=namesrvs, config=merge(TEST_CONFIG, overrides),
                         slaves=slaves)
        made.append(c)
        return c.start()

    yield _make
    stop_and_check(made, root, older)


def commitlogs_identical(root: str, a: str = "broker-a", b: str = "broker-a.1", root_b: str | None = None) -> int:
    """Compares two instances' commitlog files byte for byte (``b`` under ``root_b``, by default
    under ``root`` too); returns the files compared."""
    from hostmq.root import RootPaths
    da = os.path.join(RootPaths(root).store_dir(a), "commitlog")
    db = os.path.join(RootPaths(root_b or root).store_dir(b), "commitlog")
    names = sorted(os.listdir(da))
    assert names == sorted(os.listdir(db))
    for n in names:
        with open(os.path.join(da, n), "rb") as fa, open(os.path.join(db, n), "rb") as fb:
            assert fa.read() == fb.read(), f"commitlog file {n} differs"
    return len(names)


class SendsUntilStopped:
    """A thread sending one message at a time (body ``%08d`` of a counter, after ``start``) until
    :meth:`stop` or the first error (kept in ``error``); ``acked`` holds (body, msg_id) of every
    SEND_OK, ``answered`` (body, status) of every send answered — the broker stored each of them,
    whatever the status."""

    def __init__(self, root: str, topic: str, start: int = 0) -> None:
        import threading
        self.root, self.topic, self.start = root, topic, start
        self.acked: list[tuple[bytes, str]] = []
        self.answered: list[tuple[bytes, object]] = []
        self.error: Exception | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import hostmq
        with hostmq.Producer(self.root, retries=0) as p:
            i = self.start
            while not self._stop.is_set():
                body = b"%08d" % i
                try:
                    r = p.send(hostmq.Message(self.topic, body), timeout=2.0)
                except hostmq.errors.HostMQError as e:
                    self.error = e
                    return
                self.answered.append((body, r.status))
                if r.status == hostmq.SendStatus.SEND_OK:
                    self.acked.append((body, r.msg_id))
                i += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
