"""The held-pull index (hostmq.broker.long_poll): pure, time passed in."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hostmq.broker.long_poll import HeldPull, HeldPulls
from hostmq.errors import BrokerBusyError

pytestmark = pytest.mark.timeout(60)


def pull(client=b"c1", key=("t", 0), offset=5, deadline_s=10.0, tag=None) -> HeldPull:
    return HeldPull(client, key, offset, deadline_s, token=tag, request=None)


def test_caps_per_client_and_in_total_refuse_with_busy_and_hold_nothing():
    held = HeldPulls(per_client_max=2, total_max=3)
    held.hold(pull(b"a"))
    held.hold(pull(b"a"))
    with pytest.raises(BrokerBusyError, match="max_held_pulls_per_client 2"):
        held.hold(pull(b"a"))
    held.hold(pull(b"b"))
    with pytest.raises(BrokerBusyError, match="max_held_pulls 3"):
        held.hold(pull(b"c"))
    assert len(held) == 3 and held.count(b"a") == 2 and held.count(b"c") == 0
    held.expired(100.0, 1)
    held.hold(pull(b"c"))                      # a freed place can be taken again
    assert len(held) == 3


def test_a_queue_that_moved_answers_only_the_pulls_below_its_max_lowest_first():
    held = HeldPulls(100, 100)
    for off in (7, 3, 5, 9):
        held.hold(pull(offset=off, tag=off))
    held.hold(pull(key=("t", 1), offset=0, tag="other queue"))
    assert [h.token for h in held.waiting_below(("t", 0), 6, limit=10)] == [3, 5]
    assert [h.token for h in held.waiting_below(("t", 0), 10, limit=1)] == [7]
    assert sorted(held.queues()) == [("t", 0), ("t", 1)] and len(held) == 2
    assert held.waiting_below(("nope", 0), 10, 10) == []


def test_expiry_is_earliest_first_and_bounded_per_call():
    held = HeldPulls(100, 100)
    for d in (3.0, 1.0, 2.0, 50.0):
        held.hold(pull(deadline_s=d, tag=d))
    assert [h.token for h in held.expired(2.5, limit=1)] == [1.0]
    assert [h.token for h in held.expired(2.5, limit=10)] == [2.0]
    assert held.expired(2.5, 10) == [] and len(held) == 2
    assert {h.token for h in held.drain()} == {3.0, 50.0} and len(held) == 0 and held.queues() == []


def test_churn_keeps_the_heaps_small():
    """A client that keeps one queue's pulls expiring and re-holding never grows the index."""
    held = HeldPulls(1000, 1000)
    now = 0.0
    for _ in range(200):
        for i in range(50):
            held.hold(pull(offset=1_000_000, deadline_s=now + 1.0))
        held.hold(pull(key=("t", 1), offset=0, deadline_s=now + 0.5))
        held.waiting_below(("t", 1), 1, 10)      # answered by arrival: a stale deadline entry stays
        now += 2.0
        assert len(held.expired(now, 1000)) == 50
    assert len(held) == 0
    assert len(held._deadlines) <= 200 and sum(map(len, held._by_queue.values())) <= 200


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["hold", "move", "expire"]), st.integers(0, 3), st.integers(0, 20)),
                max_size=80))
def test_random_operations_agree_with_a_plain_list(ops):
    """Model check: the index answers exactly what scanning a list of every held pull would."""
    held, model = HeldPulls(6, 15), []
    clients = [b"a", b"b", b"c"]
    for op, q, n in ops:
        key = ("t", q)
        if op == "hold":
            h = pull(clients[n % 3], key, n, float(n))
            mine = sum(1 for m in model if m.client == h.client)
            if mine >= 6 or len(model) >= 15:
                with pytest.raises(BrokerBusyError):
                    held.hold(h)
            else:
                held.hold(h)
                model.append(h)
        elif op == "move":
            want = sorted((m for m in model if m.key == key and m.offset < n), key=lambda m: (m.offset, m.seq))[:3]
            got = held.waiting_below(key, n, 3)
            assert [g.seq for g in got] == [w.seq for w in want]
            model = [m for m in model if m not in got]
        else:
            want = sorted((m for m in model if m.deadline_s <= n), key=lambda m: (m.deadline_s, m.seq))[:4]
            got = held.expired(float(n), 4)
            assert [g.seq for g in got] == [w.seq for w in want]
            model = [m for m in model if m not in got]
        assert len(held) == len(model)
        assert sorted(held.queues()) == sorted({m.key for m in model})
