"""Queue locks for orderly consumption (pure: time is an argument)."""
from __future__ import annotations

import pytest

from hostmq.broker.queue_locks import QueueLocks

pytestmark = pytest.mark.timeout(60)
Q = [("t", 0), ("t", 1)]


def test_one_owner_per_queue_until_expiry_or_release():
    locks = QueueLocks(expiry_s=60)
    assert locks.lock("g", "a", Q, 0.0) == Q
    assert locks.lock("g", "b", Q, 10.0) == []                 # held by a
    assert locks.lock("h", "b", Q, 10.0) == Q                  # another group is independent
    assert locks.lock("g", "a", Q[:1], 50.0) == Q[:1]          # a renews queue 0 only
    assert locks.lock("g", "b", Q, 61.0) == [("t", 1)]         # queue 1 expired, queue 0 was renewed
    assert locks.owner("g", "t", 0, 61.0) == "a" and locks.owner("g", "t", 1, 61.0) == "b"
    locks.unlock("g", "b", Q)                                  # b cannot unlock a's queue
    assert locks.owner("g", "t", 0, 62.0) == "a" and locks.owner("g", "t", 1, 62.0) is None
    assert locks.release_client("a") == 1
    assert locks.lock("g", "b", Q, 63.0) == Q
    assert locks.owner("g", "t", 0, 200.0) is None             # expired
