"""Fixtures for tests with real processes: clusters under a fresh root, and leak checks.

``cluster`` is a factory ``cluster(brokers=1, namesrvs=1, **config_overrides) -> LocalCluster`` (started).
At teardown every cluster is stopped, and the test fails if anything is left behind: a child process
of the test, a socket file under the root, or a shared-memory segment or semaphore with the root's
names (every broker's prefix and the root-level prefix of consumers' wake-up words).
"""
from __future__ import annotations

import os
import time

import psutil
import pytest

from hostmq import LocalCluster
from hostmq.root import shm_name
from hostmq.shm import list_segments, list_semaphores, unlink_semaphore, unlink_segment
from tests.conftest import wait_until

# Small files so tests roll commitlog, consume-queue and index files; fast expiry and registration.
TEST_CONFIG = {
    "namesrv": {"scan_interval_s": 0.2, "broker_expiry_s": 1.5},
    "broker": {"register_interval_s": 0.5},
    "store": {"commitlog_file_bytes": 4 << 20, "consume_queue_file_entries": 4000, "index_slots": 1000,
              "index_entries": 8000},
}


def sessions_settled(admin) -> int:
    """The broker's open session count once its own scheduler holds its session (the scheduler opens
    it after the broker runs, so on a loaded machine a count read earlier may still grow by one)."""
    wait_until(lambda: admin.brokers()[0]["state"].get("scheduler_heartbeat_ms", 0) > 0, 15,
               "the scheduler's session")
    return admin.brokers()[0]["sessions"]


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


def prefixes(root: str, brokers) -> list[str]:
    names = [shm_name(root, b, "x") for b in brokers] + [shm_name(root, "", "x")]
    return [n.rsplit(".", 2)[0] + "." for n in names]


def leftovers(root: str, brokers) -> list[str]:
    out = []
    for p in prefixes(root, brokers):
        out += list_segments(p) + [f"sem:{s}" for s in list_semaphores(p)]
    return out


def merge(base: dict, extra: dict) -> dict:
    out = {k: dict(v) for k, v in base.items()}
    for section, values in extra.items():
        out.setdefault(section, {}).update(values)
    return out


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    r.mkdir()
    return str(r)


@pytest.fixture
def cluster(root):
    made: list[LocalCluster] = []
    me = psutil.Process()
    # Processes an earlier test left on purpose (multiprocessing's resource tracker) are not this test's.
    older = {p.pid for p in me.children(recursive=True)}

    def _make(brokers: int = 1, namesrvs: int = 1, slaves: int = 0, **overrides) -> LocalCluster:
        c = LocalCluster(root, brokers=brokers, namesrvs=namesrvs, config=merge(TEST_CONFIG, overrides),
                         slaves=slaves)
        made.append(c)
        return c.start()

    yield _make
    names = set()
    for c in made:
        names |= set(c.brokers) | set(c.slaves)
        c.stop()
    wait_until(lambda: not [p for p in me.children(recursive=True) if p.pid not in older], 20,
               "child processes to exit")
    socks = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".sock")]
    left = leftovers(root, names or {"broker-a"})
    for n in left:
        unlink_semaphore(n[4:]) if n.startswith("sem:") else unlink_segment(n)
    assert not socks, f"socket files left behind: {socks}"
    assert not left, f"shared memory left behind: {left}"


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
