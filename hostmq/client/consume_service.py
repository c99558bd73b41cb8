"""How a push consumer runs its listener (RocketMQ ``ConsumeMessageService`` and its consume contexts).

The push consumer's pull thread fetches; a consume service runs the listener on what was fetched
and says what a verdict means. Which service a consumer has follows the listener it registered
(RocketMQ: ``MessageListenerConcurrently`` or ``MessageListenerOrderly``):

* :class:`ConsumeMessageConcurrentlyService` (here): batches of ``batch_size`` messages of one queue
  on the listener pool, in any order; a failed message is sent back to the broker (a
  :class:`SendBack`), or consumed again here after ``retry_delay_s``.
* ``orderly.ConsumeMessageOrderlyService``: queues locked on their broker, one queue's messages one
  batch at a time in queue order.

Both implement :class:`ConsumeMessageService`; the consumer calls only that interface, so
``hostmq.aio`` runs the same services with its listeners on an event loop (it overrides where a
batch runs, nothing else).

A listener is called as before — ``fn(msgs)`` — or, if it takes a second positional parameter,
``fn(msgs, context)`` with the batch's consume context (RocketMQ's ``consumeMessage(msgs, context)``):

* :class:`ConsumeConcurrentlyContext` — ``message_queue``; ``delay_level_when_next_consume`` (0: the
  broker's back-off, 3 + times consumed; -1: straight to the DLQ; n > 0: delay level n) for the
  messages of a failed batch; ``ack_index`` — on SUCCESS, messages after it count as failed (sent
  back), as in RocketMQ.
* :class:`ConsumeOrderlyContext` — ``message_queue``; ``suspend_current_queue_time_millis`` (how long
  the queue waits before a failed batch is consumed again; -1: ``retry_delay_s``); ``auto_commit``
  (kept for RocketMQ's shape: a queue's consumed offsets are always committed here, since
  ``ConsumeResult`` has no ``COMMIT``).
"""
from __future__ import annotations

import collections
import inspect
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ..errors import ValidationError
from ..message import ConsumeResult, MessageExt, MessageModel, MessageQueue
from ..protocol.messages import SendBackRequest
from .process_queue import ProcessQueue

if TYPE_CHECKING:
    from .push_consumer import PushConsumer

log = logging.getLogger(__name__)

ACK_ALL = 2 ** 31 - 1           # RocketMQ's ackIndex default (Integer.MAX_VALUE): every message acknowledged
DELAY_BROKER = 0                # delay_level_when_next_consume: the broker's back-off (3 + times consumed)
DELAY_DLQ = -1                  # ... straight to the DLQ
INLINE_MAX_S = 0.001            # a listener call longer than this is slow ...
INLINE_WINDOW = 8               # ... and a listener with half its last calls slow runs on the pool only


@dataclass
class ConsumeConcurrentlyContext:
    """What a concurrent listener may read and set for one batch (RocketMQ's class of that name)."""

    message_queue: MessageQueue
    delay_level_when_next_consume: int = DELAY_BROKER
    ack_index: int = ACK_ALL


@dataclass
class ConsumeOrderlyContext:
    """What an orderly listener may read and set for one batch (RocketMQ's class of that name)."""

    message_queue: MessageQueue
    auto_commit: bool = True
    suspend_current_queue_time_millis: int = -1


@dataclass(frozen=True)
class SendBack:
    """One failed message for the broker (RocketMQ ``sendMessageBack``): built by a consume service,
    sent by the consumer's pull thread. ``delay_level`` as ``delay_level_when_next_consume``."""

    msg: MessageExt
    delay_level: int = DELAY_BROKER

    def __post_init__(self) -> None:
        if not isinstance(self.msg, MessageExt):
            raise ValidationError(f"a send-back holds a MessageExt, got {self.msg!r}")
        if not isinstance(self.delay_level, int) or isinstance(self.delay_level, bool) or self.delay_level < -1:
            raise ValidationError(f"delay_level must be an int ≥ -1, got {self.delay_level!r}")

    def request(self, group: str, max_reconsume_times: int) -> SendBackRequest:
        """The CONSUMER_SEND_MSG_BACK request that asks the broker where the message goes."""
        return SendBackRequest(group=group, reconsume_times=self.msg.reconsume_times,
                               max_reconsume_times=max_reconsume_times, delay_level=self.delay_level)


def takes_context(fn: Callable[..., Any]) -> bool:
    """Whether a listener takes ``(msgs, context)`` — a second positional parameter — rather than
    ``(msgs)``: listeners written before the contexts existed keep their one-argument call."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):         # a builtin without a signature: the old call
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2


class ConsumeMessageService:
    """The interface the push consumer's pull thread calls (RocketMQ ``ConsumeMessageService``).

    ``submit`` runs on the pull thread; everything else a service keeps is guarded by the
    consumer's ``lock``. The defaults here are those of a service that locks nothing (concurrent)."""

    orderly = False

    def __init__(self, consumer: "PushConsumer") -> None:
        self.c = consumer

    def start(self) -> None:
        """The consumer started (its pool exists)."""

    def shutdown(self) -> None:
        """The pull thread is stopping, the pool has finished: drop timers."""

    def submit(self, mq: MessageQueue, pq: ProcessQueue, batch: list[MessageExt]) -> None:
        """Messages just fetched from ``mq`` (already held in ``pq``): consume them."""
        raise NotImplementedError

    def consume_later(self, mq: MessageQueue, pq: ProcessQueue, batch: list[MessageExt], attempt: int) -> None:
        """Messages that could not be sent back: consume them again here (``attempt`` > 0)."""
        raise NotImplementedError

    def consume_first(self, mq: MessageQueue, pq: ProcessQueue, batch: list[MessageExt],
                      positions: "dict[MessageQueue, int]") -> bool:
        """Messages just fetched from ``mq`` (``positions``: the pull consumer's, ``mq``'s already past
        them), *not* held in ``pq``: consume them on the pull thread now and keep the books after, if
        this service does that (True); False, with nothing done, and the consumer holds them and calls
        ``submit``."""
        return False

    # -- the pull thread's questions (queue locks; nothing to do for a concurrent service) ------------
    def maintain(self) -> None:
        """Once per pull-thread round, before flow control."""

    def dropped(self, mq: MessageQueue) -> None:
        """``mq`` left this member's share (under the consumer's lock)."""

    def unlocked(self) -> set[MessageQueue]:
        """Owned queues this member may not fetch from (under the consumer's lock)."""
        return set()

    def on_revoke(self, queues: list[MessageQueue]) -> None:
        """A rebalance gives ``queues`` away, before their offsets are committed."""

    def commit_allowed(self, mq: MessageQueue) -> bool:
        """Whether ``mq``'s offset may be committed now (under the consumer's lock)."""
        return True

    def unlock_all(self) -> None:
        """At shutdown, after the last commit."""

    def handed_off(self) -> bool:
        """Whether batches wait on other threads now (the pull thread then yields the GIL to them)."""
        return True


class ConsumeMessageConcurrentlyService(ConsumeMessageService):
    """Batches on the listener pool (RocketMQ ``ConsumeMessageConcurrentlyService``): a failed
    message of a CLUSTERING consumer goes back to the broker on its first failure (the pull thread
    sends it); one that cannot be sent back, or any in BROADCASTING, is consumed again here after
    ``retry_delay_s``. ``submit_batch`` and ``consume_later`` say where a batch runs (``hostmq.aio``
    overrides them to run it on its loop).

    The hot path (issue 29): a fetch that makes one batch while no batch runs on the pool is consumed
    on the pull thread itself — no hand-off to a pool thread, which would first wait for the GIL —
    as long as the listener is fast: fewer than half of its last ``INLINE_WINDOW`` calls took over
    ``INLINE_MAX_S`` (a count, not a mean, so a call that only lost its CPU to another process for a
    time slice does not send the next ones to the pool). A slow listener, or more than one batch,
    goes to the pool, so slow listeners keep the pool's concurrency and never hold up fetching for
    long (at most the slow call that shows it)."""

    def __init__(self, consumer: "PushConsumer") -> None:
        super().__init__(consumer)
        self._timers: set[threading.Timer] = set()
        self._pooled = 0                # batches submitted to the pool and not finished
        self._calls: collections.deque = collections.deque(maxlen=INLINE_WINDOW)    # slow? per recent call
        self._slow = 0                  # how many of them were slow
        self._fast = True               # fewer than half of them were: the listener may run inline
        self._own_pool = type(self).submit_batch is ConsumeMessageConcurrentlyService.submit_batch
        self.inline_batches = 0         # batches consumed on the pull thread (for tests and stats)

    def handed_off(self) -> bool:
        return self._pooled > 0

    def shutdown(self) -> None:
        with self.c.lock:
            timers, self._timers = list(self._timers), set()
        for t in timers:
            t.cancel()

    def submit(self, mq: MessageQueue, pq: ProcessQueue, batch: list[MessageExt]) -> None:
        size = self.c.batch_size
        if len(batch) <= size and not self._pooled and self._fast and self._own_pool:
            self.inline_batches += 1
            try:
                self.consume(mq, pq, batch, 0)
            except Exception:               # as a pool thread would, never end the pull thread
                log.exception("%s: consuming a batch failed", self.c.group)
            return
        for i in range(0, len(batch), size):
            self.submit_batch(mq, pq, batch[i:i + size], 0)

    def consume_first(self, mq: MessageQueue, pq: ProcessQueue, batch: list[MessageExt],
                      positions: "dict[MessageQueue, int]") -> bool:
        """``submit``'s inline case with the listener called first: what the pull thread runs between
        a poll that woke and the listener is what a push consumer adds to a poll's latency (issue 29).
        The books come after — nothing else reads them meanwhile (commits, flow control and rebalances
        run on this thread, which is busy here; a pooled retry only removes its own offsets): a batch
        consumed whole only moves ``pq.next_offset`` past it; otherwise it is held and settled as
        ``consume`` does, so the failed part stays held until it is sent back or consumed again."""
        c = self.c
        if self._pooled or not self._fast or len(batch) > c.batch_size or not self._own_pool or c.stopping.is_set():
            return False
        self.inline_batches += 1
        next_offset = pq.next_offset        # (until the books are kept below)
        try:
            result, ctx = self._timed_call(mq, batch)
            verdict = _verdict(c.group, result, ctx, len(batch))
            next_offset = positions.get(mq, 0)      # this thread's own: as it was when the poll returned
            with c.lock:
                if verdict[0] == len(batch) - 1:
                    if next_offset > pq.next_offset:
                        pq.next_offset = next_offset
                    return True
                pq.hold(batch, next_offset)
            self.settle(mq, pq, batch, 0, result, ctx, verdict)
        except Exception:               # as a pool thread would, never end the pull thread
            log.exception("%s: consuming a batch failed", c.group)
            with c.lock:                # held (at most once), so no commit passes what may not be consumed
                pq.hold(batch, next_offset)
        return True

    def submit_batch(self, mq: MessageQueue, pq: ProcessQueue, batch: list[MessageExt], attempt: int) -> None:
        """One batch to the listener pool."""
        pool = self.c.pool
        if pool is None:
            return
        with self.c.lock:
            self._pooled += 1
        try:
            pool.submit(self._pooled_consume, mq, pq, batch, attempt)
        except RuntimeError:                # the pool is shutting down: the offset stays uncommitted
            with self.c.lock:
                self._pooled -= 1

    def _pooled_consume(self, mq: MessageQueue, pq: ProcessQueue, batch: list[MessageExt], attempt: int) -> None:
        try:
            self.consume(mq, pq, batch, attempt)
        finally:
            with self.c.lock:
                self._pooled -= 1

    def consume(self, mq: MessageQueue, pq: ProcessQueue, batch: list[MessageExt], attempt: int) -> None:
        c = self.c
        if pq.dropped or c.stopping.is_set():
            return                          # another member owns the queue now; it re-reads from the commit
        result, ctx = self._timed_call(mq, batch)
        self.settle(mq, pq, batch, attempt, result, ctx)

    def _timed_call(self, mq: MessageQueue, batch: list[MessageExt]) -> tuple[ConsumeResult, ConsumeConcurrentlyContext]:
        """The listener on ``batch`` with a new context: ``(verdict, context)``; the call counted slow
        or not (over ``INLINE_MAX_S``) among the last ``INLINE_WINDOW``, for the inline choice."""
        c = self.c
        ctx = ConsumeConcurrentlyContext(mq)
        t0 = time.monotonic()
        result = c.call_listener(batch, ctx)
        slow = time.monotonic() - t0 > INLINE_MAX_S
        with c.lock:
            calls = self._calls
            if len(calls) == calls.maxlen:
                self._slow -= calls[0]
            calls.append(slow)
            self._slow += slow
            self._fast = 2 * self._slow < max(1, len(calls))
        return result, ctx

    def settle(self, mq: MessageQueue, pq: ProcessQueue, batch: list[MessageExt], attempt: int,
               result: ConsumeResult, ctx: ConsumeConcurrentlyContext,
               verdict: tuple[int, int] | None = None) -> None:
        """What the listener's verdict on ``batch`` means (RocketMQ ``processConsumeResult``): the
        messages up to ``ctx.ack_index`` on SUCCESS are done (their offsets released); the others go
        to the retry topic (or the DLQ) by the pull thread on a clustering consumer's first failure,
        at ``ctx.delay_level_when_next_consume``; else again after ``retry_delay_s`` (``consume_later``)."""
        c = self.c
        ack, level = verdict if verdict is not None else _verdict(c.group, result, ctx, len(batch))
        done, failed = batch[:ack + 1], batch[ack + 1:]
        if done:
            with c.lock:
                pq.remove([m.queue_offset for m in done])
        if not failed:
            return
        if c.model == MessageModel.CLUSTERING and attempt == 0:
            c.failed.put((mq, pq, tuple(SendBack(m, level) for m in failed)))
            return
        if attempt + 1 >= c.max_reconsume_times:
            log.error("%s: %d messages failed %d times; retrying every %.1f s until they succeed",
                      c.group, len(failed), attempt + 1, c.retry_delay_s)
        self.consume_later(mq, pq, failed, attempt + 1)

    def consume_later(self, mq: MessageQueue, pq: ProcessQueue, batch: list[MessageExt], attempt: int) -> None:
        timer = threading.Timer(self.c.retry_delay_s, self._retry, (mq, pq, batch, attempt))
        timer.daemon = True
        with self.c.lock:
            self._timers.add(timer)
        timer.start()

    def _retry(self, mq: MessageQueue, pq: ProcessQueue, batch: list[MessageExt], attempt: int) -> None:
        with self.c.lock:
            self._timers.discard(threading.current_thread())    # type: ignore[arg-type]
        if not self.c.stopping.is_set():
            self.submit_batch(mq, pq, batch, attempt)


def _verdict(group: str, result: ConsumeResult, ctx: ConsumeConcurrentlyContext, n: int) -> tuple[int, int]:
    """``(index of the last message acknowledged, delay level for the others)`` from a verdict and
    what the listener set in its context; a context field of the wrong type counts as failure of
    the whole batch at the broker's back-off (logged: the listener cannot be handed an error)."""
    ack, level = ctx.ack_index, ctx.delay_level_when_next_consume
    if not isinstance(level, int) or isinstance(level, bool) or level < DELAY_DLQ:
        log.error("listener of %s set delay_level_when_next_consume=%r (an int ≥ -1 is expected); "
                  "using the broker's back-off", group, level)
        level = DELAY_BROKER
    if result != ConsumeResult.SUCCESS:
        return -1, level
    if not isinstance(ack, int) or isinstance(ack, bool):
        log.error("listener of %s set ack_index=%r (an int is expected); consuming the batch again", group, ack)
        return -1, level
    return max(-1, min(ack, n - 1)), level
