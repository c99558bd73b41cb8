"""Auto-batching of ``send_async`` (RocketMQ 5's ``ProduceAccumulator``): one call per message, one
ring frame per batch.

A producer made with ``auto_batch=True`` does not publish each ``send_async`` message as its own
frame. The message is validated and encoded at once (a bad message raises in the caller, as
always; ``Producer.encoded_alone``, one native call, for a plain message) and its record — for no
queue yet — joins the open batch of its topic; the batch goes out as one batch frame — one queue,
one ring write, one wake-up of the writer — when it holds ``batch_max_messages`` messages or
``batch_max_bytes`` bytes, or when its first message has waited ``batch_max_delay_ms`` (a flusher
thread), or at ``flush()`` / ``shutdown()``. Every message keeps its own Future and its own
SendResult (its message id and queue offset within the batch, ``session.Waiter.futures``).

Only messages the producer may place freely are batched: not those with a queue, selector or
sharding key (their order is the caller's), delay messages (no delay in a batch, as in RocketMQ) or
bodies large enough to be compressed. A batch is published like any async send (on another broker if
its broker is gone or busy); if it cannot be, its futures fail together with the last error.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from .. import records as R
from ..errors import HostMQError, ValidationError
from ..message import Message
from ..store.encode import restamp
from ..ingress.session import Waiter

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchConfig:
    """``Producer(auto_batch=True)``'s limits (RocketMQ 5: batchMaxBytes 32 KiB, batchMaxDelayMs 10)."""
    max_messages: int = 256          # a batch goes out once it holds this many messages
    max_bytes: int = 32 << 10        # … or this many body + properties bytes
    max_delay_ms: float = 1.0        # … or once its first message has waited this long

    def __post_init__(self) -> None:
        for name in ("max_messages", "max_bytes"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValidationError(f"BatchConfig.{name} must be an int ≥ 1, got {v!r}")
        if not isinstance(self.max_delay_ms, (int, float)) or isinstance(self.max_delay_ms, bool) \
                or not 0 <= self.max_delay_ms <= 60_000:
            raise ValidationError(f"BatchConfig.max_delay_ms must be 0..60000, got {self.max_delay_ms!r}")


@dataclass
class _Open:
    """The open batch of one topic: its records (encoded for queue 0 and no broker: ``restamp``
    stamps the queue and broker they go to) and each one's Future."""
    overhead: int                    # a record's bytes besides its body and properties
    first_msg: object                # routes the batch (its topic) and carries its timeout
    records: list = field(default_factory=list)
    sizes: list = field(default_factory=list)
    futures: list = field(default_factory=list)
    nbytes: int = 0
    due: float = 0.0                 # monotonic time it must go out by
    deadline: float = 0.0            # the send timeout of its first message


class Accumulator:
    def __init__(self, producer, config: BatchConfig) -> None:
        self.producer = producer
        self.config = config
        self._open: dict[str, _Open] = {}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="hostmq-batcher", daemon=True)
        self._thread.start()

    def add(self, msg, record: bytes, fut, timeout_s: float) -> None:
        """Join ``msg``'s ``record`` (encoded for queue 0 and no broker) to its topic's open batch."""
        cfg = self.config
        now = time.monotonic()
        full = None
        with self._lock:
            b = self._open.get(msg.topic)
            if b is None:
                # routed by a message of our own: the caller's may change after this call
                b = self._open[msg.topic] = _Open(R.record_size(0, len(msg.topic.encode()), 0), Message(msg.topic, b""),
                                                  due=now + cfg.max_delay_ms / 1000, deadline=now + timeout_s)
                self._wake.notify()
            b.records.append(record)
            b.sizes.append(len(record))
            b.futures.append(fut)
            b.nbytes += len(record) - b.overhead         # body + properties bytes, as the limit counts
            if len(b.records) >= cfg.max_messages or b.nbytes >= cfg.max_bytes:
                full = self._open.pop(msg.topic)
        if full is not None:
            self._publish(full)

    def flush(self) -> None:
        """Publish every open batch now."""
        with self._lock:
            batches, self._open = list(self._open.values()), {}
        for b in batches:
            self._publish(b)

    def close(self) -> None:
        with self._lock:
            self._stop = True
            self._wake.notify()
        self._thread.join(5)
        self.flush()

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._stop:
                    return
                now = time.monotonic()
                due = [t for t, b in self._open.items() if b.due <= now]
                batches = [self._open.pop(t) for t in due]
                if not batches:
                    nxt = min((b.due for b in self._open.values()), default=None)
                    self._wake.wait(None if nxt is None else max(0.0, nxt - now))
                    continue
            for b in batches:
                self._publish(b)

    def _publish(self, b: _Open) -> None:
        """One batch frame on a queue the producer chooses (``Producer.publish_frame``: another broker
        if this one is gone or busy); its futures fail together otherwise."""
        joined = b"".join(b.records)

        def frame(mq, session) -> tuple:
            payload = restamp(joined, b.sizes, mq.queue_id, session.store_host)
            return R.FRAME_BATCH, payload, len(b.sizes), Waiter(mq, b.sizes, futures=b.futures)
        try:
            self.producer.publish_frame(b.first_msg, None, None, None, None, b.deadline, frame)
            return
        except HostMQError as e:
            error = e
        except Exception as e:          # never leave a caller's future hanging
            log.exception("auto-batching: publishing a batch of %d failed", len(b.futures))
            error = e
        for f in b.futures:
            if not f.done():
                f.set_exception(error)
