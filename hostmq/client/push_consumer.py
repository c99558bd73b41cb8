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
  in queue order (``orderly.OrderlyService``).
* BROADCASTING: every instance reads every queue; offsets are kept per ``instance_name`` under the
  root (``offset_store.LocalOffsets``).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from .. import records as R
from ..semantics.retry import RETRY_PREFIX, retry_record, retry_topic
from ..errors import HostMQError, ValidationError
from ..protocol.codes import RequestCode
from ..protocol.messages import SendBackRequest
from ..message import ConsumeFrom, ConsumeResult, MessageExt, MessageModel, MessageQueue
from .membership import HEARTBEAT_INTERVAL_S, REBALANCE_INTERVAL_S
from .offset_store import LocalOffsets, local_offsets_path
from .orderly import OrderlyService
from .process_queue import ProcessQueue
from .pull_consumer import PullConsumer
from .rebalance import Strategy
from ..ingress.session import ProducerSession, Waiter
from .sql92 import SQL
from ..store.filter import parse_tag_expression

log = logging.getLogger(__name__)

MAX_HELD_MESSAGES = 1000
MAX_HELD_BYTES = 100 << 20
RETRY_DELAY_S = 1.0
POLL_ERROR_PAUSE_S = 1.0        # the pull thread's pause after an unexpected error of a poll


class PushConsumer:
    def __init__(self, root=None, group: str = "DEFAULT_CONSUMER", model: MessageModel = MessageModel.CLUSTERING,
                 consume_from: ConsumeFrom = ConsumeFrom.LAST_OFFSET, consume_timestamp_ms: int | None = None,
                 allocate: Strategy = "average", max_reconsume_times: int = 16, batch_size: int = 1,
                 threads: int = 4, *, instance_name: str = "DEFAULT", pull_batch_size: int = 32,
                 max_held_messages: int = MAX_HELD_MESSAGES, max_held_bytes: int = MAX_HELD_BYTES,
                 auto_commit_interval_s: float = 5.0, rebalance_interval_s: float = REBALANCE_INTERVAL_S,
                 heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S, retry_delay_s: float = RETRY_DELAY_S) -> None:
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
        self.listener: Callable[[list[MessageExt]], ConsumeResult] | None = None
        self.pull: PullConsumer | None = None
        self.queues: dict[MessageQueue, ProcessQueue] = {}
        # What the consume services (``orderly.OrderlyService``, ``hostmq.aio``) share with this consumer:
        # ``lock`` (process queues and orderly state), ``stopping``, ``pool`` (the listener threads),
        # ``failed`` (batches to send back) and :meth:`call_listener`.
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.pool: ThreadPoolExecutor | None = None
        self._timers: set[threading.Timer] = set()
        self.failed: queue.SimpleQueue = queue.SimpleQueue()   # (process queue, batch) to send back
        self._sessions: dict[str, ProducerSession] = {}          # broker → ring for send-backs
        self.orderly: OrderlyService | None = None
        self.lock = threading.Lock()
        self.error: BaseException | None = None

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

    def register(self, fn: Callable[[list[MessageExt]], ConsumeResult], orderly: bool = False) -> None:
        if not callable(fn):
            raise ValidationError("the listener must be callable")
        if orderly and self.model != MessageModel.CLUSTERING:
            raise ValidationError("orderly consumption needs MessageModel.CLUSTERING (queues are locked per group)")
        self.orderly = OrderlyService(self) if orderly else None
        self.listener = fn

    def start(self) -> "PushConsumer":
        if self.pull is not None:
            return self
        if not self.subscriptions:
            raise ValidationError("subscribe to at least one topic before start()")
        if self.listener is None:
            raise ValidationError("register a listener before start()")
        store = None
        pull = PullConsumer(self.root, group=self.group, auto_commit=False, consume_from=self.consume_from,
                            consume_timestamp_ms=self.consume_timestamp_ms, max_poll_records=self.pull_batch_size,
                            allocate=self.allocate, rebalance_interval_s=self.rebalance_interval_s,
                            heartbeat_interval_s=self.heartbeat_interval_s,
                            # No spin: a spinning thread holds the GIL, and the listener threads that
                            # must run the messages just fetched would wait for it to sleep.
                            spin_s=0.0)
        try:
            if self.model == MessageModel.BROADCASTING:
                store = LocalOffsets(local_offsets_path(pull.root, self.instance_name, self.group))
                pull.offsets = store
            pull.commit_position = self._commit_position
            if self.orderly is not None:
                pull.on_revoke = self.orderly.on_revoke
            self.pull = pull
            self._setup_queues()
        except BaseException:
            pull.close()
            self.pull = None
            raise
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix=f"hostmq-consume {self.group}")
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
                if self.orderly is not None:
                    self.orderly.maintain()
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
                self._sync_queues()
                if msgs:
                    self._dispatch(msgs)
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
            for t in list(self._timers):
                t.cancel()
            self._send_back_failed()
            self._commit()
            if self.orderly is not None:
                try:
                    self.orderly.unlock_all()
                except HostMQError as e:
                    log.warning("unlocking the queues of %s failed: %s", self.group, e)
            for session in self._sessions.values():
                session.close(1.0)
            pull.close()

    def _sync_queues(self) -> None:
        """Process queues follow the pull consumer's assignment (after each rebalance)."""
        positions = self.pull.positions
        reset, self.pull.reset_queues = self.pull.reset_queues, set()
        with self.lock:
            for mq in [q for q in self.queues if q not in positions or q in reset]:
                self.queues.pop(mq).dropped = True
                if self.orderly is not None:
                    self.orderly.dropped(mq)
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
            if self.orderly is not None:    # only what this member holds the lock of is fetched
                full |= self.orderly.unlocked()
        pull = self.pull
        if full != pull.paused:
            pull.resume(pull.paused - full)
            pull.pause(full)

    def _dispatch(self, msgs: list[MessageExt]) -> None:
        by_queue: dict[MessageQueue, list[MessageExt]] = {}
        for m in msgs:
            by_queue.setdefault(m.queue, []).append(m)
        for mq, batch in by_queue.items():
            with self.lock:
                pq = self.queues.get(mq)
                if pq is None:
                    continue
                pq.add([(m.queue_offset, m.store_size) for m in batch], self.pull.positions.get(mq, 0))
            if self.orderly is not None:
                self.orderly.dispatch(mq, pq, batch)
                continue
            for i in range(0, len(batch), self.batch_size):
                self._submit(pq, batch[i:i + self.batch_size], 0)

    def _submit(self, pq: ProcessQueue, batch: list[MessageExt], attempt: int) -> None:
        try:
            self.pool.submit(self._consume, pq, batch, attempt)
        except RuntimeError:                # the pool is shutting down: the offset stays uncommitted
            pass

    def _consume(self, pq: ProcessQueue, batch: list[MessageExt], attempt: int) -> None:
        if pq.dropped or self.stopping.is_set():
            return                          # another member owns the queue now; it re-reads from the commit
        self._settle(pq, batch, attempt, self.call_listener(batch) == ConsumeResult.SUCCESS, self._retry_later)

    def _settle(self, pq: ProcessQueue, batch: list[MessageExt], attempt: int, ok: bool, later) -> None:
        """What the listener's verdict on ``batch`` (``ok``) means: done (its offsets released); to the
        retry topic (or the DLQ) by the pull thread, on a clustering consumer's first failure; else the
        batch again after ``retry_delay_s`` through ``later(pq, batch, attempt)`` (hostmq.aio passes
        its event loop's own)."""
        if ok:
            with self.lock:
                pq.remove([m.queue_offset for m in batch])
            return
        if self.model == MessageModel.CLUSTERING and attempt == 0:
            self.failed.put((pq, batch))        # to the retry topic (or the DLQ), by the pull thread
            return
        if attempt + 1 >= self.max_reconsume_times:
            log.error("%s: %d messages failed %d times; retrying every %.1f s until they succeed",
                      self.group, len(batch), attempt + 1, self.retry_delay_s)
        later(pq, batch, attempt + 1)

    def call_listener(self, batch: list[MessageExt]) -> ConsumeResult:
        """The listener's verdict on a batch; an exception or a wrong return value counts as
        RECONSUME_LATER (logged)."""
        for m in batch:
            if m.queue.topic.startswith(RETRY_PREFIX):    # a retried message is shown under its own topic
                m._topic = m.properties.get(R.PROP_RETRY_TOPIC)
        try:
            result = self.listener(batch)
        except Exception:
            log.exception("listener of %s failed; consuming again later", self.group)
            return ConsumeResult.RECONSUME_LATER
        if not isinstance(result, ConsumeResult):
            log.error("listener of %s returned %r (not a ConsumeResult); consuming again later", self.group, result)
            return ConsumeResult.RECONSUME_LATER
        return result

    def _retry(self, pq: ProcessQueue, batch, attempt: int) -> None:
        with self.lock:
            self._timers.discard(threading.current_thread())
        if not self.stopping.is_set():
            self._submit(pq, batch, attempt)

    # -- retries --------------------------------------------------------------------------------------
    def _send_back_failed(self) -> None:
        """Send failed batches back to their broker (retry topic after a back-off, or the DLQ); a
        message that cannot be sent back is consumed again here after ``retry_delay_s``."""
        while True:
            try:
                pq, batch, *level = self.failed.get_nowait()
            except queue.Empty:
                return
            done = []
            for m in batch:
                try:
                    self._send_back(m, level[0] if level else 0)
                    done.append(m.queue_offset)
                except HostMQError as e:
                    log.warning("%s: sending %s back failed (%s); consuming it again here later",
                                self.group, m.msg_id, e)
                    self._retry_later(pq, [m], 1)
            with self.lock:
                pq.remove(done)

    def _send_back(self, m: MessageExt, delay_level: int = 0) -> None:
        inst = self.pull.instance
        address = inst.broker_address(m.broker)
        req = SendBackRequest(group=self.group, reconsume_times=m.reconsume_times,
                              max_reconsume_times=self.max_reconsume_times, delay_level=delay_level)
        f = inst.broker_request(address, RequestCode.CONSUMER_SEND_MSG_BACK, req.to_fields()).fields
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

    def _retry_later(self, pq: ProcessQueue, batch, attempt: int) -> None:
        timer = threading.Timer(self.retry_delay_s, self._retry, (pq, batch, attempt))
        timer.daemon = True
        with self.lock:
            self._timers.add(timer)
        timer.start()

    # -- offsets --------------------------------------------------------------------------------------
    def _commit_position(self, mq: MessageQueue) -> int | None:
        with self.lock:
            if self.orderly is not None and not self.orderly.commit_allowed(mq):
                return None                 # not locked: another member may be consuming it
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
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def assignment(self) -> list[MessageQueue]:
        with self.lock:
            return sorted(self.queues)

    @property
    def skipped_records(self) -> int:
        """Stored records the pull thread passed over because they cannot be decoded (logged once each)."""
        pull = self.pull
        return pull.skipped_records if pull is not None else 0

    def __enter__(self) -> "PushConsumer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

