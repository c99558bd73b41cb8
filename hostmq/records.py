"""Every binary layout of hostmq, declared once, with pure encode/decode functions.

All layouts are big-endian and follow RocketMQ so its documentation applies.

Commitlog record (RocketMQ message format V1)::

    +0  TOTALSIZE i32 | MAGICCODE u32 | BODYCRC u32 | QUEUEID i32 | FLAG i32
    +20 QUEUEOFFSET i64 | PHYSICALOFFSET i64 | SYSFLAG i32 | BORNTIMESTAMP i64 | BORNHOST 8
    +56 STORETIMESTAMP i64 | STOREHOST 8 | RECONSUMETIMES i32 | PREPAREDTRANSACTIONOFFSET i64
    +84 BODYLENGTH i32                                   (= MSG_HEADER, 88 bytes)
    +88 BODY | TOPICLENGTH u8 | TOPIC | PROPERTIESLENGTH u16 | PROPERTIES ("name\\x01value\\x02" …)

A record never spans two files: the rest of a file is a blank record (TOTALSIZE, BLANK_MAGIC_CODE)
of at least ``MIN_BLANK_BYTES``. BODYCRC is ``crc32(body) & 0x7FFFFFFF`` (RocketMQ's ``UtilAll.crc32``);
as in RocketMQ V1 it is the only checksum, so a flipped bit in another header field is only caught
when it breaks the record's structure (size, magic, lengths).

BORNHOST / STOREHOST are ``host_tag (4 bytes) + pid (u32)``; a message id is STOREHOST followed by the
record's physical offset, 16 bytes as 32 upper-case hex digits, so a message is found from its id alone.

Decoders raise :class:`~hostmq.errors.CorruptRecordError` for any malformed input (never IndexError
or struct.error).
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import operator
import os
import re
import socket
import struct
import time
import zlib
from collections import namedtuple
from typing import Mapping

import numpy as np

from .errors import CorruptRecordError, ValidationError

# ---------------------------------------------------------------------------------------------
# Commitlog record
# ---------------------------------------------------------------------------------------------
MAGIC_CODE = 0xDAA320A7          # RocketMQ MESSAGE_MAGIC_CODE (V1), -626843481 as a Java int
BLANK_MAGIC_CODE = 0xCBD43194    # RocketMQ BLANK_MAGIC_CODE, -875286124 as a Java int

MSG_HEADER = struct.Struct(">iIIiiqqiq8sq8siqi")
MSG_HEADER_DTYPE = np.dtype([
    ("total_size", ">i4"), ("magic", ">u4"), ("body_crc", ">u4"), ("queue_id", ">i4"), ("flag", ">i4"),
    ("queue_offset", ">i8"), ("phys_offset", ">i8"), ("sys_flag", ">i4"), ("born_ts_ms", ">i8"),
    ("born_host", "S8"), ("store_ts_ms", ">i8"), ("store_host", "S8"), ("reconsume_times", ">i4"),
    ("prepared_tx_offset", ">i8"), ("body_length", ">i4"),
])
assert MSG_HEADER.size == MSG_HEADER_DTYPE.itemsize == 88
RecordHeader = namedtuple("RecordHeader", MSG_HEADER_DTYPE.names)
# Byte offset of each header field inside a record, taken from the one declaration above.
FIELD = {name: MSG_HEADER_DTYPE.fields[name][1] for name in MSG_HEADER_DTYPE.names}

TOPIC_LEN = struct.Struct(">B")
PROPS_LEN = struct.Struct(">H")
BLANK = struct.Struct(">iI")               # TOTALSIZE, BLANK_MAGIC_CODE
MIN_BLANK_BYTES = BLANK.size               # every file ends with at least this much blank record
SIZE_MAGIC = struct.Struct(">iI")          # the first two fields of any record

MAX_TOPIC_CHARS = 127
MAX_PROPERTIES_BYTES = (1 << 15) - 1       # PROPERTIESLENGTH is a u16 and RocketMQ limits it to < 32 KiB
MAX_BODY_BYTES_DEFAULT = 4 * 1024 * 1024

# SYSFLAG bits (RocketMQ MessageSysFlag)
SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
SYSFLAG_TX_PREPARED = 0x1 << 2
SYSFLAG_TX_COMMIT = 0x2 << 2
SYSFLAG_TX_ROLLBACK = 0x3 << 2
SYSFLAG_TX_MASK = 0x3 << 2

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

_TOPIC_RE = re.compile(r"[%|a-zA-Z0-9_-]+")    # used with fullmatch: "$" would accept a trailing \n
_MSG_ID_RE = re.compile(r"[0-9A-Fa-f]{32}")     # bytes.fromhex alone would skip embedded whitespace


class RecordKind:
    """What :func:`check_record` found at a position."""

    MESSAGE = 0
    BLANK = 1


def record_size(body_bytes: int, topic_bytes: int, props_bytes: int) -> int:
    """Total stored size of a record with the given variable parts."""
    return MSG_HEADER.size + body_bytes + TOPIC_LEN.size + topic_bytes + PROPS_LEN.size + props_bytes


def body_crc(body: bytes) -> int:
    """RocketMQ's ``UtilAll.crc32(body)``: CRC32 with the sign bit cleared."""
    return zlib.crc32(body) & 0x7FFFFFFF


def record_tail(topic_b: bytes, props_b: bytes) -> bytes:
    """The bytes after the body: TOPICLENGTH, TOPIC, PROPERTIESLENGTH, PROPERTIES."""
    # The length fields are a u8 and a u16: say so instead of leaking struct.error.
    if len(topic_b) > 0xFF:
        raise ValidationError(f"topic is {len(topic_b)} bytes; a record holds at most 255")
    if len(props_b) > 0xFFFF:
        raise ValidationError(f"properties are {len(props_b)} bytes; a record holds at most 65535")
    return TOPIC_LEN.pack(len(topic_b)) + topic_b + PROPS_LEN.pack(len(props_b)) + props_b


def encode_record(topic_b: bytes, body: bytes, props_b: bytes, *, queue_id: int = 0, flag: int = 0,
                  sys_flag: int = 0, born_ts_ms: int = 0, born_host: bytes = b"\0" * 8,
                  store_ts_ms: int = 0, store_host: bytes = b"\0" * 8, reconsume_times: int = 0,
                  prepared_tx_offset: int = 0, queue_offset: int = 0, phys_offset: int = 0,
                  crc: int | None = None) -> bytes:
    """One complete record. The writer patches queue/phys offsets and the store time later."""
    blen, tlen, plen = len(body), len(topic_b), len(props_b)
    if tlen > 0xFF or plen > 0xFFFF:
        record_tail(topic_b, props_b)               # raises the ValidationError
    fmt = _record_struct(blen, tlen, plen)
    return fmt.pack(fmt.size, MAGIC_CODE, (zlib.crc32(body) & 0x7FFFFFFF) if crc is None else crc, queue_id,
                    flag, queue_offset, phys_offset, sys_flag, born_ts_ms, born_host, store_ts_ms, store_host,
                    reconsume_times, prepared_tx_offset, blen, body, tlen, topic_b, plen, props_b)


@functools.lru_cache(maxsize=1024)
def _record_struct(blen: int, tlen: int, plen: int) -> struct.Struct:
    """The whole record as one format (header, body, topic, properties): one pack per record."""
    return struct.Struct(f"{MSG_HEADER.format}{blen}sB{tlen}sH{plen}s")


def _fail(pos: int, why: str) -> CorruptRecordError:
    return CorruptRecordError("", pos, why)


def check_record(buf, pos: int, limit: int, verify_crc: bool = True) -> tuple[int, int]:
    """Validate the record at ``pos`` (bytes up to ``limit`` are available).

    Returns ``(kind, total_size)``; raises CorruptRecordError for a torn, truncated or garbage record.
    """
    limit = min(limit, len(buf))    # a limit past the buffer must not turn into struct.error
    if limit - pos < SIZE_MAGIC.size:
        raise _fail(pos, "truncated before size and magic")
    total, magic = SIZE_MAGIC.unpack_from(buf, pos)
    if magic == BLANK_MAGIC_CODE:
        if total < MIN_BLANK_BYTES or total > limit - pos:
            raise _fail(pos, f"blank record of impossible size {total}")
        return RecordKind.BLANK, total
    if magic != MAGIC_CODE:
        raise _fail(pos, f"bad magic 0x{magic:08X}")
    if total < record_size(0, 0, 0) or total > limit - pos:
        raise _fail(pos, f"impossible total size {total} (room {limit - pos})")
    body_len = struct.unpack_from(">i", buf, pos + FIELD["body_length"])[0]
    if body_len < 0 or MSG_HEADER.size + body_len + TOPIC_LEN.size > total:
        raise _fail(pos, f"body length {body_len} does not fit total size {total}")
    tpos = pos + MSG_HEADER.size + body_len
    topic_len = int(buf[tpos])    # int(): a numpy uint8 would wrap when added to an offset
    ppos = tpos + TOPIC_LEN.size + topic_len
    if ppos + PROPS_LEN.size > pos + total:
        raise _fail(pos, "topic length does not fit")
    props_len = PROPS_LEN.unpack_from(buf, ppos)[0]
    if ppos + PROPS_LEN.size + props_len != pos + total:
        raise _fail(pos, "lengths do not add up to the total size")
    if props_len and buf[pos + total - 1] != 2:
        # Every encoder ends PROPERTIES with \x02: a zeroed (torn) record tail fails here even though
        # the body CRC, the only checksum of the V1 format, does not cover the properties.
        raise _fail(pos, "properties do not end with \\x02 (torn tail)")
    if verify_crc:
        stored = struct.unpack_from(">I", buf, pos + FIELD["body_crc"])[0]
        start = pos + MSG_HEADER.size
        if body_crc(buf[start:start + body_len]) != stored:
            raise _fail(pos, "body CRC mismatch")
    return RecordKind.MESSAGE, total


def record_topic(buf, pos: int) -> str:
    """Topic of a (checked) record."""
    body_len = struct.unpack_from(">i", buf, pos + FIELD["body_length"])[0]
    tpos = pos + MSG_HEADER.size + body_len
    n = int(buf[tpos])
    return _topic_str(bytes(buf[tpos + 1:tpos + 1 + n]))


@functools.lru_cache(maxsize=4096)
def _topic_str(b: bytes) -> str:
    return b.decode("utf-8")


def record_properties_bytes(buf, pos: int) -> bytes:
    """PROPERTIES bytes of a (checked) record."""
    body_len = struct.unpack_from(">i", buf, pos + FIELD["body_length"])[0]
    tpos = pos + MSG_HEADER.size + body_len
    ppos = tpos + TOPIC_LEN.size + int(buf[tpos])
    plen = PROPS_LEN.unpack_from(buf, ppos)[0]
    return bytes(buf[ppos + PROPS_LEN.size:ppos + PROPS_LEN.size + plen])


def decode_record(buf, pos: int = 0, limit: int | None = None, verify_crc: bool = True):
    """Fully decode and validate one record: ``(RecordHeader, topic, body, properties)``."""
    limit = len(buf) if limit is None else limit
    kind, total = check_record(buf, pos, limit, verify_crc)
    if kind != RecordKind.MESSAGE:
        raise _fail(pos, "blank record where a message was expected")
    h = RecordHeader._make(MSG_HEADER.unpack_from(buf, pos))
    try:
        topic = record_topic(buf, pos)
    except UnicodeDecodeError as e:
        raise _fail(pos, f"topic is not UTF-8: {e}") from None
    props = decode_properties(record_properties_bytes(buf, pos))
    start = pos + MSG_HEADER.size
    return h, topic, bytes(buf[start:start + h.body_length]), props


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


# ---------------------------------------------------------------------------------------------
# Batches: records encoded back to back, patched in place by the writer with numpy
# ---------------------------------------------------------------------------------------------
# The fields the appender fills in — QUEUEID, QUEUEOFFSET, PHYSICALOFFSET, STORETIMESTAMP — as one
# 28-byte scatter per record (QUEUEID too, so a record always names the queue it was counted in).
_PATCH_COLS = np.concatenate([
    np.arange(FIELD["queue_id"], FIELD["queue_id"] + 4),
    np.arange(FIELD["queue_offset"], FIELD["queue_offset"] + 16),      # queue offset, phys offset
    np.arange(FIELD["store_ts_ms"], FIELD["store_ts_ms"] + 8),
])
_PATCH_DTYPE = np.dtype([("queue_id", ">i4"), ("queue_offset", ">i8"), ("phys_offset", ">i8"),
                         ("store_ts_ms", ">i8")])
assert len(_PATCH_COLS) == _PATCH_DTYPE.itemsize == 28
assert FIELD["phys_offset"] == FIELD["queue_offset"] + 8


def encode_batch(records_: list[bytes]) -> tuple[bytes, np.ndarray]:
    """Concatenate encoded records; returns the blob and each record's start (int64) within it."""
    sizes = np.fromiter((len(r) for r in records_), dtype=np.int64, count=len(records_))
    starts = np.zeros(len(records_), dtype=np.int64)
    if len(records_) > 1:
        np.cumsum(sizes[:-1], out=starts[1:])
    return b"".join(records_), starts


def batch_record_sizes(blob, starts: np.ndarray) -> np.ndarray:
    """TOTALSIZE of each record in a batch blob (vectorised read)."""
    u8 = np.frombuffer(blob, dtype=np.uint8)
    if len(starts) and (starts.max() + 4 > len(u8) or starts.min() < 0):
        raise _fail(int(starts.max()), "batch record start beyond the blob")
    idx = starts[:, None] + np.arange(4)
    return u8[idx].view(">i4").ravel().astype(np.int64)


_HOST_COLS = np.arange(FIELD["store_host"], FIELD["store_host"] + 8)


def patch_batch(u8: np.ndarray, abs_starts: np.ndarray, first_queue_offset, phys_offsets: np.ndarray,
                store_ts_ms: int, queue_id: int | None = None, store_host: bytes | None = None) -> None:
    """Write QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP (and QUEUEID, STOREHOST) of many records.

    ``u8`` is a writable uint8 view of the destination, ``abs_starts`` the records' positions in it;
    queue offsets are ``first_queue_offset + i`` (or an array of them). With ``queue_id`` None the
    records keep the queue id they were encoded with.
    """
    n = len(abs_starts)
    vals = np.empty(n, dtype=_PATCH_DTYPE)
    if isinstance(first_queue_offset, np.ndarray):
        vals["queue_offset"] = first_queue_offset
    else:
        vals["queue_offset"] = _ARANGE[:n] + first_queue_offset if n <= len(_ARANGE) else \
            np.arange(first_queue_offset, first_queue_offset + n)
    vals["phys_offset"] = phys_offsets
    vals["store_ts_ms"] = store_ts_ms
    raw = vals.view(np.uint8).reshape(n, _PATCH_DTYPE.itemsize)
    if queue_id is None:
        u8[abs_starts[:, None] + _PATCH_COLS[4:]] = raw[:, 4:]
    else:
        vals["queue_id"] = queue_id
        u8[abs_starts[:, None] + _PATCH_COLS] = raw
    if store_host is not None:      # the broker's, whatever the producer wrote (message ids use it)
        u8[abs_starts[:, None] + _HOST_COLS] = np.frombuffer(store_host, np.uint8)


_ARANGE = np.arange(4096, dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# Message id, hosts, unique ids
# ---------------------------------------------------------------------------------------------
MSG_ID = struct.Struct(">8sq")     # STOREHOST, PHYSICALOFFSET
assert MSG_ID.size == 16


def encode_msg_id(store_host: bytes, phys_offset: int) -> str:
    return MSG_ID.pack(store_host, phys_offset).hex().upper()


def decode_msg_id(msg_id: str) -> tuple[bytes, int]:
    """``(store_host, phys_offset)`` of a message id; ValidationError if it is not one."""
    if not isinstance(msg_id, str) or len(msg_id) != 2 * MSG_ID.size:
        raise ValidationError(f"message id must be {2 * MSG_ID.size} hex digits, got {msg_id!r}")
    if not _MSG_ID_RE.fullmatch(msg_id):
        raise ValidationError(f"message id is not hex: {msg_id!r}")
    host, phys = MSG_ID.unpack(bytes.fromhex(msg_id))
    if phys < 0:
        raise ValidationError(f"message id has a negative offset: {msg_id!r}")
    return host, phys


@functools.lru_cache(maxsize=1)
def host_tag() -> bytes:
    """4 bytes naming this machine (from /etc/machine-id, else the host name)."""
    try:
        with open("/etc/machine-id", "rb") as f:
            seed = f.read().strip()
    except OSError:
        seed = b""
    seed = seed or socket.gethostname().encode()
    return hashlib.md5(seed).digest()[:4]


def host_bytes(pid: int | None = None) -> bytes:
    """BORNHOST / STOREHOST value: host tag + pid (this process's when ``pid`` is None)."""
    if pid is None:
        return _MY_HOST[0]
    return host_tag() + struct.pack(">I", pid & 0xFFFFFFFF)


_MY_HOST: list = [b""]          # this process's host bytes, set again in a forked child


def _seed_unique_ids() -> None:
    """RocketMQ-style client unique ids: a per-process prefix (host tag + pid) and a counter seeded
    from the clock, 32 hex digits. Re-seeded in a forked child so parent and child never share one;
    call it as ``records.new_unique_id()`` (the module attribute is replaced on fork)."""
    global new_unique_id
    _MY_HOST[0] = host_bytes(os.getpid())
    prefix = _MY_HOST[0].hex().upper()
    counter = itertools.count(int(time.time() * 1000) << 16).__next__
    new_unique_id = lambda: f"{prefix}{counter():016X}"  # noqa: E731 - the hot path wants no frame


new_unique_id = None
_seed_unique_ids()
os.register_at_fork(after_in_child=_seed_unique_ids)


# ---------------------------------------------------------------------------------------------
# Validation and hashing
# ---------------------------------------------------------------------------------------------
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
def tag_hash(tag: str) -> int:
    """Java ``String.hashCode`` of a tag (a signed 32-bit int), as stored in the consume queue."""
    return java_string_hash(tag)


_ASCII_HASH_MAX = 512
# 31**(k-1) … 31**0 modulo 2**32 for the last k characters: hash(s) = Σ s[i]·31**(n-1-i), wrapped once.
_POW31_DESC = [pow(31, _ASCII_HASH_MAX - 1 - i, 1 << 32) for i in range(_ASCII_HASH_MAX)]


def java_string_hash(s: str) -> int:
    """Java ``String.hashCode``: over UTF-16 code units, wrapping at 32 bits, signed."""
    n = len(s)
    if n <= _ASCII_HASH_MAX and s.isascii():
        # ASCII characters are one UTF-16 unit each: one C-level multiply-and-sum instead of a loop.
        h = sum(map(operator.mul, s.encode("ascii"), _POW31_DESC[_ASCII_HASH_MAX - n:])) & 0xFFFFFFFF
        return h - (1 << 32) if h >= (1 << 31) else h
    h = 0
    data = s.encode("utf-16-be", "surrogatepass")    # Java strings may hold lone surrogates
    for (unit,) in struct.iter_unpack(">H", data):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h >= (1 << 31) else h


_POW31 = np.ones(256, dtype=np.uint32)
for _i in range(1, 256):
    _POW31[_i] = np.uint32((int(_POW31[_i - 1]) * 31) & 0xFFFFFFFF)
# 31 is odd, so 31**k is invertible modulo 2**32: lets a right-padded row be hashed in one pass.
_INV_POW31 = np.array([pow(int(p), -1, 1 << 32) for p in _POW31], dtype=np.uint32)


def java_string_hash_many(strings: list[str]) -> np.ndarray:
    """Vectorised :func:`java_string_hash` for many strings (int32 array)."""
    n = len(strings)
    out = np.empty(n, dtype=np.int32)
    if n == 0:
        return out
    arr = np.array(strings, dtype=str)
    width = arr.dtype.itemsize // 4
    if width == 0 or width >= len(_POW31):
        return np.array([java_string_hash(s) for s in strings], dtype=np.int32)
    cp = arr.view(np.uint32).reshape(n, width)
    if (cp > 0xFFFF).any():    # astral characters need surrogate pairs: take the exact path
        return np.array([java_string_hash(s) for s in strings], dtype=np.int32)
    lens = np.fromiter((len(s) for s in strings), dtype=np.intp, count=n)
    with np.errstate(over="ignore"):
        h = (cp * _POW31[width - 1::-1]).sum(axis=1, dtype=np.uint32)
        h = h * _INV_POW31[width - lens]
    return h.view(np.int32)


def decompress_body(body: bytes) -> bytes:
    try:
        return zlib.decompress(body)
    except zlib.error as e:
        raise _fail(0, f"compressed body does not inflate: {e}") from None


# ---------------------------------------------------------------------------------------------
# Consume queue entry
# ---------------------------------------------------------------------------------------------
CQ_ENTRY = np.dtype([("phys_offset", ">i8"), ("size", ">i4"), ("tag_hash", ">i8")])
assert CQ_ENTRY.itemsize == 20
CQ_ENTRY_STRUCT = struct.Struct(">qiq")
assert CQ_ENTRY_STRUCT.size == CQ_ENTRY.itemsize

# ---------------------------------------------------------------------------------------------
# Index file (RocketMQ IndexFile): header | hash slots | linked entries
# ---------------------------------------------------------------------------------------------
INDEX_HEADER = struct.Struct(">qqqqii")   # begin_ts_ms, end_ts_ms, begin_phys, end_phys, slots used, count
IndexHeader = namedtuple("IndexHeader", "begin_ts_ms end_ts_ms begin_phys_offset end_phys_offset "
                                        "hash_slot_count index_count")
assert INDEX_HEADER.size == 40
INDEX_SLOT = np.dtype(">i4")              # number of the newest entry in the slot's chain; 0 = empty
INDEX_ENTRY = np.dtype([("key_hash", ">i4"), ("phys_offset", ">i8"), ("time_diff_s", ">i4"),
                        ("prev_index", ">i4")])
assert INDEX_ENTRY.itemsize == 20
INDEX_ENTRY_STRUCT = struct.Struct(">iqii")


def index_file_bytes(slots: int, entries: int) -> int:
    return INDEX_HEADER.size + slots * INDEX_SLOT.itemsize + entries * INDEX_ENTRY.itemsize


# ---------------------------------------------------------------------------------------------
# Checkpoint (RocketMQ StoreCheckpoint plus the dispatched offsets, with a CRC)
# ---------------------------------------------------------------------------------------------
CHECKPOINT = struct.Struct(">qqqqqqqqI")
Checkpoint = namedtuple("Checkpoint", "physic_msg_ts_ms logics_msg_ts_ms index_msg_ts_ms "
                                      "master_flushed_offset confirm_phys_offset commitlog_flushed_offset "
                                      "cq_flushed_phys_offset index_flushed_phys_offset")
CHECKPOINT_FILE_BYTES = 4096


def encode_checkpoint(cp: Checkpoint) -> bytes:
    body = struct.pack(">qqqqqqqq", *cp)
    return body + struct.pack(">I", zlib.crc32(body))


def decode_checkpoint(data: bytes) -> Checkpoint:
    if len(data) < CHECKPOINT.size:
        raise _fail(0, f"checkpoint is {len(data)} bytes, needs {CHECKPOINT.size}")
    *vals, crc = CHECKPOINT.unpack_from(data, 0)
    if zlib.crc32(data[:CHECKPOINT.size - 4]) != crc:
        raise _fail(0, "checkpoint CRC mismatch")
    return Checkpoint(*vals)


# ---------------------------------------------------------------------------------------------
# Shared-memory layouts (hostmq.shm): segment header, ingress ring header, frame, completion
# ---------------------------------------------------------------------------------------------
# These layouts never leave the host, so unlike the store formats above they use the machine's
# NATIVE byte order: cursors and flags are published with aligned native int64 stores
# (``memoryview.cast("q")``, OS_NOTES 14), and every other field must agree with them.
#
# Segment header — the first 128 bytes of every hostmq shared-memory segment; the payload starts
# at SEGMENT_PAYLOAD_OFFSET (one page, so rings inside are page aligned)::
#
#     +0   magic "HOSTMQSG" (8, stored last)  | +8  layout_version u32   | +12 header_bytes u32 (4096)
#     +16  kind (16, ASCII, NUL padded: "ingress", …)
#     +32  owner_pid i64                      | +40 owner_start_time_s f64 (psutil create_time)
#     +48  boot_id (16, raw UUID of /proc/sys/kernel/random/boot_id)
#     +64  generation u64 (random per creation) | +72 size_bytes u64 (whole segment)
#     +80  created_ms i64 (wall clock)        | +88 reserved (40, zero)
#     +128 … +4096 unused                     | +4096 payload (size given to Segment.create)
SEGMENT_MAGIC = b"HOSTMQSG"
SEGMENT_HEADER = np.dtype([
    ("magic", "S8"), ("layout_version", "u4"), ("header_bytes", "u4"), ("kind", "S16"),
    ("owner_pid", "i8"), ("owner_start_time_s", "f8"), ("boot_id", "S16"), ("generation", "u8"),
    ("size_bytes", "u8"), ("created_ms", "i8"), ("reserved", "S40"),
])
assert SEGMENT_HEADER.itemsize == 128
assert SEGMENT_HEADER.fields["magic"][1] == 0     # published last with one aligned int64 store
SEGMENT_PAYLOAD_OFFSET = 4096
SEGMENT_KIND_BYTES = SEGMENT_HEADER.fields["kind"][0].itemsize

# Ingress ring (one per producer session) — the segment payload is::
#
#     +0    ring header (256, below)
#     +256  completion ring: completion_entries × COMPLETION (writer → producer)
#     +data_offset (page aligned)  data ring: data_bytes of FRAMEs (producer → writer)
#
# Ring header: one 64-byte line per writer so a cursor store never shares a cache line with the
# other side's cursor. Line 0 is written once by the creator before the segment's magic is
# published; line 1 only by the producer; line 2 only by the writer. Cursors are monotonic byte
# (data) or entry (completion) counters; the index into the ring is ``pos & (capacity - 1)``::
#
#     line 0 +0   data_offset u64 | data_bytes u64 | completion_offset u64 | completion_entries u64
#            +32  max_frame_bytes u64 | reserved (24)
#     line 1 +64  data_write_pos i64 | completion_read_pos i64 | producer_waiting i64 | producer_state i64
#            +96  reserved (32)
#     line 2 +128 data_read_pos i64 | completion_write_pos i64 | writer_waiting i64 | writer_state i64
#            +160 appended_data_pos i64 | staged_completion_pos i64 | reserved (16)
#     line 3 +192 reserved (64)
RING_KIND = "ingress"
#
# The writer's journal (line 2, +160/+168) makes a writer restart exactly-once: ``appended_data_pos``
# is the data position up to which frames are in the commitlog, ``staged_completion_pos`` the end of
# the completion entries written for them (published to the producer only up to
# ``completion_write_pos``, e.g. after a SYNC_FLUSH group commit). See hostmq.broker.writer.
RING_LAYOUT_VERSION = 2
RING_HEADER = np.dtype({
    "names": ["data_offset", "data_bytes", "completion_offset", "completion_entries", "max_frame_bytes",
              "data_write_pos", "completion_read_pos", "producer_waiting", "producer_state",
              "data_read_pos", "completion_write_pos", "writer_waiting", "writer_state",
              "appended_data_pos", "staged_completion_pos"],
    "formats": ["u8"] * 5 + ["i8"] * 10,
    "offsets": [0, 8, 16, 24, 32, 64, 72, 80, 88, 128, 136, 144, 152, 160, 168],
    "itemsize": 256,
})
assert RING_HEADER.itemsize == 256
# Index of each ring-header field in the header viewed as int64 words (``cast("q")``).
RING_WORD = {name: RING_HEADER.fields[name][1] // 8 for name in RING_HEADER.names}
assert all(RING_HEADER.fields[n][1] % 8 == 0 for n in RING_HEADER.names)
assert RING_HEADER.fields["data_write_pos"][1] // 64 != RING_HEADER.fields["data_read_pos"][1] // 64
RING_STATE_OPEN = 0
RING_STATE_CLOSED = 1        # producer_state: the producer closed its session cleanly
RING_STATE_DROPPED = 2       # writer_state: the writer found the ring corrupt and stopped reading it

# Frame — what a producer publishes into the data ring, 8-byte aligned, never split at the end::
#
#     +0  frame_bytes u32 (header + payload, exact; the next frame starts at align8(frame_bytes))
#     +4  kind u32 (FRAME_MESSAGE | FRAME_BATCH | FRAME_SKIP)   +8 seq i64 (producer's completion id)
#     +16 record_count u32                                      +20 flags u32 (producer ↔ writer hints)
#     +24 payload: record_count commitlog records back to back (QUEUEOFFSET/PHYSICALOFFSET left 0)
#
# A SKIP frame (record_count 0) pads from its position to the end of the ring; when fewer than
# FRAME_HEADER.size bytes remain before the end, both sides skip them without any header.
FRAME_HEADER = struct.Struct("=IIqII")
FRAME_HEADER_DTYPE = np.dtype([("frame_bytes", "u4"), ("kind", "u4"), ("seq", "i8"),
                               ("record_count", "u4"), ("flags", "u4")])
assert FRAME_HEADER.size == FRAME_HEADER_DTYPE.itemsize == 24
FRAME_ALIGN = 8
FRAME_MESSAGE = 1            # exactly one record
FRAME_BATCH = 2              # one or more records (a RocketMQ batch: one topic and queue)
FRAME_SKIP = 3               # padding to the end of the ring
FRAME_KINDS = (FRAME_MESSAGE, FRAME_BATCH, FRAME_SKIP)
MIN_RECORD_BYTES = record_size(0, 0, 0)     # a frame carries at least this much per record

# Completion — one per MESSAGE/BATCH frame, written by the writer in the producer's ring::
#
#     +0 seq i64 | +8 status i32 | +12 record_count i32 | +16 queue_offset i64 (first record)
#     +24 phys_offset i64 (first record) | +32 store_ts_ms i64
COMPLETION = np.dtype([("seq", "i8"), ("status", "i4"), ("record_count", "i4"), ("queue_offset", "i8"),
                       ("phys_offset", "i8"), ("store_ts_ms", "i8")])
assert COMPLETION.itemsize == 40
# status: >= 0 stored (values follow message.SendStatus order), < 0 refused (nothing stored).
COMPLETION_SEND_OK = 0
COMPLETION_FLUSH_DISK_TIMEOUT = 1
COMPLETION_FLUSH_SLAVE_TIMEOUT = 2
COMPLETION_SLAVE_NOT_AVAILABLE = 3
COMPLETION_BAD_RECORD = -1           # a record failed validation (check_record)
COMPLETION_STORE_FULL = -2           # disk above the refuse-writes ratio
COMPLETION_NOT_AVAILABLE = -3        # the broker cannot accept writes (shutting down, slave, …)
COMPLETION_NO_TOPIC = -4             # the topic does not exist on this broker, or the queue id is too big

# Broker state — one segment per running broker (``/hostmq.<hash12>.state.0``), created by the broker
# process before it starts its children and unlinked when it stops. Positions that other processes
# read are published here with aligned native int64 stores; each 64-byte line has ONE writer::
#
#     line 0 +0   (broker, once, before the magic) flush_disk_type (0 async, 1 sync) | session_slots |
#                 waiter_slots | broker_pid | store_host (8 raw bytes) | commitlog_file_bytes | started_ms |
#                 consume_queue_file_entries
#     line 1 +64  (broker control) broker_state | sessions_version | topics_version | waiters_version |
#                 control_heartbeat_ms
#     line 2 +128 (writer) write_pos | writer_pid | writer_waiting | last_store_ts_ms | writer_heartbeat_ms |
#                 appended_records | flush_request_pos
#     line 3 +192 (writer) intent_valid | intent_slot | intent_generation | intent_phys_start |
#                 intent_data_end | intent_cw_end
#     line 4 +256 (dispatcher) dispatched_pos | dispatcher_pid | dispatcher_waiting | dispatch_seq |
#                 cq_flushed_pos | dispatched_records
#     line 5 +320 (flusher) flushed_pos | flusher_pid | flusher_waiting | flush_count | last_flush_ms |
#                 checkpoint_ms | flush_latency_us
#     line 6 +384 (broker, once, before the magic) index_slots | index_entries
#     +512                      session table: session_slots × STATE_SLOT (broker control)
#     +512 + 64·S               writer attach table: session_slots × i64 generation (writer)
#     +512 + 72·S               waiter table: waiter_slots × STATE_SLOT (broker control)
#
# ``write_pos`` is the end of the commitlog records the writer has finished (never a torn record
# below it); ``dispatched_pos`` the end of what consume queues and index cover; ``flushed_pos`` the end
# of what is on disk. Readers may see an older value, never a torn one (OS_NOTES 14).
BROKER_STATE_KIND = "broker"
BROKER_STATE_VERSION = 1
_STATE_FIELDS = [
    (0, ["flush_disk_type", "session_slots", "waiter_slots", "broker_pid", "store_host",
         "commitlog_file_bytes", "started_ms", "consume_queue_file_entries"]),
    (64, ["broker_state", "sessions_version", "topics_version", "waiters_version", "control_heartbeat_ms"]),
    (128, ["write_pos", "writer_pid", "writer_waiting", "last_store_ts_ms", "writer_heartbeat_ms",
           "appended_records", "flush_request_pos"]),
    (192, ["intent_valid", "intent_slot", "intent_generation", "intent_phys_start", "intent_data_end",
           "intent_cw_end"]),
    (256, ["dispatched_pos", "dispatcher_pid", "dispatcher_waiting", "dispatch_seq", "cq_flushed_pos",
           "dispatched_records"]),
    (320, ["flushed_pos", "flusher_pid", "flusher_waiting", "flush_count", "last_flush_ms", "checkpoint_ms",
           "flush_latency_us"]),
    (384, ["index_slots", "index_entries"]),
]
BROKER_STATE = np.dtype({
    "names": [n for _, names in _STATE_FIELDS for n in names],
    "formats": ["S8" if n == "store_host" else "i8" for _, names in _STATE_FIELDS for n in names],
    "offsets": [base + 8 * i for base, names in _STATE_FIELDS for i in range(len(names))],
    "itemsize": 512,
})
assert BROKER_STATE.itemsize == 512 and all(len(names) <= 8 for _, names in _STATE_FIELDS)
STATE_WORD = {name: BROKER_STATE.fields[name][1] // 8 for name in BROKER_STATE.names}
BROKER_STARTING, BROKER_RUNNING, BROKER_STOPPING = 0, 1, 2
FLUSH_ASYNC, FLUSH_SYNC = 0, 1
DEFAULT_SESSION_SLOTS = 256
DEFAULT_WAITER_SLOTS = 256

# One row of the session and waiter tables: which shared-memory segment a client registered::
#
#     +0 state i64 (SLOT_FREE | SLOT_ACTIVE | SLOT_CLOSING) | +8 generation u64 (the segment's)
#     +16 owner_pid i64 | +24 name (40, ASCII, NUL padded)
STATE_SLOT = np.dtype([("state", "i8"), ("generation", "u8"), ("owner_pid", "i8"), ("name", "S40")])
assert STATE_SLOT.itemsize == 64
SLOT_FREE, SLOT_ACTIVE, SLOT_CLOSING = 0, 1, 2
STATE_SLOT_NAME_BYTES = STATE_SLOT.fields["name"][0].itemsize


def broker_state_bytes(session_slots: int, waiter_slots: int) -> tuple[int, int, int, int]:
    """``(sessions_offset, attach_offset, waiters_offset, total_bytes)`` of a broker state payload."""
    sessions = BROKER_STATE.itemsize
    attach = sessions + session_slots * STATE_SLOT.itemsize
    waiters = attach + session_slots * 8
    return sessions, attach, waiters, waiters + waiter_slots * STATE_SLOT.itemsize


# Waiter — a consumer's wake-up word (``/hostmq.<hash12>.wait.<id>``, owned by the consumer and
# registered with every broker it reads from); the dispatcher posts the semaphore of the same name
# after publishing ``dispatched_pos`` when ``waiting`` is set::
#
#     +0 waiting i64 (consumer) | +8 reserved (56)
WAITER_KIND = "waiter"
WAITER_VERSION = 1
WAITER = np.dtype({"names": ["waiting"], "formats": ["i8"], "offsets": [0], "itemsize": 64})
assert WAITER.itemsize == 64
