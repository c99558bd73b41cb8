"""A push consumer's per-queue hold: the safe commit offset never passes an unfinished message."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from hostmq.client.process_queue import ProcessQueue

pytestmark = pytest.mark.timeout(60)


def test_safe_offset_is_the_lowest_unfinished_or_the_next_to_fetch():
    pq = ProcessQueue(10)
    assert pq.safe_offset() == 10
    pq.add([(10, 100), (11, 100), (12, 50)], 13)
    assert pq.count == 3 and pq.size_bytes == 250 and pq.safe_offset() == 10
    assert pq.remove([11]) == 10                     # 10 still running: cannot move past it
    assert pq.remove([10]) == 12
    assert pq.remove([12]) == 13 and pq.count == 0 and pq.size_bytes == 0
    pq.add([(13, 1)], 14)
    pq.add([(13, 1)], 14)                            # the same message twice is held once
    assert pq.count == 1 and pq.size_bytes == 1
    assert pq.is_full(1, 10**6) and pq.is_full(100, 1) and not pq.is_full(2, 2)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 60), st.randoms(use_true_random=False))
def test_any_completion_order_commits_exactly_the_finished_prefix(n, rnd):
    pq = ProcessQueue(0)
    pq.add([(i, 1) for i in range(n)], n)
    order = list(range(n))
    rnd.shuffle(order)
    done = set()
    for off in order:
        safe = pq.remove([off])
        done.add(off)
        prefix = 0
        while prefix in done:
            prefix += 1
        assert safe == prefix


class _Fetched:
    """What ``hold`` reads of a fetched MessageExt."""

    def __init__(self, queue_offset: int, store_size: int) -> None:
        self.queue_offset, self.store_size = queue_offset, store_size


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 500)), max_size=8),
                          st.integers(0, 60)), max_size=10))
def test_hold_of_messages_keeps_each_offset_once_with_its_first_size(batches):
    b = ProcessQueue(5)
    held: dict[int, int] = {}
    nxt_max = 5
    for batch, nxt in batches:
        b.hold([_Fetched(o, s) for o, s in batch], nxt)
        for o, s in batch:
            held.setdefault(o, s)
        nxt_max = max(nxt_max, nxt)
        assert (b.held, b.size_bytes, b.next_offset, b.safe_offset()) == \
            (held, sum(held.values()), nxt_max, min(held) if held else nxt_max)
