"""The asyncio pull consumer: ``async for msg in consumer``, ``await consumer.commit()`` — the sync
pull consumer's guarantees (docs/api.md "Consuming") with one thread per consumer.

Every step of the sync consumer runs on the consumer's one worker thread (``_bridge.Worker``),
which is the one thread that ever touches it (the sync consumer is not thread-safe). A poll there
sleeps on the brokers' futex words as the sync ``poll`` does (woken by each dispatcher on arrival)
and on one more word of our own, which ``close`` and ``seek`` post to end it early. Its batch
reaches the loop through the loop's self-pipe; ``async for`` hands the messages out one by one, and
the next poll starts only when the batch is used up — one worker call per batch, none per message.

Offsets: a batch's messages not handed out yet are never committed. The offset committed for a
queue (by ``commit``, by auto-commit at the start of the next poll, and at ``close``) is that of
its first message still held here, else the position the consumer has read to — so what an
``async for`` body has not received is delivered again after a restart or a rebalance (at least
once, as the sync consumer).

Cancelling: a cancelled ``await`` (``async for``, ``poll``) stops waiting only. A poll already
running finishes on the worker and its batch is kept for the next ``async for`` step or ``poll``;
nothing is lost and the consumer stays usable and closable.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
from typing import Any, Iterable

import numpy as np

from .. import records as R
from ..store.filter import parse_tag_expression
from ..client.pull_consumer import PullConsumer as _SyncPullConsumer
from ..client.sql92 import SQL
from ..errors import ValidationError
from ..message import ConsumeFrom, MessageExt, MessageQueue
from ..shm.futex import MAX_WAITV, FutexWord
from ._bridge import Worker, bridge

POLL_SLICE_S = 2.0      # one worker poll of ``async for`` waits at most this long before the next


class _Woken(Exception):
    """The consumer's own wake word was posted: end the poll on the worker now."""


class _Engine(_SyncPullConsumer):
    """The sync pull consumer, with a wake word of its own in its waits and commits that stop at the
    first message the asyncio side still holds."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, commit_position=self.held_position, **kwargs)
        self._wake_words = np.zeros(1, np.int64)        # private memory: only this process posts it
        self.wake = FutexWord(self._wake_words, 0)
        self._token = 0
        self.held_lock = threading.Lock()
        self.held_first: dict[MessageQueue, int] = {}   # queue → offset of its first message held
        self.held_count: collections.Counter = collections.Counter()

    # -- polls that the loop can end ------------------------------------------------------------------
    def poll_once(self, timeout: float, token: int) -> list[MessageExt]:
        """On the worker: one sync poll (ended early when the wake word moves past ``token``); its
        messages are held (not committable) before the loop sees them."""
        self._token = token
        try:
            msgs = self.poll(timeout)
        except _Woken:
            return []
        with self.held_lock:
            for m in msgs:
                self.held_first.setdefault(m.queue, m.queue_offset)
                self.held_count[m.queue] += 1
        return msgs

    def _seqs(self) -> list[tuple]:
        seqs = super()._seqs()
        if len(seqs) < MAX_WAITV:
            seqs.append((self.wake, self._token))
        return seqs

    def _wait(self, seqs: list[tuple], deadline: float) -> None:
        if self.wake.arm() != self._token:
            raise _Woken()
        super()._wait(seqs, deadline)
        if self.wake.arm() != self._token:
            raise _Woken()

    # -- what the loop has handed out ---------------------------------------------------------------
    def handed(self, m: MessageExt) -> None:
        """On the loop: ``m`` went to the application; its queue may commit past it."""
        q = m.queue
        with self.held_lock:
            self.held_count[q] -= 1
            if self.held_count[q] <= 0:
                del self.held_count[q]
                self.held_first.pop(q, None)
            else:
                self.held_first[q] = m.queue_offset + 1

    def drop_held(self, queues: set[MessageQueue] | None = None) -> None:
        """Forget held messages of ``queues`` (None: all) — they were discarded by a seek."""
        with self.held_lock:
            for q in list(self.held_first) if queues is None else queues:
                self.held_first.pop(q, None)
                self.held_count.pop(q, None)

    def held_position(self, mq: MessageQueue) -> int | None:
        """What ``commit`` stores for ``mq``: the first message the loop still holds, else the
        position read to (the sync consumer's ``commit_position`` callback)."""
        with self.held_lock:
            first = self.held_first.get(mq)
        return self.positions[mq] if first is None else first


class PullConsumer:
    """See the module docstring. ``async with PullConsumer(root, group=...) as c`` (or ``await
    c.close()``); ``subscribe`` / ``assign`` first, then ``async for m in c`` or ``await c.poll()``."""

    def __init__(self, root: Any = None, group: str = "DEFAULT_CONSUMER", auto_commit: bool = True,
                 consume_from: ConsumeFrom = ConsumeFrom.LAST_OFFSET, consume_timestamp_ms: int | None = None, *,
                 auto_commit_interval_s: float = 5.0, max_poll_records: int = 32, timeout_s: float = 3.0,
                 allocate: Any = "average", rebalance_interval_s: float | None = None,
                 heartbeat_interval_s: float | None = None) -> None:
        intervals = {k: v for k, v in (("rebalance_interval_s", rebalance_interval_s),
                                       ("heartbeat_interval_s", heartbeat_interval_s)) if v is not None}
        # spin_s=0: a spinning worker would hold the GIL the loop needs
        self._engine = _Engine(root, group, auto_commit, consume_from, consume_timestamp_ms,
                               auto_commit_interval_s=auto_commit_interval_s, max_poll_records=max_poll_records,
                               spin_s=0.0, timeout_s=timeout_s, allocate=allocate, **intervals)
        self._worker = Worker(f"hostmq-aio-consumer {group}")
        self._setup: list[concurrent.futures.Future] = []     # subscribe/assign queued on the worker
        self._buffer: collections.deque[MessageExt] = collections.deque()
        self._inflight: concurrent.futures.Future | None = None
        self._mode: str | None = None
        self.closed = False

    @property
    def group(self) -> str:
        return self._engine.group

    @property
    def sync(self) -> _SyncPullConsumer:
        """The sync consumer underneath (its counters: ``skipped_records``, ``wait_stats``)."""
        return self._engine

    # -- assignment (queued on the worker; errors surface at the next await) --------------------------
    def subscribe(self, topic: str, expression: str | SQL = "*") -> None:
        """Read ``topic`` as a member of the group (the sync ``subscribe``); bad arguments raise here."""
        R.validate_topic(topic)
        if isinstance(expression, str):
            parse_tag_expression(expression)
        elif not isinstance(expression, SQL):
            raise ValidationError(f"expression must be a tag expression or hostmq.SQL, got {expression!r}")
        self._queue_setup("subscribe", self._engine.subscribe, topic, expression)

    def assign(self, queues: Iterable[MessageQueue], expression: str = "*") -> None:
        """Read exactly these queues (the sync ``assign``); bad arguments raise here."""
        queues = list(queues)
        if any(not isinstance(q, MessageQueue) for q in queues):
            raise ValidationError(f"assign takes MessageQueue objects, got {queues!r}")
        parse_tag_expression(expression)
        self._queue_setup("assign", self._engine.assign, queues, expression)

    def _queue_setup(self, mode: str, fn: Any, *args: Any) -> None:
        self._check_open()
        if self._mode not in (None, mode):
            raise ValidationError("assign and subscribe cannot be mixed")
        self._mode = mode
        self._setup.append(self._worker.submit(fn, *args))

    async def _call(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` on the worker, after the queued set-up (whose first error is raised)."""
        self._check_open()
        await self._settle_setup()
        return await self._worker.call(fn, *args)

    async def _settle_setup(self) -> None:
        setup, self._setup = self._setup, []
        loop = asyncio.get_running_loop()
        for f in setup:
            await bridge(f, loop)

    # -- consuming ------------------------------------------------------------------------------------
    def __aiter__(self) -> "PullConsumer":
        return self

    async def __anext__(self) -> MessageExt:
        """The next message, waiting as long as it takes; the iteration ends when the consumer closes."""
        while not self._buffer:
            if self.closed:
                raise StopAsyncIteration
            self._buffer.extend(await self._poll_slice(POLL_SLICE_S))
        if self.closed:
            raise StopAsyncIteration
        return self._hand(self._buffer.popleft())

    async def poll(self, timeout: float = 1.0) -> list[MessageExt]:
        """Up to ``max_poll_records`` messages, waiting up to ``timeout`` seconds; [] if none came."""
        self._check_open()
        if not self._buffer:
            self._buffer.extend(await self._poll_slice(timeout, wait_s=timeout))
        n = min(len(self._buffer), self._engine.max_poll_records)
        return [self._hand(self._buffer.popleft()) for _ in range(n)]

    def _hand(self, m: MessageExt) -> MessageExt:
        self._engine.handed(m)
        return m

    async def _poll_slice(self, timeout: float, wait_s: float | None = None) -> list[MessageExt]:
        """The batch of one worker poll (started unless one is running already: a cancelled call's
        is picked up here); [] if ``wait_s`` passes first (the poll keeps running, its batch kept)."""
        await self._settle_setup()
        if self._inflight is None:
            if self.closed:
                return []
            self._inflight = self._worker.submit(self._engine.poll_once, timeout, self._engine.wake.arm())
        src = self._inflight
        fut = bridge(src, asyncio.get_running_loop())
        if wait_s is None:
            await asyncio.wait({fut})
        else:
            done, _ = await asyncio.wait({fut}, timeout=max(0.0, wait_s))
            if not done:
                return []
        return self._take(src)

    def _take(self, src: concurrent.futures.Future) -> list[MessageExt]:
        """The finished poll's batch for the first caller that looks; [] for any other (several
        tasks may have awaited the same poll)."""
        if self._inflight is not src:
            return []
        self._inflight = None
        return src.result()

    async def _interrupt(self) -> None:
        """End a running poll now and keep its batch (before a seek or close)."""
        src = self._inflight
        if src is None:
            return
        self._engine.wake.post()
        await asyncio.wait({bridge(src, asyncio.get_running_loop())})
        try:
            self._buffer.extend(self._take(src))
        except Exception:               # its error belongs to the poll nobody waits for any more
            pass

    # -- offsets --------------------------------------------------------------------------------------
    async def commit(self) -> None:
        """Store, per queue, the offset of the first message not handed out yet (the sync ``commit``)."""
        await self._call(self._engine.commit)

    async def committed(self, mq: MessageQueue) -> int | None:
        return await self._call(self._engine.committed, mq)

    async def seek(self, mq: MessageQueue, offset: int) -> None:
        """Continue ``mq`` from ``offset``; held messages of ``mq`` are dropped."""
        await self._interrupt()
        await self._call(self._engine.seek, mq, offset)
        self._drop({mq})

    async def seek_to_timestamp(self, timestamp_ms: int) -> None:
        await self._interrupt()
        await self._call(self._engine.seek_to_timestamp, timestamp_ms)
        self._drop(None)

    def _drop(self, queues: set[MessageQueue] | None) -> None:
        self._buffer = collections.deque(m for m in self._buffer if queues is not None and m.queue not in queues)
        self._engine.drop_held(queues)

    async def position(self, mq: MessageQueue) -> int:
        """The offset of the next message of ``mq`` handed out."""
        pos = await self._call(self._engine.position, mq)
        with self._engine.held_lock:
            return self._engine.held_first.get(mq, pos)

    async def assignment(self) -> list[MessageQueue]:
        return await self._call(self._engine.assignment)

    # -- life -----------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise ValidationError("the consumer is closed")

    async def close(self) -> None:
        """End a running poll, commit (with ``auto_commit``) what was handed out, leave the group,
        join the worker thread. An ``async for`` over this consumer ends."""
        if self.closed:
            return
        self.closed = True              # no poll starts from now on
        await self._interrupt()
        try:
            for f in self._setup:
                f.cancel()
            await self._worker.call(self._engine.close)
        finally:
            self._worker.shutdown()

    aclose = close

    async def __aenter__(self) -> "PullConsumer":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
