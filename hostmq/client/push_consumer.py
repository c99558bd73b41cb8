"""The push consumer (docs/api.md "Consuming"; RocketMQ ``DefaultMQPushConsumer``, concurrent mode).

One pull thread does everything that talks to brokers — membership and rebalance, fetching, offset
commits — through a :class:`PullConsumer` it owns; a pool of ``threads`` runs the listener on
batches of ``batch_size`` messages of one queue. Messages go from the mapped store to the listener
without crossing a socket; an idle pull thread sleeps on the consumer's wake-up semaphore, which
the dispatcher posts on arrival (the shared-memory form of RocketMQ's 15 s broker long poll).

* Flow control (RocketMQ ``pullThresholdForQueue`` / ``…SizeInMiB``): a queue holding
  ``max_held_messages`` (1000) or ``max_held_bytes`` (100 MiB) unconsumed messages is not fetched
  from until its listener catches up.
* Offsets: per queue the first message whose listener has not finished (``process_queue``) is
  committed every ``auto_commit_interval_s`` (5 s), when a queue moves to another member, and at
  shutdown — a crash re-delivers only unfinished messages. Messages the subscription filtered out
  (and undecodable records the read side skipped) hold nothing back: with nothing held, a queue
  commits the pull consumer's position, as RocketMQ's ``ProcessQueue`` does.
* A stored record that cannot be decoded never reaches the listener (the pull consumer skips and
  logs it, ``skipped_records`` counts it), and no error of a poll ends the pull thread: it is
  logged and the thread polls again after a pause.
* ``RECONSUME_LATER`` or an exception from the listener (CLUSTERING): each message is sent back
  to the broker — ``%RETRY%<group>`` after a growing back-off, ``%DLQ%<group>`` after
  ``max_reconsume_times`` retries (``semantics.retry``); members subscribe to their retry topic and a
  retried message is shown under its original topic. If a send-back fails, or in BROADCASTING, the
  batch is consumed again here after ``retry_delay_s`` (RocketMQ's local fallback); its offset is not
  committed past it meanwhile.
* ``register(fn, orderly=True)``: queues locked on their broker, one queue's messages one at a time
  in queue order (``orderly.ConsumeMessageOrderlyService``).
* The listener runs in a consume service chosen by ``register`` (``consume_service``: RocketMQ's
  ``ConsumeMessageConcurrentlyService`` / ``ConsumeMessageOrderlyService``); a listener that takes a
  second positional parameter is called ``fn(msgs, context)`` with the batch's consume context
  (``ConsumeConcurrentlyContext`` / ``ConsumeOrderlyContext``), else ``fn(msgs)`` as always.
* BROADCASTING: every instance reads every queue; offsets are kept per ``instance_name`` under the
  root (``offset_store.LocalOffsets``).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable

from .. import records as R
from ..semantics.retry import RETRY_PREFIX, retry_record, retry_topic
from ..errors import HostMQError, ValidationError
from ..protocol.codes import RequestCode
from ..message import ConsumeFrom, ConsumeResult, MessageExt, MessageModel, MessageQueue
from .membership import HEARTBEAT_INTERVAL_S, REBALANCE_INTERVAL_S
from .offset_store import LocalOffsets, local_offsets_path
from .consume_service import (ConsumeConcurrentlyContext, ConsumeMessageConcurrentlyService, ConsumeMessageService,
                              ConsumeOrderlyContext, SendBack, takes_context)
from .orderly import ConsumeMessageOrderlyService
from .process_queue import ProcessQueue
from .pull_consumer import PullConsumer
from .rebalance import Strategy
from ..ingress.session import ProducerSession, Waiter
from ..waiting import IdleStrategy, client_idle
from .sql92 import SQL
from ..store.filter import parse_tag_expression

log = logging.getLogger(__name__)

MAX_HELD_MESSAGES = 1000
MAX_HELD_BYTES = 100 << 20
RETRY_DELAY_S = 1.0
POLL_ERROR_PAUSE_S = 1.0        # the pull thread's pause after an unexpected error of a poll


ServiceFactory = Callable[["PushConsumer", bool], ConsumeMessageService]


def show_original_topics(batch: list[MessageExt]) -> None:
    """A retried message is shown under its own topic (RocketMQ ``resetRetryAndNamespace``)."""
    for m in batch:
        if m.topic.startswith(RETRY_PREFIX):
            m.show_as(m.properties.get(R.PROP_RETRY_TOPIC))


def default_context(batch: list[MessageExt], orderly: bool) -> ConsumeConcurrentlyContext | ConsumeOrderlyContext:
    """A context for a caller of ``call_listener`` that passed none: the batch's queue as shown."""
    mq = batch[0].queue if batch else MessageQueue("", "", 0)
    return ConsumeOrderlyContext(mq) if orderly else ConsumeConcurrentlyContext(mq)


def listener_raised(group: str) -> ConsumeResult:
    """A listener raised (called in the ``except``): logged, the batch is consumed again later."""
    log.exception("listener of %s failed; consuming again later", group)
    return ConsumeResult.RECONSUME_LATER


def listener_verdict(group: str, result: Any) -> ConsumeResult:
    """A listener's return value as a verdict: anything but a ConsumeResult is RECONSUME_LATER (logged)."""
    if not isinstance(result, ConsumeResult):
        log.error("listener of %s returned %r (not a ConsumeResult); consuming again later", group, result)
        return ConsumeResult.RECONSUME_LATER
    return result


class PushConsumer:
    def __init__(self, root=None, group: str = "DEFAULT_CONSUMER", model: MessageModel = MessageModel.CLUSTERING,
                 consume_from: ConsumeFrom = ConsumeFrom.LAST_OFFSET, consume_timestamp_ms: int | None = None,
                 allocate: Strategy = "average", max_reconsume_times: int = 16, batch_size: int = 1,
                 threads: int = 4, *, instance_name: str = "DEFAULT", pull_batch_size: int = 32,
                 max_held_messages: int = MAX_HELD_MESSAGES, max_held_bytes: int = MAX_HELD_BYTES,
                 auto_commit_interval_s: float = 5.0, rebalance_interval_s: float = REBALANCE_INTERVAL_S,
                 heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S, retry_delay_s: float = RETRY_DELAY_S,
                 service_factory: ServiceFactory | None = None, idle: "str | IdleStrategy | None" = None) -> None:
        """``service_factory(consumer, orderly)``: the consume service ``register`` installs (default:
        ``ConsumeMessageOrderlyService`` or ``ConsumeMessageConcurrentlyService``); ``hostmq.aio``
        passes services that run listeners on its event loop. ``idle``: how the pulling thread waits
        for messages (an :class:`~hostmq.waiting.IdleStrategy` or its string; default
        ``$HOSTMQ_IDLE`` or auto). Its spin holds the GIL the listener threads need: ``yield`` and
        ``backoff`` give it up between checks, ``spin`` only when its budget ends."""
        if service_factory is not None and not callable(service_factory):
            raise ValidationError(f"service_factory must be callable, got {service_factory!r}")
        self.idle = client_idle(idle, None, 50e-6, "PushConsumer idle")
        if not isinstance(model, MessageModel):
            raise ValidationError(f"model must be a hostmq.MessageModel, got {model!r}")
        for name, v in (("batch_size", batch_size), ("threads", threads), ("pull_batch_size", pull_batch_size),
                        ("max_held_messages", max_held_messages), ("max_held_bytes", max_held_bytes)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValidationError(f"{name} must be an int ≥ 1, got {v!r}")
        R.validate_consumer_group(group)
        self.root, self.group, self.model = root, group, model
        self.consume_from, self.consume_timestamp_ms = consume_from, consume_timestamp_ms
        self.allocate, self.max_reconsume_times = allocate, max_reconsume_times
        self.batch_size, self.threads, self.instance_name = batch_size, threads, instance_name
        self.pull_batch_size = pull_batch_size
        self.max_held_messages, self.max_held_bytes = max_held_messages, max_held_bytes
        self.auto_commit_interval_s = auto_commit_interval_s
        self.rebalance_interval_s, self.heartbeat_interval_s = rebalance_interval_s, heartbeat_interval_s
        self.retry_delay_s = retry_delay_s
        self.subscriptions: dict[str, str | SQL] = {}
        self.listener: Callable[..., ConsumeResult] | None = None
        self.listener_takes_context = False     # called fn(msgs, context) rather than fn(msgs)
        self.service_factory = service_factory
        self.service: ConsumeMessageService | None = None
        self.pull: PullConsumer | None = None
        self.queues: dict[MessageQueue, ProcessQueue] = {}
        # What the consume services (``consume_service``, ``orderly``, ``hostmq.aio``) share with this
        # consumer: ``queues``, ``lock`` (process queues and service state), ``stopping``, ``pool`` (the
        # listener threads), ``failed`` (send-backs for the pull thread), ``pull`` and :meth:`call_listener`.
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.pool: ThreadPoolExecutor | None = None
        # (queue, process queue, tuple of SendBack): failed messages the pull thread sends back
        self.failed: queue.SimpleQueue = queue.SimpleQueue()
        self._sessions: dict[str, ProducerSession] = {}          # broker → ring for send-backs
        self.lock = threading.Lock()
        self.error: BaseException | None = None
        self._synced_version = -1       # the pull consumer's assignment_version the process queues follow
        self._first_mq: MessageQueue | None = None      # _consume_first's last queue and its process queue
        self._first_pq: ProcessQueue | None = None

    # -- set-up ---------------------------------------------------------------------------------------
    def subscribe(self, topic: str, expression: str | SQL = "*") -> None:
        if self.pull is not None:
            raise ValidationError("subscribe before start()")
        if isinstance(expression, str):
            parse_tag_expression(expression)
        elif not isinstance(expression, SQL):
            raise ValidationError(f"expression must be a tag expression or hostmq.SQL, got {expression!r}")
        from .. import records as R
        R.validate_topic(topic)
        self.subscriptions[topic] = expression

    def register(self, fn: Callable[..., ConsumeResult], orderly: bool = False) -> None:
        """``fn(msgs)`` or ``fn(msgs, context)`` → ``ConsumeResult``; ``orderly`` picks the orderly
        consume service (RocketMQ: registering a ``MessageListenerOrderly``)."""
        if not callable(fn):
            raise ValidationError("the listener must be callable")
        if orderly and self.model != MessageModel.CLUSTERING:
            raise ValidationError("orderly consumption needs MessageModel.CLUSTERING (queues are locked per group)")
        if self.pull is not None:
            raise ValidationError("register before start()")
        if self.service_factory is not None:
            service = self.service_factory(self, bool(orderly))
            if not isinstance(service, ConsumeMessageService):
                raise ValidationError(f"service_factory returned {service!r}, not a ConsumeMessageService")
        else:
            service = ConsumeMessageOrderlyService(self) if orderly else ConsumeMessageConcurrentlyService(self)
        self.service = service
        self.listener = fn
        self.listener_takes_context = takes_context(fn)

    @property
    def orderly(self) -> ConsumeMessageOrderlyService | None:
        """The orderly consume service, if the listener is orderly (else None)."""
        s = self.service
        return s if isinstance(s, ConsumeMessageOrderlyService) else None

    def start(self) -> "PushConsumer":
        if self.pull is not None:
            return self
        if not self.subscriptions:
            raise ValidationError("subscribe to at least one topic before start()")
        if self.listener is None or self.service is None:
            raise ValidationError("register a listener before start()")
        service = self.service
        store = None
        pull = PullConsumer(self.root, group=self.group, auto_commit=False, consume_from=self.consume_from,
                            consume_timestamp_ms=self.consume_timestamp_ms, max_poll_records=self.pull_batch_size,
                            allocate=self.allocate, rebalance_interval_s=self.rebalance_interval_s,
                            heartbeat_interval_s=self.heartbeat_interval_s,
                            on_revoke=service.on_revoke, commit_position=self._commit_position,
                            idle=self.idle)
        try:
            if self.model == MessageModel.BROADCASTING:
                store = LocalOffsets(local_offsets_path(pull.root, self.instance_name, self.group))
                pull.offsets = store
            self.pull = pull
            self._setup_queues()
        except BaseException:
            pull.close()
            self.pull = None
            raise
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix=f"hostmq-consume {self.group}")
        service.start()
        self._thread = threading.Thread(target=self._run, name=f"hostmq-pull {self.group}", daemon=True)
        self._thread.start()
        return self

    def _setup_queues(self) -> None:
        pull = self.pull
        if self.model == MessageModel.CLUSTERING:
            for topic, expr in self.subscriptions.items():
                pull.subscribe(topic, expr)
            pull.subscribe(retry_topic(self.group))      # failed messages come back here (RocketMQ)
        else:
            self._broadcast_assign()
        self._sync_queues()

    def _broadcast_assign(self) -> None:
        pull = self.pull
        queues = []
        for topic in self.subscriptions:
            try:
                queues += pull.instance.subscribe_queues(topic, refresh=True)
            except HostMQError as e:
                log.info("broadcast %s: no route for %s yet: %s", self.group, topic, e)
        if set(queues) != set(pull.positions):
            pull.assign(queues)
            pull.subscriptions = dict(self.subscriptions)      # per-topic filters for assigned queues

    # -- the pull thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        pull = self.pull
        next_commit = time.monotonic() + self.auto_commit_interval_s
        next_route = time.monotonic() + self.rebalance_interval_s
        try:
            while not self.stopping.is_set():
                if self.model == MessageModel.BROADCASTING and time.monotonic() >= next_route:
                    next_route = time.monotonic() + self.rebalance_interval_s
                    self._broadcast_assign()
                self._sync_queues()
                self.service.maintain()
                self._flow_control()
                try:
                    msgs = pull.poll(0.2)
                except HostMQError as e:
                    log.warning("pull for %s failed: %s", self.group, e)
                    self.stopping.wait(0.5)
                    continue
                except Exception:           # a bug or a store we cannot read: never end the thread
                    log.exception("pull for %s failed; polling again in %.1f s", self.group, POLL_ERROR_PAUSE_S)
                    self.stopping.wait(POLL_ERROR_PAUSE_S)
                    continue
                if pull.reset_queues or pull.assignment_version != self._synced_version:
                    self._sync_queues()     # (its own first test, inline: this is the hot path)
                if msgs and not self._consume_first(msgs):
                    self._dispatch(msgs)
                    # Hand the GIL to the listener thread just woken: else it waits for this thread's
                    # next poll round to block in the futex (push p50 550 → 330–390 µs, 2 vCPUs, quiet)
                    if self.service.handed_off():
                        time.sleep(0)
                self._advance_idle()
                self._send_back_failed()
                if time.monotonic() >= next_commit:
                    next_commit = time.monotonic() + self.auto_commit_interval_s
                    self._commit()
        except BaseException as e:          # keep the reason for shutdown(); never die silently
            self.error = e
            log.exception("pull thread of %s failed", self.group)
        finally:
            self.pool.shutdown(wait=True)
            self.service.shutdown()
            self._send_back_failed()
            self._commit()
            try:
                self.service.unlock_all()
            except HostMQError as e:
                log.warning("unlocking the queues of %s failed: %s", self.group, e)
            for session in self._sessions.values():
                session.close(1.0)
            pull.close()

    def _sync_queues(self) -> None:
        """Process queues follow the pull consumer's assignment (after each rebalance)."""
        pull = self.pull
        if not pull.reset_queues and pull.assignment_version == self._synced_version:
            return                  # the common case, twice per pull round: nothing joined, left or moved
        self._synced_version = pull.assignment_version
        positions = pull.positions
        reset, pull.reset_queues = pull.reset_queues, set()
        with self.lock:
            for mq in [q for q in self.queues if q not in positions or q in reset]:
                self.queues.pop(mq).dropped = True
                self.service.dropped(mq)
            for mq, off in positions.items():
                if mq not in self.queues:
                    self.queues[mq] = ProcessQueue(off)

    def _advance_idle(self) -> None:
        """Queues whose fetched messages were all delivered (or filtered out) may commit up to the
        pull position: without this, messages a subscription filters out after the last matching
        one would stay uncommitted, and the group's lag would never reach 0."""
        positions = self.pull.positions
        with self.lock:
            for mq, pq in self.queues.items():
                off = positions.get(mq)
                if off is not None and off > pq.next_offset:
                    pq.next_offset = off

    def _flow_control(self) -> None:
        with self.lock:
            full = {mq for mq, pq in self.queues.items() if pq.is_full(self.max_held_messages, self.max_held_bytes)}
            full |= self.service.unlocked()     # orderly: only what this member holds the lock of is fetched
        pull = self.pull
        if full != pull.paused:
            pull.resume(pull.paused - full)
            pull.pause(full)

    def _consume_first(self, msgs: list[MessageExt]) -> bool:
        """The hot path (issue 29): a poll's messages all from one queue, consumed on this thread by
        the service's ``consume_first`` — the listener called before the process queue's books, which
        only this thread reads for commits, flow control and rebalances (so nothing reads them while
        the listener runs). False, with nothing done, where the service or the fetch does not allow
        it: ``_dispatch`` then holds and submits as usual."""
        fetched, groups = self.pull.last_fetch
        if fetched is not msgs or len(groups) != 1:
            return False
        mq = groups[0][0]
        pq = self._first_pq
        if pq is None or pq.dropped or self._first_mq is not mq:
            with self.lock:
                pq = self.queues.get(mq)
            if pq is None or pq.dropped:
                return False
            self._first_mq, self._first_pq = mq, pq
        return self.service.consume_first(mq, pq, msgs, self.pull.positions)

    def _dispatch(self, msgs: list[MessageExt]) -> None:
        fetched, groups = self.pull.last_fetch
        by_queue: Iterable[tuple[MessageQueue, list[MessageExt]]]
        if fetched is msgs:         # the poll's own list: its queues' slices are known
            if len(groups) == 1:    # the usual round, one queue's messages: no copy of the list
                mq, a, b = groups[0]
                by_queue = ((mq, msgs if a == 0 and b == len(msgs) else msgs[a:b]),)
            else:
                by_queue = [(mq, msgs[a:b]) for mq, a, b in groups]
        else:
            grouped: dict[MessageQueue, list[MessageExt]] = {}
            for m in msgs:
                grouped.setdefault(m.queue, []).append(m)
            by_queue = grouped.items()
        for mq, batch in by_queue:
            with self.lock:
                pq = self.queues.get(mq)
                if pq is None:
                    continue
                pq.hold(batch, self.pull.positions.get(mq, 0))
            self.service.submit(mq, pq, batch)

    def call_listener(self, batch: list[MessageExt],
                      context: ConsumeConcurrentlyContext | ConsumeOrderlyContext | None = None) -> ConsumeResult:
        """The listener's verdict on a batch, ``context`` passed if it takes one (built here if none is
        given); an exception or a wrong return value counts as RECONSUME_LATER (logged)."""
        if context is None or context.message_queue.topic.startswith(RETRY_PREFIX):
            show_original_topics(batch)     # (a batch comes from one queue: only a retry queue's need it)
        try:        # (listener_args, inline: this runs once per delivered batch)
            if self.listener_takes_context:
                result = self.listener(batch, context if context is not None
                                       else default_context(batch, self.orderly is not None))
            else:
                result = self.listener(batch)
        except Exception:
            return listener_raised(self.group)
        return listener_verdict(self.group, result)

    def listener_args(self, batch: list[MessageExt],
                      context: ConsumeConcurrentlyContext | ConsumeOrderlyContext | None) -> tuple:
        """What the listener is called with: ``(batch, context)`` if it takes a context (one for this
        consumer's mode when none is given), else ``(batch,)``."""
        if not self.listener_takes_context:
            return (batch,)
        return batch, context if context is not None else default_context(batch, self.orderly is not None)


    # -- retries --------------------------------------------------------------------------------------
    def _send_back_failed(self) -> None:
        """Send failed messages back to their broker (retry topic after a back-off, or the DLQ); a
        message that cannot be sent back is consumed again here (the service's ``consume_later``)."""
        while True:
            try:
                mq, pq, backs = self.failed.get_nowait()
            except queue.Empty:
                return
            done = []
            for back in backs:
                m = back.msg
                try:
                    self.send_back(back)
                    done.append(m.queue_offset)
                except HostMQError as e:
                    log.warning("%s: sending %s back failed (%s); consuming it again here later",
                                self.group, m.msg_id, e)
                    self.service.consume_later(mq, pq, [m], 1)
            with self.lock:
                pq.remove(done)

    def send_back(self, back: SendBack) -> None:
        """Store ``back.msg`` where its broker says (retry topic or DLQ), through this consumer's
        ring to that broker (pull thread only)."""
        m = back.msg
        inst = self.pull.instance
        address = inst.broker_address(m.broker)
        f = inst.broker_request(address, RequestCode.CONSUMER_SEND_MSG_BACK,
                                back.request(self.group, self.max_reconsume_times).to_fields()).fields
        session = self._sessions.get(m.broker)
        if session is None or session.broken is not None:
            session = self._sessions[m.broker] = ProducerSession(inst, m.broker, address, data_bytes=4 << 20,
                                                                 completion_entries=256, spin_s=0.0)
        rec = retry_record(bytes(m.raw), f["topic"], f["queue_id"], f["delay_level"], f["delay_levels"],
                           session.store_host, m.msg_id)
        session.send(R.FRAME_MESSAGE, rec, 1, Waiter(MessageQueue(f["topic"], m.broker, f["queue_id"])),
                     time.monotonic() + 10.0)
        if f["delay_level"] == 0:
            log.warning("%s: %s failed %d times; moved to %s", self.group, m.msg_id, m.reconsume_times + 1, f["topic"])

    # -- offsets --------------------------------------------------------------------------------------
    def _commit_position(self, mq: MessageQueue) -> int | None:
        with self.lock:
            if not self.service.commit_allowed(mq):
                return None                 # orderly, not locked: another member may be consuming it
            pq = self.queues.get(mq)
            return pq.safe_offset() if pq is not None else self.pull.positions[mq]

    def _commit(self) -> None:
        try:
            self.pull.commit()
        except HostMQError as e:
            log.warning("committing offsets of %s failed: %s", self.group, e)

    # -- life -----------------------------------------------------------------------------------------
    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop fetching, let running listeners finish, commit, leave the group."""
        self.stopping.set()
        self.join(timeout_s)

    def assignment(self) -> list[MessageQueue]:
        with self.lock:
            return sorted(self.queues)

    @property
    def skipped_records(self) -> int:
        """Stored records the pull thread passed over because they cannot be decoded (logged once each)."""
        pull = self.pull
        return pull.skipped_records if pull is not None else 0

    def _thread_alive(self) -> bool:
        t = self._thread
        return t is not None and t.is_alive()

    def join(self, timeout_s: float) -> None:
        """Wait for the pull thread to end (after ``stopping`` was set): it has sent failed messages
        back, committed and left the group."""
        if self._thread is threading.current_thread():
            return                  # a listener on the pull thread (consume_service): it ends after the call
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def __enter__(self) -> "PushConsumer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

