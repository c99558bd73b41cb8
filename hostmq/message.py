"""The user's nouns: Message, MessageExt, MessageQueue, SendResult and the enums of API.md.

``MessageExt`` is built per received message, so it is cheap to make: it keeps a private copy of the
record's bytes and decodes header fields and properties only when first read (see ``records``).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable, Mapping

from . import records
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

    __slots__ = ("_raw", "_hdr", "_props", "broker", "_topic")

    def __init__(self, raw: bytes, broker: str = "") -> None:  # noqa: D107 - built by the store
        self._raw = raw
        self._hdr = None
        self._props = None
        self.broker = broker
        self._topic = None          # a retried message shows its original topic (RocketMQ resetRetryTopic)

    # -- decoded lazily -------------------------------------------------------------------------
    def _header(self) -> records.RecordHeader:
        h = self._hdr
        if h is None:
            h = self._hdr = records.RecordHeader._make(records.MSG_HEADER.unpack_from(self._raw, 0))
        return h

    def _properties(self) -> dict[str, str]:
        p = self._props
        if p is None:
            p = self._props = records.decode_properties(records.record_properties_bytes(self._raw, 0))
        return p

    @property
    def raw(self) -> bytes:
        """The record exactly as stored in the commitlog."""
        return self._raw

    @property
    def topic(self) -> str:  # type: ignore[override]
        return self._topic or records.record_topic(self._raw, 0)

    @property
    def body(self) -> bytes:  # type: ignore[override]
        h = self._header()
        start = records.MSG_HEADER.size
        body = self._raw[start:start + h.body_length]
        if h.sys_flag & records.SYSFLAG_COMPRESSED:
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
        return self._header().queue_offset

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


def _short(body: bytes) -> str:
    return repr(body[:32]) + ("…" if len(body) > 32 else "")


__all__ = ["Message", "MessageExt", "MessageQueue", "SendResult", "SendStatus", "TransactionState",
           "ConsumeResult", "MessageModel", "ConsumeFrom"]
