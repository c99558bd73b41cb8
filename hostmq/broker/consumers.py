"""Who is in each consumer group, as one broker sees it (RocketMQ ``ConsumerManager``), pure.

Clients heartbeat to every broker of their topics with their consumer groups; a client leaves a
group when it unregisters, when its process is gone (same host: its pid is checked every second,
so a killed consumer's queues move at the next rebalance) or when it has been silent for the
channel expiry. Every change of a group's member list is returned to the caller, which bumps the
state segment's ``consumers_version`` word: members watch it and rebalance at once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass
class _Client:
    last_seen_s: float
    pid: int
    producer_groups: frozenset[str]
    consumer_groups: frozenset[str]


class ConsumerTable:
    def __init__(self) -> None:
        self.clients: dict[str, _Client] = {}

    def heartbeat(self, client_id: str, pid: int, producer_groups, consumer_groups, now_s: float) -> set[str]:
        """Record a heartbeat; the groups whose member list changed."""
        old = self.clients.get(client_id)
        new = _Client(now_s, pid, frozenset(producer_groups), frozenset(consumer_groups))
        self.clients[client_id] = new
        return set(new.consumer_groups) if old is None else set(old.consumer_groups ^ new.consumer_groups)

    def unregister(self, client_id: str) -> set[str]:
        old = self.clients.pop(client_id, None)
        return set(old.consumer_groups) if old is not None else set()

    def expire(self, now_s: float, expiry_s: float, alive: Callable[[int], bool]) -> set[str]:
        """Drop clients silent past ``expiry_s`` or whose process is gone; the groups that changed."""
        changed: set[str] = set()
        for cid, c in list(self.clients.items()):
            if now_s - c.last_seen_s > expiry_s or (c.pid > 0 and not alive(c.pid)):
                changed |= self.unregister(cid)
        return changed

    def members(self, group: str) -> list[str]:
        """Client ids in ``group``, sorted (what every member allocates over)."""
        return sorted(cid for cid, c in self.clients.items() if group in c.consumer_groups)

    def groups(self) -> list[str]:
        return sorted({g for c in self.clients.values() for g in c.consumer_groups})

    def __len__(self) -> int:
        return len(self.clients)
