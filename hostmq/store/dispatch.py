"""What the dispatcher learns about committed records (RocketMQ ``DispatchRequest``).

``DispatchRequest`` is one record as a plain tuple (``CommitLog.scan``); ``DispatchBatch`` is many
records as numpy columns (``scan_batch``), the dispatcher's fast path: record positions are found by
hopping (or by one vectorised check over a run of equal-size records), header fields are gathered
for all records at once, and a record's tail (topic + properties) is parsed once per distinct tail —
tails usually differ only in the unique id, which the encoder puts last and which is sliced out as
bytes. Both are read-only over the commitlog; consumed by the consume queues and the index.

Nothing read back is trusted (issue 15): both scans re-check every record's structure the way
recovery does (``records.check_stored_record`` without the body CRC: size within bounds, magic,
PHYSICALOFFSET = position, queue id and offset not negative, lengths adding up to TOTALSIZE) — the
columnar scan with vectorised checks — and stop at the first record that fails, reporting it
(``DispatchBatch.error``): nothing after it can be located. A sound record whose TOPIC is not a valid
topic name (``records.stored_topic``) is skipped and counted (``DispatchBatch.skipped``): its topic
would become a consume-queue directory.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .. import records as R
from .mapped_file import arithmetic_step
from .record_checks import sound_at, sound_rows, why_broken

log = logging.getLogger(__name__)


class DispatchRequest(NamedTuple):
    topic: str
    queue_id: int
    phys_offset: int        # commitlog byte offset of the record
    size: int               # TOTALSIZE of the record
    tag_hash: int           # consume-queue tag code (tag hash, or due time for delay messages)
    store_ts_ms: int
    queue_offset: int
    keys: str               # KEYS property as stored ("k1 k2"), "" if none
    uniq_key: str           # UNIQ_KEY property, "" if none
    sys_flag: int


# ---------------------------------------------------------------------------------------------
# Columnar scan: the dispatcher's fast path
# ---------------------------------------------------------------------------------------------
_SIZE_MAGIC = R.SIZE_MAGIC
_HDR_BYTES = R.MSG_HEADER.size
_UNIQ_MARK = np.frombuffer((R.PROP_UNIQ_KEY + R.NAME_VALUE_SEP).encode(), np.uint8)
UNIQ_LEN = 32                                   # records.new_unique_id() is 32 hex digits
UNIQ_TAIL = len(_UNIQ_MARK) + UNIQ_LEN + 1      # "UNIQ…\x01" + id + "\x02" ends the properties
_MAGIC_I32 = np.int32(R.MAGIC_CODE - (1 << 32))  # MAGICCODE as the signed int read_be returns
_MIN_RUN = 8                                    # equal-size records worth a vectorised guess
_HDR = R.MSG_HEADER
_UNIQ_MARK_B = (R.PROP_UNIQ_KEY + R.NAME_VALUE_SEP).encode()
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"   # RocketMQ TopicValidator.RMQ_SYS_SCHEDULE_TOPIC
_FIXED_BYTES = R.record_size(0, 0, 0)           # a record with empty body, topic and properties
_F = R.FIELD
_PROPERTY_END = R.PROPERTY_SEP.encode()[0]
_TLEN = R.TOPIC_LEN.size
_LENGTHS = R.TOPIC_LEN.size + R.PROPS_LEN.size    # TOPICLENGTH and PROPERTIESLENGTH in a tail
# Where _request finds each field in the header tuple record_checks.sound_at unpacked.
_TOTAL, _QID, _QOFF, _PHYS, _SYSFLAG, _STORE_TS, _BLEN = (R.HEADER_INDEX[n] for n in (
    "total_size", "queue_id", "queue_offset", "phys_offset", "sys_flag", "store_ts_ms", "body_length"))


@dataclass
class DispatchBatch:
    """Dispatch facts of many records as columns (row i = i-th record in commitlog order)."""

    topics: list[str] = field(default_factory=list)   # distinct topics; ``topic_ids`` index it
    topic_ids: np.ndarray = None
    queue_ids: np.ndarray = None
    phys_offsets: np.ndarray = None
    sizes: np.ndarray = None
    tag_codes: np.ndarray = None
    store_ts_ms: np.ndarray = None
    queue_offsets: np.ndarray = None
    sys_flags: np.ndarray = None
    keys: list = field(default_factory=list)          # (row, "k1 k2") for rows with KEYS
    uniq_rows: np.ndarray = None                      # rows whose unique id is in ``uniq_bytes``
    uniq_bytes: np.ndarray = None                     # (len(uniq_rows), 32) uint8
    uniq_other: list = field(default_factory=list)    # (row, id) for ids found by full parsing
    error: tuple[int, str] | None = None              # (phys, why): the scan stopped at a broken record
    skipped: int = 0                                  # sound records left out: their topic is invalid

    def __len__(self) -> int:
        return 0 if self.phys_offsets is None else len(self.phys_offsets)

    def unique_ids(self) -> dict[int, str]:
        """Row → unique id, for the rows that have one."""
        uniq = dict(self.uniq_other)
        for r, b in zip(self.uniq_rows.tolist(), self.uniq_bytes):
            uniq[r] = b.tobytes().decode("ascii", "replace")
        return uniq

    def requests(self) -> list[DispatchRequest]:
        """The same facts as one DispatchRequest per record (for tests and slow consumers)."""
        keys = dict(self.keys)
        uniq = self.unique_ids()
        return [DispatchRequest(self.topics[t], q, p, s, c, ts, qo, keys.get(i, ""), uniq.get(i, ""), f)
                for i, (t, q, p, s, c, ts, qo, f) in enumerate(zip(
                    self.topic_ids.tolist(), self.queue_ids.tolist(), self.phys_offsets.tolist(),
                    self.sizes.tolist(), self.tag_codes.tolist(), self.store_ts_ms.tolist(),
                    self.queue_offsets.tolist(), self.sys_flags.tolist()))]


def record_positions(mf, rel: int, end: int, budget: int) -> tuple[np.ndarray, int, str | None]:
    """Positions of the records in ``mf`` from ``rel`` up to ``end`` (at most ``budget``).

    Returns the positions, where scanning stopped (``file_bytes`` after a blank record) and why it
    stopped early if the record there cannot be located (its TOTALSIZE or magic is impossible), else
    None. Runs of equal-size records are found with one vectorised check instead of a hop per record.
    """
    mm, file_bytes = mf.mm, mf.file_bytes
    last_header = file_bytes - _HDR_BYTES
    pieces: list = []
    singles: list[int] = []
    count = 0
    while rel < end and count < budget:
        if rel + R.MIN_BLANK_BYTES > file_bytes:
            return _join(pieces, singles), rel, "no room for the blank record that ends a file"
        total, magic = _SIZE_MAGIC.unpack_from(mm, rel)
        if magic == R.BLANK_MAGIC_CODE and R.MIN_BLANK_BYTES <= total <= file_bytes - rel:
            return _join(pieces, singles), file_bytes, None
        if rel > last_header or magic != R.MAGIC_CODE or not _FIXED_BYTES <= total <= end - rel:
            why = f"size {total}, magic 0x{magic:08X} (room {end - rel})"
            return _join(pieces, singles), rel, why
        run = min((end - rel) // total, budget - count)
        if run >= _MIN_RUN and rel + total <= last_header and \
                _SIZE_MAGIC.unpack_from(mm, rel + total)[0] == total:
            cand = rel + total * np.arange(run, dtype=np.int64)
            same = (mf.read_be(cand + _F["total_size"], 4) == total) & (mf.read_be(cand + _F["magic"], 4) == _MAGIC_I32)
            k = run if same.all() else int(np.argmin(same))
            if singles:
                pieces.append(np.array(singles, np.int64))
                singles = []
            pieces.append(cand[:k])
            rel += k * total
            count += k
            continue
        singles.append(rel)
        rel += total
        count += 1
    return _join(pieces, singles), rel, None


def _join(pieces: list, singles: list) -> np.ndarray:
    if singles:
        pieces.append(np.array(singles, np.int64))
    if not pieces:
        return np.empty(0, np.int64)
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


def scan_batch(commitlog, from_phys: int, limit_phys: int, max_records: int = 8192
               ) -> tuple[DispatchBatch, int]:
    """Dispatch facts of the records in [from_phys, limit_phys), vectorised; and the next offset."""
    out = _Builder(commitlog)
    phys = from_phys
    while phys < limit_phys and out.count < max_records:
        mf = commitlog.mfq.find(phys)
        if mf is None:
            break
        base = mf.file_from_offset
        rel0 = phys - base
        committed = mf.committed_pos
        pos, rel, why = record_positions(mf, rel0, min(committed, limit_phys - base),
                                         max_records - out.count)
        if len(pos):
            bad = out.add_file_piece(mf, pos)
            if bad is not None:
                rel, why = bad
        if why is not None:
            out.error = (base + rel, why)
            return out.build(), base + rel
        phys = base + rel
        if rel < mf.file_bytes and rel >= committed or rel == rel0:
            break
    return out.build(), phys


def stored_unique_ids(commitlog, start: int, end: int, batch: int = 8192) -> dict[tuple[str, str], list[int]]:
    """``(topic, unique id) → phys offsets`` of the records in [start, end), by :func:`scan_batch`
    (the scheduler's check after a restart). Stops at a broken record: what follows it is not
    readable either."""
    out: dict[tuple[str, str], list[int]] = {}
    phys = start
    while phys < end:
        b, nxt = scan_batch(commitlog, phys, end, batch)
        if len(b):
            topics, tids, offsets = b.topics, b.topic_ids.tolist(), b.phys_offsets.tolist()
            for r, u in sorted(b.unique_ids().items()):
                out.setdefault((topics[tids[r]], u), []).append(offsets[r])
        if b.error is not None or nxt <= phys:
            break
        phys = nxt
    return out


class _Builder:
    def __init__(self, commitlog) -> None:
        self.cl = commitlog
        self.count = 0
        self.cols: list[tuple] = []
        self.topic_index: dict[str, int] = {}
        self.keys: list = []
        self.uniq_rows: list = []
        self.uniq_bytes: list = []
        self.uniq_other: list = []
        self.error: tuple[int, str] | None = None
        self.skipped = 0

    def add_file_piece(self, mf, pos: np.ndarray) -> tuple[int, str] | None:
        """Add the records at ``pos`` in ``mf``; if one of them is broken, only those before it, and
        return ``(its position in the file, why)``."""
        step = arithmetic_step(pos)      # a run of equal-size records: strided views, no gathers
        sizes = mf.read_be(pos, 4, step).astype(np.int64)
        blen = mf.read_be(pos + _F["body_length"], 4, step).astype(np.int64)
        ok = sound_rows(mf, pos, step, sizes, blen)
        if ok.all():
            self._add(mf, pos, step, sizes, blen)
            return None
        k = int(np.argmin(ok))
        if k:
            self._add(mf, pos[:k], arithmetic_step(pos[:k]), sizes[:k], blen[:k])
        return int(pos[k]), why_broken(mf, int(pos[k]))

    def _add(self, mf, pos: np.ndarray, step: int | None, sizes: np.ndarray, blen: np.ndarray) -> None:
        def rd(at: int, width: int) -> np.ndarray:
            return mf.read_be(pos + at, width, step).astype(np.int64)

        ts = rd(_F["store_ts_ms"], 8)
        topic_ids = np.empty(len(pos), np.int64)
        codes = np.empty(len(pos), np.int64)
        tstart = pos + _HDR_BYTES + blen
        tlen = sizes - _HDR_BYTES - blen
        first_row = self.count
        lengths = np.unique(tlen).tolist()
        for length in lengths:
            rows = np.flatnonzero(tlen == length) if len(lengths) > 1 else np.arange(len(pos))
            sub_step = arithmetic_step(tstart[rows])   # (the last record may differ in size)
            self._tails(mf.rows(tstart[rows], int(length), sub_step), int(length), rows, first_row,
                        topic_ids, codes, ts)
        self.cols.append((topic_ids, rd(_F["queue_id"], 4), mf.file_from_offset + pos, sizes, codes, ts,
                          rd(_F["queue_offset"], 8), rd(_F["sys_flag"], 4)))
        self.count += len(pos)

    def _tails(self, mat, length, rows, first_row, topic_ids, codes, ts) -> None:
        ut = UNIQ_TAIL
        if length >= ut + 3:
            mark = (mat[:, length - ut:length - ut + len(_UNIQ_MARK)] == _UNIQ_MARK).all(axis=1)
            whole = (mat[:, length - ut - 1] == 2) | (mat[:, 0].astype(np.int64) + 3 + ut == length)
            fast = mark & whole
        else:
            fast = np.zeros(len(rows), bool)
        if fast.all():
            self.uniq_rows.append(rows + first_row)
            self.uniq_bytes.append(np.array(mat[:, length - UNIQ_LEN - 1:length - 1]))
            self._prefixes(mat[:, :length - ut], rows, first_row, topic_ids, codes, ts, False)
            return
        if fast.any():
            sel = np.flatnonzero(fast)
            self.uniq_rows.append(rows[sel] + first_row)
            self.uniq_bytes.append(mat[sel, length - UNIQ_LEN - 1:length - 1])
            self._prefixes(mat[sel, :length - ut], rows[sel], first_row, topic_ids, codes, ts, False)
        sel = np.flatnonzero(~fast)
        self._prefixes(mat[sel], rows[sel], first_row, topic_ids, codes, ts, True)

    def _prefixes(self, mat, rows, first_row, topic_ids, codes, ts, has_uniq_inside: bool) -> None:
        """Parse each distinct tail prefix once; spread the results over its rows."""
        if (mat == mat[0]).all():
            groups = [(mat[0].tobytes(), rows)]
        else:
            flat = np.ascontiguousarray(mat).view(np.dtype((np.void, mat.shape[1]))).ravel()
            uniq, inv = np.unique(flat, return_inverse=True)
            groups = [(u.tobytes(), rows[inv.ravel() == k]) for k, u in enumerate(uniq)]
        for tail, grp in groups:
            parsed = self.cl._tail_cache.get(tail)
            if parsed is None:
                parsed = parse_tail(self.cl, tail)
            topic, code, keys, uniq_key, delay = parsed
            if topic is None:               # not a topic name (parse_tail logged it)
                topic_ids[grp] = -1
                self.skipped += len(grp)
                continue
            tid = self.topic_index.setdefault(topic, len(self.topic_index))
            topic_ids[grp] = tid
            codes[grp] = code if not delay else ts[grp] + delay
            if keys:
                self.keys.extend((int(r) + first_row, keys) for r in grp)
            if has_uniq_inside and uniq_key:
                self.uniq_other.extend((int(r) + first_row, uniq_key) for r in grp)

    def build(self) -> DispatchBatch:
        b = DispatchBatch(topics=list(self.topic_index), keys=sorted(self.keys),
                          uniq_other=sorted(self.uniq_other))
        if not self.cols:
            empty = np.empty(0, np.int64)
            (b.topic_ids, b.queue_ids, b.phys_offsets, b.sizes, b.tag_codes, b.store_ts_ms,
             b.queue_offsets, b.sys_flags) = (empty,) * 8
        else:
            cols = [np.concatenate(c) if len(self.cols) > 1 else c[0] for c in zip(*self.cols)]
            (b.topic_ids, b.queue_ids, b.phys_offsets, b.sizes, b.tag_codes, b.store_ts_ms,
             b.queue_offsets, b.sys_flags) = [np.asarray(c, np.int64) for c in cols]
        if self.uniq_rows:
            b.uniq_rows = np.concatenate(self.uniq_rows)
            b.uniq_bytes = np.concatenate(self.uniq_bytes)
        else:
            b.uniq_rows, b.uniq_bytes = np.empty(0, np.int64), np.empty((0, UNIQ_LEN), np.uint8)
        b.error, b.skipped = self.error, self.skipped
        return _without_skipped(b) if self.skipped else b


def _without_skipped(b: DispatchBatch) -> DispatchBatch:
    """The batch without its rows of invalid topics (``topic_ids`` -1), rows renumbered."""
    keep = b.topic_ids >= 0
    new_row = np.cumsum(keep) - 1
    for name in ("topic_ids", "queue_ids", "phys_offsets", "sizes", "tag_codes", "store_ts_ms",
                 "queue_offsets", "sys_flags"):
        setattr(b, name, getattr(b, name)[keep])
    kept_uniq = keep[b.uniq_rows]
    b.uniq_rows, b.uniq_bytes = new_row[b.uniq_rows[kept_uniq]], b.uniq_bytes[kept_uniq]
    b.keys = [(int(new_row[r]), k) for r, k in b.keys if keep[r]]
    b.uniq_other = [(int(new_row[r]), u) for r, u in b.uniq_other if keep[r]]
    return b


_POW31_ID = np.array([pow(31, UNIQ_LEN - 1 - i, 1 << 32) for i in range(UNIQ_LEN)], np.uint32)
_POW31_LEN = np.uint32(pow(31, UNIQ_LEN, 1 << 32))


def index_entries(batch: DispatchBatch, prefix_hash, key_hashes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Index entries of a batch in RocketMQ's order (per message: unique id, then each key).

    ``prefix_hash(topic)`` is Java's hash of ``topic + "#"`` as uint32; ``key_hashes(topics, keys)``
    hashes ``topic#key`` strings. Unique ids sliced out as bytes are hashed here without making
    strings: ``hash(p + id) = hash(p) * 31**32 + hash(id)`` modulo 2**32. Prepared and rolled-back
    transaction messages are not indexed. Returns (key_hash int32 ≥ 0, phys_offset, store_ts_ms).
    """
    rows_parts, sub_parts, hash_parts = [], [], []
    if len(batch.uniq_rows):
        pre = np.array([prefix_hash(t) for t in batch.topics], np.uint32)[batch.topic_ids[batch.uniq_rows]]
        with np.errstate(over="ignore"):
            h = pre * _POW31_LEN + (batch.uniq_bytes.astype(np.uint32) * _POW31_ID).sum(axis=1, dtype=np.uint32)
        h = np.abs(h.view(np.int32))
        h[h < 0] = 0        # abs(-2**31) overflows: RocketMQ uses 0
        rows_parts.append(batch.uniq_rows)
        sub_parts.append(np.zeros(len(h), np.int64))
        hash_parts.append(h)
    strs_rows, strs_sub, strs_topics, strs_keys = [], [], [], []
    for row, uniq in batch.uniq_other:
        strs_rows.append(row), strs_sub.append(0), strs_topics.append(batch.topics[batch.topic_ids[row]])
        strs_keys.append(uniq)
    for row, keys in batch.keys:
        topic = batch.topics[batch.topic_ids[row]]
        for j, k in enumerate(k for k in keys.split(R.KEY_SEPARATOR) if k):
            strs_rows.append(row), strs_sub.append(j + 1), strs_topics.append(topic), strs_keys.append(k)
    if strs_keys:
        rows_parts.append(np.array(strs_rows, np.int64))
        sub_parts.append(np.array(strs_sub, np.int64))
        hash_parts.append(np.asarray(key_hashes(strs_topics, strs_keys), np.int32))
    if not rows_parts:
        e = np.empty(0, np.int64)
        return np.empty(0, np.int32), e, e
    rows, sub, hashes = (np.concatenate(p) for p in (rows_parts, sub_parts, hash_parts))
    order = np.lexsort((sub, rows))
    rows, hashes = rows[order], hashes[order]
    tx = batch.sys_flags[rows] & R.SYSFLAG_TX_MASK
    keep = (tx != R.SYSFLAG_TX_PREPARED) & (tx != R.SYSFLAG_TX_ROLLBACK)
    rows, hashes = rows[keep], hashes[keep]
    return hashes, batch.phys_offsets[rows], batch.store_ts_ms[rows]


# ---------------------------------------------------------------------------------------------
# Record by record: CommitLog.scan (a few records, and the appender taking over)
# ---------------------------------------------------------------------------------------------
def scan_records(cl, from_phys: int, limit_phys: int, max_records: int = 4096
                 ) -> tuple[list[DispatchRequest], int]:
    """Parse records of the commitlog ``cl`` from ``from_phys`` up to ``limit_phys``; returns
    requests and the next offset.

    Re-checks every record as recovery does (``records.check_stored_record``, no body CRC; the same
    checks inline here, on the header already unpacked): the scan stops at a broken one and says where
    and why in ``cl.scan_error`` (``(phys, why)``, else None) — nothing after it can be located. A
    sound record whose topic is not a valid name is left out (``cl.skipped_records`` counts them).
    """
    out: list[DispatchRequest] = []
    append = out.append
    cl.scan_error = None
    phys = from_phys
    file_bytes = cl.file_bytes
    while phys < limit_phys and len(out) < max_records:
        mf = cl.mfq.find(phys)
        if mf is None:
            break
        base = mf.file_from_offset
        mm = mf.mm
        rel = phys - base
        committed = mf.committed_pos
        end = min(committed, limit_phys - base)
        budget = max_records - len(out)
        while rel < end and budget:
            total, h = sound_at(mm, rel, end, file_bytes, base)
            if total <= 0:
                if total == 0:                          # a blank record: the file is complete
                    rel = file_bytes
                    break
                cl.scan_error = (base + rel, why_broken(mf, rel, end))
                return out, base + rel
            req = _request(cl, mm, rel, h)
            if req is not None:
                append(req)
                budget -= 1
            else:
                cl.skipped_records += 1
            rel += total
        phys = base + rel
        if rel < file_bytes and rel >= committed:
            break
    return out, phys


def _request(cl, mm, rel: int, h) -> DispatchRequest | None:
    # The tail (topic + properties) of most records differs only in the unique id, which the
    # encoder puts last: parse the rest once per distinct tail and cache it.
    tail = mm[rel + _HDR_BYTES + h[_BLEN]:rel + h[_TOTAL]]
    n = len(tail)
    if tail[-UNIQ_TAIL:-UNIQ_LEN - 1] == _UNIQ_MARK_B and (
            tail[n - UNIQ_TAIL - 1] == _PROPERTY_END or tail[0] + _LENGTHS + UNIQ_TAIL == n):  # a whole property
        uniq = tail[-UNIQ_LEN - 1:-1].decode("ascii", "replace")
        tail = tail[:-UNIQ_TAIL]
    else:
        uniq = None
    parsed = cl._tail_cache.get(tail)
    if parsed is None:
        parsed = parse_tail(cl, tail)
    topic, code, keys, parsed_uniq, delay = parsed
    if topic is None:
        return None
    if delay:
        code = h[_STORE_TS] + delay
    return DispatchRequest(topic, h[_QID], h[_PHYS], h[_TOTAL], code, h[_STORE_TS], h[_QOFF], keys,
                           parsed_uniq if uniq is None else uniq, h[_SYSFLAG])


def parse_tail(cl, tail: bytes) -> tuple:
    """(topic, tag code, keys, unique key, delay ms) of a record's tail (after the body, without
    a trailing unique-id property); topic None if it is not a valid topic name (logged once)."""
    tlen = tail[0]
    topic = R.stored_topic(bytes(tail[_TLEN:_TLEN + tlen]))
    if topic is None:
        log.error("commitlog: a record names topic %r, not a valid topic name; it is not dispatched",
                  bytes(tail[_TLEN:_TLEN + tlen]))
    props = b"\x02" + tail[_LENGTHS + tlen:]
    tags = _prop(props, b"\x02TAGS\x01")
    delay = 0
    if topic == SCHEDULE_TOPIC and cl.delay_levels_ms:
        delay = _delay_ms(cl.delay_levels_ms, _prop(props, b"\x02DELAY\x01"))
    code = R.tag_hash(tags) if tags else 0
    parsed = (topic, code, _prop(props, b"\x02KEYS\x01"),
              _prop(props, b"\x02UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x01"), delay)
    if len(cl._tail_cache) >= 4096:   # unique keys would grow it without bound
        cl._tail_cache.clear()
    cl._tail_cache[tail] = parsed
    return parsed


def _delay_ms(levels_ms: tuple[int, ...], level: str) -> int:
    try:
        n = int(level)
    except (TypeError, ValueError):
        return 0
    n = min(max(n, 1), len(levels_ms))
    return levels_ms[n - 1]


def _prop(props: bytes, name: bytes) -> str:
    """Value of one property in ``\\x02``-prefixed PROPERTIES bytes; "" if absent."""
    i = props.find(name)
    if i < 0:
        return ""
    i += len(name)
    j = props.find(b"\x02", i)
    return props[i:j if j >= 0 else len(props)].decode("utf-8", "replace")
