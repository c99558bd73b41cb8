"""The asyncio producer: ``await send(msg)`` / ``await send_batch(msgs)``, the sync producer's
guarantees (docs/api.md "Producing") without a thread per send.

A send runs on the event loop as far as nothing blocks: validate, pick a queue from a cached route,
encode the record into the session's ingress ring, ring the writer's doorbell. The writer's answer
comes back as the sync client's: the session's one completion reader thread sleeps on the ring's
completion futex and resolves the frame's future, which reaches the loop through its self-pipe
(``_bridge.bridge``). What can block — a first route lookup or auto-created topic, opening a session
with a broker, a ring full for a while (back-pressure) — runs on the producer's one worker thread
(``_bridge.Worker``); sends queued behind it keep their order.

Failure handling is the sync producer's: a send refused because the broker is gone, busy or does not
serve the topic is retried on another broker (``retries``, RocketMQ's ``retryTimesWhenSendFailed``)
within its timeout; ``SendTimeout`` when no answer came in time (the message may still be stored).

Cancelling an ``await send`` stops waiting, nothing else: a frame already in the ring is appended by
the writer and its completion consumed as usual (the result is dropped), so the ring, its completion
slots and later sends are unaffected. Whether a cancelled send was stored is unknown, as for a
timed-out one.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Any, Callable, Sequence

from .. import records as R
from ..client.producer import Producer as _SyncProducer
from ..ingress.session import ProducerSession, Waiter
from ..errors import BrokerBusyError, ConnectError, NoRouteError, SendTimeout, ValidationError
from ..message import Message, MessageQueue, SendResult
from ..ingress.ring import DEFAULT_COMPLETION_ENTRIES, DEFAULT_DATA_BYTES
from ..store.encode import encode_records
from ._bridge import Worker, bridge

Prepared = tuple[bytes, bytes, int, bytes]        # topic bytes, body, sys flag, properties bytes
Frame = tuple[int, bytes, int, "list[int] | None"]   # kind, payload, record count, record sizes
FrameFn = Callable[[MessageQueue, ProducerSession], Frame]


class _WouldBlock(Exception):
    """A step that needs the worker thread (a route lookup, a session to open, a full ring)."""


class _Engine(_SyncProducer):
    """The sync producer, with a route cache the loop may read without a lookup."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loop_thread: int | None = None
        self._fresh: dict[str, tuple[float, list[MessageQueue]]] = {}    # topic → (expiry, queues)

    def _queues(self, topic: str, deadline: float) -> list[MessageQueue]:
        if threading.get_ident() == self.loop_thread:
            hit = self._fresh.get(topic)
            if hit is None or hit[0] <= time.monotonic():
                raise _WouldBlock()
            return hit[1]
        queues = super()._queues(topic, deadline)
        inst = self.instance
        assert inst is not None             # started: routes come from it
        # as fresh as the client instance's own cache: looked up again after the same age
        self._fresh[topic] = (time.monotonic() + inst.route_max_age_s, queues)
        return queues

    def forget(self, broker: str, topic: str, error: Exception) -> None:
        self._fresh.pop(topic, None)
        super().forget(broker, topic, error)


class Producer:
    """See the module docstring. ``async with Producer(root) as p`` (or ``await p.start()`` …
    ``await p.close()``); a send on a producer not started yet starts it."""

    def __init__(self, root: Any = None, group: str = "DEFAULT_PRODUCER", *, send_timeout_s: float = 3.0,
                 retries: int = 2, compress_over_bytes: int = 4096, ring_bytes: int = DEFAULT_DATA_BYTES,
                 completion_entries: int = DEFAULT_COMPLETION_ENTRIES, latency_fault: bool = True) -> None:
        # spin_s=0: nobody here waits by spinning (a spinning thread would hold the loop's GIL)
        self._engine = _Engine(root, group, send_timeout_s=send_timeout_s, retries=retries,
                               compress_over_bytes=compress_over_bytes, spin_s=0.0, ring_bytes=ring_bytes,
                               completion_entries=completion_entries, latency_fault=latency_fault)
        self._worker = Worker(f"hostmq-aio-producer {group}")
        # Publishes handed to the worker (written by the loop) and finished there (by the worker):
        # while they differ, later sends go to the worker too — their order kept, the ring's
        # write lock never waited for on the loop.
        self._handed = 0
        self._finished = 0
        self.closed = False

    @property
    def group(self) -> str:
        return self._engine.group

    @property
    def sync(self) -> _SyncProducer:
        """The sync producer underneath (for reading its state, e.g. ``sync.instance``)."""
        return self._engine

    # -- life -----------------------------------------------------------------------------------------
    async def start(self) -> "Producer":
        if self.closed:
            raise ValidationError("the producer is closed")
        if not self._engine.started:
            await self._worker.call(self._engine.start)
        self._engine.loop_thread = threading.get_ident()
        return self

    async def close(self) -> None:
        """Wait (up to 3 s) for sends in flight, end every session, join the worker thread."""
        if self.closed:
            return
        self.closed = True
        try:
            await self._worker.call(self._engine.shutdown)
        finally:
            self._worker.shutdown()

    aclose = close

    async def __aenter__(self) -> "Producer":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- sends ----------------------------------------------------------------------------------------
    async def send(self, msg: Message, timeout: float | None = None, *, queue: MessageQueue | None = None,
                   selector: Callable[..., MessageQueue] | None = None, arg: Any = None,
                   sharding_key: str | None = None) -> SendResult:
        """Send and await the broker's answer; retried on another broker on failure (as the sync
        ``send``). ``queue`` / ``selector(queues, msg, arg)`` / ``sharding_key`` pin the queue."""
        deadline = await self._deadline(timeout)
        topic_b, body, sys_flag, props = self._engine.prepare(msg)

        def frame(mq: MessageQueue, session: ProducerSession) -> Frame:
            rec = self._engine.record(topic_b, body, props, sys_flag, mq, msg, session)
            return R.FRAME_MESSAGE, rec, 1, None
        return await self._retrying(msg, queue, selector, arg, sharding_key, deadline, frame)

    async def send_batch(self, msgs: Sequence[Message], timeout: float | None = None, *,
                         queue: MessageQueue | None = None) -> SendResult:
        """Messages of one topic to one queue as one frame; one SendResult whose ``msg_id`` is the
        comma-separated ids and ``queue_offset`` the first message's (as the sync ``send_batch``)."""
        msgs = list(msgs)
        if not msgs:
            raise ValidationError("send_batch needs at least one message")
        deadline = await self._deadline(timeout)
        prepared = [self._prepare_batched(m, msgs[0].topic) for m in msgs]
        flags = [m.flag for m in msgs]

        def frame(mq: MessageQueue, session: ProducerSession) -> Frame:
            payload, sizes = encode_records(prepared[0][0], [p[1] for p in prepared], [p[3] for p in prepared],
                                            queue_id=mq.queue_id, flags=flags, born_ts_ms=int(time.time() * 1000),
                                            born_host=R.host_bytes(), store_host=session.store_host)
            if len(payload) > session.max_batch_bytes:
                raise ValidationError(f"batch of {len(payload)} bytes exceeds the {session.max_batch_bytes} bytes "
                                      f"one batch may take on broker {mq.broker} (a frame of its ring, a "
                                      f"commitlog file); split it")
            return R.FRAME_BATCH, payload, len(sizes), sizes
        return await self._retrying(msgs[0], queue, None, None, None, deadline, frame)

    def _prepare_batched(self, m: Message, topic: str) -> Prepared:
        if not isinstance(m, Message) or m.topic != topic:
            raise ValidationError(f"a batch holds messages of one topic ({topic!r})")
        if m.delay_level:
            raise ValidationError("delay messages cannot be sent in a batch (as in RocketMQ)")
        return self._engine.prepare(m, compress=False)

    async def _deadline(self, timeout: float | None) -> float:
        if not self._engine.started or self._engine.loop_thread != threading.get_ident():
            await self.start()
        return time.monotonic() + (self._engine.send_timeout_s if timeout is None else timeout)

    # -- one send, retried ----------------------------------------------------------------------------
    async def _retrying(self, msg: Message, queue: MessageQueue | None, selector: Callable[..., MessageQueue] | None,
                        arg: Any, sharding_key: str | None, deadline: float, frame: FrameFn) -> SendResult:
        """``frame`` published on a chosen queue and its answer awaited; if the broker is gone, busy or
        refuses the topic, again on another broker (unless the queue is pinned) while time is left."""
        eng = self._engine
        pinned = queue is not None or selector is not None or sharding_key is not None
        last_failed: str | None = None
        error: Exception | None = None
        for _ in range(1 + (0 if pinned else eng.retries)):
            mq = await self._choose(msg, queue, selector, arg, sharding_key, last_failed, deadline)
            t0 = time.monotonic()
            try:
                result = await self._attempt(mq, frame, deadline)
                eng.note_latency(mq.broker, t0, False)
                return result
            except (ConnectError, BrokerBusyError, NoRouteError) as e:
                error, last_failed = e, mq.broker
                eng.note_latency(mq.broker, t0, True)
                await self._worker.call(eng.forget, mq.broker, msg.topic, e)   # may close a session
                if time.monotonic() >= deadline:
                    break
        assert error is not None
        raise error

    async def _choose(self, msg: Message, queue: MessageQueue | None, selector: Callable[..., MessageQueue] | None,
                      arg: Any, sharding_key: str | None, last_failed: str | None, deadline: float) -> MessageQueue:
        args = (msg, queue, selector, arg, sharding_key, last_failed, deadline)
        try:
            return self._engine.choose(*args)
        except _WouldBlock:
            return await self._worker.call(self._engine.choose, *args)

    async def _attempt(self, mq: MessageQueue, frame: FrameFn, deadline: float) -> SendResult:
        """Publish ``frame`` on ``mq`` and await its completion."""
        loop = asyncio.get_running_loop()
        future: concurrent.futures.Future = concurrent.futures.Future()
        session = self._engine.cached_session(mq.broker)
        if self._handed == self._finished and session is not None and session.broken is None:
            kind, payload, count, sizes = frame(mq, session)
            try:    # a deadline already past: one try to write, never a wait for room on the loop
                session.submit(kind, payload, count, Waiter(mq, sizes, future), 0.0, is_async=True)
            except BrokerBusyError:         # the ring is full now: wait for room on the worker
                await self._publish_on_worker(mq, frame, deadline, future)
        else:
            await self._publish_on_worker(mq, frame, deadline, future)
        answer = bridge(future, loop)
        try:
            async with asyncio.timeout_at(loop.time() + max(0.0, deadline - time.monotonic())):
                return await answer
        except TimeoutError as e:
            if isinstance(e, SendTimeout):
                raise
            raise SendTimeout(f"no acknowledgement from broker {mq.broker} within the send timeout "
                              f"(the message may still be stored)") from None

    async def _publish_on_worker(self, mq: MessageQueue, frame: FrameFn, deadline: float,
                                 future: concurrent.futures.Future) -> None:
        src = self._worker.submit(self._publish, mq, frame, deadline, future)
        self._handed += 1
        await bridge(src, asyncio.get_running_loop())

    def _publish(self, mq: MessageQueue, frame: FrameFn, deadline: float, future: concurrent.futures.Future) -> None:
        """On the worker: open the session if needed and publish, waiting for room up to ``deadline``."""
        try:
            session = self._engine.session(mq)
            kind, payload, count, sizes = frame(mq, session)
            session.submit(kind, payload, count, Waiter(mq, sizes, future), deadline, is_async=True)
        finally:
            self._finished += 1
