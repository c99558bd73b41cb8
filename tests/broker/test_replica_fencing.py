"""Fencing by epoch at a slave (``broker/replica.py`` ``follow_decision``, issue 27), pure: which
proven masters a slave follows, and which cuts of its log it takes."""
from __future__ import annotations

import pytest

from hostmq.broker.replica import follow_decision
from hostmq.errors import FencedError

pytestmark = pytest.mark.timeout(30)


def decide(epoch, truncate_to=None, *, end=1000, seen=0, acked=0, own=0, accept=False):
    return follow_decision(epoch, truncate_to, end, seen, acked, own, accept)


@pytest.mark.parametrize("epoch,seen,own", [(0, 1, 0), (1, 2, 0), (1, 0, 2), (0, -1, 1)])
def test_a_master_older_than_the_slave_follows_is_refused(epoch, seen, own):
    with pytest.raises(FencedError, match="older than epoch") as e:
        decide(epoch, seen=seen, own=own)
    assert e.value.epoch == epoch and e.value.newest == max(seen, own)


def test_a_master_of_the_same_or_a_newer_epoch_is_followed_from_the_slaves_end():
    assert decide(0) is None and decide(3, seen=2) is None
    assert decide(1, truncate_to=1000) is None and decide(1, truncate_to=5000) is None   # nothing to cut


def test_a_cut_is_taken_only_from_a_strictly_newer_epoch():
    assert decide(1, truncate_to=400, seen=0) == 400
    assert decide(0, truncate_to=400, seen=-1) == 400           # a slave that never followed a master
    with pytest.raises(FencedError, match="not newer than epoch 1"):
        decide(1, truncate_to=400, seen=1)                      # the same master, or a forger of its epoch


def test_a_cut_never_goes_below_what_a_sync_master_was_told_without_the_operator():
    with pytest.raises(FencedError, match="acknowledged up to 600"):
        decide(2, truncate_to=400, seen=1, acked=600)
    assert decide(2, truncate_to=600, seen=1, acked=600) == 600     # down to the ack itself: nothing acked lost
    assert decide(2, truncate_to=400, seen=1, acked=600, accept=True) == 400
    assert decide(1, truncate_to=400, seen=1, accept=True) == 400


def test_the_fence_refuses_an_old_master_even_with_the_operators_flag():
    with pytest.raises(FencedError):
        decide(0, truncate_to=0, seen=1, accept=True)
