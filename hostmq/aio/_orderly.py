"""Orderly consumption for the asyncio push consumer: the sync ``OrderlyService`` (queue locks on
the brokers, taken over and let go by the pull thread) whose per-queue task is a task on the loop.

As in the sync consumer, one task per locked queue runs the listener on that queue's messages one
batch at a time, in queue order; on ``RECONSUME_LATER`` (or an exception) the queue is suspended for
``retry_delay_s`` and the same messages are consumed again, up to ``max_reconsume_times``; then they
go to the DLQ and the queue goes on. The state (``pending``, ``running``, ``locked``) is the sync
service's, guarded by the consumer's lock; the pull thread reads it as before.
"""
from __future__ import annotations

import collections
from typing import TYPE_CHECKING

from ..client.orderly import DLQ_LEVEL, OrderlyService
from ..client.process_queue import ProcessQueue
from ..client.push_consumer import PushConsumer as _SyncPushConsumer
from ..message import ConsumeResult, MessageExt, MessageQueue

if TYPE_CHECKING:
    from .push_consumer import PushConsumer


class AsyncOrderly(OrderlyService):
    def __init__(self, consumer: _SyncPushConsumer, front: "PushConsumer") -> None:
        super().__init__(consumer)
        self.front = front

    def _kick(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        """Start the queue's task on the loop unless one runs (pull thread or loop)."""
        if self._claim(mq, pq) and not self.front.call_soon(self.front._start_orderly, self, mq, pq):
            self.stopped(mq)

    def stopped(self, mq: MessageQueue) -> None:
        with self.c.lock:
            self.running.discard(mq)

    async def consume(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        """The queue's task: its pending messages through the listener, in order."""
        try:
            attempts = 0
            while True:
                taken = self._next_batch(mq, pq)
                if taken is None:
                    return
                pending, batch = taken
                if await self.front._consume_one(batch) == ConsumeResult.SUCCESS:
                    attempts = 0
                    self._done(pending, pq, batch)
                    continue
                attempts += 1
                if attempts > self.c.max_reconsume_times:
                    # given up: to the DLQ, and the queue goes on in order after it
                    self._done(pending, pq, batch, dead=True)
                    attempts = 0
                    continue
                await self.front.pause(self.c.retry_delay_s)   # suspend the queue, then the same again
        finally:
            self.stopped(mq)
            if not self.c.stopping.is_set():
                self._kick(mq, pq)          # messages that came while the task was leaving

    def _next_batch(self, mq: MessageQueue, pq: ProcessQueue) -> tuple[collections.deque, list[MessageExt]] | None:
        """The queue's pending deque (this one: a take-over replaces it) and its next batch."""
        c = self.c
        with c.lock:
            pending = self.pending.get(mq)
            if pq.dropped or c.stopping.is_set() or not pending or mq not in self.locked:
                return None
            return pending, [pending[i] for i in range(min(c.batch_size, len(pending)))]

    def _done(self, pending: collections.deque, pq: ProcessQueue, batch: list[MessageExt], dead: bool = False) -> None:
        c = self.c
        with c.lock:
            for _ in batch:
                pending.popleft()
            if not dead:
                pq.remove([m.queue_offset for m in batch])
        if dead:        # its offset is committed past the batch once the send-back is stored
            c.failed.put((pq, batch, DLQ_LEVEL))

