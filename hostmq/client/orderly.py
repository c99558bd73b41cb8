"""Orderly consumption for the push consumer (RocketMQ ``ConsumeMessageOrderlyService`` and the
lock half of ``RebalanceImpl``).

A member consumes a queue only while it holds the queue's lock on the queue's broker
(``LOCK_BATCH_MQ``; the broker keeps a lock 60 s, the member renews every 20 s, and a member whose
process is gone loses its locks at once). One task per queue runs the listener on that queue's
messages one batch at a time, in queue order. How a queue changes hands without breaking order:

* the old owner, on revoke, stops its task and waits for the batch in the listener, commits, and
  only then unlocks (``UNLOCK_BATCH_MQ`` once the task is gone);
* the new owner may compute its share before the old owner let go; it cannot lock the queue until
  then, and when the lock is finally granted it re-reads the group's committed offset and drops
  whatever it fetched before — reading from the offset it saw at rebalance time would consume again
  what the old owner consumed meanwhile (RocketMQ computes the pull offset only after the lock);
* offsets of queues not locked are never committed (they are somebody else's).

On ``RECONSUME_LATER`` (or an exception) the queue is suspended for ``retry_delay_s`` and the same
messages are consumed again, up to ``max_reconsume_times``; then they go to the DLQ and the queue
goes on. The listener's ``ConsumeOrderlyContext`` may set how long the queue is suspended
(``suspend_current_queue_time_millis``).

This is the push consumer's ``ConsumeMessageService`` for orderly listeners
(``consume_service``); ``OrderlyService`` is its earlier name.
"""
from __future__ import annotations

import collections
import logging
import time
from typing import TYPE_CHECKING

from ..errors import HostMQError
from ..message import ConsumeResult, MessageExt, MessageQueue
from ..protocol.codes import RequestCode
from ..protocol.messages import LockRequest
from .consume_service import DELAY_DLQ, ConsumeMessageService, ConsumeOrderlyContext, SendBack
from .process_queue import ProcessQueue

if TYPE_CHECKING:
    from .push_consumer import PushConsumer

log = logging.getLogger(__name__)

LOCK_RENEW_S = 20.0             # RocketMQ: an orderly member renews its queue locks every 20 s
LOCK_RETRY_S = 0.5              # ... and asks again for queues it owns but could not lock this often
REVOKE_WAIT_S = 1.0             # how long a revoked queue's running batch may finish before the commit
DLQ_LEVEL = DELAY_DLQ           # send-back delay level that means "straight to the DLQ"


class ConsumeMessageOrderlyService(ConsumeMessageService):
    """State is guarded by the consumer's lock; ``maintain`` and ``submit`` run on the pull thread,
    ``_consume`` on the listener pool."""

    orderly = True

    def __init__(self, consumer: "PushConsumer") -> None:
        super().__init__(consumer)
        self.locked: set[MessageQueue] = set()
        self.pending: dict[MessageQueue, collections.deque] = {}     # fetched, not yet consumed
        self.running: set[MessageQueue] = set()                      # a task is consuming it
        self.to_unlock: set[MessageQueue] = set()                    # dropped; unlock once the task is gone
        self._next_renew = self._next_retry = 0.0

    # -- pull thread ----------------------------------------------------------------------------------
    def dropped(self, mq: MessageQueue) -> None:
        """The queue left this member's share (under the consumer's lock)."""
        self.pending.pop(mq, None)
        if mq in self.locked:
            self.locked.discard(mq)
            self.to_unlock.add(mq)

    def unlocked(self) -> set[MessageQueue]:
        """Owned queues this member may not fetch from (under the consumer's lock)."""
        return {mq for mq in self.c.queues if mq not in self.locked}

    def submit(self, mq: MessageQueue, pq: ProcessQueue, batch: list[MessageExt]) -> None:
        with self.c.lock:
            if self.c.queues.get(mq) is not pq or mq not in self.locked:
                return                      # fetched before the lock: dropped when it is granted
            self.pending.setdefault(mq, collections.deque()).extend(batch)
        self._kick(mq, pq)

    def maintain(self) -> None:
        """Unlock what was let go, lock (renew) what is owned; take over newly locked queues."""
        c = self.c
        now = time.monotonic()
        with c.lock:
            done = {mq for mq in self.to_unlock if mq not in self.running}
        if done:
            self._request(RequestCode.UNLOCK_BATCH_MQ, done)
            self.to_unlock -= done
        with c.lock:
            owned = set(c.queues)
            missing = owned - self.locked
        if now < self._next_renew and not (missing and now >= self._next_retry):
            return
        self._next_retry = now + LOCK_RETRY_S
        if not missing:
            self._next_renew = now + LOCK_RENEW_S
        held = self._request(RequestCode.LOCK_BATCH_MQ, owned)
        with c.lock:
            held &= set(c.queues)
            lost = self.locked - held
        if lost:                            # not renewed (broker unreachable or lock expired): keep what
            try:                            # was consumed, stop; a re-lock reads the committed offset
                c.pull.commit_queues(lost)
            except HostMQError as e:
                log.warning("%s: committing queues whose lock was lost failed: %s", c.group, e)
        with c.lock:
            gained = held - self.locked
            self.locked = held
            for mq in lost:
                self.pending.pop(mq, None)
        for mq in sorted(gained):
            self._take_over(mq)

    def _take_over(self, mq: MessageQueue) -> None:
        """Continue a newly locked queue from the group's committed offset as it is now."""
        c = self.c
        try:
            offset = c.pull.reload_position(mq)
        except HostMQError as e:
            log.warning("%s: cannot read the committed offset of %s (%s); locking it again later", c.group, mq, e)
            with c.lock:
                self.locked.discard(mq)
            return
        with c.lock:
            old = c.queues.get(mq)
            if old is not None:
                old.dropped = True
            pq = c.queues[mq] = ProcessQueue(offset)
            self.pending.pop(mq, None)
        log.info("%s: locked %s, consuming from offset %d", c.group, mq, offset)
        self._kick(mq, pq)

    def on_revoke(self, queues: list[MessageQueue]) -> None:
        """A rebalance gives these queues away: stop their tasks and wait (briefly) for the batch in
        the listener, so the commit that follows covers it."""
        c = self.c
        with c.lock:
            for mq in queues:
                pq = c.queues.get(mq)
                if pq is not None:
                    pq.dropped = True
        deadline = time.monotonic() + REVOKE_WAIT_S
        while time.monotonic() < deadline:
            with c.lock:
                if not any(mq in self.running for mq in queues):
                    return
            time.sleep(0.005)
        log.warning("%s: a listener still runs on a revoked queue after %.1f s; its batch may come again",
                    c.group, REVOKE_WAIT_S)

    def consume_later(self, mq: MessageQueue, pq: ProcessQueue, batch: list[MessageExt], attempt: int) -> None:
        """A dead letter that could not be sent back: the queue consumes it again, in its place
        (RocketMQ suspends the queue and consumes the message again)."""
        with self.c.lock:
            if self.c.queues.get(mq) is not pq or mq not in self.locked:
                return                      # the queue moved on: its next owner reads from the commit
            self.pending.setdefault(mq, collections.deque()).extendleft(reversed(batch))
        self._kick(mq, pq)

    def commit_allowed(self, mq: MessageQueue) -> bool:
        return mq in self.locked            # under the consumer's lock

    def unlock_all(self) -> None:
        """At shutdown, after the last commit: the next owner need not wait for the pid check."""
        held = self.locked | self.to_unlock
        self.locked, self.to_unlock = set(), set()
        if held:
            self._request(RequestCode.UNLOCK_BATCH_MQ, held)

    def _request(self, code: int, queues) -> set[MessageQueue]:
        c = self.c
        inst, member = c.pull.instance, c.pull.member
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in queues:
            by_broker.setdefault(mq.broker, []).append(mq)
        held: set[MessageQueue] = set()
        for broker, mqs in sorted(by_broker.items()):
            try:
                req = LockRequest(group=c.group, client_id=member.client_id,
                                  queues=[{"topic": q.topic, "queue_id": q.queue_id} for q in mqs])
                f = inst.broker_request(inst.broker_address(broker), code, req.to_fields(), timeout_s=2.0)
                held |= {MessageQueue(r["topic"], broker, r["queue_id"]) for r in f.fields.get("locked", [])}
            except HostMQError as e:
                log.info("%s: queue locks on %s: %s", c.group, broker, e)
        return held

    # -- listener pool --------------------------------------------------------------------------------
    def _kick(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        """Start the queue's task unless one runs (one task per queue keeps the order)."""
        if not self._claim(mq, pq):
            return
        try:
            self.c.pool.submit(self._consume, mq, pq)
        except RuntimeError:                # shutting down
            with self.c.lock:
                self.running.discard(mq)

    def _claim(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        """Whether ``mq``'s task starts now — messages pending, the queue locked and still this
        consumer's, no task of it running — and if so, marked running."""
        with self.c.lock:
            if mq in self.running or not self.pending.get(mq) or mq not in self.locked or pq.dropped:
                return False
            self.running.add(mq)
        return True

    def _consume(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        c = self.c
        attempts = 0
        try:
            while True:
                taken = self.next_batch(mq, pq)
                if taken is None:
                    return
                pending, batch = taken
                ctx = ConsumeOrderlyContext(mq)
                attempts, pause_s = self.after(c.call_listener(batch, ctx), attempts, mq, pending, pq, batch, ctx)
                if pause_s:
                    c.stopping.wait(pause_s)    # suspend this queue, then the same messages again
        finally:
            with c.lock:
                self.running.discard(mq)
            self._kick(mq, pq)              # messages that came while the task was leaving

    # -- one queue's task, shared with hostmq.aio's loop task -----------------------------------------
    def after(self, verdict: ConsumeResult, attempts: int, mq: MessageQueue, pending: collections.deque,
              pq: ProcessQueue, batch: list[MessageExt], ctx: ConsumeOrderlyContext) -> tuple[int, float]:
        """What the queue's task does with the listener's verdict on ``batch`` (its ``attempts``-th
        failure so far): ``(attempts now, seconds to suspend the queue before the same batch again,
        0 for none)``. Success commits; after ``max_reconsume_times`` failures the batch is given up
        to the DLQ and the queue goes on in order after it (its offset committed past the batch once
        the send-back is stored)."""
        if verdict == ConsumeResult.SUCCESS:
            self.done(pending, pq, batch)
            return 0, 0.0
        attempts += 1
        if attempts > self.c.max_reconsume_times:
            self.give_up(mq, pending, pq, batch)
            return 0, 0.0
        return attempts, self.suspend_s(ctx)

    def next_batch(self, mq: MessageQueue, pq: ProcessQueue) -> tuple[collections.deque, list[MessageExt]] | None:
        """The queue's pending deque (this one: a take-over replaces it) and its next batch; None
        when the task should end (dropped, stopping, nothing pending, lock lost)."""
        c = self.c
        with c.lock:
            pending = self.pending.get(mq)
            if pq.dropped or c.stopping.is_set() or not pending or mq not in self.locked:
                return None
            return pending, [pending[i] for i in range(min(c.batch_size, len(pending)))]

    def done(self, pending: collections.deque, pq: ProcessQueue, batch: list[MessageExt]) -> None:
        """``batch`` consumed: off the pending deque, its offsets released."""
        with self.c.lock:
            for _ in batch:
                pending.popleft()
            pq.remove([m.queue_offset for m in batch])

    def give_up(self, mq: MessageQueue, pending: collections.deque, pq: ProcessQueue, batch: list[MessageExt]) -> None:
        """``batch`` failed ``max_reconsume_times`` times: off the pending deque, to the DLQ (its
        offsets are released once the send-back is stored)."""
        with self.c.lock:
            for _ in batch:
                pending.popleft()
        self.c.failed.put((mq, pq, tuple(SendBack(m, DELAY_DLQ) for m in batch)))

    def suspend_s(self, ctx: ConsumeOrderlyContext) -> float:
        """How long the queue waits before a failed batch is consumed again: the listener's
        ``suspend_current_queue_time_millis`` if it set one (≥ 0), else ``retry_delay_s``."""
        ms = ctx.suspend_current_queue_time_millis
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or ms < 0:
            if ms != -1:
                log.error("listener of %s set suspend_current_queue_time_millis=%r (a number ≥ 0 is expected); "
                          "suspending for retry_delay_s", self.c.group, ms)
            return self.c.retry_delay_s
        return ms / 1000.0


OrderlyService = ConsumeMessageOrderlyService      # the earlier name
