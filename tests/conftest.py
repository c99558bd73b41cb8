"""Session-wide set-up for every test.

A test run that was killed outright (SIGKILL, an environment restart) cannot unlink the shared-memory
segments of the clusters it had running, and their roots are temporary directories nobody starts a
broker in again — so the broker's own reclaim at start never sees them. Such a segment was found
after the frame fuzzer's test (root /tmp/hmqff-*/r0) was killed mid-run. Every test session
therefore begins by unlinking hostmq segments whose owner process is dead
(``shm.reclaim_stale``: the header's pid, start ticks and boot id; a live cluster's are untouched).
"""
from __future__ import annotations

import logging

import pytest

from hostmq.shm import reclaim_stale
from hostmq.waiting import poll_until

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


@pytest.fixture(scope="session", autouse=True)
def reclaim_segments_of_killed_runs():
    gone = reclaim_stale()
    if gone:
        log.warning("unlinked %d shared-memory names left by a killed run: %s", len(gone), gone)
    yield


def wait_until(cond, timeout_s: float = 15.0, what: str = "condition", step_s: float = 0.02):
    """Poll ``cond`` until it returns something truthy (returned) or fail after ``timeout_s`` — the
    one way tests wait for a condition (never a bare sleep)."""
    return poll_until(cond, timeout_s, what, step_s=step_s, error=AssertionError)
