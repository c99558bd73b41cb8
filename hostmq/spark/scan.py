"""Reading a root's topics straight from the store files, for the Spark data source (no pyspark here).

The driver plans with :class:`StoreScan`: the queues of the topics on every broker of the root and
the offsets that are safe to read — a live broker's readable position (dispatched, and flushed under
SYNC_FLUSH), or, for a stopped broker, what crash recovery would keep (``store.readonly``). Executors
call :func:`read_range` on one queue's offset range; it maps the files read-only and yields rows as
Arrow record batches or tuples. Nothing here writes to the store or needs the broker to run.

Retention: a queue's first readable offset is the first entry whose record is still in the commitlog
(consume-queue files may outlive the commitlog files they point at until the broker corrects them).
Asking for less is data loss: :class:`DataLossError`, or a logged skip with ``fail_on_data_loss=False``.

Arrow batches are built by ``hostmq/store/_columns.c`` (:data:`NATIVE_COLUMNS`, None where it was not
built or ``HOSTMQ_NATIVE_COLUMNS=0``): Arrow's buffers straight from the records, no Python object per
message. :func:`batch_columns` + :func:`arrow_batch` stay its spec and serve tuples, row filters and
every batch the native path hands back (tests/store/test_columns_native.py compares the two).
"""
from __future__ import annotations

import datetime as dt
import functools
import logging
import os
from typing import Callable, Iterator

import numpy as np

from .. import records as R
from ..broker.topics import TopicTable, topics_path
from ..client.broker_view import BrokerView
from ..errors import DataLossError, HostMQError
from ..records import FIELD, KEY_SEPARATOR, PROP_KEYS, PROP_TAGS, decode_properties
from ..root import RootPaths
from ..store.reader import GetStatus
from .options import OptionError, QueueKey

log = logging.getLogger(__name__)

try:
    from ..store import _columns as NATIVE_COLUMNS
except ImportError:         # not built (no compiler at install time): batch_columns serves
    NATIVE_COLUMNS = None
if os.environ.get("HOSTMQ_NATIVE_COLUMNS", "1") == "0":     # the Python path only (benchmarks, bisecting)
    NATIVE_COLUMNS = None
if NATIVE_COLUMNS is not None:
    R.layout_check(all(NATIVE_COLUMNS.LAYOUT[k] == FIELD[k] for k in (
        "queue_offset", "phys_offset", "sys_flag", "born_ts_ms", "store_ts_ms", "store_host", "body_length"))
        and NATIVE_COLUMNS.LAYOUT["MSG_HEADER"] == R.MSG_HEADER.size
        and NATIVE_COLUMNS.LAYOUT["PROPERTY_END"] == ord(R.PROPERTY_SEP)
        and NATIVE_COLUMNS.LAYOUT["NAME_VALUE_SEP"] == ord(R.NAME_VALUE_SEP) and len(KEY_SEPARATOR.encode()) == 1,
        "hostmq/store/_columns.c's layout differs from records.py's (rebuild it: pip install -e .)")
_PROP_NAMES = (PROP_TAGS.encode(), PROP_KEYS.encode(), KEY_SEPARATOR.encode(), R.SYSFLAG_COMPRESSED)

READ_CHUNK = 4096               # consume-queue entries fetched per step (tuples)
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


def iter_batches(root: str, key: QueueKey, start: int, end: int, fail_on_data_loss: bool,
                 chunk: int = READ_CHUNK) -> Iterator:
    """:class:`MessageBatch` es covering [start, end) of one queue, in order (read-only maps)."""
    topic, broker, qid = key
    view = BrokerView(root, broker)
    try:
        r = view.reader
        r.refresh_queue(topic, qid)
        off = start
        while off < end:
            b = r.get_batch(topic, qid, off, min(chunk, end - off))
            if getattr(b, "skipped", 0) and b.next_offset > off:
                # Records no decoder accepts (logged by the reader) are passed over, as consumers do:
                # they are not data lost to retention.
                if len(b):
                    yield b
                off = b.next_offset
                continue
            if b.status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.MESSAGE_WAS_REMOVING) or \
                    (len(b) and int(b.queue_offsets[0]) != off):
                first = first_live_offset(r, topic, qid)
                if fail_on_data_loss:
                    raise DataLossError(lost_range_message(key, off, first))
                log.warning("skipping: %s", lost_range_message(key, off, first))
                off = first if first > off else off + 1
                continue
            if not len(b):
                raise DataLossError(f"{topic} on {broker} queue {qid}: offset {off} is not readable "
                                    f"(status {b.status.name}) although planned up to {end}")
            yield b
            off = b.next_offset
    finally:
        view.close()


def batch_columns(b, key: QueueKey, row_filter: Callable | None = None) -> dict:
    """The row values of a batch as column lists / arrays (header fields gathered with numpy; only
    the properties are decoded one message at a time)."""
    topic, broker, qid = key
    hdr = b.headers()
    n = len(hdr)
    bodies, props_raw = b.bodies_and_properties(hdr, len(topic))
    raw = hdr.view(np.uint8).reshape(n, -1)        # message id = store host + phys offset, big-endian
    host_at, phys_at = FIELD["store_host"], FIELD["phys_offset"]
    hexed = np.concatenate([raw[:, host_at:host_at + 8], raw[:, phys_at:phys_at + 8]], axis=1).tobytes().hex().upper()
    props = [decode_properties(p) for p in props_raw]
    cols = {"queue_offset": hdr["queue_offset"].astype(np.int64), "msg_id": [hexed[i:i + 32] for i in range(0, 32 * n, 32)],
            "tags": [d.get(PROP_TAGS) for d in props], "properties": props, "body": bodies,
            "born_ms": hdr["born_ts_ms"].astype(np.int64), "store_ms": hdr["store_ts_ms"].astype(np.int64)}
    cols["keys"] = [[k for k in d[PROP_KEYS].split(KEY_SEPARATOR) if k] if PROP_KEYS in d else [] for d in props]
    if row_filter is not None:
        keep = [i for i, (t, d) in enumerate(zip(cols["tags"], props)) if row_filter(t, d)]
        if len(keep) < n:
            idx = np.array(keep, dtype=np.int64)
            cols = {c: v[idx] if isinstance(v, np.ndarray) else [v[i] for i in keep] for c, v in cols.items()}
    cols["n"] = len(cols["msg_id"])
    return cols


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def read_range(root: str, key: QueueKey, start: int, end: int, *, row_filter: Callable | None = None,
               fail_on_data_loss: bool = True, arrow: bool = True, batch_rows: int = 8192) -> Iterator:
    """Rows of one queue's [start, end): ``pyarrow.RecordBatch`` es of at most ``batch_rows``
    (``arrow``) or tuples in the order of ``COLUMNS``."""
    topic, broker, qid = key
    native = arrow and row_filter is None and NATIVE_COLUMNS is not None
    for b in iter_batches(root, key, start, end, fail_on_data_loss, batch_rows if arrow else READ_CHUNK):
        rb = native_arrow_batch(b, key) if native else None
        if rb is not None:
            if rb.num_rows:
                yield rb
            continue
        c = batch_columns(b, key, row_filter)
        if not c["n"]:
            continue
        if arrow:
            yield arrow_batch(c, key)
            continue
        ms = dt.timedelta(milliseconds=1)
        for off, mid, tags, keys, props, body, born, stored in zip(
                c["queue_offset"].tolist(), c["msg_id"], c["tags"], c["keys"], c["properties"], c["body"],
                c["born_ms"].tolist(), c["store_ms"].tolist()):
            yield (topic, broker, qid, off, mid, tags, keys, props, body, _EPOCH + born * ms, _EPOCH + stored * ms)


def arrow_batch(c: dict, key: QueueKey):
    """One record batch (Spark checks the schema exactly: int32 queue id, int64 offsets,
    timestamp[us, UTC], every column nullable)."""
    import pyarrow as pa
    topic, broker, qid = key
    n = c["n"]
    ts = pa.timestamp("us", tz="UTC")
    return pa.RecordBatch.from_arrays([
        pa.array([topic] * n, pa.string()), pa.array([broker] * n, pa.string()),
        pa.array(np.full(n, qid, np.int32), pa.int32()), pa.array(c["queue_offset"], pa.int64()),
        pa.array(c["msg_id"], pa.string()), pa.array(c["tags"], pa.string()), pa.array(c["keys"], pa.list_(pa.string())),
        _map_array(c["properties"]),
        pa.array(c["body"], pa.binary()), pa.array(c["born_ms"] * 1000, ts), pa.array(c["store_ms"] * 1000, ts)],
        schema=arrow_schema())


def _map_array(dicts: list[dict]):
    """map<string,string> from flat keys and values (much cheaper than a list of pairs per row)."""
    import pyarrow as pa
    offsets = np.zeros(len(dicts) + 1, np.int32)
    np.cumsum([len(d) for d in dicts], out=offsets[1:])
    keys = [k for d in dicts for k in d]
    values = [v for d in dicts for v in d.values()]
    return pa.MapArray.from_arrays(pa.array(offsets), pa.array(keys, pa.string()), pa.array(values, pa.string()))


def native_arrow_batch(b, key: QueueKey):
    """``arrow_batch(batch_columns(b, key), key)`` built from the buffers ``NATIVE_COLUMNS.columns``
    fills in one call, or None where it hands the batch back (a record it does not read exactly as
    :func:`batch_columns` does: that path then gives its own outcome)."""
    import pyarrow as pa
    topic, broker, qid = key
    if len(topic) > 0xFF:
        return None
    # MessageBatch's spans (reader.py): its mapped files, each record's file, position and size.
    index = None if b._file is None else np.ascontiguousarray(b._file, np.int64)
    got = NATIVE_COLUMNS.columns(tuple(mf.mm for mf in b._files), index, np.ascontiguousarray(b._pos, np.int64),
                                 np.ascontiguousarray(b._sizes, np.int64), len(topic), *_PROP_NAMES)
    if got is None:
        return None
    (qoff, born, stored, ids, body_off, body, tag_valid, tag_nulls, tag_off, tags, keys_off, key_off, keys, map_off,
     name_off, names, value_off, values) = got
    n = len(b)
    buf, ts, i32 = pa.py_buffer, pa.timestamp("us", tz="UTC"), pa.int32()

    def strings(count: int, offsets, data, valid=None, nulls: int = 0):
        return pa.Array.from_buffers(pa.string(), count, [valid, buf(offsets), buf(data)], null_count=nulls)

    entries = pa.Array.from_buffers(i32, n + 1, [None, buf(map_off)])
    props = pa.MapArray.from_arrays(entries, strings(len(name_off) // 4 - 1, name_off, names),
                                    strings(len(value_off) // 4 - 1, value_off, values))
    key_list = pa.Array.from_buffers(_keys_type(), n, [None, buf(keys_off)],
                                     children=[strings(len(key_off) // 4 - 1, key_off, keys)])
    return pa.RecordBatch.from_arrays([
        _constant_strings(topic, n), _constant_strings(broker, n), _constant_int32(qid, n),
        pa.Array.from_buffers(pa.int64(), n, [None, buf(qoff)]),
        pa.Array.from_buffers(pa.string(), n, [None, _fixed_offsets(32, n), buf(ids)]),
        strings(n, tag_off, tags, buf(tag_valid) if tag_nulls else None, tag_nulls), key_list, props,
        pa.Array.from_buffers(pa.binary(), n, [None, buf(body_off), buf(body)]),
        pa.Array.from_buffers(ts, n, [None, buf(born)]), pa.Array.from_buffers(ts, n, [None, buf(stored)])],
        schema=arrow_schema())


@functools.lru_cache(maxsize=16)
def _fixed_offsets(width: int, n: int):
    """int32 offsets of ``n`` strings of ``width`` bytes each, as an Arrow buffer (shared between batches)."""
    import pyarrow as pa
    return pa.py_buffer(np.arange(n + 1, dtype=np.int32) * np.int32(width))


@functools.lru_cache(maxsize=16)
def _constant_strings(value: str, n: int):
    """A string column of ``n`` times ``value`` (Spark wants plain strings, no dictionary)."""
    import pyarrow as pa
    data = value.encode()
    return pa.Array.from_buffers(pa.string(), n, [None, _fixed_offsets(len(data), n), pa.py_buffer(data * n)])


@functools.lru_cache(maxsize=16)
def _constant_int32(value: int, n: int):
    import pyarrow as pa
    return pa.array(np.full(n, value, np.int32), pa.int32())


def _keys_type():
    import pyarrow as pa
    return pa.list_(pa.field("element", pa.string()))


@functools.cache
def arrow_schema():
    import pyarrow as pa
    ts = pa.timestamp("us", tz="UTC")
    return pa.schema([("topic", pa.string()), ("broker", pa.string()), ("queue_id", pa.int32()),
                      ("queue_offset", pa.int64()), ("msg_id", pa.string()), ("tags", pa.string()),
                      ("keys", _keys_type()),
                      ("properties", pa.map_(pa.string(), pa.string())), ("body", pa.binary()),
                      ("born_timestamp", ts), ("store_timestamp", ts)])
