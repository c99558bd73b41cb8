"""What a push consumer holds of one queue (RocketMQ ``ProcessQueue``), pure.

Messages fetched but not yet consumed are held here by queue offset. The offset that is safe to
commit is the lowest offset still held (everything below it is consumed), or the next offset to
fetch when nothing is held — so a crash re-delivers only messages whose listener had not finished
(at-least-once), never skips one. Flow control reads ``count`` and ``size_bytes``.
"""
from __future__ import annotations

import heapq
from typing import NamedTuple


class _Held(NamedTuple):
    """What ``hold`` reads of a fetched message."""

    queue_offset: int
    store_size: int


class ProcessQueue:
    def __init__(self, next_offset: int) -> None:
        self.held: dict[int, int] = {}         # queue offset → message bytes
        self._heap: list[int] = []             # offsets, lazily pruned
        self.size_bytes = 0
        self.next_offset = next_offset          # one past the last offset fetched
        self.dropped = False                    # the queue moved to another member: stop work on it

    @property
    def count(self) -> int:
        return len(self.held)

    def add(self, offsets_and_sizes, next_offset: int) -> None:
        """``hold`` of (queue offset, stored size) pairs."""
        self.hold([_Held(off, size) for off, size in offsets_and_sizes], next_offset)

    def hold(self, msgs, next_offset: int) -> None:
        """``add`` of fetched messages (each one's ``queue_offset`` and ``store_size``)."""
        held, heap = self.held, self._heap
        for m in msgs:
            off = m.queue_offset
            if off not in held:
                size = held[off] = m.store_size
                self.size_bytes += size
                heapq.heappush(heap, off)
        if next_offset > self.next_offset:
            self.next_offset = next_offset

    def remove(self, offsets) -> int:
        """Mark consumed; the offset now safe to commit."""
        for off in offsets:
            size = self.held.pop(off, None)
            if size is not None:
                self.size_bytes -= size
        return self.safe_offset()

    def safe_offset(self) -> int:
        heap = self._heap
        while heap and heap[0] not in self.held:
            heapq.heappop(heap)
        return heap[0] if heap else self.next_offset

    def is_full(self, max_count: int, max_bytes: int) -> bool:
        return self.count >= max_count or self.size_bytes >= max_bytes
