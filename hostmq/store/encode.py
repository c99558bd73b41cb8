"""Message → record bytes, shared by the embedded store and the producer (which encodes into its
ring so the writer only copies and patches offsets)."""
from __future__ import annotations

import time
import zlib
from typing import Mapping

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
        data = f"TAGS\x01{tags}\x02{R.PROP_UNIQ_KEY}\x01{uniq_key}\x02".encode("utf-8")
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
    data = "".join(parts).encode("utf-8")
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
