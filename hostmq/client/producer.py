"""The producer (docs/api.md "Producing"): messages travel through shared memory, never a socket.

``send`` validates the message (nothing leaves the process if it is bad), picks a queue — explicit,
by ``selector`` / ``sharding_key``, or round-robin with RocketMQ's latency fault strategy
(``fault``) — encodes the record straight into its session's ingress ring (``session``), and waits
for the writer's completion (a bounded spin, then the semaphore). A sync send that fails because the
broker is gone, busy or refuses the topic is retried up to ``retries`` times on another broker within
its timeout (RocketMQ: ``retryTimesWhenSendFailed`` = 2). Bodies over ``compress_over_bytes`` are
zlib-compressed (SYSFLAG bit 0) and decompressed transparently by readers.

The route comes from any live NameServer; a topic no broker serves is auto-created (RocketMQ's
TBW102 path: every broker with ``auto_create_topic`` creates it and registers at once).
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
import zlib
from typing import Callable, Sequence

from .. import records as R
from ..config import Config
from ..errors import BrokerBusyError, ConnectError, HostMQError, NoRouteError, ValidationError
from ..message import Message, MessageQueue, SendResult
from ..protocol.codes import RequestCode
from ..protocol.messages import TopicRequest
from ..root import RootPaths
from ..waiting import IdleStrategy, client_idle
from ..ingress.ring import DEFAULT_COMPLETION_ENTRIES, DEFAULT_DATA_BYTES
from ..store.encode import NATIVE as NATIVE_ENCODE, TAGS_B, UNIQ_B, check_body, encode_messages, properties_bytes, restamp
from ..semantics.schedule import schedule_parts
from ..semantics.system_topics import is_system_topic
from .accumulator import Accumulator, BatchConfig
from .async_sends import AsyncSends
from .fault import LatencyFaultTolerance, select_queue
from .instance import ClientInstance
from ..ingress.session import ProducerSession, Waiter

log = logging.getLogger(__name__)

COMPRESS_LEVEL = 5              # RocketMQ's default compressLevel
ROUTE_WAIT_S = 5.0              # how long a first send waits for an auto-created topic's route
LANE_TTL_S = 0.5                # how long _send_plain trusts a topic's queue list before asking again


class Producer:
    """See the module docstring. ``start()`` / ``shutdown()``, or use it as a context manager; a send
    on a producer not started yet starts it."""

    def __init__(self, root=None, group: str = "DEFAULT_PRODUCER", *, send_timeout_s: float = 3.0,
                 retries: int = 2, compress_over_bytes: int = 4096, spin_s: float | None = None,
                 idle: "str | IdleStrategy | None" = None, ring_bytes: int = DEFAULT_DATA_BYTES, completion_entries: int = DEFAULT_COMPLETION_ENTRIES,
                 latency_fault: bool = True, auto_batch: bool = False, batch: BatchConfig | None = None) -> None:
        """``auto_batch``: ``send_async`` gathers messages into batch frames (``accumulator``;
        ``batch`` sets its limits). ``idle``: how a sync send waits for its completion — an
        :class:`~hostmq.waiting.IdleStrategy` or its string ("spin", "backoff:50", "sleep", "auto";
        default ``$HOSTMQ_IDLE`` or auto, budget 200 µs); a bare ``spin_s`` is a busy spin that long."""
        R.validate_group(group)             # RocketMQ Validators.checkGroup, as for consumer groups
        self.root = root
        self.group = group
        self.send_timeout_s = send_timeout_s
        self.retries = retries
        self.compress_over_bytes = compress_over_bytes
        self.idle = client_idle(idle, spin_s, 200e-6, "Producer idle")
        self.spin_s = self.idle.spin_s
        self.ring_bytes = ring_bytes
        self.completion_entries = completion_entries
        self.fault = LatencyFaultTolerance() if latency_fault else None
        self.instance: ClientInstance | None = None
        self._sessions: dict[str, ProducerSession] = {}
        self._lock = threading.Lock()
        self._rr = 0
        self._started = False
        self._limits = Config().store
        self._topics: dict[str, bytes] = {}       # validated topic names
        self._lanes: dict[str, tuple] = {}        # _send_plain's per-topic cache (_lane)
        self.batch_config = (batch or BatchConfig()) if auto_batch else None
        self._accumulator: Accumulator | None = None
        self._async_sends: AsyncSends | None = None

    # -- life -----------------------------------------------------------------------------------------
    def start(self) -> "Producer":
        if self._started:
            return self
        self.instance = ClientInstance(self.root, timeout_s=self.send_timeout_s)
        paths = RootPaths(self.instance.root)
        try:
            self._limits = Config.load(paths.config_file).store if os.path.exists(paths.config_file) \
                else Config().store
        except HostMQError:     # a broken hostmq.toml is the servers' problem; use the defaults
            self._limits = Config().store
        self._started = True
        return self

    @property
    def started(self) -> bool:
        """Whether ``start`` ran (and ``shutdown`` has not since)."""
        return self._started

    def flush(self) -> None:
        """Publish every message ``send_async`` holds in an open batch (``auto_batch``) now."""
        if self._accumulator is not None:
            self._accumulator.flush()
        if self._async_sends is not None:
            self._async_sends.flush()

    def shutdown(self) -> None:
        acc, self._accumulator = self._accumulator, None
        if acc is not None:             # its last batches go out before the sessions close
            acc.close()
        sends, self._async_sends = self._async_sends, None
        if sends is not None:
            sends.flush()
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
            self._started = False
            self._lanes = {}
        for s in sessions:
            s.close()
        if self.instance is not None:
            self.instance.close()
            self.instance = None

    close = shutdown

    def __enter__(self) -> "Producer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # -- the public sends -----------------------------------------------------------------------------
    def send(self, msg: Message, timeout: float | None = None, *, queue: MessageQueue | None = None,
             selector: Callable | None = None, arg=None, sharding_key: str | None = None) -> SendResult:
        """Send and wait for the broker's answer (SendResult); retried on another broker on failure."""
        if queue is None and selector is None and sharding_key is None:
            out = self._send_plain(msg, timeout)
            if out is not None:
                return out
        deadline = time.monotonic() + (self.send_timeout_s if timeout is None else timeout)
        alone = self.encoded_alone(msg)
        if alone is not None:           # the common case, encoded in one native call
            payload, sizes = alone

            def attempt(mq: MessageQueue, session: ProducerSession) -> SendResult:
                rec = restamp(payload, sizes, mq.queue_id, session.store_host)
                return session.send(R.FRAME_MESSAGE, rec, 1, Waiter(mq), deadline)
            return self._retrying(msg, queue, selector, arg, sharding_key, deadline, attempt)[1]
        topic_b, body, sys_flag, props = self.prepare(msg)

        def attempt(mq: MessageQueue, session: ProducerSession) -> SendResult:
            rec = self.record(topic_b, body, props, sys_flag, mq, msg, session)
            return session.send(R.FRAME_MESSAGE, rec, 1, Waiter(mq), deadline)
        return self._retrying(msg, queue, selector, arg, sharding_key, deadline, attempt)[1]

    def send_async(self, msg: Message, timeout: float | None = None, *, queue: MessageQueue | None = None,
                   selector: Callable | None = None, arg=None, sharding_key: str | None = None,
                   callback: Callable | None = None) -> concurrent.futures.Future:
        """Send without waiting: a Future of the SendResult (``callback(future)`` runs when it is done,
        on the thread that read the broker's answer — the session's completion thread, or a caller
        waiting on a result). A plain message is batched naturally (``client.async_sends``): its
        Future is a ``SendFuture`` view into its frame."""
        if queue is None and selector is None and sharding_key is None and self.batch_config is None:
            # The common case: a view into a naturally batched frame (client.async_sends), the
            # message encoded onto the open frame in one native call; AsyncSends.add_slow otherwise.
            sends = self._async_sends or self._make_async_sends()
            g = sends.gather
            view = g.add(msg)
            if view is None:
                view = sends.add_slow(msg, self.send_timeout_s if timeout is None else timeout)
            elif g.due is not None:
                sends.publish_due()
            if view is not None:
                if callback is not None:
                    view.add_done_callback(callback)
                return view
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if callback is not None:
            fut.add_done_callback(callback)
        if self.batch_config is not None and queue is None and selector is None and sharding_key is None \
                and isinstance(msg, Message) and not msg.delay_level:
            alone = self.encoded_alone(msg)
            if alone is not None:
                record = alone[0]
            else:
                topic_b, body, sys_flag, props = self.prepare(msg, compress=False)
                if len(body) > self.compress_over_bytes:
                    self._submit_async(msg, timeout, queue, selector, arg, sharding_key, fut,
                                       (topic_b, *self._compressed(body), props))     # too large to batch: alone
                    return fut
                record = R.encode_record(topic_b, body, props, flag=msg.flag, born_ts_ms=int(time.time() * 1000),
                                         born_host=R.host_bytes(), store_host=b"")
            acc = self._accumulator
            if acc is None:
                with self._lock:
                    acc = self._accumulator = self._accumulator or Accumulator(self, self.batch_config)
            acc.add(msg, record, fut, self.send_timeout_s if timeout is None else timeout)
            return fut
        self._submit_async(msg, timeout, queue, selector, arg, sharding_key, fut)
        return fut

    def send_oneway(self, msg: Message, *, queue: MessageQueue | None = None, selector: Callable | None = None,
                    arg=None, sharding_key: str | None = None) -> None:
        """Send without any answer (RocketMQ oneway): errors after the frame left are not reported."""
        self._submit_async(msg, None, queue, selector, arg, sharding_key, None)

    def send_batch(self, msgs: Sequence[Message], timeout: float | None = None, *,
                   queue: MessageQueue | None = None) -> SendResult:
        """Send messages of one topic to one queue as one frame; one SendResult whose ``msg_id`` is
        the comma-separated ids and ``queue_offset`` the first message's."""
        msgs = list(msgs)
        if not msgs:
            raise ValidationError("send_batch needs at least one message")
        first = msgs[0]
        if not isinstance(first, Message):
            raise ValidationError(f"a batch holds hostmq.Message objects, got {type(first).__name__}")
        # Checked and encoded once (ids drawn once, as RocketMQ sets them before its retries); each
        # attempt stamps its queue and broker into a copy.
        payload, sizes = self._encoded(msgs, first.topic)
        deadline = time.monotonic() + (self.send_timeout_s if timeout is None else timeout)

        def attempt(mq: MessageQueue, session: ProducerSession) -> SendResult:
            if len(payload) > session.max_batch_bytes:
                raise ValidationError(f"batch of {len(payload)} bytes exceeds the {session.max_batch_bytes} bytes "
                                      f"one batch may take on broker {mq.broker} (a frame of its ring, a "
                                      f"commitlog file); split it")
            return session.send(R.FRAME_BATCH, restamp(payload, sizes, mq.queue_id, session.store_host), len(sizes),
                                Waiter(mq, sizes), deadline)
        return self._retrying(msgs[0], queue, None, None, None, deadline, attempt)[1]

    # -- pieces ---------------------------------------------------------------------------------------
    def _send_plain(self, msg: Message, timeout: float | None) -> SendResult | None:
        """``send``'s usual case in as little Python as it takes — what a send costs after the process
        slept is mostly the code it runs on cold caches: a plain message (``encoded_alone``'s case)
        of a topic this producer has validated, whose route is cached, to the next queue round-robin
        when its broker is available and its session open — encoded for that queue and broker at once
        (no ``restamp`` copy) and published. None, with nothing sent and no id drawn, for anything
        else: ``send`` then takes it. If this first attempt fails the way ``_retrying`` retries, the
        retries go on there with the same record."""
        if msg.__class__ is not Message or NATIVE_ENCODE is None:
            return None
        body, topic = msg.body, msg.topic
        if body.__class__ is not bytes or topic.__class__ is not str or msg.delay_level \
                or len(body) > self.compress_over_bytes:
            return None
        now = time.monotonic()
        lane = self._lanes.get(topic)
        if lane is None or now >= lane[0]:
            lane = self._lane(topic, now)
            if lane is None:
                return None
        _, topic_b, queues = lane
        rr = self._rr + 1
        mq = queues[rr % len(queues)]
        fault = self.fault
        if fault is not None:           # fault.available, inline
            item = fault.items.get(mq.broker)
            if item is not None and time.time() * 1000 < item.available_from_ms:
                return None
        session = self._sessions.get(mq.broker)
        if session is None or session.broken is not None:
            return None
        lim = self._limits
        prefix, counter = R._UID_SOURCE[0]      # records.unique_id_source(), host_bytes(): inline
        enc = NATIVE_ENCODE.encode_messages([msg], topic, topic_b, mq.queue_id, int(time.time() * 1000),
                                            R._MY_HOST[0], session.store_host, lim.max_message_bytes,
                                            lim.max_properties_bytes, TAGS_B, UNIQ_B, prefix, counter)
        if enc is None:
            return None
        self._rr = rr
        t0 = now
        deadline = now + (self.send_timeout_s if timeout is None else timeout)
        try:
            out = session.send(R.FRAME_MESSAGE, enc[0], 1, Waiter(mq), deadline)
        except (ConnectError, BrokerBusyError, NoRouteError) as e:
            self.note_latency(mq.broker, t0, True)
            self.forget(mq.broker, topic, e)
            if time.monotonic() >= deadline or not self.retries:
                raise
            payload, sizes = enc

            def attempt(mq: MessageQueue, session: ProducerSession) -> SendResult:
                return session.send(R.FRAME_MESSAGE, restamp(payload, sizes, mq.queue_id, session.store_host), 1,
                                    Waiter(mq), deadline)
            return self._retrying(msg, None, None, None, None, deadline, attempt, mq.broker, e)[1]
        if fault is not None:           # note_latency, inline
            fault.update(mq.broker, (time.monotonic() - t0) * 1000, time.time() * 1000)
        return out

    def _lane(self, topic: str, now: float) -> tuple | None:
        """``(good until, topic bytes, writable queues)`` for ``_send_plain``: a topic validated before
        whose route the instance holds fresh (kept at most ``LANE_TTL_S``, and never past the route's
        own age); None otherwise."""
        topic_b = self._topics.get(topic)
        inst = self.instance
        queues = inst.cached_publish_queues(topic) if topic_b is not None and inst is not None else None
        if not queues:
            self._lanes.pop(topic, None)
            return None
        lane = (now + LANE_TTL_S, topic_b, queues)
        if len(self._lanes) < 10_000:
            self._lanes[topic] = lane
        return lane

    def _retrying(self, msg: Message, queue, selector, arg, sharding_key, deadline: float,
                  attempt: Callable, last_failed: str | None = None,
                  failed: Exception | None = None) -> tuple[MessageQueue, object]:
        """``attempt(queue, session)`` on a chosen queue; if the broker is gone, busy or refuses the
        topic, again on another broker (unless the queue is pinned) while time is left. ``(queue, its
        result)``, or the last error. ``last_failed`` / ``failed``: a first attempt made elsewhere
        (``_send_plain``) failed on that broker with that error: the retries that are left."""
        pinned = queue is not None or selector is not None or sharding_key is not None
        error = failed
        for _ in range((0 if failed is not None else 1) + (0 if pinned else self.retries)):
            mq = self.choose(msg, queue, selector, arg, sharding_key, last_failed, deadline)
            t0 = time.monotonic()
            try:
                out = attempt(mq, self.session(mq))
                self.note_latency(mq.broker, t0, False)
                return mq, out
            except (ConnectError, BrokerBusyError, NoRouteError) as e:
                error, last_failed = e, mq.broker
                self.note_latency(mq.broker, t0, True)
                self.forget(mq.broker, msg.topic, e)
                if time.monotonic() >= deadline:
                    break
        raise error

    def _submit_async(self, msg, timeout, queue, selector, arg, sharding_key, fut, prepared=None) -> None:
        deadline = time.monotonic() + (self.send_timeout_s if timeout is None else timeout)
        alone = self.encoded_alone(msg) if prepared is None else None
        if alone is not None:           # the common case, encoded in one native call
            payload, sizes = alone

            def frame(mq: MessageQueue, session: ProducerSession) -> tuple:
                return R.FRAME_MESSAGE, restamp(payload, sizes, mq.queue_id, session.store_host), 1, \
                    Waiter(mq, None, fut)
            self.publish_frame(msg, queue, selector, arg, sharding_key, deadline, frame)
            return
        topic_b, body, sys_flag, props = prepared or self.prepare(msg)

        def frame(mq: MessageQueue, session: ProducerSession) -> tuple:
            rec = self.record(topic_b, body, props, sys_flag, mq, msg, session)
            return R.FRAME_MESSAGE, rec, 1, Waiter(mq, None, fut)
        self.publish_frame(msg, queue, selector, arg, sharding_key, deadline, frame)

    def publish_frame(self, msg: Message, queue, selector, arg, sharding_key, deadline: float,
                      frame: Callable) -> tuple[ProducerSession, Waiter]:
        """Publish the frame ``frame(queue, session)`` builds — ``(kind, payload, count, waiter)`` —
        without waiting for it; on another broker if this one is gone or busy (unless the queue is
        pinned); the last error otherwise. ``(session, waiter)`` of the attempt that published it.
        Async sends (``async_sends``) and auto-batches (``accumulator``)."""
        pinned = queue is not None or selector is not None or sharding_key is not None
        last_failed, error = None, None
        for _ in range(1 + (0 if pinned else self.retries)):
            mq = self.choose(msg, queue, selector, arg, sharding_key, last_failed, deadline)
            try:
                session = self.session(mq)
                kind, payload, count, waiter = frame(mq, session)
                session.submit(kind, payload, count, waiter, deadline, is_async=True)
                return session, waiter
            except (ConnectError, BrokerBusyError) as e:
                error, last_failed = e, mq.broker
                self.note_latency(mq.broker, time.monotonic(), True)
                self.forget(mq.broker, msg.topic, e)
        raise error

    # The pieces of a send below are public so that ``hostmq.aio.Producer`` composes its sends from
    # them (prepare, choose, session / cached_session, record, note_latency, forget) without reaching
    # into this class; they are not part of docs/api.md.
    def prepare(self, msg: Message, compress: bool = True) -> tuple[bytes, bytes, int, bytes]:
        """Validate; ``(topic bytes, body to store, sys flag, properties bytes)``. Nothing is sent
        for a message that fails here."""
        if not isinstance(msg, Message):
            raise ValidationError(f"expected a hostmq.Message, got {type(msg).__name__}")
        topic_b = self.topic_bytes(msg.topic)
        lim = self._limits
        body = bytes(check_body(msg.body, lim.max_message_bytes))
        if msg.flag.__class__ is not int or not -(1 << 31) <= msg.flag < (1 << 31):
            raise ValidationError(f"flag must be a 32-bit int, got {msg.flag!r}")
        props = properties_bytes(msg, R.new_unique_id(), lim.max_properties_bytes)
        body, sys_flag = self._compressed(body) if compress else (body, 0)
        return topic_b, body, sys_flag, props

    def encoded_alone(self, msg: Message) -> tuple[bytes, list[int]] | None:
        """A message that needs neither the delay routing nor compression, checked and encoded as a
        batch of one (``store.encode.encode_messages``; queue and broker stamped per attempt with
        ``restamp``): the same record ``prepare`` + ``record`` build. None for any other message."""
        if msg.__class__ is not Message or msg.delay_level or msg.body.__class__ is not bytes \
                or len(msg.body) > self.compress_over_bytes:
            return None
        return self._encoded([msg], msg.topic)

    def _encoded(self, msgs: list[Message], topic: str) -> tuple[bytes, list[int]]:
        """``msgs`` (of ``topic``) checked and encoded for queue 0 and no broker (``restamp`` stamps
        those per attempt), their unique ids drawn from this process's counter."""
        lim = self._limits
        prefix, counter = R.unique_id_source()
        return encode_messages(msgs, topic, self.topic_bytes(topic), queue_id=0, born_ts_ms=int(time.time() * 1000),
                               born_host=R.host_bytes(), store_host=b"", max_body_bytes=lim.max_message_bytes,
                               max_props_bytes=lim.max_properties_bytes, uid_prefix=prefix, uid_next=counter)

    def topic_bytes(self, topic: str) -> bytes:
        """``topic`` validated as a user's topic, encoded (cached); starts the producer if it was not."""
        if not self._started:
            self.start()
        topic_b = self._topics.get(topic) if topic.__class__ is str else None
        if topic_b is None:
            topic_b = R.validate_topic(topic)
            if is_system_topic(topic):
                raise ValidationError(f"topic {topic!r} is a system topic; users cannot send to it")
            if len(self._topics) < 10_000:
                self._topics[topic] = topic_b
        return topic_b

    def _compressed(self, body: bytes) -> tuple[bytes, int]:
        """``(body to store, sys flag)``: zlib-compressed if over ``compress_over_bytes`` and smaller so."""
        if len(body) > self.compress_over_bytes:
            packed = zlib.compress(body, COMPRESS_LEVEL)
            if len(packed) < len(body):
                return packed, R.SYSFLAG_COMPRESSED
        return body, 0

    @staticmethod
    def record(topic_b: bytes, body: bytes, props: bytes, sys_flag: int, mq: MessageQueue, msg: Message,
               session: ProducerSession) -> bytes:
        """The stored record of a prepared message for ``mq`` (a delayed one under the schedule topic)."""
        queue_id = mq.queue_id
        if msg.delay_level:             # stored under the schedule topic until due (broker.schedule)
            topic_b, queue_id, props = schedule_parts(mq.topic, queue_id, props, msg.delay_level,
                                                      session.delay_levels)
            if len(props) > session.max_properties_bytes:
                raise ValidationError(f"properties of {len(props)} bytes with the delay routing exceed "
                                      f"{session.max_properties_bytes}")
        return R.encode_record(topic_b, body, props, queue_id=queue_id, flag=msg.flag, sys_flag=sys_flag,
                               born_ts_ms=int(time.time() * 1000), born_host=R.host_bytes(),
                               store_host=session.store_host)

    def choose(self, msg: Message, queue, selector, arg, sharding_key, last_failed,
               deadline: float) -> MessageQueue:
        """The queue a send goes to: ``queue`` if pinned, else ``selector``'s or ``sharding_key``'s,
        else the next one round-robin, avoiding ``last_failed`` and brokers the latency fault marks."""
        if queue is not None:
            if not isinstance(queue, MessageQueue) or queue.topic != msg.topic:
                raise ValidationError(f"queue {queue!r} is not a queue of topic {msg.topic!r}")
            return queue
        queues = self._queues(msg.topic, deadline)
        if selector is not None:
            mq = selector(queues, msg, arg)
            if not isinstance(mq, MessageQueue) or mq.topic != msg.topic:
                raise ValidationError(f"selector returned {mq!r}, not a queue of topic {msg.topic!r}")
            return mq
        if sharding_key is not None:
            if not isinstance(sharding_key, str):
                raise ValidationError(f"sharding_key must be a string, got {sharding_key!r}")
            return queues[abs(R.java_string_hash(sharding_key)) % len(queues)]
        self._rr += 1
        return select_queue(queues, self._rr, self.fault, time.time() * 1000, last_failed)

    def _queues(self, topic: str, deadline: float) -> list[MessageQueue]:
        inst = self.instance
        try:
            return inst.publish_queues(topic)
        except NoRouteError:
            pass
        self._auto_create(topic)
        wait_until = min(deadline, time.monotonic() + ROUTE_WAIT_S)
        while True:
            try:
                return inst.publish_queues(topic, refresh=True)
            except NoRouteError:
                if time.monotonic() >= wait_until:
                    raise
                time.sleep(0.02)

    def _auto_create(self, topic: str) -> None:
        """Ask every live broker to create the topic (each registers it with the NameServers)."""
        info = self.instance.cluster_info()
        errors = []
        created = 0
        for name, b in sorted(info["brokers"].items()):
            if not b.master_address:
                continue
            try:
                self.instance.broker_request(b.master_address, RequestCode.AUTO_CREATE_TOPIC,
                                             TopicRequest.of(topic=topic).to_fields(), timeout_s=2.0)
                created += 1
            except HostMQError as e:
                errors.append(f"{name}: {e}")
        if not created:
            raise NoRouteError(f"no route for topic {topic!r} and no broker created it"
                               + (f" ({'; '.join(errors)})" if errors else " (no broker is registered)"))

    def session(self, mq: MessageQueue) -> ProducerSession:
        """The session to ``mq``'s broker, opened (a connect, a ring mapped) on first use."""
        return self._broker_session(mq.broker, mq.topic)

    def cached_session(self, broker: str) -> ProducerSession | None:
        """The session to ``broker`` if one was opened (broken or not), without opening one: what a
        caller that must not block may use."""
        return self._sessions.get(broker)

    def _broker_session(self, broker: str, topic: str | None = None) -> ProducerSession:
        """The session (ingress ring) to ``broker``, opened on first use (its address from ``topic``'s
        route when given, else from the cluster info)."""
        s = self._sessions.get(broker)
        if s is not None and s.broken is None:
            return s
        with self._lock:
            s = self._sessions.get(broker)
            if s is not None and s.broken is None:
                return s
            if s is not None:
                s.close(0)
            address = self.instance.broker_address(broker, topic)
            s = ProducerSession(self.instance, broker, address, data_bytes=self.ring_bytes,
                                completion_entries=self.completion_entries, idle=self.idle)
            s.on_drained = self._drained
            self._sessions[broker] = s
            return s

    def _make_async_sends(self) -> AsyncSends:
        if not self._started:
            self.start()
        with self._lock:
            sends = self._async_sends = self._async_sends or AsyncSends(self)
        return sends

    def _drained(self) -> None:
        """A session's completion thread read completions: open async frames may go out now."""
        sends = self._async_sends
        if sends is not None:
            sends.poke()

    def note_latency(self, broker: str, t0: float, failed: bool) -> None:
        """A send to ``broker`` begun at ``t0`` ended (``failed``: isolate it a while) — the latency
        fault tolerance's input."""
        if self.fault is not None:
            self.fault.update(broker, (time.monotonic() - t0) * 1000, time.time() * 1000, isolation=failed)

    def forget(self, broker: str, topic: str, error: Exception) -> None:
        """After a failure: drop a broken session and the topic's cached route."""
        s = self._sessions.get(broker)
        if s is not None and s.broken is not None:
            with self._lock:
                if self._sessions.get(broker) is s:
                    del self._sessions[broker]
            s.close(0)
        self._lanes.pop(topic, None)
        if self.instance is not None:
            self.instance.forget_route(topic)
        log.info("send to %s failed: %s", broker, error)
