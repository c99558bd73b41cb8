"""Queue choice and RocketMQ's latency fault strategy (pure; time is an argument)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

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


# -- the latency table, at its edges --------------------------------------------------------------------
@pytest.mark.parametrize("latency_ms,avoid_ms", [
    (-1, 0), (0.0, 0), (99.999, 0), (100, 0), (549.999, 0), (550.0, 30_000), (999.5, 30_000), (1000.0, 60_000),
    (1999.999, 60_000), (2000, 120_000), (14_999.9, 180_000), (15_000.0, 600_000), (float("inf"), 600_000)])
def test_not_available_durations_at_fractional_edges(latency_ms, avoid_ms):
    assert not_available_ms(latency_ms) == avoid_ms


@settings(max_examples=300, deadline=None)
@given(st.floats(0, 1e7, allow_nan=False), st.floats(0, 1e7, allow_nan=False))
def test_a_slower_answer_is_never_avoided_for_less_time(a, b):
    lo, hi = sorted((a, b))
    assert not_available_ms(lo) <= not_available_ms(hi)
    assert not_available_ms(hi) in {0, 30_000, 60_000, 120_000, 180_000, 600_000}


# -- availability over explicit time ------------------------------------------------------------------
def test_a_broker_becomes_available_exactly_when_its_duration_has_passed():
    f = LatencyFaultTolerance()
    f.update("a", 2500, now_ms=5_000)                         # 2 min
    assert not f.available("a", 5_000) and not f.available("a", 124_999.9)
    assert f.available("a", 125_000) and f.available("a", 10 ** 12)
    assert f.available("never-seen", 0)


def test_the_latest_report_replaces_the_previous_one():
    f = LatencyFaultTolerance()
    f.update("a", 20_000, now_ms=0)                           # 10 min
    f.update("a", 10, now_ms=1)                               # then a fast answer: fine at once
    assert f.available("a", 1)
    f.update("a", 10, now_ms=2, isolation=True)               # then a failure: 30 s from now
    assert not f.available("a", 30_001) and f.available("a", 30_002)
    f.update("a", 600, now_ms=100_000)                        # a slow answer after the isolation ended
    assert not f.available("a", 129_999) and f.available("a", 130_000)


def test_isolation_ignores_the_measured_latency_and_counts_as_30_s_of_it():
    f = LatencyFaultTolerance()
    f.update("fast-fail", 1, now_ms=1000, isolation=True)
    f.update("slow-fail", 99_999, now_ms=1000, isolation=True)
    for b in ("fast-fail", "slow-fail"):
        assert not f.available(b, 1000 + ISOLATION_MS - 1) and f.available(b, 1000 + ISOLATION_MS)
    assert ISOLATION_MS == 30_000
    f.update("slow-ok", 29_000, now_ms=0)                     # avoided 10 min: until 600 000
    assert f.least_bad(["slow-fail", "slow-ok"]) == "slow-fail"     # sooner available wins first
    # Available at the same time as the isolated broker (31 000) with 29 000 ms < 30 000 ms of
    # latency: the isolation counts as 30 s of latency, so this one is less bad.
    f.update("slow-ok2", 29_000, now_ms=1000 + ISOLATION_MS - 600_000)
    assert f.least_bad(["fast-fail", "slow-ok2"]) == "slow-ok2"


def test_least_bad_orders_by_availability_then_latency_then_name():
    f = LatencyFaultTolerance()
    f.update("c", 700, now_ms=0)                              # available from 30 000, latency 700
    f.update("b", 600, now_ms=0)                              # available from 30 000, latency 600
    f.update("a", 600, now_ms=0)                              # same as b: the name decides
    f.update("d", 1500, now_ms=-40_000)                       # available from 20 000: soonest
    assert f.least_bad(["c", "b", "a", "d"]) == "d"
    assert f.least_bad(["c", "b", "a"]) == "a"
    assert f.least_bad(["c", "b"]) == "b"
    assert f.least_bad(["b", "a"]) == f.least_bad(["a", "b"]) == "a"


# -- queue choice ------------------------------------------------------------------------------------------
def test_without_a_fault_table_the_choice_is_plain_round_robin_from_any_index():
    for index in (-5, -1, 0, 3, 4, 10 ** 9 + 1):
        assert select_queue(QUEUES, index, None, 0) == QUEUES[index % 4]


def test_unavailable_brokers_are_skipped_in_round_robin_order():
    three = [MessageQueue("T", b, 0) for b in ("a", "b", "c")]
    f = LatencyFaultTolerance()
    f.update("b", 5000, now_ms=0)
    assert [select_queue(three, i, f, 1).broker for i in range(3)] == ["a", "c", "c"]
    f.update("c", 5000, now_ms=0)
    assert [select_queue(three, i, f, 1).broker for i in range(3)] == ["a", "a", "a"]


def test_a_retry_avoids_the_failed_broker_even_when_the_others_are_unavailable():
    f = LatencyFaultTolerance()
    f.update("broker-b", 1200, now_ms=0)                      # b is slow and unavailable; a is fine
    picks = [select_queue(QUEUES, i, f, 10, last_failed_broker="broker-a") for i in range(4)]
    assert {q.broker for q in picks} == {"broker-b"}
    assert [q.queue_id for q in picks] == [0, 1, 0, 1]        # round-robin within the least bad


def test_a_failed_broker_that_is_the_only_one_is_still_tried_round_robin():
    only_a = [MessageQueue("T", "a", q) for q in range(3)]
    f = LatencyFaultTolerance()
    f.update("a", 0, now_ms=0, isolation=True)
    assert [select_queue(only_a, i, f, 1, last_failed_broker="a").queue_id for i in range(4)] == [0, 1, 2, 0]
    assert [select_queue(only_a, i, None, 1, last_failed_broker="a").queue_id for i in range(3)] == [0, 1, 2]


def _reference_choice(queues, index, unavailable, failed):
    """What select_queue must return when some queue is eligible (written from the docstring)."""
    n = len(queues)
    others_exist = any(q.broker != failed for q in queues)
    for i in range(n):
        q = queues[(index + i) % n]
        if (q.broker != failed or not others_exist) and q.broker not in unavailable:
            return q
    return None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 3)), min_size=1, max_size=10, unique=True),
       st.integers(-50, 50), st.dictionaries(st.sampled_from("abcd"), st.integers(0, 20_000)),
       st.one_of(st.none(), st.sampled_from("abcd")), st.integers(0, 200_000))
def test_queue_choice_matches_the_documented_rule(qs, index, latencies, failed, now_ms):
    queues = [MessageQueue("T", b, q) for b, q in qs]
    f = LatencyFaultTolerance()
    for b, lat in latencies.items():
        f.update(b, lat, now_ms=0)
    unavailable = {b for b, lat in latencies.items() if now_ms < not_available_ms(lat)}
    got = select_queue(queues, index, f, now_ms, last_failed_broker=failed)
    assert got in queues
    expected = _reference_choice(queues, index, unavailable, failed)
    if expected is not None:
        assert got == expected
    else:                                  # every candidate is unavailable: one of the least bad's queues
        candidates = {q.broker for q in queues if q.broker != failed} or {q.broker for q in queues}
        assert got.broker in candidates
        soonest = min(not_available_ms(latencies[b]) for b in candidates)
        assert not_available_ms(latencies[got.broker]) == soonest
        mine = [q for q in queues if q.broker == got.broker]
        assert got == mine[index % len(mine)]
