"""The embedded store: commitlog + consume queues + index + checkpoint in one process.

``MessageStore(path)`` opens (and recovers) the store directory::

    path/commitlog/00000000000000000000 …       path/consumequeue/TOPIC/QUEUEID/… 
    path/index/<yyyyMMddHHmmssSSS> …            path/checkpoint  path/abort  path/lock

Ownership: the process holding ``lock`` (an exclusive ``flock``, released by the kernel if it dies)
is the only writer of everything under ``path``; a second open raises StoreLockedError. ``abort``
exists while the store is open; finding it at open means the last run died, and recovery rescans
(see ``recovery``). In the broker the same parts are driven by separate processes (writer,
dispatcher, flusher); this facade runs them inline: ``put`` appends, ``dispatch`` builds consume
queues and the index, flushing follows the configured policy.
"""
from __future__ import annotations

import enum
import errno
import fcntl
import functools
import os
import time
from typing import Iterable, NamedTuple, Sequence

import numpy as np

from .. import records as R
from ..config import ASYNC_FLUSH, Config, StoreConfig, store_config
from .filter import parse_tag_expression
from ..errors import (CorruptRecordError, MessageNotFoundError, StoreFullError, StoreLockedError,
                      ValidationError)
from ..fsutil import ensure_dir, fsync_dir, open_file
from ..message import Message, MessageExt, MessageQueue
from . import cleanup, recovery
from .meta import effective_config
from .checkpoint import StoreCheckpoint
from .commitlog import CommitLog
from .consume_queue import ConsumeQueue
from .consume_queue_store import ConsumeQueueStore
from .encode import check_body, encode_message, properties_bytes
from .flush import AsyncFlushState, async_flush_pages
from .transient_pool import TransientStorePool
from .reader import GetResult, MessageBatch, get_batch, get_messages

DISK_CHECK_INTERVAL_MS = 10_000





class PutStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"


class PutResult(NamedTuple):
    status: PutStatus
    msg_id: str
    queue_id: int
    queue_offset: int
    phys_offset: int


class PutBatchResult(Sequence):
    """Results of ``put_batch``: arrays for all messages, a PutResult per message on demand."""

    def __init__(self, status: PutStatus, queue_id: int, first_queue_offset: int,
                 phys_offsets: np.ndarray, host_hex: str) -> None:
        self.status = status
        self.queue_id = queue_id
        self.first_queue_offset = first_queue_offset
        self.phys_offsets = phys_offsets
        self._host_hex = host_hex

    @property
    def queue_offsets(self) -> np.ndarray:
        return np.arange(self.first_queue_offset, self.first_queue_offset + len(self.phys_offsets))

    def __len__(self) -> int:
        return len(self.phys_offsets)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        phys = int(self.phys_offsets[i])
        return PutResult(self.status, f"{self._host_hex}{phys:016X}", self.queue_id,
                         self.first_queue_offset + range(len(self))[i], phys)

    @property
    def msg_ids(self) -> list[str]:
        return [f"{self._host_hex}{p:016X}" for p in self.phys_offsets.tolist()]


def delay_levels_ms(spec: str) -> tuple[int, ...]:
    """``"1s 5s 1m 2h"`` → milliseconds per level (level 1 first)."""
    units = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
    out = []
    for item in spec.split():
        try:
            out.append(int(item[:-1]) * units[item[-1]])
        except (KeyError, ValueError):
            raise ValidationError(f"bad delay level {item!r} in {spec!r}") from None
    return tuple(out)


class MessageStore:
    def __init__(self, path: str, config: StoreConfig | Config | dict | None = None, *,
                 broker: str = "", store_host: bytes | None = None,
                 progress: "recovery.RecoveryProgress | None" = None) -> None:
        self.path = os.path.abspath(path)
        self.config = store_config(config)
        levels = config.broker.message_delay_level if isinstance(config, Config) else None
        self.broker = broker
        ensure_dir(self.path)
        self._lock_fd = _take_lock(os.path.join(self.path, "lock"))
        self.closed = False
        try:
            self._open(store_host, delay_levels_ms(levels or Config().broker.message_delay_level), progress)
        except BaseException:
            os.close(self._lock_fd)
            raise

    def _open(self, store_host: bytes | None, levels: tuple[int, ...], progress) -> None:
        # The file sizes are the store's own (store.json): another configuration never misreads it.
        cfg = self.config = effective_config(self.path, self.config)
        # RocketMQ uses the pool only with ASYNC_FLUSH (isTransientStorePoolEnable)
        self.pool = TransientStorePool(cfg.commitlog_file_bytes, cfg.transient_store_pool_size) \
            if cfg.transient_store_pool_enable and cfg.flush_disk_type == ASYNC_FLUSH else None
        # whole milliseconds, as put compares them: a fraction here kept a put in the same millisecond
        # from committing with commit_interval_ms 0
        self._next_commit_ms = int(time.time() * 1000) + cfg.commit_interval_ms
        self.abort_path = os.path.join(self.path, "abort")
        self.abnormal = os.path.exists(self.abort_path)
        self.commitlog = CommitLog(self.path, cfg.commitlog_file_bytes, store_host=store_host,
                                   warm=cfg.warm_mapped_file, advice=cfg.commitlog_advice, delay_levels_ms=levels,
                                   preallocate_at=cfg.preallocate_at_ratio if cfg.preallocate_next_file else None,
                                   lock_head=cfg.mlock_commitlog_head, pool=self.pool)
        self.commitlog.mfq.load()
        self.cq_store = ConsumeQueueStore(self.path, cfg, self.commitlog)
        self.checkpoint = StoreCheckpoint(os.path.join(self.path, "checkpoint"))
        self.recovery = recovery.run(self, progress)
        self.cq_store.dispatched_phys = self.recovery.commitlog_max_offset
        fd = open_file(self.abort_path, os.O_WRONLY | os.O_CREAT)
        os.fsync(fd)
        os.close(fd)
        fsync_dir(self.path)
        self._flush_state = AsyncFlushState(time.time() * 1000, time.time() * 1000)
        self._next_disk_check_ms = 0.0
        self._refuse_writes = False
        self._topics: dict[str, bytes] = {}

    # -- the dispatcher's part (consume queues, index), as recovery and callers see it ------------
    @property
    def queues(self) -> dict[tuple[str, int], ConsumeQueue]:
        return self.cq_store.queues

    @property
    def index(self):
        return self.cq_store.index

    @property
    def consume_queues_present(self) -> bool:
        return self.cq_store.consume_queues_present

    @property
    def dispatched_phys(self) -> int:
        return self.cq_store.dispatched_phys

    def all_consume_queues(self) -> list[ConsumeQueue]:
        return self.cq_store.all_consume_queues()

    def consume_queue(self, topic: str, queue_id: int, create: bool = False) -> ConsumeQueue | None:
        return self.cq_store.consume_queue(topic, queue_id, create)

    def redispatch(self, start: int, end: int, batch: int = 8192, progress=None) -> tuple[int, bool]:
        return self.cq_store.redispatch(start, end, batch, progress)

    def rebuild_topic_queue_table(self) -> None:
        self.commitlog.topic_queue_table = self.cq_store.topic_queue_table()

    # -- writing ----------------------------------------------------------------------------------
    def _topic_bytes(self, topic) -> bytes:
        b = self._topics.get(topic) if isinstance(topic, str) else None
        if b is None:
            b = self._topics[topic] = R.validate_topic(topic)
        return b

    def _check_writable(self, queue_id, now_ms: float) -> None:
        if self.closed:
            raise ValidationError("the store is closed")
        if queue_id.__class__ is not int or not 0 <= queue_id < (1 << 31):
            raise ValidationError(f"queue_id must be an int in [0, 2**31), got {queue_id!r}")
        if now_ms >= self._next_disk_check_ms:
            self._check_disk(now_ms)
        if self._refuse_writes:
            raise StoreFullError(f"disk holding {self.path} is over "
                                 f"{self.config.disk_refuse_ratio:.0%} full; writes refused")

    def put(self, msg: Message, queue_id: int = 0) -> PutResult:
        """Append one message. Bad input raises ValidationError and stores nothing. Unlike a producer,
        the store takes system property names (RocketMQ's store checks none); only the names it
        writes itself — TAGS, KEYS, DELAY, the unique id — are refused (docs/conformance.md).

        The one-message hot path: common checks are inlined, the rest is in ``_check_writable``.
        """
        now_ms = int(time.time() * 1000)
        if (now_ms >= self._next_disk_check_ms or self._refuse_writes or self.closed
                or queue_id.__class__ is not int or not 0 <= queue_id < 2147483648):
            self._check_writable(queue_id, now_ms)
        topic = msg.topic
        topic_b = (self._topics.get(topic) if topic.__class__ is str else None) or self._topic_bytes(topic)
        cfg = self.config
        body = msg.body
        if body.__class__ is not bytes or not 0 < len(body) <= cfg.max_message_bytes:
            body = bytes(check_body(body, cfg.max_message_bytes))
        props = properties_bytes(msg, R.new_unique_id(), cfg.max_properties_bytes, user_rules=False)
        flag = msg.flag
        if flag.__class__ is not int:
            raise ValidationError(f"flag must be an int, got {flag!r}")
        cl = self.commitlog
        try:
            r = cl.append(topic, topic_b, queue_id, body, props, flag=flag, now_ms=now_ms)
        except OSError as e:
            raise self._append_failed(e, cl.max_offset()) from None
        if self.pool is not None:
            self._commit_step(now_ms)
        if cfg.flush_disk_type != ASYNC_FLUSH or now_ms - self._flush_state.last_flush_ms >= cfg.flush_interval_ms:
            status = self._after_append(now_ms)
        else:
            status = PutStatus.PUT_OK
        return PutResult(status, f"{cl.host_hex}{r.phys_offset:016X}", queue_id, r.queue_offset,
                         r.phys_offset)

    def put_batch(self, msgs: Iterable[Message], queue_id: int = 0) -> PutBatchResult:
        """Append messages of one topic to one queue in one go (all validated first)."""
        now_ms = int(time.time() * 1000)
        self._check_writable(queue_id, now_ms)
        msgs = list(msgs)
        if not msgs:
            raise ValidationError("put_batch needs at least one message")
        topic = msgs[0].topic
        topic_b = self._topic_bytes(topic)
        cfg, cl = self.config, self.commitlog
        recs = []
        for m in msgs:
            if m.topic != topic:
                raise ValidationError(f"a batch holds one topic; got {topic!r} and {m.topic!r}")
            if m.delay_level:
                raise ValidationError("delay messages cannot be sent in a batch (as in RocketMQ)")
            recs.append(encode_message(m, topic_b, queue_id, max_body_bytes=cfg.max_message_bytes,
                                       max_props_bytes=cfg.max_properties_bytes,
                                       born_host=cl.store_host, born_ts_ms=now_ms))
        blob, starts = R.encode_batch(recs)
        return self.append_encoded(topic, queue_id, blob, starts, now_ms=now_ms)

    def append_encoded(self, topic: str, queue_id: int, blob, starts: np.ndarray,
                       sizes: np.ndarray | None = None, now_ms: int | None = None) -> PutBatchResult:
        """Append a pre-encoded batch (``records.encode_batch``) — the writer's path."""
        if now_ms is None:
            now_ms = int(time.time() * 1000)
        if (now_ms >= self._next_disk_check_ms or self._refuse_writes or self.closed
                or queue_id.__class__ is not int or not 0 <= queue_id < 2147483648):
            self._check_writable(queue_id, now_ms)
        if topic.__class__ is not str or topic not in self._topics:
            self._topic_bytes(topic)
        cl = self.commitlog
        start, q_before = cl.max_offset(), cl.topic_queue_table.get((topic, queue_id))
        try:
            q0, phys = self._append_chunks(topic, queue_id, blob, starts, sizes, now_ms)
        except OSError as e:
            raise self._append_failed(e, start, (topic, queue_id), q_before) from None
        if self.pool is not None:
            self._commit_step(now_ms)
        cfg = self.config
        if cfg.flush_disk_type != ASYNC_FLUSH or now_ms - self._flush_state.last_flush_ms >= cfg.flush_interval_ms:
            status = self._after_append(now_ms)
        else:
            status = PutStatus.PUT_OK
        return PutBatchResult(status, queue_id, q0, phys, cl.host_hex)

    def _append_chunks(self, topic: str, queue_id: int, blob, starts: np.ndarray, sizes: np.ndarray | None,
                       now_ms: int) -> tuple[int, np.ndarray]:
        """A batch never spans commitlog files (``CommitLog.append_batch``); the embedded store, whose
        results carry every record's position, splits one larger than a file into file-sized runs."""
        cl = self.commitlog
        if sizes is None:
            sizes = R.batch_record_sizes(blob, starts)
        room = cl.file_bytes - R.MIN_BLANK_BYTES
        if int(sizes.sum()) <= room:
            r = cl.append_batch(topic, queue_id, blob, starts, sizes, now_ms=now_ms)
            return r.queue_offset, r.phys_offsets
        q0, parts, i, n = None, [], 0, len(starts)
        ends = np.cumsum(sizes)
        while i < n:
            j = max(int(np.searchsorted(ends, (ends[i - 1] if i else 0) + room, side="right")), i + 1)
            r = cl.append_batch(topic, queue_id, blob, starts[i:j], sizes[i:j], now_ms=now_ms)
            q0 = r.queue_offset if q0 is None else q0
            parts.append(r.phys_offsets)
            i = j
        return q0, np.concatenate(parts)

    def _append_failed(self, e: OSError, start: int, key=None, queue_offset: int | None = None) -> StoreFullError:
        """ENOSPC / EIO creating the next commitlog file: undo what the append copied, say why."""
        self.commitlog.rollback(start)
        if key is not None:         # a split batch: runs before the failing one counted their records
            if queue_offset is None:
                self.commitlog.topic_queue_table.pop(key, None)
            else:
                self.commitlog.topic_queue_table[key] = queue_offset
        why = "the disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else os.strerror(e.errno or 0)
        return StoreFullError(f"cannot append to {self.path}: {why}; nothing was stored")

    def _commit_step(self, now_ms: float) -> None:
        """Transient store pool: commit what waits once ``commit_least_pages`` pages do, and all of it
        at least every ``commit_interval_ms`` (RocketMQ CommitRealTimeService)."""
        cfg = self.config
        if now_ms >= self._next_commit_ms:
            self._next_commit_ms = now_ms + cfg.commit_interval_ms
            self.commitlog.commit(0)
        else:
            self.commitlog.commit(cfg.commit_least_pages)

    def _after_append(self, now_ms: float) -> PutStatus:
        cfg = self.config
        if cfg.flush_disk_type != ASYNC_FLUSH:
            self.commitlog.flush(0)          # SYNC_FLUSH inline: durable before we answer
            return PutStatus.PUT_OK
        pages = async_flush_pages(now_ms, self._flush_state, cfg.flush_interval_ms,
                                  cfg.flush_least_pages, cfg.flush_thorough_interval_ms)
        if pages is not None:
            self.commitlog.flush(pages)
        return PutStatus.PUT_OK

    # -- dispatch ---------------------------------------------------------------------------------
    def dispatch(self) -> int:
        """Build consume-queue and index entries up to the commitlog's write position."""
        return self.cq_store.dispatch()

    # -- reading ----------------------------------------------------------------------------------
    def get(self, topic: str, queue_id: int, queue_offset: int, max_count: int = 32,
            expression: str | None = "*") -> GetResult:
        _check_read(queue_offset, max_count)
        cfg = self.config
        return get_messages(self.queues.get((topic, queue_id)), self.commitlog, queue_offset, max_count,
                            _tag_filter(expression), cfg.max_transfer_bytes, self.broker)

    def get_batch(self, topic: str, queue_id: int, queue_offset: int, max_count: int = 4096) -> MessageBatch:
        _check_read(queue_offset, max_count)
        return get_batch(self.queues.get((topic, queue_id)), self.commitlog,
                         MessageQueue(topic, self.broker, queue_id), queue_offset, max_count)

    def min_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get((topic, queue_id))
        return cq.min_offset() if cq else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get((topic, queue_id))
        return cq.max_offset() if cq else 0

    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int) -> int:
        cq = self.queues.get((topic, queue_id))
        return cq.offset_for_timestamp(ts_ms, self.commitlog.store_ts_at) if cq else 0

    def view(self, msg_id: str) -> MessageExt:
        """The message with this id; MessageNotFoundError if there is none."""
        _, phys = R.decode_msg_id(msg_id)
        return self._message_at(phys, msg_id)

    def _message_at(self, phys: int, what: str) -> MessageExt:
        try:
            raw = self.commitlog.record_at(phys) if phys < self.commitlog.max_offset() else None
        except CorruptRecordError:
            raw = None
        m = MessageExt(raw, self.broker) if raw is not None else None
        if m is None or m.commitlog_offset != phys:
            raise MessageNotFoundError(f"no message {what} in {self.path}")
        return m

    def query_by_key(self, topic: str, key: str, max_count: int = 32, begin_ms: int = 0,
                     end_ms: int | None = None) -> list[MessageExt]:
        """Messages of ``topic`` with this key (or unique id) stored within [begin_ms, end_ms]."""
        if self.index is None:
            return []
        end_ms = (1 << 62) if end_ms is None else end_ms
        found = []
        for phys in sorted(set(self.index.query(topic, key, max_count * 2, begin_ms, end_ms))):
            try:
                m = self._message_at(phys, f"at {phys}")
            except MessageNotFoundError:
                continue
            if m.topic == topic and (key in m.keys or m.unique_id == key) \
                    and begin_ms <= m.store_timestamp_ms <= end_ms:
                found.append(m)
        return found[-max_count:]

    # -- durability and life --------------------------------------------------------------------
    def flush(self) -> None:
        """Make everything appended and dispatched durable, then record it in the checkpoint."""
        cl = self.commitlog
        cl.commit(0)
        cl_end = cl.flush(0)
        dispatched = self.dispatched_phys
        self.cq_store.flush()
        self.checkpoint.update(physic_msg_ts_ms=cl.last_store_ts_ms, logics_msg_ts_ms=cl.last_store_ts_ms,
                               index_msg_ts_ms=cl.last_store_ts_ms, commitlog_flushed_offset=cl_end,
                               cq_flushed_phys_offset=dispatched, index_flushed_phys_offset=dispatched)
        self.checkpoint.flush()

    def _check_disk(self, now_ms: float) -> None:
        self._next_disk_check_ms = now_ms + DISK_CHECK_INTERVAL_MS
        cfg = self.config
        d = cleanup.decide(time.localtime(now_ms / 1000).tm_hour, cleanup.disk_used_ratio(self.path),
                           cfg.delete_when, cfg.disk_max_used_ratio, cfg.disk_force_clean_ratio,
                           cfg.disk_refuse_ratio)
        if d.delete_expired or d.force:
            self.clean_expired(now_ms, force=d.force)
        self._refuse_writes = cleanup.disk_used_ratio(self.path) > cfg.disk_refuse_ratio

    def clean_expired(self, now_ms: float | None = None, force: bool = False) -> list[str]:
        """Delete commitlog files past ``file_reserved_hours`` (the oldest ones anyway if ``force``),
        then consume-queue and index files that only point at deleted data."""
        cfg, cl = self.config, self.commitlog
        gone = cleanup.delete_expired_commitlog(cl.mfq, cfg, self.dispatched_phys, now_ms, force)
        if gone:
            self.cq_store.delete_expired(cl.min_offset())
        return gone

    def close(self) -> None:
        """Clean close: dispatch, flush, checkpoint the confirmed end, remove ``abort``, unlock."""
        if self.closed:
            return
        self.commitlog.commit(0)
        self.dispatch()
        self.checkpoint.update(confirm_phys_offset=self.commitlog.max_offset())
        self.flush()
        self.cq_store.close()
        self.commitlog.close()
        if self.pool is not None:
            self.pool.close()
        os.unlink(self.abort_path)
        fsync_dir(self.path)                # a crash now must not find the abort file again
        self.closed = True
        os.close(self._lock_fd)

    def __enter__(self) -> "MessageStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_read(queue_offset, max_count) -> None:
    if queue_offset.__class__ is not int:
        raise ValidationError(f"queue_offset must be an int, got {queue_offset!r}")
    if max_count.__class__ is not int or max_count < 1:
        raise ValidationError(f"max_count must be a positive int, got {max_count!r}")


@functools.lru_cache(maxsize=256)
def _tag_filter(expression):
    return parse_tag_expression(expression)


def _take_lock(path: str) -> int:
    fd = open_file(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        os.close(fd)
        raise StoreLockedError(os.path.dirname(path), f"pid {holder}" if holder else "") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd
