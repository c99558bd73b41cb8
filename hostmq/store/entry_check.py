"""Does a consume-queue entry point at its own record? Checked against the commitlog (issue 15).

An entry ``(phys_offset, size)`` at queue offset *q* of queue (topic, queue id) is right when the
commitlog holds, at ``phys_offset``, a record of TOTALSIZE ``size`` with the message magic, whose
PHYSICALOFFSET is ``phys_offset``, QUEUEID the queue's id, QUEUEOFFSET *q*, whose BODYLENGTH fits,
and whose TOPIC is the queue's topic. The body CRC is not checked (recovery did that for the part of
the log it rescanned; an entry check is about where entries point).

Used by re-dispatch (``ConsumeQueue.put_many``: an entry that holds is never replaced by a record that
claims the same offset) and by abnormal recovery (``ConsumeQueue.verify``: every entry, vectorised).
Pure reads of the commitlog's maps; nothing here writes.
"""
from __future__ import annotations

import numpy as np

from .. import records as R

_HDR = R.MSG_HEADER
_FIXED_BYTES = R.record_size(0, 0, 0)
_F = R.FIELD
_MAGIC_I32 = np.int32(R.MAGIC_CODE - (1 << 32))     # MAGICCODE as a signed big-endian int32
_TOPIC_LEN_AT = _HDR.size                            # TOPICLENGTH follows the body: + BODYLENGTH
_TLEN = R.TOPIC_LEN.size
_TOTAL, _MAGIC_I, _QID, _QOFF, _PHYS, _BLEN = (R.HEADER_INDEX[n] for n in (
    "total_size", "magic", "queue_id", "queue_offset", "phys_offset", "body_length"))


def holds_record(commitlog, phys_offset: int, size: int, topic_b: bytes, queue_id: int,
                 queue_offset: int) -> bool:
    """Whether the entry ``(phys_offset, size)`` at ``queue_offset`` of (topic, queue id) is right."""
    mf = commitlog.mfq.find(phys_offset)
    if mf is None or size < _FIXED_BYTES:
        return False
    rel = phys_offset - mf.file_from_offset
    if rel + size > mf.committed_pos:
        return False
    h = _HDR.unpack_from(mf.mm, rel)
    if (h[_TOTAL] != size or h[_MAGIC_I] != R.MAGIC_CODE or h[_PHYS] != phys_offset or h[_QID] != queue_id
            or h[_QOFF] != queue_offset or not 0 <= h[_BLEN] <= size - _FIXED_BYTES):
        return False
    tpos = rel + _TOPIC_LEN_AT + h[_BLEN]
    tl = len(topic_b)
    return mf.mm[tpos] == tl and tpos + _TLEN + tl + R.PROPS_LEN.size <= rel + size and \
        mf.mm[tpos + _TLEN:tpos + _TLEN + tl] == topic_b


def check_entries(commitlog, topic_b: bytes, queue_id: int, first_queue_offset: int,
                  phys_offsets: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """:func:`holds_record` for consecutive entries from ``first_queue_offset``, vectorised per
    commitlog file; a bool per entry."""
    n = len(phys_offsets)
    ok = np.zeros(n, bool)
    files = commitlog.mfq.files
    if not n or not files:
        return ok
    phys_offsets = np.asarray(phys_offsets, np.int64)
    sizes = np.asarray(sizes, np.int64)
    starts = np.fromiter((mf.file_from_offset for mf in files), np.int64, len(files))
    which = np.searchsorted(starts, phys_offsets, "right") - 1
    queue_offsets = first_queue_offset + np.arange(n, dtype=np.int64)
    for fi in np.unique(which[which >= 0]).tolist():
        mf = files[fi]
        sel = np.flatnonzero(which == fi)
        rel = phys_offsets[sel] - mf.file_from_offset
        sz = sizes[sel]
        inside = (sz >= _FIXED_BYTES) & (rel + sz <= mf.committed_pos)
        sel, rel, sz = sel[inside], rel[inside], sz[inside]
        if len(sel):
            ok[sel] = _check_in_file(mf, rel, sz, topic_b, queue_id, queue_offsets[sel])
    return ok


def _check_in_file(mf, rel: np.ndarray, sizes: np.ndarray, topic_b: bytes, queue_id: int,
                   queue_offsets: np.ndarray) -> np.ndarray:
    """Entries whose records lie inside ``mf`` (``rel + sizes <= committed``): the header checks."""
    u8 = mf.u8
    good = ((be_ints(u8, rel + _F["total_size"], 4) == sizes) & (be_ints(u8, rel + _F["magic"], 4) == _MAGIC_I32)
            & (be_ints(u8, rel + _F["phys_offset"], 8) == rel + mf.file_from_offset)
            & (be_ints(u8, rel + _F["queue_id"], 4) == queue_id)
            & (be_ints(u8, rel + _F["queue_offset"], 8) == queue_offsets))
    blen = be_ints(u8, rel + _F["body_length"], 4)
    tl = len(topic_b)
    good &= (blen >= 0) & (blen <= sizes - _FIXED_BYTES - tl)
    tpos = rel + _TOPIC_LEN_AT + np.where(good, blen, 0)          # inside the record for good rows
    good &= u8[tpos] == tl
    rows = np.flatnonzero(good)
    if tl and len(rows):
        name = u8[tpos[rows, None] + _TLEN + np.arange(tl)]
        good[rows] = (name == np.frombuffer(topic_b, np.uint8)).all(axis=1)
    return good


def be_ints(u8: np.ndarray, positions: np.ndarray, width: int) -> np.ndarray:
    """Big-endian signed ints of ``width`` bytes at ``positions`` of ``u8`` (every one in bounds), as
    int64."""
    raw = u8[positions[:, None] + np.arange(width)]
    return np.ascontiguousarray(raw).view(f">i{width}").ravel().astype(np.int64)
