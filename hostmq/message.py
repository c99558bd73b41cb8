"""The user's nouns: Message, MessageExt, MessageQueue, SendResult and the enums of docs/api.md.

``MessageExt`` is built per received message, so it is cheap to make: it keeps a private copy of the
record's bytes and decodes header fields and properties only when first read (see ``records``).
Stored bytes are untrusted (an old store, a damaged disk): every accessor raises
:class:`~hostmq.errors.CorruptRecordError` for bytes it cannot decode, never another exception, and
:meth:`MessageExt.check` decodes everything up front, which is how the read side
(``store/reader.py``) skips such a record instead of handing it to a consumer.
"""
from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Iterable, Mapping

from . import records
from .errors import CorruptRecordError, ValidationError
from .records import PROP_KEYS, PROP_TAGS, PROP_DELAY, KEY_SEPARATOR


class SendStatus(enum.Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


class TransactionState(enum.Enum):
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"


class ConsumeResult(enum.Enum):
    SUCCESS = "SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class MessageModel(enum.Enum):
    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class ConsumeFrom(enum.Enum):
    LAST_OFFSET = "LAST_OFFSET"
    FIRST_OFFSET = "FIRST_OFFSET"
    TIMESTAMP = "TIMESTAMP"


@dataclass(frozen=True, order=True, slots=True)
class MessageQueue:
    """One queue of a topic on one broker; hashable and ordered (topic, broker, queue_id)."""

    topic: str
    broker: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker}#{self.queue_id}"


@dataclass(frozen=True, slots=True)
class SendResult:
    status: SendStatus
    msg_id: str
    queue: MessageQueue
    queue_offset: int


class Message:
    """A message to send. ``keys`` may be one string or an iterable of strings (RocketMQ KEYS)."""

    __slots__ = ("topic", "body", "tags", "keys", "properties", "delay_level", "flag")

    def __init__(self, topic: str, body: bytes, tags: str | None = None, keys: Iterable[str] | str = (),
                 properties: Mapping[str, str] | None = None, delay_level: int = 0, flag: int = 0) -> None:
        self.topic = topic
        self.body = body
        self.tags = tags
        self.keys = (keys,) if isinstance(keys, str) else tuple(keys)
        self.properties = dict(properties) if properties else {}
        self.delay_level = delay_level
        self.flag = flag

    def all_properties(self) -> dict[str, str]:
        """User properties plus the system ones (TAGS, KEYS, DELAY) as stored in the record."""
        props = dict(self.properties)
        if self.tags:
            props[PROP_TAGS] = self.tags
        if self.keys:
            props[PROP_KEYS] = KEY_SEPARATOR.join(self.keys)
        if self.delay_level:
            props[PROP_DELAY] = str(self.delay_level)
        return props

    def __repr__(self) -> str:
        return (f"Message(topic={self.topic!r}, body={_short(self.body)}, tags={self.tags!r}, "
                f"keys={self.keys!r})")


class MessageExt(Message):
    """A stored message. Holds a private copy of its record; fields are decoded on first access."""

    __slots__ = ("_raw", "_hdr", "_props", "broker", "_topic", "_body")

    def __init__(self, raw: bytes, broker: str = "") -> None:  # noqa: D107 - built by the store
        self._raw = raw
        self._hdr = None
        self._props = None
        self.broker = broker
        self._topic = None          # a retried message shows its original topic (RocketMQ resetRetryTopic)
        self._body = None           # a compressed body once inflated

    def check(self, topic: bytes | None = None, queue_id: int | None = None,
              queue_offset: int | None = None) -> None:
        """Raise CorruptRecordError unless every accessor can decode this record (header, topic,
        properties, a compressed body) and, for those given, it names this topic, queue id and queue
        offset (the consume-queue entry it was read through). The properties are decoded here (and
        kept: most consumers read tags or properties anyway), a compressed body is inflated and kept."""
        raw = self._raw
        why, pstart, sys_flag = _shape(raw, topic, queue_id, queue_offset)
        if why is None:
            try:
                self._props = records.decode_properties(bytes(raw[pstart:]))
            except CorruptRecordError as e:
                why = e.why
        if why is not None:
            raise CorruptRecordError("", self._phys_hint(), why)
        if sys_flag & records.SYSFLAG_COMPRESSED:
            self._body = records.decompress_body(self._stored_body())

    def _phys_hint(self) -> int:
        """PHYSICALOFFSET as stored (for error messages; -1 if the record is too short to hold one)."""
        try:
            return _PHYS.unpack_from(self._raw, records.FIELD["phys_offset"])[0]
        except struct.error:
            return -1

    # -- decoded lazily -------------------------------------------------------------------------
    def _header(self) -> records.RecordHeader:
        h = self._hdr
        if h is None:
            try:
                h = self._hdr = records.RecordHeader._make(records.MSG_HEADER.unpack_from(self._raw, 0))
            except struct.error:
                raise CorruptRecordError("", -1, f"{len(self._raw)} bytes cannot hold a record header") from None
        return h

    def _properties(self) -> dict[str, str]:
        p = self._props
        if p is None:
            try:
                data = records.record_properties_bytes(self._raw, 0)
            except (struct.error, IndexError):
                raise CorruptRecordError("", self._phys_hint(), "properties lie outside the record") from None
            p = self._props = records.decode_properties(data)
        return p

    def _stored_body(self) -> bytes:
        h = self._header()
        start = records.MSG_HEADER.size
        return self._raw[start:start + h.body_length]

    @property
    def raw(self) -> bytes:
        """The record exactly as stored in the commitlog."""
        return self._raw

    def show_as(self, topic: str | None) -> None:
        """Show this message under ``topic`` (a retried message under its original topic, as RocketMQ's
        ``resetRetryAndNamespace``); None or "" shows the stored topic again."""
        if topic is not None and not isinstance(topic, str):
            raise ValidationError(f"topic must be a str or None, got {topic!r}")
        self._topic = topic or None

    @property
    def topic(self) -> str:  # type: ignore[override]
        if self._topic:
            return self._topic
        try:
            return records.record_topic(self._raw, 0)
        except (struct.error, IndexError, UnicodeDecodeError) as e:
            raise CorruptRecordError("", self._phys_hint(), f"undecodable topic: {e}") from None

    @property
    def body(self) -> bytes:  # type: ignore[override]
        b = self._body
        if b is not None:
            return b
        raw = self._raw
        try:        # SYSFLAG and BODYLENGTH in one unpack (what _stored_body and _header give, ~3× faster)
            sys_flag, n = _FLAG_BODY_LEN_UNPACK(raw)
        except struct.error:
            self._header()          # raises its CorruptRecordError for a record too short for a header
            raise
        body = raw[_HDR_BYTES:_HDR_BYTES + n]
        if sys_flag & _COMPRESSED:
            body = records.decompress_body(body)
        return body

    @property
    def tags(self) -> str | None:  # type: ignore[override]
        return self._properties().get(PROP_TAGS)

    @property
    def keys(self) -> tuple[str, ...]:  # type: ignore[override]
        k = self._properties().get(PROP_KEYS)
        return tuple(x for x in k.split(KEY_SEPARATOR) if x) if k else ()

    @property
    def properties(self) -> dict[str, str]:  # type: ignore[override]
        """All properties, system ones included (TAGS, KEYS, UNIQ_KEY, …)."""
        return self._properties()

    @property
    def delay_level(self) -> int:  # type: ignore[override]
        d = self._properties().get(PROP_DELAY)
        # isdecimal(), not isdigit(): "²" is a digit that int() (and Java's parseInt) rejects
        return int(d) if d and d.isdecimal() else 0

    @property
    def flag(self) -> int:  # type: ignore[override]
        return self._header().flag

    @property
    def msg_id(self) -> str:
        h = self._header()
        return records.encode_msg_id(h.store_host, h.phys_offset)

    @property
    def unique_id(self) -> str | None:
        return self._properties().get(records.PROP_UNIQ_KEY)

    @property
    def queue_id(self) -> int:
        return self._header().queue_id

    @property
    def queue_offset(self) -> int:
        h = self._hdr
        if h is None:           # the one field, without decoding the header (a push consumer's books)
            try:
                return _PHYS.unpack_from(self._raw, _QOFF_AT)[0]
            except struct.error:
                h = self._header()          # too short: CorruptRecordError, as every field raises
        return h.queue_offset

    @property
    def commitlog_offset(self) -> int:
        return self._header().phys_offset

    @property
    def born_timestamp_ms(self) -> int:
        return self._header().born_ts_ms

    @property
    def store_timestamp_ms(self) -> int:
        return self._header().store_ts_ms

    @property
    def reconsume_times(self) -> int:
        return self._header().reconsume_times

    @property
    def sys_flag(self) -> int:
        return self._header().sys_flag

    @property
    def store_size(self) -> int:
        return len(self._raw)

    @property
    def queue(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker, self.queue_id)

    def __repr__(self) -> str:
        return (f"MessageExt(topic={self.topic!r}, queue_id={self.queue_id}, "
                f"queue_offset={self.queue_offset}, msg_id={self.msg_id}, body={_short(self.body)})")


# -- the decode check ---------------------------------------------------------------------------
# The header fields a consumer's check reads, in one unpack; positions from records.FIELD.
_F = records.FIELD
_CHECK = struct.Struct(f">iI{_F['queue_id'] - 8}xi{_F['queue_offset'] - _F['queue_id'] - 4}xq"
                       f"{_F['sys_flag'] - _F['queue_offset'] - 8}xi{_F['body_length'] - _F['sys_flag'] - 4}xi")
records.layout_check(_CHECK.size == records.MSG_HEADER.size and _F["total_size"] == 0 and _F["magic"] == 4,
                     "message._CHECK reads TOTALSIZE and MAGICCODE first, over the whole header")
_PHYS = struct.Struct(">q")                     # PHYSICALOFFSET and QUEUEOFFSET: big-endian int64
_QOFF_AT = records.FIELD["queue_offset"]
_FLAG_BODY_LEN = struct.Struct(f">{_F['sys_flag']}xi{_F['body_length'] - _F['sys_flag'] - 4}xi")
records.layout_check(_FLAG_BODY_LEN.size == records.MSG_HEADER.size,
                     "message._FLAG_BODY_LEN reads SYSFLAG and BODYLENGTH, which ends the header")
_FLAG_BODY_LEN_UNPACK = _FLAG_BODY_LEN.unpack_from
_COMPRESSED = records.SYSFLAG_COMPRESSED
_CHECK_UNPACK = _CHECK.unpack_from
_MAGIC, _HDR_BYTES, _MIN_RECORD_BYTES = records.MAGIC_CODE, records.MSG_HEADER.size, records.MIN_RECORD_BYTES
_TLEN, _PLEN = records.TOPIC_LEN.size, records.PROPS_LEN.size
records.layout_check(_TLEN == 1 and records.PROPS_LEN.format == ">H",       # as _shape reads them
                     "TOPICLENGTH is one byte and PROPERTIESLENGTH a big-endian u16")


def _shape(raw, topic: bytes | None, queue_id: int | None, queue_offset: int | None) -> tuple[str | None, int, int]:
    """(why ``raw`` is not one well-formed record, where its PROPERTIES start, its SYSFLAG): what
    ``records.check_record`` checks without the body CRC (the read path does not verify it), a
    UTF-8 topic, and the expected topic / queue id / queue offset when given. A fast mirror of
    check_record (one call per message on a consumer's path), property-tested against it in
    tests/test_message.py."""
    n = len(raw)
    if n < _MIN_RECORD_BYTES:
        return f"{n} bytes is shorter than any record", 0, 0
    total, magic, qid, qoff, sys_flag, body_len = _CHECK_UNPACK(raw)
    if magic != _MAGIC:
        return f"bad magic 0x{magic:08X}", 0, 0
    if total != n:
        return f"total size {total} is not the {n} bytes read for it", 0, 0
    tstart = _HDR_BYTES + _TLEN + body_len
    if body_len < 0 or tstart + _PLEN > n:
        return f"body length {body_len} does not fit total size {total}", 0, 0
    ppos = tstart + raw[tstart - 1]
    if ppos + _PLEN > n:
        return "topic length does not fit", 0, 0
    pstart = ppos + _PLEN
    if pstart + (raw[ppos] << 8 | raw[ppos + 1]) != n:
        return "lengths do not add up to the total size", 0, 0
    if pstart < n and raw[n - 1] != 2:
        return "properties do not end with \\x02 (torn tail)", 0, 0
    topic_b = bytes(raw[tstart:ppos])
    if topic is not None and topic_b != topic:
        return f"record of topic {topic_b[:64]!r} where {topic!r} was expected", 0, 0
    try:
        topic_b.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"topic is not UTF-8: {e}", 0, 0
    if queue_id is not None and qid != queue_id:
        return f"record of queue {qid} where queue {queue_id} was expected", 0, 0
    if queue_offset is not None and qoff != queue_offset:
        return f"record of queue offset {qoff} where {queue_offset} was expected", 0, 0
    return None, pstart, sys_flag


def _short(body: bytes) -> str:
    return repr(body[:32]) + ("…" if len(body) > 32 else "")


__all__ = ["Message", "MessageExt", "MessageQueue", "SendResult", "SendStatus", "TransactionState",
           "ConsumeResult", "MessageModel", "ConsumeFrom"]
