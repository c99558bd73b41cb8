"""Every binary layout of hostmq, declared once, with pure encode/decode functions.

The store layouts are big-endian and follow RocketMQ so its documentation applies; the
shared-memory layouts (native byte order, never on disk) are in ``hostmq/shm_layouts.py`` and the
topic / property names and the PROPERTIES codec in ``hostmq/record_fields.py``, both re-exported
here, so every layout is ``records.NAME``.

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

The record codec — ``encode_record``, ``check_record``, ``check_stored_record``, ``record_fields``,
``java_string_hash``, ``cq_entries`` / ``cq_entry`` — is C (``hostmq/_codec.c``, built by pip) when it
was built (``NATIVE``); the ``py_``-prefixed functions here are its reference, which it mirrors
exactly (same results, same exceptions and messages) and which serve when it was not built.
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
from typing import Callable

import numpy as np

from .errors import CorruptRecordError, ValidationError
# Topic and group names, property names and the PROPERTIES codec (kept apart only for size).
from .record_fields import *  # noqa: F401,F403
from .record_fields import MAX_TOPIC_CHARS, decode_properties  # used below

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
def layout_check(ok: bool, what: str) -> None:
    """A layout fact a module relies on, checked at its import: ImportError if it does not hold.
    Not an ``assert``, which ``python -O`` drops: a module that disagrees with these declarations
    would write records every reader rejects, or read fields where they are not."""
    if not ok:
        raise ImportError(f"hostmq: layout check failed: {what}")


_layout_check = layout_check


_layout_check(MSG_HEADER.size == MSG_HEADER_DTYPE.itemsize == 88, "MSG_HEADER is 88 bytes in both declarations")
RecordHeader = namedtuple("RecordHeader", MSG_HEADER_DTYPE.names)
# Byte offset of each header field inside a record, taken from the one declaration above.
FIELD = {name: MSG_HEADER_DTYPE.fields[name][1] for name in MSG_HEADER_DTYPE.names}
# Position of each header field in a ``MSG_HEADER.unpack`` tuple (and so in RecordHeader and
# RecordFields): hot paths that unpack the header once read ``h[HEADER_INDEX["queue_id"]]`` through a
# constant taken at import, never a bare ``h[3]``.
HEADER_INDEX = {name: i for i, name in enumerate(MSG_HEADER_DTYPE.names)}
_HEADER_CODES = re.findall(r"\d*[a-zA-Z]", MSG_HEADER.format.lstrip("<>!=@"))
_layout_check(len(_HEADER_CODES) == len(FIELD) and all(
    struct.calcsize(">" + "".join(_HEADER_CODES[:i])) == FIELD[name] for name, i in HEADER_INDEX.items()),
    "MSG_HEADER's struct format puts every field where MSG_HEADER_DTYPE does")

TOPIC_LEN = struct.Struct(">B")
PROPS_LEN = struct.Struct(">H")
BLANK = struct.Struct(">iI")               # TOTALSIZE, BLANK_MAGIC_CODE
MIN_BLANK_BYTES = BLANK.size               # every file ends with at least this much blank record
SIZE_MAGIC = struct.Struct(">iI")          # the first two fields of any record

MAX_PROPERTIES_BYTES = (1 << 15) - 1       # PROPERTIESLENGTH is a u16 and RocketMQ limits it to < 32 KiB
MAX_BODY_BYTES_DEFAULT = 4 * 1024 * 1024

# SYSFLAG bits (RocketMQ MessageSysFlag)
SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
SYSFLAG_TX_PREPARED = 0x1 << 2
SYSFLAG_TX_COMMIT = 0x2 << 2
SYSFLAG_TX_ROLLBACK = 0x3 << 2
SYSFLAG_TX_MASK = 0x3 << 2

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


def py_encode_record(topic_b: bytes, body: bytes, props_b: bytes, *, queue_id: int = 0, flag: int = 0,
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


def py_check_record(buf, pos: int, limit: int, verify_crc: bool = True) -> tuple[int, int]:
    """Validate the record at ``pos`` (bytes up to ``limit`` are available).

    Returns ``(kind, total_size)``; raises CorruptRecordError for a torn, truncated or garbage record.
    """
    limit = min(limit, len(buf))    # a limit past the buffer must not turn into struct.error
    if pos < 0:                     # struct and indexing would count it from the buffer's end
        raise _fail(pos, f"negative position {pos}")
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


# What record_fields returns: the header fields, then where the variable parts are.
RecordFields = namedtuple("RecordFields", (*MSG_HEADER_DTYPE.names, "body_start", "body_len", "topic_b",
                                           "props_start", "props_len"))


def py_record_fields(buf, pos: int) -> tuple:
    """Every field of the record at ``pos`` in one call, as a plain tuple laid out as
    :data:`RecordFields` (``RecordFields._make`` names them). For a record :func:`check_record` passed;
    on anything else it still reads nothing outside ``buf`` (CorruptRecordError instead)."""
    n = len(buf)
    if pos < 0 or n - pos < MSG_HEADER.size:
        raise _fail(pos, "record header lies outside the buffer")
    h = MSG_HEADER.unpack_from(buf, pos)
    body_len = h[-1]
    body_start = pos + MSG_HEADER.size
    tpos = body_start + body_len
    if body_len < 0 or tpos + TOPIC_LEN.size > n:
        raise _fail(pos, "body lies outside the buffer")
    ppos = tpos + TOPIC_LEN.size + int(buf[tpos])
    if ppos + PROPS_LEN.size > n:
        raise _fail(pos, "topic lies outside the buffer")
    props_len = PROPS_LEN.unpack_from(buf, ppos)[0]
    if ppos + PROPS_LEN.size + props_len > n:
        raise _fail(pos, "properties lie outside the buffer")
    return (*h, body_start, body_len, bytes(buf[tpos + TOPIC_LEN.size:ppos]), ppos + PROPS_LEN.size, props_len)


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
_layout_check(len(_PATCH_COLS) == _PATCH_DTYPE.itemsize == 28, "len(_PATCH_COLS) == _PATCH_DTYPE.itemsize == 28")
_layout_check(FIELD["phys_offset"] == FIELD["queue_offset"] + 8, "phys_offset follows queue_offset")


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
_layout_check(MSG_ID.size == 16, "MSG_ID.size == 16")


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
    _UID_SOURCE[0] = (prefix, counter)
    new_unique_id = lambda: f"{prefix}{counter():016X}"  # noqa: E731 - the hot path wants no frame


def unique_id_source() -> tuple[str, Callable[[], int]]:
    """``(prefix, counter)`` of :func:`new_unique_id` (its ids are ``f"{prefix}{counter():016X}"``), for
    encoders that draw many ids at once (``store.encode.encode_messages``); re-seeded in a forked child."""
    return _UID_SOURCE[0]


new_unique_id = None
_UID_SOURCE: list = [None]
_seed_unique_ids()
os.register_at_fork(after_in_child=_seed_unique_ids)


# ---------------------------------------------------------------------------------------------
# Hashing
# ---------------------------------------------------------------------------------------------
def tag_hash(tag: str) -> int:
    """Java ``String.hashCode`` of a tag (a signed 32-bit int), as stored in the consume queue."""
    return java_string_hash(tag)


_ASCII_HASH_MAX = 512
# 31**(k-1) … 31**0 modulo 2**32 for the last k characters: hash(s) = Σ s[i]·31**(n-1-i), wrapped once.
_POW31_DESC = [pow(31, _ASCII_HASH_MAX - 1 - i, 1 << 32) for i in range(_ASCII_HASH_MAX)]


def py_java_string_hash(s: str) -> int:
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
_layout_check(CQ_ENTRY.itemsize == 20, "CQ_ENTRY.itemsize == 20")
CQ_ENTRY_STRUCT = struct.Struct(">qiq")
_layout_check(CQ_ENTRY_STRUCT.size == CQ_ENTRY.itemsize, "CQ_ENTRY's struct and dtype agree")


def py_cq_entries(phys_offsets, sizes, tag_codes) -> bytes:
    """Consume-queue entries (:data:`CQ_ENTRY`) for equally long sequences of integers; ValidationError
    if their lengths differ or a value does not fit its field."""
    n = len(phys_offsets)
    if len(sizes) != n or len(tag_codes) != n:
        raise ValidationError(f"consume-queue entries need as many sizes and tag codes as offsets, got "
                              f"{n}, {len(sizes)} and {len(tag_codes)}")
    pack = CQ_ENTRY_STRUCT.pack
    parts = []
    for i, entry in enumerate(zip(phys_offsets, sizes, tag_codes)):
        try:
            parts.append(pack(*entry))
        except (struct.error, OverflowError) as e:     # OverflowError: a numpy uint64 past int64
            raise ValidationError(f"consume-queue entry {i} does not fit (i64, i32, i64): {e}") from None
    return b"".join(parts)


def py_cq_entry(phys_offset: int, size: int, tag_code: int) -> bytes:
    """One consume-queue entry: :func:`py_cq_entries` of one."""
    return py_cq_entries((phys_offset,), (size,), (tag_code,))

# ---------------------------------------------------------------------------------------------
# Index file (RocketMQ IndexFile): header | hash slots | linked entries
# ---------------------------------------------------------------------------------------------
INDEX_HEADER = struct.Struct(">qqqqii")   # begin_ts_ms, end_ts_ms, begin_phys, end_phys, slots used, count
IndexHeader = namedtuple("IndexHeader", "begin_ts_ms end_ts_ms begin_phys_offset end_phys_offset "
                                        "hash_slot_count index_count")
_layout_check(INDEX_HEADER.size == 40, "INDEX_HEADER.size == 40")
INDEX_SLOT = np.dtype(">i4")              # number of the newest entry in the slot's chain; 0 = empty
INDEX_ENTRY = np.dtype([("key_hash", ">i4"), ("phys_offset", ">i8"), ("time_diff_s", ">i4"),
                        ("prev_index", ">i4")])
_layout_check(INDEX_ENTRY.itemsize == 20, "INDEX_ENTRY.itemsize == 20")
INDEX_ENTRY_STRUCT = struct.Struct(">iqii")


def index_file_bytes(slots: int, entries: int) -> int:
    return INDEX_HEADER.size + slots * INDEX_SLOT.itemsize + entries * INDEX_ENTRY.itemsize


# ---------------------------------------------------------------------------------------------
# Replica mark: ``store/replica.pos`` of a slave (broker/replica_mark.py; the replica is its only
# writer). Native int64 words in a mapped file, stored without fsync (a killed process leaves them in
# the page cache; after a host crash they may be older — only hints, checked against the log):
#   master_end_pos  the master's commitlog end this slave last heard of (what a promotion compares)
#   last_phys, last_size, last_crc  the last record the replica appended (its CRC32 over the whole
#                   record): where the handshake's walk to the log's last record may start
# ---------------------------------------------------------------------------------------------
# replica.pos (broker/replica_mark.py): version 0 had the first four words only (the rest read 0)
REPLICA_MARK = np.dtype([("master_end_pos", "i8"), ("last_phys", "i8"), ("last_size", "i8"), ("last_crc", "i8"),
                         ("version", "i8"), ("seen_epoch", "i8"), ("sync_acked", "i8")])
REPLICA_MARK_VERSION = 1
_layout_check(REPLICA_MARK.itemsize == 56, "REPLICA_MARK.itemsize == 56")
REPLICA_MARK_FILE = "replica.pos"
REPLICA_MARK_FILE_BYTES = 4096


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
# Stored records: what every reader of the commitlog re-checks (issue 15)
# ---------------------------------------------------------------------------------------------
# The appender (hostmq/store/commitlog.py) writes a record's TOTALSIZE and MAGICCODE last, so a record
# whose other fields are not all written never looks valid. Readers still never trust what they read
# back: a stored record must also say where it is (PHYSICALOFFSET is its own position) and name a
# queue id and queue offset that can exist. Recovery ends the valid log at the first record that fails
# (``check_stored_record``); the dispatcher stops there. A topic read back is a name only if
# ``validate_topic`` would accept it (``stored_topic``): the consume-queue directory is built from it.
_STORED_IDS = struct.Struct(">i4xqq")       # QUEUEID, (FLAG), QUEUEOFFSET, PHYSICALOFFSET
_layout_check(FIELD["queue_offset"] == FIELD["queue_id"] + 8 and FIELD["phys_offset"] == FIELD["queue_id"] + 16,
              "queue_id, queue_offset, phys_offset are adjacent")
_TOPIC_BYTES_RE = re.compile(f"[%|a-zA-Z0-9_-]{{1,{MAX_TOPIC_CHARS}}}".encode())   # _TOPIC_RE's rules


def py_check_stored_record(buf, pos: int, limit: int, phys_offset: int, verify_crc: bool = True
                           ) -> tuple[int, int]:
    """:func:`check_record` for a record read back from the commitlog at ``phys_offset``: also
    PHYSICALOFFSET must be ``phys_offset`` and QUEUEID / QUEUEOFFSET not negative.

    A record an appender was killed writing (fields copied, not yet patched) fails here.
    """
    kind, total = py_check_record(buf, pos, limit, verify_crc)
    if kind == RecordKind.MESSAGE:
        queue_id, queue_offset, stored_phys = _STORED_IDS.unpack_from(buf, pos + FIELD["queue_id"])
        if stored_phys != phys_offset:
            raise _fail(pos, f"PHYSICALOFFSET {stored_phys} is not the record's position {phys_offset}")
        if queue_id < 0 or queue_offset < 0:
            raise _fail(pos, f"impossible queue id {queue_id} or queue offset {queue_offset}")
    return kind, total


@functools.lru_cache(maxsize=4096)
def stored_topic(topic_b: bytes) -> str | None:
    """The topic TOPIC bytes read back from the store name, or None if :func:`validate_topic` would
    refuse it (a name read back is never used as a path unless it passes)."""
    return topic_b.decode("ascii") if _TOPIC_BYTES_RE.fullmatch(topic_b) else None


MIN_RECORD_BYTES = record_size(0, 0, 0)     # a frame carries at least this much per record

# The shared-memory layouts live in hostmq/shm_layouts.py (kept apart only for size); they are
# re-exported here so every layout is reached the same way, as ``records.NAME``.
from .shm_layouts import *  # noqa: E402,F401,F403


# ---------------------------------------------------------------------------------------------
# The native codec: the public names are hostmq/_codec.c's functions when it was built, else the
# py_ references above (which tests/test_codec_native.py compares them with, byte for byte)
# ---------------------------------------------------------------------------------------------
try:
    from . import _codec as NATIVE_CODEC
except ImportError:         # not built (no compiler at install time): the references serve
    NATIVE_CODEC = None
NATIVE = NATIVE_CODEC is not None
NATIVE_LAYOUT = {          # what hostmq/_codec.c must agree on (its LAYOUT), checked at import
    "MSG_HEADER": MSG_HEADER.size, "MAGIC_CODE": MAGIC_CODE, "BLANK_MAGIC_CODE": BLANK_MAGIC_CODE,
    "MIN_RECORD_BYTES": MIN_RECORD_BYTES, "MIN_BLANK_BYTES": MIN_BLANK_BYTES, "CQ_ENTRY": CQ_ENTRY.itemsize,
    "HOST_BYTES": MSG_HEADER_DTYPE["born_host"].itemsize, "TOPIC_LEN_BYTES": TOPIC_LEN.size,
    "PROPS_LEN_BYTES": PROPS_LEN.size, "PROPERTY_END": ord(PROPERTY_SEP), "NAME_VALUE_SEP": ord(NAME_VALUE_SEP),
    "FIELD": FIELD, "WIDTH": {name: MSG_HEADER_DTYPE[name].itemsize for name in MSG_HEADER_DTYPE.names},
    "CQ_FIELD": {name: CQ_ENTRY.fields[name][1] for name in CQ_ENTRY.names}}
CODEC_LAYOUT_HEADER = "hostmq/include/record_layout.h"


def codec_layout_header(layout: dict | None = None) -> str:
    """The text of :data:`CODEC_LAYOUT_HEADER`: :data:`NATIVE_LAYOUT` as C constants, so the C codec
    never declares the layout a second time by hand. ``tools/gen_layout.py`` writes it (the file is
    committed: pip builds the codec without running Python first); tests/test_codec_layout.py fails
    when the committed file is not what this returns, i.e. when a declaration here changed and the
    header was not regenerated. Its X-macros let the codec build ``LAYOUT`` from the same constants,
    so a stale build is refused at import too. ``layout`` (NATIVE_LAYOUT's shape) is for tests."""
    lay = NATIVE_LAYOUT if layout is None else layout
    names = list(lay["FIELD"])
    cq_names = list(lay["CQ_FIELD"])
    lines = [
        f"/* {CODEC_LAYOUT_HEADER}: GENERATED by tools/gen_layout.py from hostmq/records.py (NATIVE_LAYOUT).",
        " * Do not edit: change the declarations in records.py and run tools/gen_layout.py;",
        " * tests/test_codec_layout.py fails while this file and records.py disagree. */",
        "#ifndef HOSTMQ_RECORD_LAYOUT_H",
        "#define HOSTMQ_RECORD_LAYOUT_H",
        "",
        "/* Commitlog record (V1) header: byte offset (OFF_) and width (W_) of each field. */",
        "enum {",
        *(f"    OFF_{n.upper()} = {lay['FIELD'][n]}, W_{n.upper()} = {lay['WIDTH'][n]}," for n in names),
        "};",
        "",
        "/* Sizes. */",
        "enum {",
        f"    HDR_BYTES = {lay['MSG_HEADER']}, HOST_BYTES = {lay['HOST_BYTES']},",
        f"    TOPIC_LEN_BYTES = {lay['TOPIC_LEN_BYTES']}, PROPS_LEN_BYTES = {lay['PROPS_LEN_BYTES']},",
        f"    MIN_RECORD_BYTES = {lay['MIN_RECORD_BYTES']}, MIN_BLANK_BYTES = {lay['MIN_BLANK_BYTES']},",
        f"    CQ_ENTRY_BYTES = {lay['CQ_ENTRY']},",
        "};",
        "",
        "/* Consume-queue entry: byte offset of each field. */",
        "enum {",
        *(f"    CQ_OFF_{n.upper()} = {lay['CQ_FIELD'][n]}," for n in cq_names),
        "};",
        "",
        f"#define MAGIC_CODE 0x{lay['MAGIC_CODE']:08X}u",
        f"#define BLANK_MAGIC_CODE 0x{lay['BLANK_MAGIC_CODE']:08X}u",
        f"#define PROPERTY_END 0x{lay['PROPERTY_END']:02X}",
        f"#define NAME_VALUE_SEP 0x{lay['NAME_VALUE_SEP']:02X}",
        "",
        "/* X(name, offset, width) for each header field, X(name, offset) for each entry field: the",
        " * codec builds its LAYOUT (compared with records.NATIVE_LAYOUT at import) from these. */",
        "#define HOSTMQ_RECORD_FIELDS(X) \\",
        *(f"    X(\"{n}\", OFF_{n.upper()}, W_{n.upper()})" + (" \\" if i < len(names) - 1 else "")
          for i, n in enumerate(names)),
        "#define HOSTMQ_CQ_FIELDS(X) \\",
        *(f"    X(\"{n}\", CQ_OFF_{n.upper()})" + (" \\" if i < len(cq_names) - 1 else "")
          for i, n in enumerate(cq_names)),
        "",
        "#endif",
        "",
    ]
    return "\n".join(lines)



# The writer's native step (hostmq/ingress/_step.c) reads and writes the ring header, the completion
# entries, the frame headers and the broker state words: their layout, generated into
# STEP_LAYOUT_HEADER by tools/gen_layout.py like the codec's (tests/ingress/test_native_step.py fails
# while the committed file is stale; the module compares its LAYOUT with this at import).
STEP_LAYOUT = {
    "RING_WORD": {n: RING_WORD[n] for n in ("data_write_pos", "completion_read_pos", "producer_waiting",
                                            "data_read_pos", "completion_write_pos", "appended_data_pos",
                                            "staged_completion_pos", "writer_waiting", "writer_state")},
    "RING_STATE": {"DROPPED": RING_STATE_DROPPED},
    "RING_HEADER_BYTES": RING_HEADER.itemsize,
    "STATE_WORD": {n: STATE_WORD[n] for n in ("write_pos", "last_store_ts_ms", "appended_records", "intent_valid",
                                              "intent_slot", "intent_generation", "intent_phys_start",
                                              "intent_data_end", "intent_cw_end", "committed_pos",
                                              # the native loop's (serve_loop): its sleep and what ends it
                                              "writer_waiting", "dispatcher_waiting", "dispatch_wake",
                                              "sessions_version", "topics_version", "flush_error",
                                              "fenced_epoch", "ha_slaves", "confirmed_pos",
                                              # measurement stamps of follow_up's queue wake-ups
                                              "step_started_ns", "step_woke_ns", "step_cpu")},
    "FRAME": {n: FRAME_HEADER_DTYPE.fields[n][1] for n in FRAME_HEADER_DTYPE.names},
    "FRAME_HEADER_BYTES": FRAME_HEADER.size,
    "FRAME_KIND": {"MESSAGE": FRAME_MESSAGE, "BATCH": FRAME_BATCH, "SKIP": FRAME_SKIP},
    "COMPLETION": {n: COMPLETION.fields[n][1] for n in COMPLETION.names},
    "COMPLETION_BYTES": COMPLETION.itemsize,
    "COMPLETION_STATUS": {"SEND_OK": COMPLETION_SEND_OK, "NO_TOPIC": COMPLETION_NO_TOPIC},
    "QUEUE_WAKE_WORDS": QUEUE_WAKE_WORDS,
}
STEP_LAYOUT_HEADER = "hostmq/include/step_layout.h"


def step_layout_flat(layout: dict | None = None) -> dict[str, int]:
    """:data:`STEP_LAYOUT` as ``{"GROUP.name": value}`` (``"GROUP"`` for a plain constant): what
    ``hostmq.ingress._step.LAYOUT`` holds when it was built from the current header."""
    out: dict[str, int] = {}
    for group, v in (STEP_LAYOUT if layout is None else layout).items():
        if isinstance(v, dict):
            out.update({f"{group}.{n}": int(x) for n, x in v.items()})
        else:
            out[group] = int(v)
    return out


def step_layout_header(layout: dict | None = None) -> str:
    """The text of :data:`STEP_LAYOUT_HEADER`: :data:`STEP_LAYOUT` as C constants (see
    :func:`codec_layout_header`). ``layout`` (STEP_LAYOUT's shape) is for tests."""
    lay = STEP_LAYOUT if layout is None else layout
    flat = step_layout_flat(lay)

    def block(prefix: str, d: dict) -> list[str]:
        return ["enum {", *(f"    {prefix}{n.upper()} = {v}," for n, v in d.items()), "};", ""]

    lines = [
        f"/* {STEP_LAYOUT_HEADER}: GENERATED by tools/gen_layout.py from hostmq/records.py (STEP_LAYOUT).",
        " * Do not edit: change the declarations in hostmq/shm_layouts.py and run tools/gen_layout.py;",
        " * tests/ingress/test_native_step.py fails while this file and the declarations disagree. */",
        "#ifndef HOSTMQ_STEP_LAYOUT_H",
        "#define HOSTMQ_STEP_LAYOUT_H",
        "",
        "/* Ring header: index of each word (int64) the step uses. */",
        *block("RW_", lay["RING_WORD"]),
        f"enum {{ RING_HEADER_BYTES = {lay['RING_HEADER_BYTES']} }};",
        "",
        *block("RING_STATE_", lay["RING_STATE"]),
        "/* Broker state: index of each word (int64) the step uses. */",
        *block("SW_", lay["STATE_WORD"]),
        "/* Frame header: byte offset of each field (native byte order). */",
        *block("FR_OFF_", lay["FRAME"]),
        f"enum {{ FRAME_HEADER_BYTES = {lay['FRAME_HEADER_BYTES']} }};",
        "",
        *block("FRAME_", lay["FRAME_KIND"]),
        "/* Completion entry: byte offset of each field (native byte order). */",
        *block("CO_OFF_", lay["COMPLETION"]),
        f"enum {{ COMPLETION_BYTES = {lay['COMPLETION_BYTES']} }};",
        "",
        *block("COMPLETION_", lay["COMPLETION_STATUS"]),
        f"enum {{ QUEUE_WAKE_WORDS = {lay['QUEUE_WAKE_WORDS']} }};",
        "",
        "/* X(\"GROUP.name\", value) for each constant above: the step builds its LAYOUT (compared with",
        " * records.step_layout_flat() at import) from these. */",
        "#define HOSTMQ_STEP_CONSTANTS(X) \\",
        *(f"    X(\"{k}\", {v})" + (" \\" if i < len(flat) - 1 else "") for i, (k, v) in enumerate(flat.items())),
        "",
        "#endif",
        "",
    ]
    return "\n".join(lines)


if NATIVE:
    # Not an ``assert``: ``python -O`` drops those, and a codec that disagrees would write records
    # every reader rejects.
    _layout_check(NATIVE_CODEC.LAYOUT == NATIVE_LAYOUT, "hostmq/_codec.c's layout differs from records.py's "
                  "(rebuild it: pip install -e . or tools/test.sh)")
    from .record_fields import _RESERVED_MARKS, check_properties  # noqa: E402
    # The C functions hand what they do not handle themselves (odd argument types, values out of
    # range) to these references, so both raise the same exceptions.
    NATIVE_CODEC._bind(CorruptRecordError=CorruptRecordError, ValidationError=ValidationError,
                       check_properties=check_properties, reserved_property_marks=_RESERVED_MARKS,
                       encode_record=py_encode_record, check_record=py_check_record,
                       check_stored_record=py_check_stored_record, record_fields=py_record_fields,
                       java_string_hash=py_java_string_hash, cq_entries=py_cq_entries, cq_entry=py_cq_entry)
    encode_record = NATIVE_CODEC.encode_record
    check_record = NATIVE_CODEC.check_record
    check_stored_record = NATIVE_CODEC.check_stored_record
    record_fields = NATIVE_CODEC.record_fields
    java_string_hash = NATIVE_CODEC.java_string_hash
    cq_entries = NATIVE_CODEC.cq_entries
    cq_entry = NATIVE_CODEC.cq_entry
else:
    encode_record = py_encode_record
    check_record = py_check_record
    check_stored_record = py_check_stored_record
    record_fields = py_record_fields
    java_string_hash = py_java_string_hash
    cq_entries = py_cq_entries
    cq_entry = py_cq_entry
