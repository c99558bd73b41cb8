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

log = logging.getLogger(__name__)


@pytest.fixture(scope="session", autouse=True)
def reclaim_segments_of_killed_runs():
    gone = reclaim_stale()
    if gone:
        log.warning("unlinked %d shared-memory names left by a killed run: %s", len(gone), gone)
    yield
