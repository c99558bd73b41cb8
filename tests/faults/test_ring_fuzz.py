"""The hostile-producer fuzzer's short run (the full run is ``hostmq faults --fuzz-cases``)."""
from __future__ import annotations

import random

import pytest

from hostmq import records as R
from hostmq.faults import ring_fuzz

pytestmark = pytest.mark.timeout(300)


def test_every_case_kind_is_made_and_each_is_a_frame_the_ring_accepts():
    rng = random.Random(3)
    kinds = set()
    for _ in range(500):
        kind, fkind, count, payload, what = ring_fuzz.make_case(rng)
        kinds.add(kind)
        assert fkind in (R.FRAME_MESSAGE, R.FRAME_BATCH) and count >= 1 and payload and what
    assert kinds == {"honest", "flip", "batch", "size", "topic", "props", "random", "queue", "race", "header"}


def test_a_short_run_finds_no_failure(tmp_path):
    (result,) = ring_fuzz.run(str(tmp_path), 400, seed=11)
    assert result.kind == "ring" and result.cases == 400
    assert result.failures == []
