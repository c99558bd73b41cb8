"""Reading a root's topics straight from the store files, for the Spark data source (no pyspark here).

The driver plans with :class:`StoreScan`: the queues of the topics on every broker of the root and
the offsets that are safe to read — a live broker's readable position (dispatched, and flushed under
SYNC_FLUSH), or, for a stopped broker, what crash recovery would keep (``store.readonly``). Executors
call :func:`read_range` on one queue's offset range; it maps the files read-only and yields rows as
Arrow record batches or tuples. Nothing here writes to the store or needs the broker to run.

Retention: a queue's first readable offset is the first entry whose record is still in the commitlog
(consume-queue files may outlive the commitlog files they point at until the broker corrects them).
Asking for less is data loss: :class:`DataLossError`, or a logged skip with ``fail_on_data_loss=False``.
"""
from __future__ import annotations

import datetime as dt
import logging
import os
from typing import Callable, Iterator

from ..broker.topics import TopicTable, topics_path
from ..client.broker_view import BrokerView
from ..errors import DataLossError, HostMQError
from ..message import MessageExt
from ..root import RootPaths
from ..store.reader import GetStatus
from .options import OptionError, QueueKey

log = logging.getLogger(__name__)

READ_CHUNK = 4096               # consume-queue entries fetched per step
SCHEMA_DDL = ("topic string, broker string, queue_id int, queue_offset bigint, msg_id string, tags string, "
              "keys array<string>, properties map<string,string>, body binary, born_timestamp timestamp, "
              "store_timestamp timestamp")
COLUMNS = ("topic", "broker", "queue_id", "queue_offset", "msg_id", "tags", "keys", "properties", "body",
           "born_timestamp", "store_timestamp")


class StoreScan:
    """The driver's look at a root: brokers, queues of topics, readable offset ranges."""

    def __init__(self, root: str) -> None:
        try:
            self.paths = RootPaths.of(root).require()
        except HostMQError as e:
            raise OptionError(f"option 'root': {e}") from None
        self.root = self.paths.root
        self.views: dict[str, BrokerView] = {}

    def brokers(self) -> list[str]:
        return [b for b in self.paths.brokers() if os.path.isdir(os.path.join(self.paths.store_dir(b), "commitlog"))
                or os.path.exists(topics_path(self.paths.config_dir(b)))]

    def view(self, broker: str) -> BrokerView:
        v = self.views.get(broker)
        if v is not None and v.stale():        # the broker restarted (or stopped) since: look again
            v.close()
            v = None
        if v is None:
            v = self.views[broker] = BrokerView(self.root, broker)
        return v

    def queues(self, topics) -> list[QueueKey]:
        """Every queue of ``topics`` on every broker: declared in the broker's topics.json or present
        in its store. An unknown topic is an OptionError naming it."""
        found: set[QueueKey] = set()
        for broker in self.brokers():
            declared = {}
            path = topics_path(self.paths.config_dir(broker))
            if os.path.exists(path):
                try:
                    declared = TopicTable(path).topics
                except HostMQError as e:
                    log.warning("%s: %s; using the store's queue directories only", broker, e)
            cq_root = os.path.join(self.paths.store_dir(broker), "consumequeue")
            for topic in topics:
                if topic in declared:
                    found.update((topic, broker, q) for q in range(declared[topic].read_queues))
                d = os.path.join(cq_root, topic)
                if os.path.isdir(d):
                    found.update((topic, broker, int(q)) for q in os.listdir(d) if q.isdecimal())
        missing = [t for t in topics if not any(k[0] == t for k in found)]
        if missing:
            raise OptionError(f"option 'topic': no broker under {self.root} has topic(s) {missing}")
        return sorted(found)

    def bounds(self, key: QueueKey) -> tuple[int, int]:
        """(first offset still readable, one past the last readable offset) of a queue."""
        topic, broker, qid = key
        r = self.view(broker).reader
        hi = r.refresh_queue(topic, qid)
        lo = min(first_live_offset(r, topic, qid), hi)
        return lo, hi

    def offset_for_timestamp(self, key: QueueKey, ts_ms: int) -> int:
        topic, broker, qid = key
        r = self.view(broker).reader
        r.refresh_queue(topic, qid)
        return r.offset_for_timestamp(topic, qid, ts_ms)

    def close(self) -> None:
        for v in self.views.values():
            v.close()
        self.views.clear()


def first_live_offset(reader, topic: str, qid: int) -> int:
    """The first queue offset whose record the commitlog still holds (binary search: physical
    offsets grow with queue offsets)."""
    cq = reader.queues.get((topic, qid))
    if cq is None:
        return 0
    lo, hi = cq.min_offset(), cq.max_offset()
    cl_min = reader.commitlog.min_offset()
    while lo < hi:
        mid = (lo + hi) // 2
        ents = cq.entries(mid, 1)
        if len(ents) and int(ents["phys_offset"][0]) >= cl_min:
            hi = mid
        else:
            lo = mid + 1
    return lo


def lost_range_message(key: QueueKey, wanted: int, first: int) -> str:
    topic, broker, qid = key
    return (f"{topic} on {broker} queue {qid}: offsets {wanted}..{first - 1} were deleted by retention before "
            f"they were read (first readable offset is {first}). Set failOnDataLoss=false to skip ahead.")


def iter_messages(root: str, key: QueueKey, start: int, end: int, fail_on_data_loss: bool) -> Iterator:
    """(queue offset, record memoryview, broker) for each message of ``key`` in [start, end)."""
    topic, broker, qid = key
    view = BrokerView(root, broker)
    try:
        r = view.reader
        r.refresh_queue(topic, qid)
        off = start
        while off < end:
            b = r.get_batch(topic, qid, off, min(READ_CHUNK, end - off))
            if b.status == GetStatus.OFFSET_TOO_SMALL or (len(b) and int(b.queue_offsets[0]) != off) \
                    or b.status == GetStatus.MESSAGE_WAS_REMOVING:
                first = first_live_offset(r, topic, qid)
                if fail_on_data_loss:
                    raise DataLossError(lost_range_message(key, off, first))
                log.warning("skipping: %s", lost_range_message(key, off, first))
                off = max(first, off + 1) if first <= off else first
                continue
            if not len(b):
                raise DataLossError(f"{topic} on {broker} queue {qid}: offset {off} is not readable "
                                    f"(status {b.status.name}) although planned up to {end}")
            for i, qoff in enumerate(b.queue_offsets.tolist()):
                if qoff >= end:
                    return
                yield qoff, b.record_view(i)
            off = b.next_offset
    finally:
        view.close()


def _row_fields(rec: memoryview, broker: str):
    """One record as row values (copied out of the map): topic, queue id, msg id, tags, keys,
    properties, body, born and store time in ms."""
    m = MessageExt(bytes(rec), broker)
    return (m.topic, m.queue_id, m.msg_id, m.tags, list(m.keys), m.properties, m.body, m.born_timestamp_ms,
            m.store_timestamp_ms)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def read_range(root: str, key: QueueKey, start: int, end: int, *, row_filter: Callable | None = None,
               fail_on_data_loss: bool = True, arrow: bool = True, batch_rows: int = 8192) -> Iterator:
    """Rows of one queue's [start, end): ``pyarrow.RecordBatch`` es of ``batch_rows`` (``arrow``)
    or tuples in the order of ``COLUMNS``."""
    broker = key[1]
    cols = ArrowColumns(broker)
    for qoff, rec in iter_messages(root, key, start, end, fail_on_data_loss):
        f = _row_fields(rec, broker)
        if row_filter is not None and not row_filter(f[3], f[5]):
            continue
        if not arrow:
            topic, qid, msg_id, tags, keys, props, body, born, stored = f
            yield (topic, broker, qid, qoff, msg_id, tags, keys, props, body,
                   _EPOCH + dt.timedelta(milliseconds=born), _EPOCH + dt.timedelta(milliseconds=stored))
            continue
        cols.add(qoff, f)
        if cols.n >= batch_rows:
            yield cols.batch()
            cols = ArrowColumns(broker)
    if cols.n:
        yield cols.batch()


class ArrowColumns:
    """Column lists for one record batch, converted in one go (Spark checks the schema exactly:
    int32 queue id, int64 offsets, timestamp[us, UTC], every column nullable)."""

    def __init__(self, broker: str) -> None:
        self.broker = broker
        self.n = 0
        self.topic, self.qid, self.qoff, self.msg_id, self.tags = [], [], [], [], []
        self.keys, self.props, self.body, self.born, self.stored = [], [], [], [], []

    def add(self, qoff: int, f) -> None:
        topic, qid, msg_id, tags, keys, props, body, born, stored = f
        self.topic.append(topic)
        self.qid.append(qid)
        self.qoff.append(qoff)
        self.msg_id.append(msg_id)
        self.tags.append(tags)
        self.keys.append(keys)
        self.props.append(list(props.items()))
        self.body.append(body)
        self.born.append(born * 1000)
        self.stored.append(stored * 1000)
        self.n += 1

    def batch(self):
        import pyarrow as pa
        ts = pa.timestamp("us", tz="UTC")
        return pa.RecordBatch.from_arrays([
            pa.array(self.topic, pa.string()), pa.array([self.broker] * self.n, pa.string()),
            pa.array(self.qid, pa.int32()), pa.array(self.qoff, pa.int64()), pa.array(self.msg_id, pa.string()),
            pa.array(self.tags, pa.string()), pa.array(self.keys, pa.list_(pa.string())),
            pa.array(self.props, pa.map_(pa.string(), pa.string())), pa.array(self.body, pa.binary()),
            pa.array(self.born, ts), pa.array(self.stored, ts)], schema=arrow_schema())


def arrow_schema():
    import pyarrow as pa
    ts = pa.timestamp("us", tz="UTC")
    return pa.schema([("topic", pa.string()), ("broker", pa.string()), ("queue_id", pa.int32()),
                      ("queue_offset", pa.int64()), ("msg_id", pa.string()), ("tags", pa.string()),
                      ("keys", pa.list_(pa.field("element", pa.string()))),
                      ("properties", pa.map_(pa.string(), pa.string())), ("body", pa.binary()),
                      ("born_timestamp", ts), ("store_timestamp", ts)])
