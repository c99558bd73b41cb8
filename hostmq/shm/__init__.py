"""Shared-memory building blocks of the data path (docs/internals.md: processes, shared-memory rules).

* :mod:`.segment` — shared-memory segments with an owner header (named POSIX ones, sealed
  memfds); liveness; reclaim.
* :mod:`.ring` — the ingress ring: a producer's frames to the writer, completions back.
* :mod:`.futex` — futex words: wake-ups through shared memory the waiter trusts.
* :mod:`.signal` — waiting flags and spin-then-block waits on futex words.

Names of named segments come from :func:`hostmq.root.shm_name` (``/hostmq.<hash12>.<kind>.<n>``).
"""
from .ring import DEFAULT_COMPLETION_ENTRIES, DEFAULT_DATA_BYTES, Frame, FrameBatch, IngressRing
from .futex import FutexWord
from .segment import (Segment, SegmentInfo, list_segments, list_semaphores, read_info, reclaim_stale,
                      shm_free_bytes, unlink_semaphore, unlink_segment)
from .signal import Flag, WaitStats, fence, notify_if_waiting, wait_for

__all__ = [
    "Segment", "SegmentInfo", "list_segments", "list_semaphores", "read_info", "reclaim_stale",
    "unlink_segment", "unlink_semaphore", "shm_free_bytes",
    "IngressRing", "Frame", "FrameBatch", "DEFAULT_DATA_BYTES", "DEFAULT_COMPLETION_ENTRIES",
    "FutexWord", "Flag", "WaitStats", "wait_for", "notify_if_waiting", "fence",
]
