"""Queue choice for sending and RocketMQ's latency fault strategy (``MQFaultStrategy``), pure.

A broker whose send failed, or answered slowly, is avoided for a while: a failure isolates it for
30 s; a latency of at least 550 ms / 1 s / 2 s / 3 s / 15 s for 30 s / 1 min / 2 min / 3 min /
10 min. Queue choice is round-robin over the topic's writable queues, skipping unavailable brokers
(and, on a retry, the broker that just failed); when every broker is unavailable the least bad one
is used anyway, so a send is always attempted. Time is an argument (``now_ms``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..message import MessageQueue

LATENCY_MAX_MS = (50, 100, 550, 1000, 2000, 3000, 15000)
NOT_AVAILABLE_MS = (0, 0, 30000, 60000, 120000, 180000, 600000)
ISOLATION_MS = 30_000


def not_available_ms(latency_ms: float) -> int:
    """How long a broker that answered in ``latency_ms`` is avoided (RocketMQ ``computeNotAvailableDuration``)."""
    for i in range(len(LATENCY_MAX_MS) - 1, -1, -1):
        if latency_ms >= LATENCY_MAX_MS[i]:
            return NOT_AVAILABLE_MS[i]
    return 0


@dataclass
class _FaultItem:
    latency_ms: float
    available_from_ms: float


class LatencyFaultTolerance:
    """Per-broker latency and the time it becomes available again."""

    def __init__(self) -> None:
        self.items: dict[str, _FaultItem] = {}

    def update(self, broker: str, latency_ms: float, now_ms: float, isolation: bool = False) -> None:
        if not isolation and latency_ms < LATENCY_MAX_MS[2]:
            item = self.items.get(broker)
            if item is not None:        # the usual answer, below every isolating latency: noted in place
                item.latency_ms, item.available_from_ms = latency_ms, now_ms
                return
        duration = ISOLATION_MS if isolation else not_available_ms(latency_ms)
        self.items[broker] = _FaultItem(ISOLATION_MS if isolation else latency_ms, now_ms + duration)

    def available(self, broker: str, now_ms: float) -> bool:
        item = self.items.get(broker)
        return item is None or now_ms >= item.available_from_ms

    def least_bad(self, brokers: Sequence[str]) -> str | None:
        """The broker to use when none is available: soonest available, then lowest latency."""
        known = [b for b in brokers if b in self.items]
        if not known:
            return brokers[0] if brokers else None
        return min(known, key=lambda b: (self.items[b].available_from_ms, self.items[b].latency_ms, b))


def select_queue(queues: Sequence[MessageQueue], index: int, fault: LatencyFaultTolerance | None,
                 now_ms: float, last_failed_broker: str | None = None) -> MessageQueue:
    """The queue to send to: round-robin from ``index``, skipping unavailable brokers and the one that
    just failed; if every queue is skipped, the least bad broker's next queue."""
    n = len(queues)
    if n == 0:
        raise ValueError("no queue to choose from")
    for i in range(n):
        mq = queues[(index + i) % n]
        if mq.broker == last_failed_broker and any(q.broker != last_failed_broker for q in queues):
            continue
        if fault is None or fault.available(mq.broker, now_ms):
            return mq
    brokers = sorted({q.broker for q in queues if q.broker != last_failed_broker}) or sorted({q.broker for q in queues})
    best = fault.least_bad(brokers) if fault is not None else brokers[0]
    mine = [q for q in queues if q.broker == best]
    return mine[index % len(mine)]
