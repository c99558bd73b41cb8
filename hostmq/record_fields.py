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

from .errors import CorruptRecordError, ReservedPropertyError, ValidationError

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


# A group's retry topic is "%RETRY%" + group and must itself be a valid topic, so a group is at most
# 127 - 7 = 120 characters — RocketMQ's own limit since it fixed the same overflow (TopicValidator /
# Validators.GROUP_MAX_LENGTH, apache/rocketmq#9563); its 5.3.3 clients still allowed 255.
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
MAX_GROUP_CHARS = MAX_TOPIC_CHARS - len(RETRY_GROUP_TOPIC_PREFIX)


@functools.lru_cache(maxsize=65536)
def validate_group(group) -> str:
    """A producer or consumer group name, or ValidationError (RocketMQ ``Validators.checkGroup``):
    non-empty, only ``[%|a-zA-Z0-9_-]``, at most :data:`MAX_GROUP_CHARS` characters so that its
    ``%RETRY%`` and ``%DLQ%`` topics are valid topics."""
    if not isinstance(group, str) or not group:
        raise ValidationError(f"group must be a non-empty string, got {group!r}")
    if len(group) > MAX_GROUP_CHARS:
        raise ValidationError(f"group is {len(group)} characters; at most {MAX_GROUP_CHARS} allowed (its "
                              f"{RETRY_GROUP_TOPIC_PREFIX} topic must fit the {MAX_TOPIC_CHARS}-character topic limit)")
    if not _TOPIC_RE.fullmatch(group):
        raise ValidationError(f"group {group[:140]!r} has characters outside [%|a-zA-Z0-9_-]")
    return group


def validate_consumer_group(group) -> str:
    """A consumer group name: :func:`validate_group` (offset keys are ``topic@group``; '@' is not
    among the allowed characters)."""
    return validate_group(group)


# ---------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------
# RocketMQ MessageConst.STRING_HASH_SET (5.3.3): the names its Message.putUserProperty refuses.
ROCKETMQ_RESERVED_PROPERTIES = frozenset({
    "TRACE_ON", "MSG_REGION", "KEYS", "TAGS", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC", "REAL_QID",
    "TRAN_MSG", "PGROUP", "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID", "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG",
    "CORRECTION_FLAG", "MQ2_FLAG", "RECONSUME_TIME", "UNIQ_KEY", "MAX_RECONSUME_TIMES", "CONSUME_START_TIME",
    "POP_CK", "POP_CK_OFFSET", "1ST_POP_TIME", "TRAN_PREPARED_QUEUE_OFFSET", "DUP_INFO", "EXTEND_UNIQ_INFO",
    "INSTANCE_ID", "CORRELATION_ID", "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME", "PUSH_REPLY_TIME", "CLUSTER",
    "MSG_TYPE", "INNER_MULTI_QUEUE_OFFSET", "TIMER_DELAY_MS", "TIMER_DELAY_SEC", "TIMER_DELIVER_MS",
    "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES", "TIMER_OUT_MS", "TIMER_DEL_UNIQKEY",
    "TIMER_DELAY_LEVEL", "__BORNHOST", "BORN_TIMESTAMP", "DLQ_ORIGIN_TOPIC", "DLQ_ORIGIN_MESSAGE_ID", "__CRC32#",
})
# Plus the names hostmq writes that RocketMQ spells otherwise (its unique id property).
RESERVED_PROPERTIES = ROCKETMQ_RESERVED_PROPERTIES | {PROP_UNIQ_KEY}


def _blank(s: str) -> bool:
    """Java's ``s.trim().isEmpty()``: trim() strips every character up to U+0020."""
    return all(c <= " " for c in s)


def check_user_properties(props) -> dict[str, str]:
    """A message's user properties as RocketMQ's ``Message.putUserProperty`` takes them, as the
    ``dict[str, str]`` to encode: ReservedPropertyError naming every reserved name used
    (:data:`RESERVED_PROPERTIES`), ValidationError for a name or value that is None or blank
    (only characters up to U+0020, as Java's ``trim()``) or holds \x01 / \x02. Names and values
    that are not strings are taken as ``str(x)``. Checked by the producer before anything is sent."""
    if props is None:
        return {}
    if not isinstance(props, Mapping):
        raise ValidationError(f"properties must be a mapping of names to values, got {type(props).__name__}")
    reserved = [k for k in props if isinstance(k, str) and k in RESERVED_PROPERTIES]
    if reserved:
        raise ReservedPropertyError(reserved)
    out = {}
    for k, v in props.items():
        if k is None or v is None:
            raise ValidationError(f"property {k!r}: the name and the value may not be None (got {v!r})")
        k, v = str(k), str(v)
        if _blank(k) or _blank(v):
            raise ValidationError(f"property {k[:40]!r}: the name and the value may not be blank "
                                  f"(got value {v[:40]!r})")
        out[k] = v
    encode_properties(out)          # the separators and UTF-8, worded once
    return out


def encode_properties(props: Mapping[str, str]) -> bytes:
    """``name\\x01value\\x02`` for each pair (RocketMQ ``messageProperties2String``). A pair whose value
    is None is left out, as RocketMQ does (MessageDecoderTest.testNullValueProperty), and so is one
    whose value is empty: RocketMQ's decoder drops it (testString2messageProperties), so it would
    read as absent anyway — and the broker refuses it (:func:`check_properties`). ValidationError for
    an empty or None name, or \\x01 / \\x02 in a name or value."""
    parts = []
    for k, v in props.items():
        if v is None or v == "":
            continue
        if k is None:
            raise ValidationError(f"property name None (value {v!r}): names must be strings")
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
    """Inverse of :func:`encode_properties`. A pair with an empty value is dropped, as RocketMQ's
    ``string2messageProperties`` drops it (records stored before the broker refused such pairs still
    read); a name given twice takes its last value. Malformed input (not UTF-8, a pair without
    \x01 or with an empty name) raises CorruptRecordError: no encoder writes it, and the read side
    skips such a record (``store/read_check.py``) where RocketMQ would drop the pair silently."""
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
        if value:
            out[name] = value
    return out


# System properties whose values the broker itself acts on: a record is refused unless each is well
# formed (the scheduler delivers to REAL_TOPIC/REAL_QID, the dispatcher schedules by DELAY).
_INT_PROPS = {PROP_DELAY: (0, (1 << 31) - 1), PROP_REAL_QUEUE_ID: (0, (1 << 31) - 1)}
_BOOL_PROPS = (PROP_TRANSACTION_PREPARED,)


def check_properties(data) -> None:
    """Raise ValidationError unless PROPERTIES bytes are what an encoder makes: UTF-8,
    ``name\x01value\x02`` pairs with non-empty names and values, no name twice (the consume queue
    takes a tag from the first TAGS, a decoder from the last), and well-formed values for the system
    properties the broker acts on (REAL_TOPIC, REAL_QID, DELAY, TRAN_MSG, RETRY_TOPIC).

    The broker's check of every record a client writes. Whitespace-only names and values and
    reserved names are the client's check (:func:`check_user_properties`), not this one: what the
    broker itself re-writes from a stored record (a due delay message, a committed half, a retry)
    is a decode and encode of it, which satisfies exactly these rules.

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
    seen = set()
    for pair in text[:-1].split(PROPERTY_SEP):
        name, sep, value = pair.partition(NAME_VALUE_SEP)
        if not sep or not name or NAME_VALUE_SEP in value:
            raise ValidationError(f"malformed property pair {pair[:40]!r}")
        if not value:
            raise ValidationError(f"property {name[:40]!r} has an empty value (decoders drop it)")
        if name in seen:
            raise ValidationError(f"property {name[:40]!r} is given twice")
        seen.add(name)
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
    if (sep[1::2] == sep[0::2] + 1).any():                      # an empty value
        return _first_failing(u8, starts, lengths)
    if any(m in raw for m in _RESERVED_MARKS) or _names_may_repeat(blob, sep, np.cumsum(lengths)):
        return _first_failing(u8, starts, lengths)
    return -1


_ALL_ONES = np.uint64(0xFFFF_FFFF_FFFF_FFFF)
_PAD16 = np.zeros(16, np.uint8)


def _low_bytes_mask(nbytes: np.ndarray) -> np.ndarray:
    """uint64 masks keeping the low ``nbytes`` (clipped to 0..8) bytes of a little-endian word."""
    bits = np.clip(nbytes, 0, 8).astype(np.uint64) * np.uint64(8)
    return np.where(bits >= np.uint64(64), _ALL_ONES, (np.uint64(1) << (bits & np.uint64(63))) - np.uint64(1))


def _names_may_repeat(blob: np.ndarray, sep: np.ndarray, region_ends: np.ndarray) -> bool:
    """False only if no region of ``blob`` (well-formed pairs; ``sep`` the positions of their
    separators, ``region_ends`` where each region ends) names a property twice. Each name is keyed
    by its region, its length and its first 16 bytes, hashed into one word; equal names always
    share a key, so only a shared key (a name twice, two long names alike in their first 16 bytes, a
    hash collision) sends the batch to the exact check."""
    name_ends = sep[0::2]
    if len(name_ends) < 2:
        return False
    name_starts = np.empty_like(name_ends)
    name_starts[0] = 0
    name_starts[1:] = sep[1::2][:-1] + 1
    lengths = name_ends - name_starts
    windows = np.lib.stride_tricks.sliding_window_view(np.concatenate((blob, _PAD16)), 16)[name_starts]
    words = windows.view("<u8")                                 # (names, 2): each name's first 16 bytes
    w0 = words[:, 0] & _low_bytes_mask(lengths)
    w1 = words[:, 1] & _low_bytes_mask(lengths - 8)
    region = np.searchsorted(region_ends, name_ends, side="right").astype(np.uint64)
    h = (region * np.uint64(0x9E3779B97F4A7C15) ^ lengths.astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F)
         ^ w0 * np.uint64(0x165667B19E3779F9) ^ w1 * np.uint64(0xD6E8FEB86659FD93))
    h.sort()
    return bool((h[1:] == h[:-1]).any())


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
