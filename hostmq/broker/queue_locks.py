"""Broker-side queue locks for orderly consumption (RocketMQ ``RebalanceLockManager``), pure.

A member of a group that consumes in order locks each of its queues on the queue's broker before it
consumes from it, and renews the lock every 20 s; a lock not renewed for 60 s expires, and the
locks of a member whose process is gone are released at once (same host), so another member takes
the queue over without two members ever consuming it at the same time. Time is an argument.
"""
from __future__ import annotations

LOCK_EXPIRY_S = 60.0            # RocketMQ rocketmq.broker.rebalance.lockMaxLiveTime


class QueueLocks:
    def __init__(self, expiry_s: float = LOCK_EXPIRY_S) -> None:
        self.expiry_s = expiry_s
        self.locks: dict[tuple[str, str, int], tuple[str, float]] = {}   # (group, topic, qid) → (client, until)

    def lock(self, group: str, client_id: str, queues, now_s: float) -> list[tuple[str, int]]:
        """Lock (or renew) what is free, expired or already ours; the queues now held by ``client_id``."""
        held = []
        for topic, qid in queues:
            key = (group, topic, qid)
            owner = self.locks.get(key)
            if owner is None or owner[0] == client_id or owner[1] <= now_s:
                self.locks[key] = (client_id, now_s + self.expiry_s)
                held.append((topic, qid))
        return held

    def unlock(self, group: str, client_id: str, queues) -> None:
        for topic, qid in queues:
            key = (group, topic, qid)
            if self.locks.get(key, ("",))[0] == client_id:
                del self.locks[key]

    def release_client(self, client_id: str) -> int:
        """Drop every lock of a client that left or died; how many."""
        gone = [k for k, (c, _) in self.locks.items() if c == client_id]
        for k in gone:
            del self.locks[k]
        return len(gone)

    def owner(self, group: str, topic: str, qid: int, now_s: float) -> str | None:
        o = self.locks.get((group, topic, qid))
        return o[0] if o is not None and o[1] > now_s else None
