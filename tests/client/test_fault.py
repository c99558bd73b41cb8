"""Queue choice and RocketMQ's latency fault strategy (pure; time is an argument)."""
from __future__ import annotations

import pytest

from hostmq.client.fault import ISOLATION_MS, LatencyFaultTolerance, not_available_ms, select_queue
from hostmq.message import MessageQueue

pytestmark = pytest.mark.timeout(60)
QUEUES = [MessageQueue("T", b, q) for b in ("broker-a", "broker-b") for q in range(2)]


@pytest.mark.parametrize("latency_ms,avoid_ms", [
    (0, 0), (49, 0), (50, 0), (549, 0), (550, 30_000), (999, 30_000), (1000, 60_000), (2000, 120_000),
    (2999, 120_000), (3000, 180_000), (15_000, 600_000), (10 ** 6, 600_000)])
def test_not_available_durations_are_rocketmqs(latency_ms, avoid_ms):
    assert not_available_ms(latency_ms) == avoid_ms


def test_round_robin_over_every_queue_when_all_brokers_are_fine():
    f = LatencyFaultTolerance()
    picks = [select_queue(QUEUES, i, f, 0.0) for i in range(8)]
    assert picks == QUEUES + QUEUES


def test_a_slow_broker_is_avoided_until_its_time_passes():
    f = LatencyFaultTolerance()
    f.update("broker-a", 1200, now_ms=1000)                   # slow: avoided 60 s
    assert not f.available("broker-a", 1000) and f.available("broker-b", 1000)
    assert {select_queue(QUEUES, i, f, 30_000).broker for i in range(8)} == {"broker-b"}
    assert f.available("broker-a", 61_000)
    assert {select_queue(QUEUES, i, f, 61_000).broker for i in range(8)} == {"broker-a", "broker-b"}
    f.update("broker-a", 10, now_ms=70_000)                   # fast again: available at once
    assert f.available("broker-a", 70_000)


def test_a_failure_isolates_the_broker_and_a_retry_skips_the_one_that_failed():
    f = LatencyFaultTolerance()
    f.update("broker-b", 5, now_ms=0, isolation=True)
    assert not f.available("broker-b", ISOLATION_MS - 1) and f.available("broker-b", ISOLATION_MS)
    # A retry never goes back to the broker that just failed while another one exists.
    assert {select_queue(QUEUES, i, None, 0, last_failed_broker="broker-a").broker for i in range(8)} == {"broker-b"}
    # ... unless it is the only broker.
    only_a = [q for q in QUEUES if q.broker == "broker-a"]
    assert select_queue(only_a, 0, f, 0, last_failed_broker="broker-a") in only_a


def test_when_every_broker_is_unavailable_the_least_bad_is_used():
    f = LatencyFaultTolerance()
    f.update("broker-a", 3500, now_ms=0)                      # avoided until 180 000
    f.update("broker-b", 600, now_ms=0)                       # avoided until 30 000
    picks = {select_queue(QUEUES, i, f, 1000) for i in range(4)}
    assert {q.broker for q in picks} == {"broker-b"} and len(picks) == 2   # still round-robin within it
    assert f.least_bad(["broker-c"]) == "broker-c"            # unknown brokers are fine
    assert f.least_bad([]) is None


def test_no_queue_is_an_error():
    with pytest.raises(ValueError):
        select_queue([], 0, LatencyFaultTolerance(), 0)
