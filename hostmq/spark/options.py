"""Options of the ``hostmq`` Spark data source, parsed and checked on the driver (pure).

Spark hands every option over as a string; each is checked here so a mistake fails at ``load()`` /
``save()`` with a message that names the option, not later in an executor. Shapes follow Spark's
Kafka source (``startingOffsets``, ``endingOffsets``, ``startingTimestamp``, ``maxOffsetsPerTrigger``,
``failOnDataLoss``) with RocketMQ's places: an offset belongs to (topic, broker, queue id).

Offsets JSON: ``{"broker-a": {"0": 12, "1": -2}}`` (broker → queue id → queue offset) applies to
every topic read; with several topics it may be nested under the topic,
``{"orders": {"broker-a": {"0": 12}}}``. As in Kafka, ``-2`` means earliest and ``-1`` latest.
Queues not named start at the option's default (earliest).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from .. import records as R
from ..store.filter import parse_tag_expression
from ..client.sql92 import SQL
from ..errors import ConfigError, FilterSyntaxError, ValidationError

EARLIEST, LATEST = -2, -1
DEFAULT_MAX_RECORDS_PER_PARTITION = 1_000_000

QueueKey = tuple[str, str, int]          # (topic, broker, queue id)


class OptionError(ConfigError):
    """A data-source option is missing or malformed; the message names the option."""


@dataclass(frozen=True)
class OffsetSpec:
    """``earliest`` / ``latest`` for every queue, or explicit offsets with a default for the rest."""

    default: int                                       # EARLIEST or LATEST
    explicit: dict[QueueKey, int] = field(default_factory=dict)

    def for_queue(self, key: QueueKey) -> int:
        return self.explicit.get(key, self.default)


@dataclass(frozen=True)
class ReadOptions:
    root: str
    topics: tuple[str, ...]
    starting: OffsetSpec
    ending: OffsetSpec
    starting_timestamp_ms: int | None = None
    max_offsets_per_trigger: int | None = None
    max_records_per_partition: int = DEFAULT_MAX_RECORDS_PER_PARTITION
    fail_on_data_loss: bool = True
    expression: str = "*"
    expression_type: str = "TAG"                       # or SQL92
    group: str | None = None
    arrow: bool = True                                 # yield Arrow record batches (else tuples)
    arrow_batch_rows: int = 8192

    def row_filter(self):
        """A callable(tags, properties) → bool, or None when everything matches."""
        if self.expression_type == "SQL92":
            sql = SQL(self.expression)
            return lambda tags, props: sql.matches(props)
        tf = parse_tag_expression(self.expression)
        if tf.match_all:
            return None
        return lambda tags, props: tf.match_tag(tags)


@dataclass(frozen=True)
class WriteOptions:
    root: str
    topic: str | None = None                           # overrides a ``topic`` column (as Kafka's sink)
    batch_size: int = 256                              # rows per send_batch


def _get(options, name: str) -> str | None:
    v = options.get(name)
    if v is None:
        v = options.get(name.lower())
    return None if v is None else str(v)


def _root(options) -> str:
    root = _get(options, "root") or _get(options, "path")
    if not root:
        raise OptionError("option 'root' is required: the hostmq root directory (e.g. .option('root', '/var/lib/hostmq'))")
    return root


def _positive_int(options, name: str, default: int | None) -> int | None:
    raw = _get(options, name)
    if raw is None:
        return default
    try:
        v = int(raw.strip())
    except ValueError:
        raise OptionError(f"option '{name}' must be a positive integer, got {raw!r}") from None
    if v < 1:
        raise OptionError(f"option '{name}' must be a positive integer, got {raw!r}")
    return v


def _bool(options, name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    s = raw.strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no"):
        return False
    raise OptionError(f"option '{name}' must be true or false, got {raw!r}")


def parse_offsets(raw: str | None, name: str, topics: tuple[str, ...], default: int,
                  allow_earliest: bool = True) -> OffsetSpec:
    if raw is None:
        return OffsetSpec(default)
    s = raw.strip()
    if s.lower() == "earliest":
        if not allow_earliest:
            raise OptionError(f"option '{name}' cannot be 'earliest'")
        return OffsetSpec(EARLIEST)
    if s.lower() == "latest":
        return OffsetSpec(LATEST)
    try:
        obj = orjson.loads(s)
    except orjson.JSONDecodeError as e:
        raise OptionError(f"option '{name}' must be 'earliest', 'latest' or JSON like "
                          f"{{\"broker-a\": {{\"0\": 12}}}}; not JSON: {e}") from None
    if not isinstance(obj, dict) or not obj:
        raise OptionError(f"option '{name}' JSON must be a non-empty object of broker → queue id → offset")
    nested = all(isinstance(v, dict) and v and all(isinstance(x, dict) for x in v.values()) for v in obj.values())
    by_topic = obj if nested else {t: obj for t in topics}
    explicit: dict[QueueKey, int] = {}
    for topic, brokers in by_topic.items():
        if topic not in topics:
            raise OptionError(f"option '{name}' names topic {topic!r}, which is not among the topics read {list(topics)}")
        for broker, queues in brokers.items():
            if not isinstance(queues, dict):
                raise OptionError(f"option '{name}': broker {broker!r} must map queue ids to offsets, got {queues!r}")
            for qid, off in queues.items():
                if not str(qid).isdecimal():
                    raise OptionError(f"option '{name}': queue id {qid!r} of broker {broker!r} is not a number")
                if not isinstance(off, int) or isinstance(off, bool) or off < -2 or (off == EARLIEST and not allow_earliest):
                    raise OptionError(f"option '{name}': offset of {broker}/{qid} must be an int ≥ 0 "
                                      f"(or -1 latest{', -2 earliest' if allow_earliest else ''}), got {off!r}")
                explicit[(topic, broker, int(qid))] = off
    return OffsetSpec(default, explicit)


def read_options(options, streaming: bool | None) -> ReadOptions:
    """``streaming`` None: checks common to both (at ``load()``, before Spark says which)."""
    root = _root(options)
    raw_topics = _get(options, "topic") or _get(options, "topics")
    if not raw_topics or not raw_topics.strip():
        raise OptionError("option 'topic' is required: one topic or several separated by commas")
    topics = tuple(dict.fromkeys(t.strip() for t in raw_topics.split(",") if t.strip()))
    for t in topics:
        try:
            R.validate_topic(t)
        except ValidationError as e:
            raise OptionError(f"option 'topic': {e}") from None
    starting = parse_offsets(_get(options, "startingOffsets"), "startingOffsets", topics,
                             LATEST if streaming else EARLIEST)
    if streaming is True and _get(options, "endingOffsets") is not None:
        raise OptionError("option 'endingOffsets' is for batch reads only (a stream has no end)")
    ending = parse_offsets(_get(options, "endingOffsets"), "endingOffsets", topics, LATEST, allow_earliest=False)
    ts_raw = _get(options, "startingTimestamp")
    ts = None
    if ts_raw is not None:
        try:
            ts = int(ts_raw.strip())
        except ValueError:
            raise OptionError(f"option 'startingTimestamp' must be milliseconds since the epoch, got {ts_raw!r}") from None
        if ts < 0:
            raise OptionError(f"option 'startingTimestamp' must be ≥ 0, got {ts_raw!r}")
    expr = _get(options, "expression") or "*"
    etype = (_get(options, "expressionType") or "TAG").strip().upper()
    if etype not in ("TAG", "SQL92"):
        raise OptionError(f"option 'expressionType' must be TAG or SQL92, got {etype!r}")
    try:
        if etype == "SQL92":
            SQL(expr)
        else:
            parse_tag_expression(expr)
    except FilterSyntaxError as e:
        raise OptionError(f"option 'expression': {e}") from None
    group = _get(options, "group")
    if group is not None:
        try:
            R.validate_consumer_group(group)
        except ValidationError as e:
            raise OptionError(f"option 'group': {e}") from None
    mopt = _positive_int(options, "maxOffsetsPerTrigger", None)
    if mopt is not None and streaming is False:
        raise OptionError("option 'maxOffsetsPerTrigger' is for streaming reads only")
    return ReadOptions(
        root=root, topics=topics, starting=starting, ending=ending, starting_timestamp_ms=ts,
        max_offsets_per_trigger=mopt,
        max_records_per_partition=_positive_int(options, "maxRecordsPerPartition", DEFAULT_MAX_RECORDS_PER_PARTITION),
        fail_on_data_loss=_bool(options, "failOnDataLoss", True), expression=expr, expression_type=etype,
        group=group, arrow=_bool(options, "arrow", True),
        arrow_batch_rows=_positive_int(options, "arrowBatchRows", 8192))


def write_options(options) -> WriteOptions:
    root = _root(options)
    topic = _get(options, "topic")
    if topic is not None:
        try:
            R.validate_topic(topic.strip())
        except ValidationError as e:
            raise OptionError(f"option 'topic': {e}") from None
        topic = topic.strip()
    return WriteOptions(root=root, topic=topic, batch_size=_positive_int(options, "batchSize", 256))


def encode_offsets(offsets: dict[QueueKey, int]) -> dict:
    """A stream offset: topic → broker → queue id (string) → next queue offset, keys sorted (Spark
    compares offsets by their JSON)."""
    out: dict = {}
    for (topic, broker, qid), off in sorted(offsets.items()):
        out.setdefault(topic, {}).setdefault(broker, {})[str(qid)] = int(off)
    return out


def decode_offsets(obj) -> dict[QueueKey, int]:
    if not isinstance(obj, dict):
        raise OptionError(f"a hostmq stream offset must be a JSON object, got {obj!r}")
    out = {}
    for topic, brokers in obj.items():
        for broker, queues in brokers.items():
            for qid, off in queues.items():
                out[(topic, broker, int(qid))] = int(off)
    return out
