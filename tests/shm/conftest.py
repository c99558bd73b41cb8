"""Fixtures of the shared-memory tests: a real segment (``seg``, under the test's own ``shm`` names)
and its first 256 bytes as int64 words (``words``) — flags and futex words live in shared memory."""
from __future__ import annotations

import pytest

from hostmq.shm import Segment


@pytest.fixture
def seg(shm):
    s = Segment.create(shm.name("words"), 4096, "words", 1)
    yield s
    s.close()
    s.unlink()


@pytest.fixture
def words(seg):
    w = seg.buf[:256].cast("q")
    yield w
    w.release()
