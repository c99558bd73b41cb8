"""Flush policy as pure functions (RocketMQ FlushRealTimeService / GroupCommitService).

The flusher process (and the embedded store, inline) asks :func:`async_flush_pages` each time it
wakes; SYNC_FLUSH callers wait in a :class:`GroupCommit`, answered together by one fsync.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AsyncFlushState:
    last_flush_ms: float = 0.0
    last_thorough_ms: float = 0.0


def async_flush_pages(now_ms: float, state: AsyncFlushState, interval_ms: float, least_pages: int,
                      thorough_interval_ms: float) -> int | None:
    """How many dirty pages must be waiting for a flush to be worth it now, or None to sleep on.

    Every ``interval_ms`` flush if at least ``least_pages`` are dirty; every
    ``thorough_interval_ms`` flush whatever is dirty (0 pages), so a trickle never waits forever.
    """
    if now_ms - state.last_flush_ms < interval_ms:
        return None
    state.last_flush_ms = now_ms
    if now_ms - state.last_thorough_ms >= thorough_interval_ms:
        state.last_thorough_ms = now_ms
        return 0
    return least_pages


@dataclass(order=True)
class FlushRequest:
    """A SYNC_FLUSH send waiting until the commitlog is durable up to ``next_offset``."""

    next_offset: int
    deadline_ms: float
    token: object = field(compare=False, default=None)


class GroupCommit:
    """Requests collected while one fsync runs; each answered once its offset is durable."""

    def __init__(self) -> None:
        self.waiting: list[FlushRequest] = []

    def add(self, req: FlushRequest) -> None:
        self.waiting.append(req)

    def needed_offset(self) -> int:
        """The offset the next flush must reach to answer everyone waiting (0 if nobody waits)."""
        return max((r.next_offset for r in self.waiting), default=0)

    def complete(self, flushed_offset: int, now_ms: float) -> tuple[list[FlushRequest], list[FlushRequest]]:
        """Split the waiters into (done: flushed far enough, timed_out: past their deadline)."""
        done, late, keep = [], [], []
        for r in self.waiting:
            if r.next_offset <= flushed_offset:
                done.append(r)
            elif now_ms >= r.deadline_ms:
                late.append(r)
            else:
                keep.append(r)
        self.waiting = keep
        return done, late
