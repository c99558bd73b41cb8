"""Message → record bytes, shared by the embedded store and the producer (which encodes into its
ring so the writer only copies and patches offsets).

A producer's batch — ``send_batch``, auto-batches, one ``send`` — goes through :func:`encode_messages`:
hostmq/store/_encode.c in the common case (plain messages: tags at most), ``py_encode_messages`` (the
spec: each message checked as ``Producer.prepare`` checks it, then :func:`encode_records`) otherwise.
``HOSTMQ_NATIVE_ENCODE=0`` keeps to the spec."""
from __future__ import annotations

import os
import struct
import time
import zlib
from typing import Callable, Mapping, Sequence

import numpy as np

from .. import records as R
from ..errors import ReservedPropertyError, ValidationError
from ..message import Message

_SEPS = ("\x01", "\x02")


def _clean(value: str, what: str) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"{what} must be a string, got {type(value).__name__}")
    if "\x01" in value or "\x02" in value:
        raise ValidationError(f"{what} may not contain \\x01 or \\x02")
    return value


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:     # a lone surrogate: no UTF-8 for it, so no record
        raise ValidationError(f"properties hold text that has no UTF-8 form ({e.reason} at {e.start})") from None


# The names properties_bytes writes itself: a user property may never take one (it would be written
# twice, and the consume queue and a decoder would each take a different one).
OWN_NAMES = frozenset({R.PROP_TAGS, R.PROP_KEYS, R.PROP_DELAY, R.PROP_UNIQ_KEY})


def properties_bytes(msg: Message, uniq_key: str | None, max_bytes: int, user_rules: bool = True) -> bytes:
    """PROPERTIES of a message: user properties, then TAGS, KEYS, DELAY and the unique id.

    ``user_rules``: the user properties follow RocketMQ's ``putUserProperty`` rules
    (``records.check_user_properties``: no reserved name, no None or blank name or value) — what a
    producer sends. The embedded store passes False, as RocketMQ's store checks no names (tools
    write system properties such as REAL_TOPIC through it); it still refuses the names this function
    writes itself, and leaves out None values, as RocketMQ's encoder does."""
    tags = msg.tags
    if not (msg.properties or msg.keys or msg.delay_level) and tags.__class__ is str and uniq_key:
        # Common case (tags only): one format, same bytes as the general path below.
        if "\x01" in tags or "\x02" in tags:
            _clean(tags, "tags")
        data = _utf8(f"TAGS\x01{tags}\x02{R.PROP_UNIQ_KEY}\x01{uniq_key}\x02")
        if len(data) > max_bytes:
            raise ValidationError(f"properties are {len(data)} bytes encoded; at most {max_bytes} allowed")
        return data
    parts = []
    if msg.properties:
        user = R.check_user_properties(msg.properties) if user_rules else msg.properties
        if not user_rules and not isinstance(user, Mapping):
            raise ValidationError(f"properties must be a mapping, got {type(user).__name__}")
        own = OWN_NAMES.intersection(user)
        if own:
            raise ReservedPropertyError(own)
        parts.append(R.encode_properties(user).decode("utf-8"))
    if msg.tags:
        parts.append(f"TAGS\x01{_clean(msg.tags, 'tags')}\x02")
    if msg.keys:
        for k in msg.keys:
            _clean(k, "key")
            if not k or R.KEY_SEPARATOR in k:
                raise ValidationError(f"key {k!r} must be non-empty and without spaces")
        parts.append(f"KEYS\x01{R.KEY_SEPARATOR.join(msg.keys)}\x02")
    if msg.delay_level:
        if not isinstance(msg.delay_level, int) or msg.delay_level < 0:
            raise ValidationError(f"delay_level must be a non-negative int, got {msg.delay_level!r}")
        parts.append(f"DELAY\x01{msg.delay_level}\x02")
    if uniq_key:
        parts.append(f"{R.PROP_UNIQ_KEY}\x01{uniq_key}\x02")
    data = _utf8("".join(parts))
    if len(data) > max_bytes:
        raise ValidationError(f"properties are {len(data)} bytes encoded; at most {max_bytes} allowed")
    return data


def check_body(body, max_bytes: int) -> bytes:
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise ValidationError(f"body must be bytes, got {type(body).__name__}")
    n = len(body)
    if n == 0:
        raise ValidationError("body is empty")
    if n > max_bytes:
        raise ValidationError(f"body is {n} bytes; at most {max_bytes} allowed")
    return body


def encode_message(msg: Message, topic_b: bytes, queue_id: int, *, max_body_bytes: int,
                   max_props_bytes: int, born_host: bytes, store_host: bytes | None = None,
                   sys_flag: int = 0,
                   uniq_key: str | None = None, born_ts_ms: int | None = None,
                   reconsume_times: int = 0, user_rules: bool = False) -> bytes:
    """One validated record with queue/phys offset and store time left for the appender (the
    embedded store's and tools' path; a producer checks user properties through
    :func:`properties_bytes`).

    ``store_host`` is the broker's host bytes when known (the message id is built from it);
    ``user_rules`` as :func:`properties_bytes`."""
    body = check_body(msg.body, max_body_bytes)
    if msg.flag.__class__ is not int or not -(1 << 31) <= msg.flag < (1 << 31):
        raise ValidationError(f"flag must be a 32-bit int, got {msg.flag!r}")
    props = properties_bytes(msg, uniq_key or R.new_unique_id(), max_props_bytes, user_rules)
    return R.encode_record(topic_b, bytes(body), props, queue_id=queue_id, flag=msg.flag,
                           sys_flag=sys_flag, born_ts_ms=born_ts_ms or int(time.time() * 1000),
                           born_host=born_host, store_host=store_host or born_host, reconsume_times=reconsume_times)


def encode_records(topic_b: bytes, bodies: list[bytes], props: list[bytes], *, queue_id: int, flags: list[int],
                   born_ts_ms: int, born_host: bytes, store_host: bytes) -> tuple[bytes, list[int]]:
    """A batch of validated records of one topic and queue, back to back, and each record's size.

    When every record has the same size (equal bodies and properties lengths, the usual batch) the
    records are assembled as rows of one numpy array — header fields as columns, bodies and
    properties as slices — instead of one ``pack`` per record; otherwise record by record.
    """
    n = len(bodies)
    blen, plen, tlen = len(bodies[0]), len(props[0]), len(topic_b)
    same = all(len(b) == blen for b in bodies) and all(len(p) == plen for p in props)
    if not same or n < 8:
        recs = [R.encode_record(topic_b, b, p, queue_id=queue_id, flag=f, born_ts_ms=born_ts_ms,
                                born_host=born_host, store_host=store_host)
                for b, p, f in zip(bodies, props, flags)]
        return b"".join(recs), [len(r) for r in recs]
    size = R.record_size(blen, tlen, plen)
    out = np.empty((n, size), np.uint8)
    hdr = np.zeros(n, R.MSG_HEADER_DTYPE)
    hdr["total_size"] = size
    hdr["magic"] = R.MAGIC_CODE
    hdr["body_crc"] = [zlib.crc32(b) & 0x7FFFFFFF for b in bodies]
    hdr["queue_id"] = queue_id
    hdr["flag"] = flags
    hdr["born_ts_ms"] = born_ts_ms
    hdr["born_host"] = born_host
    hdr["store_host"] = store_host
    hdr["body_length"] = blen
    hs = R.MSG_HEADER.size
    out[:, :hs] = hdr.view(np.uint8).reshape(n, hs)
    out[:, hs:hs + blen] = np.frombuffer(b"".join(bodies), np.uint8).reshape(n, blen)
    t = hs + blen
    out[:, t] = tlen
    out[:, t + 1:t + 1 + tlen] = np.frombuffer(topic_b, np.uint8)
    p = t + 1 + tlen
    out[:, p:p + 2] = np.frombuffer(R.PROPS_LEN.pack(plen), np.uint8)
    if plen:
        out[:, p + 2:] = np.frombuffer(b"".join(props), np.uint8).reshape(n, plen)
    return out.tobytes(), [size] * n


# -- a producer's messages as one frame's records (hostmq/store/_encode.c is the fast path) -----------
def py_encode_messages(msgs: Sequence[Message], topic: str, topic_b: bytes, *, queue_id: int, born_ts_ms: int,
                       born_host: bytes, store_host: bytes, max_body_bytes: int, max_props_bytes: int,
                       uid_prefix: str, uid_next: Callable[[], int]) -> tuple[bytes, list[int]]:
    """The records of ``msgs`` (one topic, ``topic_b`` its validated bytes) for ``queue_id``, back to
    back, and each record's size: every message checked first as ``Producer.prepare`` checks it (a
    Message of the topic, no delay, ``check_body``, a 32-bit flag, ``properties_bytes`` with the unique
    id ``f"{uid_prefix}{uid_next():016X}"``), then :func:`encode_records`. Raises ValidationError."""
    if not msgs:
        raise ValidationError("a batch needs at least one message")
    bodies, props, flags = [], [], []
    for m in msgs:
        if not isinstance(m, Message) or m.topic != topic:
            raise ValidationError(f"a batch holds messages of one topic ({topic!r})")
        if m.delay_level:
            raise ValidationError("delay messages cannot be sent in a batch (as in RocketMQ)")
        bodies.append(bytes(check_body(m.body, max_body_bytes)))
        if m.flag.__class__ is not int or not -(1 << 31) <= m.flag < (1 << 31):
            raise ValidationError(f"flag must be a 32-bit int, got {m.flag!r}")
        flags.append(m.flag)
    for m in msgs:          # ids only once every message passed (the native path draws none before)
        props.append(properties_bytes(m, f"{uid_prefix}{uid_next():016X}", max_props_bytes))
    return encode_records(topic_b, bodies, props, queue_id=queue_id, flags=flags, born_ts_ms=born_ts_ms,
                          born_host=born_host, store_host=store_host)


def py_batch_msg_ids(host_hex: str, phys: int, sizes: Sequence[int]) -> str:
    """The comma-separated message ids of records of ``sizes`` stored back to back from ``phys``."""
    starts = phys + np.concatenate(([0], np.cumsum(sizes[:-1]))).astype(np.int64)
    return ",".join(f"{host_hex}{p:016X}" for p in starts.tolist())


_I32 = struct.Struct(">i")


def py_restamp(payload: bytes, sizes: Sequence[int], queue_id: int, store_host: bytes) -> bytes:
    """``payload``'s records (``sizes``, back to back) with QUEUEID and STOREHOST set: a batch encoded
    once, before its queue was chosen, for each queue a send tries."""
    out = bytearray(payload)
    at = 0
    for size in sizes:
        _I32.pack_into(out, at + R.FIELD["queue_id"], queue_id)
        out[at + R.FIELD["store_host"]:at + R.FIELD["store_host"] + 8] = store_host[:8].ljust(8, b"\0")
        at += size
    return bytes(out)


try:
    from . import _encode as NATIVE
except ImportError:         # not built (no compiler at install time): the spec serves
    NATIVE = None
if os.environ.get("HOSTMQ_NATIVE_ENCODE", "1") == "0":
    NATIVE = None
if NATIVE is not None:
    R.layout_check(all(NATIVE.LAYOUT[k] == R.FIELD[k] for k in ("total_size", "magic", "body_crc", "queue_id", "flag",
                                                                "born_ts_ms", "born_host", "store_host",
                                                                "body_length"))
                   and NATIVE.LAYOUT["MSG_HEADER"] == R.MSG_HEADER.size and NATIVE.LAYOUT["MAGIC_CODE"] == R.MAGIC_CODE
                   and NATIVE.LAYOUT["PROPERTY_END"] == ord(R.PROPERTY_SEP)
                   and NATIVE.LAYOUT["NAME_VALUE_SEP"] == ord(R.NAME_VALUE_SEP),
                   "hostmq/store/_encode.c's layout differs from records.py's (rebuild it: pip install -e .)")
    NATIVE._bind(Message)
TAGS_B, UNIQ_B = _TAGS_B, _UNIQ_B = R.PROP_TAGS.encode(), R.PROP_UNIQ_KEY.encode()


def encode_messages(msgs: list[Message], topic: str, topic_b: bytes, *, queue_id: int, born_ts_ms: int,
                    born_host: bytes, store_host: bytes, max_body_bytes: int, max_props_bytes: int,
                    uid_prefix: str, uid_next: Callable[[], int]) -> tuple[bytes, list[int]]:
    """:func:`py_encode_messages`, in C where every message is the common case."""
    if NATIVE is not None:
        out = NATIVE.encode_messages(msgs, topic, topic_b, queue_id, born_ts_ms, born_host, store_host,
                                     max_body_bytes, max_props_bytes, _TAGS_B, _UNIQ_B, uid_prefix, uid_next)
        if out is not None:
            return out
    return py_encode_messages(msgs, topic, topic_b, queue_id=queue_id, born_ts_ms=born_ts_ms, born_host=born_host,
                              store_host=store_host, max_body_bytes=max_body_bytes, max_props_bytes=max_props_bytes,
                              uid_prefix=uid_prefix, uid_next=uid_next)


def restamp(payload: bytes, sizes: list[int], queue_id: int, store_host: bytes) -> bytes:
    """:func:`py_restamp`, in C for the usual arguments."""
    if NATIVE is not None:
        out = NATIVE.restamp(payload, sizes, queue_id, store_host)
        if out is not None:
            return out
    return py_restamp(payload, sizes, queue_id, store_host)


def batch_msg_ids(host_hex: str, phys: int, sizes: list[int]) -> str:
    """:func:`py_batch_msg_ids`, in C for the usual arguments."""
    if NATIVE is not None:
        out = NATIVE.batch_msg_ids(host_hex, phys, sizes)
        if out is not None:
            return out
    return py_batch_msg_ids(host_hex, phys, sizes)
