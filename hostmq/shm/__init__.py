"""Shared-memory building blocks of the data path (DESIGN §2, §5).

* :mod:`.segment` — named POSIX shared-memory segments with an owner header; liveness; reclaim.
* :mod:`.ring` — the ingress ring: a producer's frames to the writer, completions back.
* :mod:`.signal` — named semaphores as wake-up signals, spin-then-block waits.

Names come from :func:`hostmq.root.shm_name` (``/hostmq.<hash12>.<kind>.<n>``); a ring's
completion signal carries the ring's own name (semaphores live in a separate namespace).
"""
from .ring import DEFAULT_COMPLETION_ENTRIES, DEFAULT_DATA_BYTES, Frame, FrameBatch, IngressRing
from .segment import (Segment, SegmentInfo, list_segments, list_semaphores, read_info, reclaim_stale,
                      shm_free_bytes, unlink_semaphore, unlink_segment)
from .signal import Flag, Signal, WaitStats, fence, notify_if_waiting, wait_for

__all__ = [
    "Segment", "SegmentInfo", "list_segments", "list_semaphores", "read_info", "reclaim_stale",
    "unlink_segment", "unlink_semaphore", "shm_free_bytes",
    "IngressRing", "Frame", "FrameBatch", "DEFAULT_DATA_BYTES", "DEFAULT_COMPLETION_ENTRIES",
    "Signal", "Flag", "WaitStats", "wait_for", "notify_if_waiting", "fence",
]
