"""Orderly consumption for the asyncio push consumer: the sync ``ConsumeMessageOrderlyService``
(queue locks on the brokers, taken over and let go by the pull thread) whose per-queue task is a
task on the loop.

As in the sync consumer, one task per locked queue runs the listener on that queue's messages one
batch at a time, in queue order; on ``RECONSUME_LATER`` (or an exception) the queue is suspended for
``retry_delay_s`` and the same messages are consumed again, up to ``max_reconsume_times``; then they
go to the DLQ and the queue goes on. The state (``pending``, ``running``, ``locked``) is the sync
service's, guarded by the consumer's lock; the pull thread reads it as before.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..client.consume_service import ConsumeOrderlyContext
from ..client.orderly import ConsumeMessageOrderlyService
from ..client.process_queue import ProcessQueue
from ..client.push_consumer import PushConsumer as _SyncPushConsumer
from ..message import MessageQueue

if TYPE_CHECKING:
    from .push_consumer import PushConsumer


class AsyncOrderly(ConsumeMessageOrderlyService):
    def __init__(self, consumer: _SyncPushConsumer, front: "PushConsumer") -> None:
        super().__init__(consumer)
        self.front = front

    def _kick(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        """Start the queue's task on the loop unless one runs (pull thread or loop)."""
        if self._claim(mq, pq) and not self.front.call_soon(self.front.start_orderly, self, mq, pq):
            self.stopped(mq)

    def stopped(self, mq: MessageQueue) -> None:
        with self.c.lock:
            self.running.discard(mq)

    async def consume(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        """The queue's task: its pending messages through the listener, in order."""
        try:
            attempts = 0
            while True:
                taken = self.next_batch(mq, pq)
                if taken is None:
                    return
                pending, batch = taken
                ctx = ConsumeOrderlyContext(mq)
                attempts, pause_s = self.after(await self.front.consume_one(batch, ctx), attempts, mq, pending,
                                               pq, batch, ctx)
                if pause_s:
                    await self.front.pause(pause_s)     # suspend the queue, then the same again
        finally:
            self.stopped(mq)
            if not self.c.stopping.is_set():
                self._kick(mq, pq)          # messages that came while the task was leaving
