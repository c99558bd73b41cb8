"""Shared-memory building blocks of the data path (docs/internals.md: processes, shared-memory rules).

* :mod:`.segment` — shared-memory segments with an owner header (named POSIX ones, sealed
  memfds); liveness; reclaim.
* :mod:`.futex` — futex words: wake-ups through shared memory the waiter trusts.
* :mod:`.signal` — waiting flags and spin-then-block waits on futex words.

The ingress ring built on them is :mod:`hostmq.ingress.ring` (layer L3).

Names of named segments come from :func:`hostmq.root.shm_name` (``/hostmq.<hash12>.<kind>.<n>``).
"""
from .futex import FutexWord
from .segment import (Segment, SegmentInfo, list_segments, list_semaphores, read_info, reclaim_stale,
                      shm_free_bytes, unlink_semaphore, unlink_segment)
from .signal import Flag, WaitStats, fence, notify_if_waiting, wait_changed, wait_for

__all__ = [
    "Segment", "SegmentInfo", "list_segments", "list_semaphores", "read_info", "reclaim_stale",
    "unlink_segment", "unlink_semaphore", "shm_free_bytes",
    "FutexWord", "Flag", "WaitStats", "wait_for", "wait_changed", "notify_if_waiting", "fence",
]
