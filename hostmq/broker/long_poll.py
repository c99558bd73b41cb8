"""Held pulls (RocketMQ ``PullRequestHoldService``): which long polls wait for which queue, until when,
and how many each client has — bounded per client and in total.

A pull that finds nothing with ``suspend_ms`` > 0 is *held*: the broker answers it when its queue's
max offset passes the pull's offset, or when its hold time is up. The index makes both cheap::

    by_queue   (topic, queue_id) -> heap of (offset, seq)    who waits for a queue, lowest offset first
    deadlines  heap of (deadline_s, seq)                     whose hold ends first
    live       seq -> HeldPull                               the holds themselves
    clients    client -> number of holds                     the caps

so a queue that moved costs O(pulls it answers · log n), expiry O(expired · log n), and nothing is
looked at while nothing happens. Heaps delete lazily and are rebuilt when stale entries outnumber
live ones, so memory stays O(live holds).

Caps: a client (one zmq connection) holds at most ``per_client_max`` pulls and the broker
``total_max`` (RocketMQ's pop long polling has the same pair, ``popPollingSize`` /
``maxPopPollingSize``); past either, :meth:`HeldPulls.hold` raises BrokerBusyError, which the client
gets as a SYSTEM_BUSY answer. An immediate empty answer was the other choice (RocketMQ answers
POLLING_FULL there); a busy error says which bound was hit and makes a client back off instead of
re-polling in a loop.

Pure: no I/O, no clock reads (callers pass ``now_s``); owned by the broker's control loop.
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Any

from ..errors import BrokerBusyError

QueueKey = tuple[str, int]


@dataclass(eq=False)
class HeldPull:
    client: bytes           # the zmq identity of the connection that asked
    key: QueueKey
    offset: int             # the queue offset the pull asked for
    deadline_s: float
    token: Any              # how to answer (transport.ReplyToken)
    request: Any            # what to read again (protocol.messages.PullRequest)
    seq: int = 0


class HeldPulls:
    """The held pulls of one broker."""

    def __init__(self, per_client_max: int, total_max: int) -> None:
        self.per_client_max = per_client_max
        self.total_max = total_max
        self._seq = itertools.count(1)
        self._live: dict[int, HeldPull] = {}
        self._by_queue: dict[QueueKey, list[tuple[int, int]]] = {}
        self._queue_live: dict[QueueKey, int] = {}
        self._deadlines: list[tuple[float, int]] = []
        self._clients: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._live)

    def count(self, client: bytes) -> int:
        return self._clients.get(client, 0)

    def has_queue(self, key: QueueKey) -> bool:
        return key in self._queue_live

    def queues(self) -> list[QueueKey]:
        """Every queue with at least one held pull."""
        return list(self._queue_live)

    def hold(self, h: HeldPull) -> None:
        """Hold ``h``; BrokerBusyError (nothing held) if its client or the broker is at its cap."""
        mine = self._clients.get(h.client, 0)
        if mine >= self.per_client_max:
            raise BrokerBusyError(f"this client already has {mine} pulls held (max_held_pulls_per_client "
                                  f"{self.per_client_max}); wait for their answers before holding more")
        if len(self._live) >= self.total_max:
            raise BrokerBusyError(f"the broker holds {len(self._live)} pulls (max_held_pulls "
                                  f"{self.total_max}); retry later")
        h.seq = next(self._seq)
        self._live[h.seq] = h
        self._clients[h.client] = mine + 1
        heapq.heappush(self._by_queue.setdefault(h.key, []), (h.offset, h.seq))
        self._queue_live[h.key] = self._queue_live.get(h.key, 0) + 1
        heapq.heappush(self._deadlines, (h.deadline_s, h.seq))

    def waiting_below(self, key: QueueKey, max_offset: int, limit: int) -> list[HeldPull]:
        """Remove and return up to ``limit`` pulls of ``key`` whose offset is below ``max_offset``
        (they now find a message), lowest offset first."""
        heap = self._by_queue.get(key)
        out: list[HeldPull] = []
        while heap and len(out) < limit and heap[0][0] < max_offset:
            _, seq = heapq.heappop(heap)
            h = self._live.get(seq)
            if h is not None:
                self._forget(h, from_queue=True)
                out.append(h)
        if key not in self._queue_live:
            self._by_queue.pop(key, None)
        return out

    def expired(self, now_s: float, limit: int) -> list[HeldPull]:
        """Remove and return up to ``limit`` pulls whose hold time is up, earliest first."""
        out: list[HeldPull] = []
        while self._deadlines and len(out) < limit and self._deadlines[0][0] <= now_s:
            _, seq = heapq.heappop(self._deadlines)
            h = self._live.get(seq)
            if h is not None:
                self._forget(h, from_queue=False)
                out.append(h)
        return out

    def drain(self) -> list[HeldPull]:
        """Remove and return every held pull (broker stopping)."""
        out = list(self._live.values())
        self.__init__(self.per_client_max, self.total_max)
        return out

    def _forget(self, h: HeldPull, *, from_queue: bool) -> None:
        """Drop ``h`` from the tables; its entry in the heap it was popped from is gone already, the
        one in the other heap goes stale (a heap is rebuilt when stale entries outnumber live ones)."""
        del self._live[h.seq]
        left = self._clients[h.client] - 1
        if left:
            self._clients[h.client] = left
        else:
            del self._clients[h.client]
        left = self._queue_live[h.key] - 1
        if not left:
            del self._queue_live[h.key]
            if not from_queue:
                self._by_queue.pop(h.key, None)
            return
        self._queue_live[h.key] = left
        heap = self._by_queue.get(h.key)
        if not from_queue and heap is not None and len(heap) > 2 * left + 64:
            fresh = [(o, s) for o, s in heap if s in self._live]
            heapq.heapify(fresh)
            self._by_queue[h.key] = fresh
        if from_queue and len(self._deadlines) > 2 * len(self._live) + 64:
            self._deadlines = [(x.deadline_s, x.seq) for x in self._live.values()]
            heapq.heapify(self._deadlines)


__all__ = ["HeldPull", "HeldPulls", "QueueKey"]
