"""What the read side does with a record it cannot decode: skip it, log it once, count it.

A consume-queue entry can lead to bytes no consumer can use — a record written before the writer
validated properties (non-UTF-8 property bytes), a damaged disk, an entry that points at the wrong
place. Handing such a record to a consumer stalls it (a filter that raises on every poll) or
crashes it (a listener that raises on every redelivery), so the readers (``reader.py``) check
every record before they return it, pass over the ones that fail — the queue offset still
advances — and report them here. Nothing is written: the record stays in the store for an
operator to look at (the log line names its commitlog offset).

* :class:`SkippedRecords` logs each skipped record once per process (a bounded memory of the ones
  already logged) with broker, topic, queue, queue offset, commitlog offset and the reason, and
  counts them (``SKIPPED.count``); consumers also count what their own polls skipped.
* :func:`check_rows` is the vectorised check of many records of one mapped file at once, for the
  zero-copy batches (``get_batch``): the same rules as ``MessageExt.check`` (hostmq/message.py),
  property-tested against it (tests/store/test_read_check.py).

Both have a native fast path (``hostmq/store/_read.c``, :data:`NATIVE`, None where it was not
built): it accepts only records this module's checks accept and hands everything else back to them,
so a skipped record is always judged and worded here (tests/store/test_read_native.py compares the
two paths on the same store files).
"""
from __future__ import annotations

import collections
import logging
import os
import re
import threading

import numpy as np

from .. import records as R
from ..errors import CorruptRecordError
from ..message import MessageExt
from .mapped_file import arithmetic_step

log = logging.getLogger(__name__)

try:
    from . import _read as NATIVE
except ImportError:         # not built (no compiler at install time): the Python checks serve
    NATIVE = None
if os.environ.get("HOSTMQ_NATIVE_READ", "1") == "0":       # the Python path only (benchmarks, bisecting)
    NATIVE = None
if NATIVE is not None:
    R.layout_check(all(NATIVE.LAYOUT[k] == R.FIELD[k] for k in ("total_size", "magic", "queue_id", "queue_offset",
                                                                "sys_flag", "body_length"))
                   and NATIVE.LAYOUT["MSG_HEADER"] == R.MSG_HEADER.size
                   and NATIVE.LAYOUT["MIN_RECORD_BYTES"] == R.MIN_RECORD_BYTES
                   and NATIVE.LAYOUT["CQ_ENTRY"] == R.CQ_ENTRY.itemsize and NATIVE.LAYOUT["MAGIC_CODE"] == R.MAGIC_CODE
                   and NATIVE.LAYOUT["PROPERTY_END"] == ord(R.PROPERTY_SEP)
                   and NATIVE.LAYOUT["NAME_VALUE_SEP"] == ord(R.NAME_VALUE_SEP),
                   "hostmq/store/_read.c's layout differs from records.py's (rebuild it: pip install -e .)")
    # It builds MessageExt as MessageExt.__init__ does: the record in ``_raw``, the broker, None in the rest.
    NATIVE._bind(MessageExt, MessageExt._raw, MessageExt.broker,
                 tuple(getattr(MessageExt, s) for s in MessageExt.__slots__ if s not in ("_raw", "broker")),
                 R.SYSFLAG_COMPRESSED, R.CQ_ENTRY)

REMEMBERED_RECORDS = 4096       # skipped records kept to log each once (older ones may log again)
VECTOR_MIN_ROWS = 48            # check_rows checks smaller batches record by record (measured crossover)
_MAGIC_I32 = np.int32(R.MAGIC_CODE - (1 << 32))     # MAGICCODE as the signed int read_be returns
_F = R.FIELD
_HDR = R.MSG_HEADER.size
_PROPERTY_END = R.PROPERTY_SEP.encode()[0]     # \x02 ends every PROPERTIES
# What records.decode_properties accepts, as one scan over many records' properties at once:
# "name\x01value\x02" pairs (a non-empty name before the first \x01; the value may hold \x01) or
# empty pairs. Each record's properties end with \x02 (checked first), so a concatenation matches
# exactly when every part does.
_PAIRS = re.compile(rb"(?:[^\x01\x02]++\x01[^\x02]*+\x02|\x02)*+").fullmatch


class SkippedRecords:
    """Records the readers of this process passed over; thread-safe (consumers poll on threads)."""

    def __init__(self, remembered: int = REMEMBERED_RECORDS) -> None:
        self.count = 0                  # distinct records skipped (as far as remembered)
        self._logged: collections.OrderedDict = collections.OrderedDict()
        self._remembered = remembered
        self._lock = threading.Lock()

    def note(self, broker: str, topic: str, queue_id: int, queue_offset: int, phys_offset: int,
             why: str) -> None:
        key = (broker, topic, queue_id, queue_offset, phys_offset)
        with self._lock:
            if key in self._logged:
                self._logged.move_to_end(key)
                return
            self._logged[key] = None
            if len(self._logged) > self._remembered:
                self._logged.popitem(last=False)
            self.count += 1
        log.error("skipping a record no consumer can decode: %s@%s#%d queue offset %d, commitlog offset %d: %s "
                  "(the queue goes on after it; the bytes stay in the store)",
                  topic, broker or "-", queue_id, queue_offset, phys_offset, why)


SKIPPED = SkippedRecords()


def check_one(mm, pos: int, size: int, topic_b: bytes, queue_id: int, queue_offset: int,
              broker: str) -> MessageExt | str:
    """The message at ``pos`` of a mapped file, checked — or why it cannot be decoded."""
    if NATIVE is not None:
        m = NATIVE.checked(mm, pos, size, topic_b, queue_id, queue_offset, broker)
        if m is not None:
            return m
    return py_check_one(mm, pos, size, topic_b, queue_id, queue_offset, broker)


def py_check_one(mm, pos: int, size: int, topic_b: bytes, queue_id: int, queue_offset: int,
                 broker: str) -> MessageExt | str:
    """:func:`check_one` in Python (the spec of the native path)."""
    if pos < 0 or size < R.MIN_RECORD_BYTES or pos + size > len(mm):
        return f"consume-queue entry ({size} bytes at {pos}) lies outside its commitlog file"
    m = MessageExt(mm[pos:pos + size], broker)
    try:
        m.check(topic_b, queue_id, queue_offset)
    except CorruptRecordError as e:
        return e.why
    return m


def check_rows(mf, rel: np.ndarray, sizes: np.ndarray, queue_offsets: np.ndarray, topic_b: bytes,
               queue_id: int) -> np.ndarray:
    """Which records (at ``rel`` positions of mapped file ``mf``, ``sizes`` bytes each, read as
    ``queue_offsets`` of ``topic_b`` / ``queue_id``) decode: a boolean mask. Fewer than
    VECTOR_MIN_ROWS are checked one by one (``check_one``: a few µs each, where the vectorised
    check costs ~100 µs whatever the count); more at once, with records evenly spaced in the file
    (one queue's equal-size records) read through strided views."""
    if NATIVE is not None:
        ok = np.empty(len(rel), bool)
        if NATIVE.check_rows(mf.mm, np.ascontiguousarray(rel, np.int64), np.ascontiguousarray(sizes, np.int64),
                             np.ascontiguousarray(queue_offsets, np.int64), topic_b, queue_id, ok):
            for r in np.flatnonzero(~ok).tolist():      # the spec judges what the fast path did not accept
                ok[r] = py_check_one(mf.mm, int(rel[r]), int(sizes[r]), topic_b, queue_id, int(queue_offsets[r]),
                                     "").__class__ is MessageExt
        return ok
    return py_check_rows(mf, rel, sizes, queue_offsets, topic_b, queue_id)


def py_check_rows(mf, rel: np.ndarray, sizes: np.ndarray, queue_offsets: np.ndarray, topic_b: bytes,
                  queue_id: int) -> np.ndarray:
    """:func:`check_rows` in Python (the spec of the native path)."""
    if len(rel) < VECTOR_MIN_ROWS:
        return np.array([py_check_one(mf.mm, p, n, topic_b, queue_id, o, "").__class__ is MessageExt
                         for p, n, o in zip(rel.tolist(), sizes.tolist(), queue_offsets.tolist())], bool)
    ok = (rel >= 0) & (sizes >= R.MIN_RECORD_BYTES) & (rel + sizes <= len(mf.u8))
    step = arithmetic_step(rel) if len(rel) > 1 and ok.all() else None
    p = rel if step else np.where(ok, rel, 0)
    end = p + np.where(ok, sizes, R.MIN_RECORD_BYTES)
    body_len = mf.read_be(p + _F["body_length"], 4, step).astype(np.int64)
    ok &= (mf.read_be(p + _F["total_size"], 4, step) == sizes) & (mf.read_be(p + _F["magic"], 4, step) == _MAGIC_I32)
    ok &= (mf.read_be(p + _F["queue_id"], 4, step) == queue_id) & \
        (mf.read_be(p + _F["queue_offset"], 8, step) == queue_offsets)
    tstart = p + _HDR + R.TOPIC_LEN.size + body_len
    ok &= (body_len >= 0) & (tstart + R.PROPS_LEN.size <= end)
    u8 = mf.u8
    topic_len = u8[np.where(ok, tstart - 1, 0)].astype(np.int64)
    ok &= topic_len == len(topic_b)
    pstart = tstart + topic_len + R.PROPS_LEN.size
    ok &= pstart <= end
    at = np.where(ok, pstart - R.PROPS_LEN.size, 0)
    ok &= pstart + (u8[at].astype(np.int64) << 8 | u8[at + 1]) == end
    ok &= (pstart == end) | (u8[np.where(ok, end - 1, 0)] == _PROPERTY_END)
    rows = np.flatnonzero(ok)
    if topic_b and len(rows):
        step_ok = step if len(rows) == len(ok) and (tstart - p == tstart[0] - p[0]).all() else None
        got = mf.rows(tstart[rows], len(topic_b), step_ok)
        ok[rows[~(got == np.frombuffer(topic_b, np.uint8)).all(axis=1)]] = False
    _check_texts(mf, ok, pstart, end, step)
    _check_compressed(mf, ok, p, body_len)
    return ok


def _check_texts(mf, ok: np.ndarray, pstart: np.ndarray, end: np.ndarray, step: int | None) -> None:
    """Properties of the rows still ``ok`` must decode: checked over all of them joined at once
    (a failure is narrowed down row by row). Topics were compared with the queue's."""
    rows = np.flatnonzero(ok)
    if not len(rows):
        return
    mm = mf.mm
    starts, ends = pstart[rows], end[rows]
    if step and len(rows) == len(ok) and (ends - starts == ends[0] - starts[0]).all():
        joined = mf.rows(starts, int(ends[0] - starts[0]), step).tobytes()     # evenly spaced: one copy
    else:
        joined = b"".join([mm[a:b] for a, b in zip(starts.tolist(), ends.tolist())])
    if (joined.isascii() and _plain_pairs(joined)) or _decodes(joined):
        return
    for r, a, b in zip(rows.tolist(), starts.tolist(), ends.tolist()):
        if not _decodes(mm[a:b]):
            ok[r] = False


def _plain_pairs(props: bytes) -> bool:
    """True if ``props`` (ending with \x02) is "name\x01value\x02" pairs with one \x01 each and
    non-empty names — what every encoder writes — in a few vectorised passes; False means "not
    this simple form" (the exact check then decides: values may hold \x01, pairs may be empty)."""
    u8 = np.frombuffer(props, np.uint8)
    at = np.flatnonzero(u8 <= 2)
    seps = u8[at]
    if len(seps) % 2 or not ((seps[0::2] == 1).all() and (seps[1::2] == 2).all()):
        return False
    pair_starts = np.concatenate(([0], at[1::2][:-1] + 1))
    return bool((at[0::2] > pair_starts).all())


def _decodes(props: bytes) -> bool:
    """Exactly what ``records.decode_properties`` accepts (without building the dict)."""
    try:
        props.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return _PAIRS(props) is not None


def _check_compressed(mf, ok: np.ndarray, p: np.ndarray, body_len: np.ndarray) -> None:
    """A compressed body must inflate (rare; inflated again when read)."""
    rows = np.flatnonzero(ok)
    if not len(rows):
        return
    flags = mf.read_be(p[rows] + _F["sys_flag"], 4)
    for r in rows[(flags & R.SYSFLAG_COMPRESSED) != 0].tolist():
        start = int(p[r]) + _HDR
        try:
            R.decompress_body(mf.mm[start:start + int(body_len[r])])
        except CorruptRecordError:
            ok[r] = False


def why_not(mf, pos: int, size: int, topic_b: bytes, queue_id: int, queue_offset: int) -> str:
    """The reason ``check_rows`` refused a row (for the log)."""
    got = check_one(mf.mm, pos, size, topic_b, queue_id, queue_offset, "")
    return got if isinstance(got, str) else "refused by the batch check"
