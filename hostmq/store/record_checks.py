"""The dispatcher's re-checks of records read back from the commitlog (issue 15).

The rules are ``records.check_stored_record``'s without the body CRC — TOTALSIZE within bounds,
magic, PHYSICALOFFSET = position, queue id and queue offset not negative, BODYLENGTH, TOPICLENGTH
and PROPERTIESLENGTH adding up to TOTALSIZE, properties ending with ``\\x02`` — applied where the
scans already hold what they need: :func:`sound_at` on a header one scan unpacked anyway,
:func:`sound_rows` vectorised over many records (the columnar scan). :func:`why_broken` asks
``check_stored_record`` itself for the words of an error; ``tests/store/test_dispatch_checks.py``
checks that the three agree on damaged logs.
"""
from __future__ import annotations

import numpy as np

from .. import records as R
from ..errors import CorruptRecordError

_HDR = R.MSG_HEADER
_HDR_BYTES = _HDR.size
_SIZE_MAGIC = R.SIZE_MAGIC
_FIXED_BYTES = R.record_size(0, 0, 0)           # a record with empty body, topic and properties
_MAGIC, _BLANK = R.MAGIC_CODE, R.BLANK_MAGIC_CODE
_F = R.FIELD
_PROPERTY_END = R.PROPERTY_SEP.encode()[0]
_TLEN, _PLEN = R.TOPIC_LEN.size, R.PROPS_LEN.size
# Where sound_at finds each field in the header tuple it unpacked (records.HEADER_INDEX).
_TOTAL, _MAGIC_I, _QID, _QOFF, _PHYS, _BLEN = (R.HEADER_INDEX[n] for n in (
    "total_size", "magic", "queue_id", "queue_offset", "phys_offset", "body_length"))


def sound_at(mm, rel: int, end: int, file_bytes: int, base: int):
    """``(TOTALSIZE, header)`` of the record at ``rel`` if ``records.check_stored_record`` (no CRC)
    accepts it and it ends by ``end``; ``(0, None)`` for a blank record; ``(-1, None)`` if broken."""
    if rel + _HDR_BYTES > end:                  # only a blank record (ending the file) fits
        if rel + R.MIN_BLANK_BYTES > file_bytes:
            return -1, None
        total, magic = _SIZE_MAGIC.unpack_from(mm, rel)
        return (0 if magic == _BLANK and R.MIN_BLANK_BYTES <= total <= file_bytes - rel else -1), None
    h = _HDR.unpack_from(mm, rel)
    total, magic, blen = h[_TOTAL], h[_MAGIC_I], h[_BLEN]
    if magic != _MAGIC:
        return (0 if magic == _BLANK and R.MIN_BLANK_BYTES <= total <= file_bytes - rel else -1), None
    if (not _FIXED_BYTES <= total <= end - rel or h[_PHYS] != base + rel or h[_QID] < 0 or h[_QOFF] < 0
            or not 0 <= blen <= total - _FIXED_BYTES):
        return -1, None
    ppos = rel + _HDR_BYTES + blen
    ppos += _TLEN + mm[ppos]
    stop = rel + total
    if ppos + _PLEN > stop or ppos + _PLEN + ((mm[ppos] << 8) | mm[ppos + 1]) != stop or \
            (ppos + _PLEN != stop and mm[stop - 1] != _PROPERTY_END):
        return -1, None
    return total, h


def sound_rows(mf, pos: np.ndarray, step: int | None, sizes: np.ndarray, blen: np.ndarray) -> np.ndarray:
    """Per record, whether its structure is what ``records.check_stored_record`` accepts (without the
    body CRC), vectorised; ``record_positions`` already checked TOTALSIZE bounds and the magic."""
    u8 = mf.u8
    ok = (mf.read_be(pos + _F["phys_offset"], 8, step) == pos + mf.file_from_offset)
    ok &= (mf.read_be(pos + _F["queue_id"], 4, step) >= 0) & (mf.read_be(pos + _F["queue_offset"], 8, step) >= 0)
    ok &= (blen >= 0) & (blen <= sizes - _FIXED_BYTES)
    end = pos + sizes
    tpos = pos + _HDR_BYTES + np.where(ok, blen, 0)             # TOPICLENGTH, inside the record
    ppos = tpos + R.TOPIC_LEN.size + u8[tpos]                   # PROPERTIESLENGTH
    ok &= ppos + R.PROPS_LEN.size <= end
    ppos = np.where(ok, ppos, pos)
    plen = (u8[ppos].astype(np.int64) << 8) | u8[ppos + 1]
    ok &= ppos + R.PROPS_LEN.size + plen == end
    ok &= (plen == 0) | (u8[end - 1] == _PROPERTY_END)
    return ok


def why_broken(mf, rel: int, end: int | None = None) -> str:
    """Why the record at ``rel`` of ``mf`` is broken, in ``check_stored_record``'s words."""
    try:
        kind, total = R.check_stored_record(mf.mm, rel, mf.file_bytes, mf.file_from_offset + rel,
                                            verify_crc=False)
    except CorruptRecordError as e:
        return e.why
    if end is not None and kind == R.RecordKind.MESSAGE and rel + total > end:
        return f"record of {total} bytes crosses the end of what is written ({mf.file_from_offset + end})"
    return "record fails the dispatcher's checks"
