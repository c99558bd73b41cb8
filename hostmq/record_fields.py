"""Names and properties of a commitlog record: topic and group names, property names, and the
PROPERTIES codec (``name\x01value\x02`` pairs) with its checks (pure).

Part of hostmq/records.py's declarations — re-exported there and used as ``records.NAME`` — kept in
their own module only to keep each file readable. Decoders raise
:class:`~hostmq.errors.CorruptRecordError`, checks of what a client sends raise
:class:`~hostmq.errors.ValidationError`.
"""
from __future__ import annotations

import functools
import re
from typing import Mapping

import numpy as np

from .errors import CorruptRecordError, ValidationError

MAX_TOPIC_CHARS = 127
_TOPIC_RE = re.compile(r"[%|a-zA-Z0-9_-]+")    # used with fullmatch: "$" would accept a trailing \n


def _fail(pos: int, why: str) -> CorruptRecordError:
    return CorruptRecordError("", pos, why)


# Property names (RocketMQ MessageConst)
PROP_TAGS = "TAGS"
PROP_KEYS = "KEYS"
PROP_UNIQ_KEY = "UNIQ_CLIENT_MESSAGE_ID_KEYIDX"
PROP_DELAY = "DELAY"
PROP_REAL_TOPIC = "REAL_TOPIC"
PROP_REAL_QUEUE_ID = "REAL_QID"
PROP_RETRY_TOPIC = "RETRY_TOPIC"
PROP_ORIGIN_MSG_ID = "ORIGIN_MESSAGE_ID"
PROP_TRANSACTION_PREPARED = "TRAN_MSG"
PROP_PRODUCER_GROUP = "PGROUP"
KEY_SEPARATOR = " "
NAME_VALUE_SEP = "\x01"
PROPERTY_SEP = "\x02"



def validate_topic(topic) -> bytes:
    """Encoded topic, or ValidationError (RocketMQ ``TopicValidator`` rules)."""
    if not isinstance(topic, str) or not topic:
        raise ValidationError(f"topic must be a non-empty string, got {topic!r}")
    if len(topic) > MAX_TOPIC_CHARS:
        raise ValidationError(f"topic is {len(topic)} characters; at most {MAX_TOPIC_CHARS} allowed")
    if not _TOPIC_RE.fullmatch(topic):
        raise ValidationError(f"topic {topic!r} has characters outside [%|a-zA-Z0-9_-]")
    return topic.encode("ascii")


@functools.lru_cache(maxsize=65536)
def validate_consumer_group(group) -> str:
    """A consumer group name: a non-empty string without '@' (offset keys are ``topic@group``)."""
    if not isinstance(group, str) or not group or "@" in group:
        raise ValidationError(f"consumer group must be a non-empty string without '@', got {group!r}")
    return group


# ---------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------
def encode_properties(props: Mapping[str, str]) -> bytes:
    """``name\\x01value\\x02`` for each pair (RocketMQ ``messageProperties2String``)."""
    parts = []
    for k, v in props.items():
        k, v = str(k), str(v)
        if not k or NAME_VALUE_SEP in k or PROPERTY_SEP in k or NAME_VALUE_SEP in v or PROPERTY_SEP in v:
            raise ValidationError(f"property {k!r}: names must be non-empty and neither name nor value "
                                  "may contain \\x01 or \\x02")
        parts.append(f"{k}\x01{v}\x02")
    try:
        return "".join(parts).encode("utf-8")
    except UnicodeEncodeError as e:    # lone surrogates have no UTF-8 form
        raise ValidationError(f"properties are not encodable as UTF-8: {e}") from None


def decode_properties(data: bytes) -> dict[str, str]:
    """Inverse of :func:`encode_properties`; malformed input raises CorruptRecordError."""
    if not data:
        return {}
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _fail(0, f"properties are not UTF-8: {e}") from None
    out = {}
    for pair in text.split(PROPERTY_SEP):
        if not pair:
            continue
        name, sep, value = pair.partition(NAME_VALUE_SEP)
        if not sep or not name:
            raise _fail(0, f"malformed property pair {pair[:40]!r}")
        out[name] = value
    return out


# System properties whose values the broker itself acts on: a record is refused unless each is well
# formed (the scheduler delivers to REAL_TOPIC/REAL_QID, the dispatcher schedules by DELAY).
_INT_PROPS = {PROP_DELAY: (0, (1 << 31) - 1), PROP_REAL_QUEUE_ID: (0, (1 << 31) - 1)}
_BOOL_PROPS = (PROP_TRANSACTION_PREPARED,)


def check_properties(data) -> None:
    """Raise ValidationError unless PROPERTIES bytes are what an encoder makes: UTF-8,
    ``name\x01value\x02`` pairs with non-empty names, and well-formed values for the system
    properties the broker acts on (REAL_TOPIC, REAL_QID, DELAY, TRAN_MSG, RETRY_TOPIC).

    A record that passes decodes everywhere (:func:`decode_properties`, the SQL92 filter).
    :func:`check_properties_many` is the same check for many records at once."""
    if not data:
        return
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValidationError(f"properties are not UTF-8: {e}") from None
    if text[-1] != PROPERTY_SEP:
        raise ValidationError("properties do not end with \\x02")
    for pair in text[:-1].split(PROPERTY_SEP):
        name, sep, value = pair.partition(NAME_VALUE_SEP)
        if not sep or not name or NAME_VALUE_SEP in value:
            raise ValidationError(f"malformed property pair {pair[:40]!r}")
        _check_reserved(name, value)


_RESERVED_MARKS = tuple(f"{n}{NAME_VALUE_SEP}".encode() for n in
                        (*_INT_PROPS, *_BOOL_PROPS, PROP_REAL_TOPIC, PROP_RETRY_TOPIC))


def check_properties_many(u8: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> int:
    """:func:`check_properties` of the PROPERTIES at ``u8[starts[i]:starts[i] + lengths[i]]`` for all i
    at once; returns -1 if all pass, else the index of the first record that fails (check it alone
    for the reason). Vectorised: the regions are gathered into one buffer; since a valid region ends
    with ``\x02``, no UTF-8 sequence can cross a boundary, so one decode of the whole buffer and one
    alternation check of its separators decide every region; the rare records naming a system
    property are checked one by one."""
    ends = starts + lengths
    nonempty = lengths > 0
    if nonempty.any() and (u8[ends[nonempty] - 1] != 2).any():
        return _first_failing(u8, starts, lengths)
    total = int(lengths.sum())
    if total == 0:
        return -1
    before = np.cumsum(lengths) - lengths            # where each region starts in the gathered buffer
    blob = u8[np.repeat(starts - before, lengths) + np.arange(total)]
    raw = blob.tobytes()
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return _first_failing(u8, starts, lengths)
    sep = np.flatnonzero((blob == 1) | (blob == 2))
    kinds = blob[sep]
    empty_name = (kinds == 1) & ((sep == 0) | (blob[np.maximum(sep - 1, 0)] == 2))
    if len(kinds) % 2 or (kinds[0::2] != 1).any() or (kinds[1::2] != 2).any() or empty_name.any():
        return _first_failing(u8, starts, lengths)
    if any(m in raw for m in _RESERVED_MARKS):
        return _first_failing(u8, starts, lengths)
    return -1


def _first_failing(u8: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> int:
    for i, (s, n) in enumerate(zip(starts.tolist(), lengths.tolist())):
        try:
            check_properties(u8[s:s + n].tobytes())
        except ValidationError:
            return i
    return -1


def _check_reserved(name: str, value: str) -> None:
    if name in _INT_PROPS:
        lo, hi = _INT_PROPS[name]
        if not (value.isascii() and value.isdigit() and lo <= int(value) <= hi):
            raise ValidationError(f"property {name} must be an integer in {lo}..{hi}, got {value[:40]!r}")
    elif name == PROP_REAL_TOPIC or name == PROP_RETRY_TOPIC:
        validate_topic(value)
    elif name in _BOOL_PROPS and value not in ("true", "false"):
        raise ValidationError(f"property {name} must be true or false, got {value[:40]!r}")
