"""Session-wide set-up for every test.

A test run that was killed outright (SIGKILL, an environment restart) cannot unlink the shared-memory
segments of the clusters it had running, and their roots are temporary directories nobody starts a
broker in again — so the broker's own reclaim at start never sees them. Such a segment was found
after the frame fuzzer's test (root /tmp/hmqff-*/r0) was killed mid-run. Every test session
therefore begins by unlinking hostmq segments whose owner process is dead
(``shm.reclaim_stale``: the header's pid, start ticks and boot id; a live cluster's are untouched) —
but never those of a broker that was alive within ``RECENT_BROKER_S``: a broker killed moments ago
(a fault run's on this machine, or a user's cluster its supervisor is restarting) still needs its
state segment and transient-pool buffers to commit what it acknowledged (``broker/pool_salvage.py``).
Reclaiming them lost acknowledged messages in the pool trials of a fault run that had test sessions
starting beside it (full run e8adc1b, trials 159–283; docs/faults.md).
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time

import psutil

import pytest

from hostmq.errors import SegmentError
from hostmq.live.state import BrokerState
from hostmq.shm import list_segments, list_semaphores, reclaim_stale, unlink_semaphore, unlink_segment
from hostmq.shm.segment import DEFAULT_PREFIX
from hostmq.shm_layouts import STATE_HEARTBEATS
from hostmq.root import shm_prefix
from hostmq.waiting import poll_until
from tests.shm import SPAWN as _SPAWN, ShmNames, leftovers as _shm_leftovers

log = logging.getLogger(__name__)
SLOW_DIRS = ("e2e", "faults", "spark", "docs", "aio")   # whole clusters, fault runs, a SparkSession
SLOW_FILES = ("test_bench.py", "test_bench_latency.py", "test_packaging.py")   # benchmarks, a wheel build


def pytest_collection_modifyitems(config, items):
    """Everything under ``SLOW_DIRS`` and in ``SLOW_FILES`` (real clusters, Spark, fault runs,
    benchmarks, the wheel build) is ``slow``: ``pytest -m "not slow"`` is the fast lane — the
    in-process tests of stores, segments, codecs and loop bodies. ``tools/test.sh`` runs both."""
    root = config.rootpath / "tests"
    for item in items:
        try:
            top = item.path.relative_to(root).parts[0]
        except ValueError:
            continue
        if top in SLOW_DIRS or top in SLOW_FILES:
            item.add_marker(pytest.mark.slow)


RECENT_BROKER_S = 600.0


def recently_alive_brokers(now_ms: int | None = None) -> set[str]:
    """The IPC prefixes of brokers whose state segment shows a heartbeat (any of its processes) within
    ``RECENT_BROKER_S``: dead or not, their names are left to their own restart."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    out = set()
    for name in list_segments(DEFAULT_PREFIX):
        if name.rsplit(".", 2)[-2:-1] != ["state"]:
            continue
        try:
            st = BrokerState.attach(name, readonly=True)
        except SegmentError:
            continue
        try:
            newest = max(st.get(word) for word in STATE_HEARTBEATS.values())
        finally:
            st.close()
        if newest > now_ms - RECENT_BROKER_S * 1000:
            out.add(name.rsplit(".", 2)[0] + ".")
    return out


def reclaim_killed_runs(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Unlink the names under ``prefix`` whose owner is dead, but for brokers alive within
    ``RECENT_BROKER_S`` (see the module docstring); the names unlinked."""
    recent = recently_alive_brokers()
    prefixes = {n.rsplit(".", 2)[0] + "." for n in list_segments(prefix)} - recent
    return [g for p in sorted(prefixes) for g in reclaim_stale(p)]


@pytest.fixture(scope="session", autouse=True)
def reclaim_segments_of_killed_runs():
    gone = reclaim_killed_runs()
    if gone:
        log.warning("unlinked %d shared-memory names left by a killed run: %s", len(gone), gone)
    yield


def wait_until(cond, timeout_s: float = 15.0, what: str = "condition", step_s: float = 0.02):
    """Poll ``cond`` until it returns something truthy (returned) or fail after ``timeout_s`` — the
    one way tests wait for a condition (never a bare sleep)."""
    return poll_until(cond, timeout_s, what, step_s=step_s, error=AssertionError)


# -- shared memory and spawned processes ------------------------------------------------------------
# Every test gets a unique root (``tmp_path``), so its IPC names ``/hostmq.<hash12>.*`` collide with
# nothing; ``shm`` asserts that no segment or semaphore under that prefix exists before the test and
# none is left after it (unlinking leftovers so one failure does not leak into the machine).
# ``spawn`` starts processes with the 'spawn' method and kills what is still running at teardown,
# before ``shm`` checks for leftovers.
@pytest.fixture
def shm(tmp_path):
    names = ShmNames(str(tmp_path), "broker-a")
    assert _shm_leftovers(names.prefix) == []
    yield names
    left = _shm_leftovers(names.prefix)
    for n in list_segments(names.prefix):
        unlink_segment(n)
    for n in list_semaphores(names.prefix):
        unlink_semaphore(n)
    assert left == [], f"test left shared memory behind: {left}"


@pytest.fixture
def spawn(shm):
    """Factory ``spawn(target, *args) -> Process`` (started, daemon); killed and joined at teardown."""
    procs = []

    def _spawn(target, *args):
        p = _SPAWN.Process(target=target, args=args, daemon=True)
        p.start()
        procs.append(p)
        return p

    yield _spawn
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(10)


# -- clusters of real processes ----------------------------------------------------------------------
# Small files so tests roll commitlog, consume-queue and index files; fast expiry and registration.
TEST_CONFIG = {
    "namesrv": {"scan_interval_s": 0.2, "broker_expiry_s": 1.5},
    "broker": {"register_interval_s": 0.5},
    "store": {"commitlog_file_bytes": 4 << 20, "consume_queue_file_entries": 4000, "index_slots": 1000,
              "index_entries": 8000},
}


def prefixes(root: str, brokers) -> list[str]:
    """The IPC name prefixes of ``brokers`` on ``root`` and the root's own."""
    return [shm_prefix(root, b) for b in brokers] + [shm_prefix(root, "")]


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


def child_pids() -> set[int]:
    """This test process's descendants now."""
    return {p.pid for p in psutil.Process().children(recursive=True)}


def stop_and_check(clusters, root: str, older: set[int], ignore=lambda: set()) -> None:
    """Stop ``clusters`` (LocalClusters under ``root``) and fail if they left anything: a child process
    not in ``older`` (nor in ``ignore()``, e.g. Spark's JVM), a socket file under the root, or a
    shared-memory segment or semaphore of the root's brokers (unlinked here, so one failure does not
    leak into the next test)."""
    names = set()
    for c in clusters:
        names |= set(c.brokers) | set(getattr(c, "slaves", ()))
        c.stop()
    me = psutil.Process()
    wait_until(lambda: not [p for p in me.children(recursive=True) if p.pid not in older | ignore()], 20,
               "the clusters' processes to exit")
    socks = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".sock")]
    left = leftovers(root, names or {"broker-a"})
    for n in left:
        unlink_semaphore(n[4:]) if n.startswith("sem:") else unlink_segment(n)
    assert not socks, f"socket files left behind: {socks}"
    assert not left, f"shared memory left behind: {left}"


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    r.mkdir()
    return str(r)


# -- a control server on a thread ---------------------------------------------------------------------
class Running:
    """A control Server whose loop runs on a thread of the test process."""

    def __init__(self, server, path: str) -> None:
        self.server = server
        self.path = path
        self.address = server.address
        self._stop = threading.Event()
        self._thread = threading.Thread(target=server.run, args=(self._stop,), name=f"server {server.name}")

    def start(self) -> "Running":
        self._thread.start()
        return self

    def stop(self) -> None:
        if not self.server.closed:
            self._stop.set()
            if self._thread.ident is not None:
                self._thread.join(10)
                assert not self._thread.is_alive()
            self.server.close()


@contextlib.contextmanager
def served(handlers, path: str, name: str = "test"):
    """``handlers`` served on ``path`` by a Server on a thread, and a RemotingClient of it; both closed
    at the end."""
    from hostmq.remoting import RemotingClient
    from hostmq.root import ipc_address
    from hostmq.transport import Server
    server = Server(ipc_address(path), handlers, name=name)
    server.bind()
    r = Running(server, path).start()
    c = RemotingClient(server.address, timeout_s=10.0)
    try:
        yield c
    finally:
        c.close()
        r.stop()
