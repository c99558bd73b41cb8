"""Writing DataFrames into hostmq topics (batch and streaming), and committing a stream's offsets
for a consumer group.

Each task opens one :class:`hostmq.Producer` and sends its rows with ``send_batch`` (rows of one
topic, up to ``batchSize`` rows or ~1 MiB per frame). Columns: ``body`` (binary or string) required;
``topic`` (string; the ``topic`` option overrides it, as in Kafka's sink), ``tags`` (string),
``keys`` (string, space-separated, or array<string>) and ``properties`` (map<string,string>)
optional; the producer checks ``properties`` as RocketMQ's ``putUserProperty`` does (reserved names
such as ``TAGS``, ``KEYS`` or the unique id — which a DataFrame read from hostmq carries in its
``properties`` — and blank names or values are refused; drop them, e.g. with ``map_filter``, before
writing back), and leaves out null values. Delivery is at-least-once: a task that fails after sending some rows is retried by Spark
and sends them again. Each task's commit message carries the message id of every row it sent.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, MapType, StringType, StructType

from ..message import Message, MessageQueue
from .options import OptionError, QueueKey, WriteOptions

log = logging.getLogger(__name__)

MAX_FRAME_BODY_BYTES = 1 << 20          # a send_batch frame carries this much body at most

_ALLOWED = {
    "body": (BinaryType, StringType),
    "topic": (StringType,),
    "tags": (StringType,),
    "keys": (StringType, ArrayType),
    "properties": (MapType,),
}


def check_write_schema(schema: StructType, opts: WriteOptions) -> tuple[str, ...]:
    """The columns the writer uses, after checking their types (at ``save()``, on the driver)."""
    cols = {f.name: f.dataType for f in schema.fields}
    if "body" not in cols:
        raise OptionError(f"writing to hostmq needs a 'body' column (binary or string); the DataFrame has {sorted(cols)}")
    if "topic" not in cols and opts.topic is None:
        raise OptionError("writing to hostmq needs option 'topic' or a 'topic' column")
    used = []
    for name, types in _ALLOWED.items():
        t = cols.get(name)
        if t is None:
            continue
        if not isinstance(t, types):
            raise OptionError(f"column '{name}' must be {' or '.join(x.__name__[:-4].lower() for x in types)}, "
                              f"got {t.simpleString()}")
        if name == "keys" and isinstance(t, ArrayType) and not isinstance(t.elementType, StringType):
            raise OptionError(f"column 'keys' must be a string or array<string>, got {t.simpleString()}")
        if name == "properties" and not (isinstance(t.keyType, StringType) and isinstance(t.valueType, StringType)):
            raise OptionError(f"column 'properties' must be map<string,string>, got {t.simpleString()}")
        used.append(name)
    return tuple(used)


@dataclass
class HostMQCommitMessage(WriterCommitMessage):
    rows: int = 0
    msg_ids: list[str] = field(default_factory=list)


def row_message(row, columns: tuple[str, ...], default_topic: str | None) -> Message:
    body = row["body"]
    if body is None:
        raise OptionError("a row has a null 'body'")
    if isinstance(body, str):
        body = body.encode()
    topic = default_topic if default_topic is not None else row["topic"]
    if topic is None:
        raise OptionError("a row has a null 'topic' and no 'topic' option is set")
    keys = row["keys"] if "keys" in columns else None
    if isinstance(keys, str):
        keys = keys.split()
    props = row["properties"] if "properties" in columns else None
    if props:       # a null map value is no value (RocketMQ's encoder leaves a null value out too)
        props = {k: v for k, v in props.items() if v is not None}
    return Message(topic, bytes(body), tags=row["tags"] if "tags" in columns else None,
                   keys=[k for k in (keys or ()) if k], properties=props or None)


def send_rows(opts: WriteOptions, columns: tuple[str, ...], rows) -> HostMQCommitMessage:
    """Send rows through one producer, in batches per topic; the ids of what was sent."""
    from ..client.producer import Producer
    out = HostMQCommitMessage()
    pending: dict[str, list[Message]] = {}
    pending_bytes: dict[str, int] = {}
    with Producer(opts.root) as producer:
        def flush(topic: str) -> None:
            msgs = pending.pop(topic)
            pending_bytes.pop(topic)
            r = producer.send_batch(msgs)
            out.msg_ids.extend(r.msg_id.split(","))
            out.rows += len(msgs)
        for row in rows:
            m = row_message(row, columns, opts.topic)
            batch = pending.setdefault(m.topic, [])
            batch.append(m)
            pending_bytes[m.topic] = pending_bytes.get(m.topic, 0) + len(m.body)
            if len(batch) >= opts.batch_size or pending_bytes[m.topic] >= MAX_FRAME_BODY_BYTES:
                flush(m.topic)
        for topic in list(pending):
            flush(topic)
    return out


class BatchWriter(DataSourceWriter):
    def __init__(self, opts: WriteOptions, columns: tuple[str, ...]) -> None:
        self.opts, self.columns = opts, columns

    def write(self, iterator) -> HostMQCommitMessage:
        return send_rows(self.opts, self.columns, iterator)

    def commit(self, messages) -> None:
        log.info("hostmq write committed: %d rows", sum(m.rows for m in messages if m is not None))

    def abort(self, messages) -> None:
        sent = sum(m.rows for m in messages if m is not None)
        log.warning("hostmq write aborted: %d rows of succeeded tasks stay in their topics (at-least-once)", sent)


class StreamWriter(DataSourceStreamWriter):
    def __init__(self, opts: WriteOptions, columns: tuple[str, ...]) -> None:
        self.opts, self.columns = opts, columns

    def write(self, iterator) -> HostMQCommitMessage:
        return send_rows(self.opts, self.columns, iterator)

    def commit(self, messages, batchId: int) -> None:
        log.info("hostmq stream write: batch %d committed, %d rows", batchId,
                 sum(m.rows for m in messages if m is not None))

    def abort(self, messages, batchId: int) -> None:
        log.warning("hostmq stream write: batch %d aborted (rows already sent stay; Spark retries the batch)", batchId)


def commit_group_offsets(root: str, group: str, offsets: dict[QueueKey, int]) -> None:
    """Store ``offsets`` as the group's consumer offsets on their brokers."""
    from ..client.instance import ClientInstance
    from ..client.offset_store import BrokerOffsets
    inst = ClientInstance(root)
    try:
        store = BrokerOffsets(inst, group)
        for (topic, broker, qid), off in sorted(offsets.items()):
            store.store(MessageQueue(topic, broker, qid), off)
    finally:
        inst.close()
