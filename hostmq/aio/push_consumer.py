"""The asyncio push consumer: ``async def`` listeners run on the event loop, with the sync push
consumer's guarantees (docs/api.md "Consuming"; RocketMQ ``DefaultMQPushConsumer``, concurrent mode).

The sync push consumer's one pull thread still does everything that talks to brokers — membership
and rebalance, fetching (asleep on the brokers' futex words while idle), flow control, offset
commits, sending failed messages back. Instead of handing batches to a thread pool it hands them to
the loop (``call_soon_threadsafe``: the loop's self-pipe), where each batch's listener runs as a
task; at most ``concurrency`` listeners run at once. A listener returns ``ConsumeResult.SUCCESS`` or
``RECONSUME_LATER``; an exception or another value counts as ``RECONSUME_LATER`` (logged). As in the
sync consumer (CLUSTERING), a failed message is sent back to the broker — ``%RETRY%<group>`` after a
growing back-off, ``%DLQ%<group>`` after ``max_reconsume_times`` retries — and if that fails, or in
BROADCASTING, it is consumed again here after ``retry_delay_s``. Offsets commit per queue the first
message whose listener has not finished: a crash re-delivers only unfinished messages.

``close`` stops fetching, lets running listeners finish (``close_timeout_s``), sends failed ones
back, commits, leaves the group and joins both threads (the pull thread and the worker that
started it). ``register(fn, orderly=True)``: the sync consumer's orderly service (queue locks on the
brokers), its per-queue tasks on the loop (``_orderly``). Both are the sync consumer's consume
services (``client.consume_service``), installed through its ``service_factory``, with a batch's
listener run on the loop; a listener taking ``(msgs, context)`` gets the same consume contexts.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from typing import Any, Awaitable, Callable, cast

from ..client.consume_service import (ConsumeConcurrentlyContext, ConsumeMessageConcurrentlyService,
                                      ConsumeMessageService, ConsumeOrderlyContext)
from ..client.process_queue import ProcessQueue
from ..client.push_consumer import (PushConsumer as _SyncPushConsumer, listener_raised, listener_verdict,
                                    show_original_topics)
from ..errors import ValidationError
from ..message import ConsumeFrom, ConsumeResult, MessageExt, MessageModel, MessageQueue
from ..client.sql92 import SQL
from ._bridge import Worker
from ._orderly import AsyncOrderly

log = logging.getLogger(__name__)

Listener = Callable[[list[MessageExt]], Awaitable[ConsumeResult]]
CLOSE_TIMEOUT_S = 30.0


class _ListenersDone:
    """Stands in for the sync consumer's listener pool: its pull thread, when stopping, waits here
    until the loop has seen its running listeners finish, then sends failed ones back and commits."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def shutdown(self, wait: bool = True) -> None:
        if wait:
            self.event.wait(CLOSE_TIMEOUT_S)


class AsyncConcurrently(ConsumeMessageConcurrentlyService):
    """The sync concurrent consume service whose batches go to the loop (``front``) instead of a
    thread pool, and whose local retries wait there."""

    def __init__(self, consumer: _SyncPushConsumer, front: "PushConsumer") -> None:
        super().__init__(consumer)
        self.front = front

    def submit_batch(self, mq: MessageQueue, pq: ProcessQueue, batch: list[MessageExt], attempt: int) -> None:
        self.front.call_soon(self.front.start_batch, self, mq, pq, batch, attempt)

    def consume_later(self, mq: MessageQueue, pq: ProcessQueue, batch: list[MessageExt], attempt: int) -> None:
        self.front.call_soon(self.front.later, self, mq, pq, batch, attempt)


class PushConsumer:
    """See the module docstring. ``subscribe``, ``register(async_fn)``, then ``async with c`` (or
    ``await c.start()`` … ``await c.close()``)."""

    def __init__(self, root: Any = None, group: str = "DEFAULT_CONSUMER", model: MessageModel = MessageModel.CLUSTERING,
                 consume_from: ConsumeFrom = ConsumeFrom.LAST_OFFSET, consume_timestamp_ms: int | None = None,
                 allocate: Any = "average", max_reconsume_times: int = 16, batch_size: int = 1,
                 concurrency: int = 16, **options: Any) -> None:
        """``options``: the sync consumer's keyword options (``instance_name``, ``pull_batch_size``,
        ``max_held_messages``, ``max_held_bytes``, ``auto_commit_interval_s``, ``rebalance_interval_s``,
        ``heartbeat_interval_s``, ``retry_delay_s``)."""
        if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
            raise ValidationError(f"concurrency must be an int ≥ 1, got {concurrency!r}")
        if "service_factory" in options:
            raise ValidationError("service_factory is this consumer's own (its listeners run on the loop)")
        self._engine = _SyncPushConsumer(root, group, model, consume_from, consume_timestamp_ms, allocate,
                                         max_reconsume_times, batch_size, 1, service_factory=self._service,
                                         **options)
        self.concurrency = concurrency
        self._worker = Worker(f"hostmq-aio-push {group}")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._limit: asyncio.Semaphore | None = None
        self._running: set[asyncio.Task] = set()      # listeners (and batches waiting for a slot)
        self._delayed: set[asyncio.Task] = set()      # local retries waiting for ``retry_delay_s``
        self._done = _ListenersDone()
        self._closing = asyncio.Event()
        self.listener: Listener | None = None
        self.closed = False

    def _service(self, consumer: _SyncPushConsumer, orderly: bool) -> ConsumeMessageService:
        """The sync consumer's ``service_factory``: its consume services, run on this loop."""
        return AsyncOrderly(consumer, self) if orderly else AsyncConcurrently(consumer, self)

    @property
    def group(self) -> str:
        return self._engine.group

    @property
    def sync(self) -> _SyncPushConsumer:
        """The sync consumer underneath (``skipped_records``, its pull consumer)."""
        return self._engine

    # -- set-up ---------------------------------------------------------------------------------------
    def subscribe(self, topic: str, expression: str | SQL = "*") -> None:
        self._engine.subscribe(topic, expression)

    def register(self, fn: Listener, orderly: bool = False) -> None:
        """``fn(msgs) -> ConsumeResult`` (or ``fn(msgs, context)``), an ``async def`` (a plain
        function returning a ConsumeResult works too). ``orderly``: queues locked on their broker,
        one queue's messages one batch at a time in queue order (``_orderly``)."""
        self._engine.register(cast(Any, fn), orderly)   # it runs here, on the loop, not in the sync pool
        self.listener = fn

    async def start(self) -> "PushConsumer":
        """Join the group and start fetching (returns once the first rebalance is done)."""
        if self.closed:
            raise ValidationError("the consumer is closed")
        if self._loop is not None:
            return self
        self._loop = asyncio.get_running_loop()
        self._limit = asyncio.Semaphore(self.concurrency)
        eng = self._engine
        try:
            await self._worker.call(eng.start)
        except BaseException:
            self._loop = None
            raise
        unused, eng.pool = eng.pool, cast(Any, self._done)    # read by the pull thread when it stops
        if unused is not None:
            unused.shutdown(wait=False)              # never given work: it has no thread
        return self

    def assignment(self) -> list[MessageQueue]:
        return self._engine.assignment()

    # -- on the loop ----------------------------------------------------------------------------------
    def call_soon(self, fn: Callable[..., None], *args: Any) -> bool:
        """From the pull thread: run ``fn(*args)`` on the loop; False if the loop is gone (the
        batch's offsets then stay uncommitted and it is delivered again)."""
        loop = self._loop
        if loop is None:
            return False
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            return False
        return True

    def start_batch(self, service: AsyncConcurrently, mq: MessageQueue, pq: ProcessQueue, batch: list[MessageExt],
                    attempt: int) -> None:
        """On the loop: a task for one batch of the concurrent service."""
        if not self._engine.stopping.is_set():
            self._spawn(self._running, self._consume(service, mq, pq, batch, attempt))

    def start_orderly(self, service: AsyncOrderly, mq: MessageQueue, pq: ProcessQueue) -> None:
        """On the loop: the task of one locked queue of the orderly service."""
        if self._engine.stopping.is_set():
            service.stopped(mq)
        else:
            self._spawn(self._running, service.consume(mq, pq))

    def later(self, service: AsyncConcurrently, mq: MessageQueue, pq: ProcessQueue, batch: list[MessageExt],
              attempt: int) -> None:
        """On the loop: the batch again after ``retry_delay_s``."""
        if not self._engine.stopping.is_set():
            self._spawn(self._delayed, self._consume_later(service, mq, pq, batch, attempt))

    def _spawn(self, tasks: set[asyncio.Task], coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _consume_later(self, service: AsyncConcurrently, mq: MessageQueue, pq: ProcessQueue,
                             batch: list[MessageExt], attempt: int) -> None:
        await asyncio.sleep(self._engine.retry_delay_s)
        self.start_batch(service, mq, pq, batch, attempt)

    async def _consume(self, service: AsyncConcurrently, mq: MessageQueue, pq: ProcessQueue,
                       batch: list[MessageExt], attempt: int) -> None:
        """One batch through the listener, and what its verdict means (as the sync service's ``consume``)."""
        eng = self._engine
        assert self._limit is not None
        ctx = ConsumeConcurrentlyContext(mq)
        async with self._limit:
            if pq.dropped or eng.stopping.is_set():
                return                  # another member owns the queue now; it re-reads from the commit
            result = await self._call_listener(batch, ctx)
        service.settle(mq, pq, batch, attempt, result, ctx)

    async def consume_one(self, batch: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeResult:
        """The listener's verdict on ``batch``, within the ``concurrency`` limit (orderly tasks)."""
        assert self._limit is not None
        async with self._limit:
            return await self._call_listener(batch, ctx)

    async def pause(self, delay_s: float) -> None:
        """Sleep ``delay_s``, or less if the consumer closes meanwhile."""
        try:
            await asyncio.wait_for(self._closing.wait(), delay_s)
        except TimeoutError:
            pass

    async def _call_listener(self, batch: list[MessageExt],
                             ctx: ConsumeConcurrentlyContext | ConsumeOrderlyContext | None = None) -> ConsumeResult:
        show_original_topics(batch)
        listener = self.listener
        assert listener is not None         # start() refuses to run without one
        try:
            result: Any = cast(Any, listener)(*self._engine.listener_args(batch, ctx))
            if inspect.isawaitable(result):
                result = await result
        except Exception:
            return listener_raised(self.group)
        return listener_verdict(self.group, result)

    # -- life -----------------------------------------------------------------------------------------
    async def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Stop fetching, let running listeners finish (up to ``timeout_s``; then they are
        cancelled and their messages delivered again later), send failed messages back, commit,
        leave the group; no thread is left."""
        if self.closed:
            return
        self.closed = True
        eng = self._engine
        eng.stopping.set()
        self._closing.set()
        for t in list(self._delayed):
            t.cancel()                  # unfinished: their offsets stay uncommitted
        try:
            others = self._running - {asyncio.current_task()}      # close() from a listener
            if others:
                _, late = await asyncio.wait(others, timeout=timeout_s)
                for t in late:
                    t.cancel()
            self._done.event.set()
            await self._worker.call(eng.join, timeout_s)
        finally:
            self._done.event.set()
            self._worker.shutdown()

    aclose = close

    async def __aenter__(self) -> "PushConsumer":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
