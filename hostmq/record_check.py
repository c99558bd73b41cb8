"""Checking what a producer put in its ingress ring before any of it reaches the commitlog (pure).

Part of the V1 record codec's spec, beside ``hostmq/records.py``: :func:`py_single_record` is the
reference that ``hostmq/_codec.c``'s ``single_record`` mirrors (same results, same exceptions and
messages; tests/test_codec_native.py compares them), and it lives here, on the codec's own layer, so the
ground-floor C codec mirrors a ground-floor module and not the broker that happens to call it (the
writer, ``hostmq/broker/writer.py``).

The writer trusts nothing in a frame: a record that is torn, lies about its lengths, fails its body
CRC, is larger than the broker allows, carries properties no decoder accepts or two decoders read apart
(``records.check_properties``: UTF-8, ``name\x01value\x02`` pairs, no empty value, no name twice,
well-formed system properties), or names another topic or queue
than the rest of its batch is refused (the whole frame, nothing stored) — a bad record in the
commitlog would make crash recovery cut the log there and lose everything after it, and one with bad
properties would stall every filtered consumer of its queue. The payload given here is the writer's
private copy of the ring bytes (``IngressRing.frames``): what was checked is what gets appended.

:func:`frame_records` is the writer's hot path for batches: record starts are found with one
vectorised check when the records have equal sizes (the usual batch), header fields of all records
are gathered at once with numpy (``records.MSG_HEADER_DTYPE``, by field name), and only the body CRC
costs one C call per record.
"""
from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

import numpy as np

from . import records as R
from .errors import ValidationError

_HDR = R.MSG_HEADER.size
_HDR_COLS = np.arange(_HDR, dtype=np.int64)
_MIN = R.MIN_RECORD_BYTES
_SIZE = struct.Struct(">i")   # TOTALSIZE, the first field (FIELD["total_size"] == 0)
_MAGIC_BE = np.uint32(R.MAGIC_CODE)
_TLEN = R.TOPIC_LEN.size      # TOPICLENGTH, u8
_PLEN = R.PROPS_LEN.size      # PROPERTIESLENGTH, u16 (big-endian)


class FrameRecords(NamedTuple):
    """The records of one valid frame: one topic and queue, starts and sizes within the payload."""

    topic_b: bytes
    queue_id: int
    starts: np.ndarray      # int64, record starts within the payload
    sizes: np.ndarray       # int64, TOTALSIZE of each record


def record_starts(payload, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Starts and sizes of ``count`` records laid back to back over the whole ``payload``.

    ValidationError unless the sizes chain exactly to the payload's end.
    """
    n = len(payload)
    if n < _SIZE.size:
        raise ValidationError(f"frame payload of {n} bytes holds no record")
    first = _SIZE.unpack_from(payload, 0)[0]
    if first >= _MIN and first * count == n:
        # Equal-size records (the usual batch): guess, then verify every size in one gather.
        starts = np.arange(count, dtype=np.int64) * first
        u8 = np.frombuffer(payload, np.uint8)
        sizes = u8[starts[:, None] + np.arange(4)].view(">i4").ravel().astype(np.int64)
        if (sizes == first).all():
            return starts, sizes
    starts = np.empty(count, np.int64)
    sizes = np.empty(count, np.int64)
    pos = 0
    for i in range(count):
        if n - pos < _MIN:
            raise ValidationError(f"record {i} of {count} starts at byte {pos} of a {n}-byte frame")
        total = _SIZE.unpack_from(payload, pos)[0]
        if total < _MIN or total > n - pos:
            raise ValidationError(f"record {i} claims {total} bytes with {n - pos} left in the frame")
        starts[i], sizes[i] = pos, total
        pos += total
    if pos != n:
        raise ValidationError(f"{count} records end at byte {pos} of a {n}-byte frame")
    return starts, sizes


def frame_records(payload, count: int, max_body_bytes: int, max_props_bytes: int) -> FrameRecords:
    """Validate every record of a frame; the topic, queue and record positions, or ValidationError.

    The topic name itself is left to the writer's topic table (see :func:`single_record`)."""
    starts, sizes = record_starts(payload, count)
    u8 = np.frombuffer(payload, np.uint8)
    hdr = np.ascontiguousarray(u8[starts[:, None] + _HDR_COLS]).view(R.MSG_HEADER_DTYPE).ravel()
    if (hdr["magic"] != _MAGIC_BE).any():
        raise ValidationError(f"record {_first(hdr['magic'] != _MAGIC_BE)} has a bad magic code")
    blen = hdr["body_length"].astype(np.int64)
    if ((blen <= 0) | (blen > max_body_bytes) | (_HDR + blen + _TLEN > sizes)).any():
        bad = _first((blen <= 0) | (blen > max_body_bytes) | (_HDR + blen + _TLEN > sizes))
        raise ValidationError(f"record {bad}: body of {int(blen[bad])} bytes is empty, over "
                              f"{max_body_bytes} bytes, or does not fit its record")
    tpos = starts + _HDR + blen
    tlen = u8[tpos].astype(np.int64)
    ppos = tpos + _TLEN + tlen
    if ((tlen == 0) | (ppos + _PLEN > starts + sizes)).any():
        raise ValidationError(f"record {_first((tlen == 0) | (ppos + _PLEN > starts + sizes))}: bad topic length")
    plen = (u8[ppos].astype(np.int64) << 8) | u8[ppos + 1]
    if (ppos + _PLEN + plen != starts + sizes).any():
        raise ValidationError(f"record {_first(ppos + _PLEN + plen != starts + sizes)}: lengths do not add up")
    if (plen > max_props_bytes).any():
        raise ValidationError(f"record {_first(plen > max_props_bytes)}: properties over {max_props_bytes} bytes")
    bad = R.check_properties_many(u8, ppos + _PLEN, plen)
    if bad >= 0:
        p0 = int(ppos[bad]) + _PLEN
        try:
            R.check_properties(bytes(payload[p0:p0 + int(plen[bad])]))
        except ValidationError as e:
            raise ValidationError(f"record {bad}: {e}") from None
    t0, tl0 = int(tpos[0]) + _TLEN, int(tlen[0])
    topic_b = bytes(payload[t0:t0 + tl0])
    qid = hdr["queue_id"]
    if count > 1:
        same = (tlen == tl0) & (qid == qid[0])
        if same.all():
            same &= (u8[(tpos + _TLEN)[:, None] + np.arange(tl0)] == u8[t0:t0 + tl0]).all(axis=1)
        if not same.all():
            raise ValidationError(f"record {_first(~same)} of a batch names another topic or queue")
    if int(qid[0]) < 0:
        raise ValidationError(f"negative queue id {int(qid[0])}")
    crc = hdr["body_crc"]
    starts_l, blen_l = (starts + _HDR).tolist(), blen.tolist()
    for i, (s, b, c) in enumerate(zip(starts_l, blen_l, crc.tolist())):
        if zlib.crc32(payload[s:s + b]) & 0x7FFFFFFF != c:
            raise ValidationError(f"record {i}: body CRC mismatch")
    return FrameRecords(topic_b, int(qid[0]), starts, sizes)


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


_BODY_LEN_AT = R.FIELD["body_length"]
_QID_AT = R.FIELD["queue_id"]
_I32 = struct.Struct(">i")     # BODYLENGTH, QUEUEID


def py_single_record(payload, max_body_bytes: int, max_props_bytes: int) -> tuple[bytes, int, int]:
    """Validate a one-record frame (the scalar fast path): ``(topic bytes, queue id, size)``.

    The reference of :func:`single_record` (``hostmq/_codec.c`` when built)."""
    n = len(payload)
    try:
        kind, total = R.py_check_record(payload, 0, n, verify_crc=True)
    except Exception as e:        # CorruptRecordError, or a struct error on a short buffer
        raise ValidationError(f"record 0: {getattr(e, 'why', e)}") from None
    if kind != R.RecordKind.MESSAGE or total != n:
        raise ValidationError(f"frame of {n} bytes holds a {total}-byte record and more")
    blen = _I32.unpack_from(payload, _BODY_LEN_AT)[0]
    if not 0 < blen <= max_body_bytes:
        raise ValidationError(f"record 0: body of {blen} bytes is empty or over {max_body_bytes} bytes")
    tpos = _HDR + blen
    tlen = int(payload[tpos])     # int(): a numpy uint8 would wrap when added to an offset
    ppos = tpos + _TLEN + tlen + _PLEN
    plen = R.PROPS_LEN.unpack_from(payload, ppos - _PLEN)[0]
    if plen > max_props_bytes:
        raise ValidationError(f"record 0: properties over {max_props_bytes} bytes")
    try:
        R.check_properties(bytes(payload[ppos:ppos + plen]))    # bytes(): a numpy slice has no truth value
    except ValidationError as e:
        raise ValidationError(f"record 0: {e}") from None
    # The topic is not checked here: the writer looks it up in its topic table, which holds only
    # valid names, and refuses the frame if it is not there.
    topic_b = bytes(payload[tpos + _TLEN:tpos + _TLEN + tlen])
    qid = _I32.unpack_from(payload, _QID_AT)[0]
    if qid < 0:
        raise ValidationError(f"negative queue id {qid}")
    return topic_b, qid, n


if R.NATIVE:
    # What the C path hands back (odd arguments): this module's reference, in the codec's state.
    R.NATIVE_CODEC._bind(single_record=py_single_record)
    single_record = R.NATIVE_CODEC.single_record
else:
    single_record = py_single_record
