"""The read side: consume-queue entries + commitlog bytes → messages (RocketMQ getMessage).

Two shapes: :func:`get_messages` builds one :class:`~hostmq.message.MessageExt` per message (each a
private copy of its record, so it outlives the store); :func:`get_batch` builds a
:class:`MessageBatch` whose bodies are zero-copy views into the mapped commitlog, with offsets and
timestamps as numpy arrays, for bulk consumers. Neither writes anything.

Both check every record before they return it (``MessageExt.check`` / ``read_check.check_rows``):
one that cannot be decoded, or is not the record its consume-queue entry names, is skipped — the
offset moves past it, it is logged once and counted (``read_check.SKIPPED``, ``skipped`` of the
result) — so one bad record never stalls a queue or reaches a consumer.
"""
from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field

import numpy as np

from .. import records as R
from .filter import TagFilter
from ..message import MessageExt, MessageQueue
from . import read_check
from .read_check import check_one, check_rows, why_not

_BODY_LEN_AT = R.FIELD["body_length"]
_STORE_TS_AT = R.FIELD["store_ts_ms"]
_SYSFLAG_AT = R.FIELD["sys_flag"]
_CQ_PHYS = struct.Struct(">q")     # a consume-queue entry's first field
_SCAN_ENTRIES = 800     # entries looked at per step when a filter skips most of them (RocketMQ: 16000 B)


class GetStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"           # entries read, none passed the filter
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"         # the queue is empty or does not exist
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"               # below the min offset (data deleted)
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"         # exactly the max offset: nothing new yet
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"     # beyond the max offset
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"       # entries point at deleted commitlog data


@dataclass(slots=True)
class GetResult:
    status: GetStatus
    messages: list = field(default_factory=list)
    next_offset: int = 0
    min_offset: int = 0
    max_offset: int = 0
    skipped: int = 0            # records passed over because they cannot be decoded (read_check)


def check_offset(queue_offset: int, min_offset: int, max_offset: int) -> tuple[GetStatus, int] | None:
    """RocketMQ's offset checks before reading: a status and the offset to continue from, or None
    when ``queue_offset`` can be read."""
    if max_offset == 0:
        return GetStatus.NO_MESSAGE_IN_QUEUE, 0
    if queue_offset < min_offset:
        return GetStatus.OFFSET_TOO_SMALL, min_offset
    if queue_offset == max_offset:
        return GetStatus.OFFSET_OVERFLOW_ONE, queue_offset
    if queue_offset > max_offset:
        return GetStatus.OFFSET_OVERFLOW_BADLY, min_offset if min_offset == 0 else max_offset
    return None


def get_messages(cq, commitlog, queue_offset: int, max_count: int, tag_filter: TagFilter,
                 max_bytes: int, broker: str = "") -> GetResult:
    """Up to ``max_count`` matching messages (and at most ``max_bytes``, at least one) from
    ``queue_offset``. Filtered-out entries still advance ``next_offset``."""
    if cq is None:
        return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE)
    lo, hi = cq.min_offset(), cq.max_offset()
    early = check_offset(queue_offset, lo, hi)
    if early:
        return GetResult(early[0], [], early[1], lo, hi)
    if tag_filter.match_all:
        if read_check.NATIVE is not None:
            return _get_all_native(cq, commitlog, queue_offset, max_count, max_bytes, broker, lo, hi)
        return _get_all(cq, commitlog, queue_offset, max_count, max_bytes, broker, lo, hi)
    msgs: list[MessageExt] = []
    nbytes = 0
    nxt = queue_offset
    removed = skipped = 0
    cl_min = commitlog.min_offset()
    mf = None
    topic_b = cq.topic.encode()
    while len(msgs) < max_count and nxt < hi:
        ents = cq.entries(nxt, max(max_count - len(msgs), _SCAN_ENTRIES))
        if not len(ents):
            break
        keep = tag_filter.match_codes(ents["tag_hash"])
        phys_l = ents["phys_offset"].tolist()
        size_l = ents["size"].tolist()
        stop = False
        for i, ok in enumerate(keep.tolist()):
            if not ok:
                continue
            phys, size = phys_l[i], size_l[i]
            if phys < cl_min:
                removed += 1
                continue
            if msgs and nbytes + size > max_bytes:
                nxt += i
                stop = True
                break
            if mf is None or not mf.file_from_offset <= phys < mf.file_end_offset:
                mf = commitlog.mfq.find(phys)
                if mf is None:
                    removed += 1
                    continue
            m = check_one(mf.mm, phys - mf.file_from_offset, size, topic_b, cq.queue_id, nxt + i, broker)
            if m.__class__ is str:
                skipped += 1
                read_check.SKIPPED.note(broker, cq.topic, cq.queue_id, nxt + i, phys, m)
                continue
            if not tag_filter.match_tag(m.tags):
                continue
            msgs.append(m)
            nbytes += size
            if len(msgs) >= max_count:
                nxt += i + 1
                stop = True
                break
        if stop:
            break
        nxt += len(ents)
    return GetResult(_status(msgs, removed), msgs, nxt, lo, hi, skipped)


def _status(msgs: list, removed: int) -> GetStatus:
    if msgs:
        return GetStatus.FOUND
    return GetStatus.MESSAGE_WAS_REMOVING if removed else GetStatus.NO_MATCHED_MESSAGE


def _get_all(cq, commitlog, queue_offset: int, max_count: int, max_bytes: int, broker: str,
             lo: int, hi: int) -> GetResult:
    """``get`` without a filter: every entry is a message to return (the common, fast case)."""
    msgs: list[MessageExt] = []
    cl_min = commitlog.min_offset()
    nbytes = removed = taken = skipped = 0
    lo_phys = hi_phys = base = 0
    mm = None
    full = False
    topic, queue_id = cq.topic, cq.queue_id
    topic_b = topic.encode()
    while taken < max_count and queue_offset + taken < hi and not full:
        ents = cq.entries(queue_offset + taken, max_count - taken)   # within one consume-queue file
        if not len(ents):
            break
        for phys, size in zip(ents["phys_offset"].tolist(), ents["size"].tolist()):
            if phys < cl_min:
                removed += 1
                taken += 1
                continue
            if msgs and nbytes + size > max_bytes:
                full = True
                break
            if not lo_phys <= phys < hi_phys:
                mf = commitlog.mfq.find(phys)
                if mf is None:
                    removed += 1
                    taken += 1
                    continue
                lo_phys, hi_phys, mm, base = mf.file_from_offset, mf.file_end_offset, mf.mm, mf.file_from_offset
            m = check_one(mm, phys - base, size, topic_b, queue_id, queue_offset + taken, broker)
            taken += 1
            if m.__class__ is str:
                skipped += 1
                read_check.SKIPPED.note(broker, topic, queue_id, queue_offset + taken - 1, phys, m)
                continue
            msgs.append(m)
            nbytes += size
    return GetResult(_status(msgs, removed), msgs, queue_offset + taken, lo, hi, skipped)


def _get_all_native(cq, commitlog, queue_offset: int, max_count: int, max_bytes: int, broker: str,
                    lo: int, hi: int) -> GetResult:
    """:func:`_get_all` with its per-entry loop in C (``read_check.NATIVE.take``: the records it
    accepts become MessageExts there, with the GIL released while it checks); what it hands back — an
    entry in another commitlog file, a record it does not accept — is done here as ``_get_all`` does
    it. Same result as ``_get_all`` (tests/store/test_read_native.py)."""
    take = read_check.NATIVE.take
    msgs: list[MessageExt] = []
    cl_min = commitlog.min_offset()
    nbytes = removed = taken = skipped = 0
    mf = commitlog.mfq.last()       # a guess: a consumer near the end reads the newest file
    lo_phys, hi_phys, mm, base = (0, 0, None, 0) if mf is None else \
        (mf.file_from_offset, mf.file_end_offset, mf.mm, mf.file_from_offset)
    full = False
    topic, queue_id = cq.topic, cq.queue_id
    topic_b = topic.encode()
    while taken < max_count and queue_offset + taken < hi and not full:
        first = queue_offset + taken
        ents = cq.entries(first, max_count - taken)   # within one consume-queue file
        n = len(ents)
        if not n:
            break
        if ents.dtype != R.CQ_ENTRY or not ents.flags.c_contiguous:    # tail entries joined: native order
            ents = np.ascontiguousarray(ents, R.CQ_ENTRY)
        i = 0
        while True:
            i, why, nbytes, rem = take(ents, i, mm, lo_phys, hi_phys, cl_min, first, topic_b, queue_id, max_bytes,
                                       nbytes, broker, msgs)
            removed += rem
            if why == _TAKE_DONE:
                break
            if why == _TAKE_FULL:
                full = True
                break
            phys, size = ents[i][["phys_offset", "size"]].item()
            if why == _TAKE_OTHER_FILE:
                mf = commitlog.mfq.find(phys)
                if mf is None:
                    removed += 1
                    i += 1
                    continue
                lo_phys, hi_phys, mm, base = mf.file_from_offset, mf.file_end_offset, mf.mm, mf.file_from_offset
                continue
            m = read_check.py_check_one(mm, phys - base, size, topic_b, queue_id, first + i, broker)   # _TAKE_ASK
            i += 1
            if m.__class__ is str:
                skipped += 1
                read_check.SKIPPED.note(broker, topic, queue_id, first + i - 1, phys, m)
                continue
            msgs.append(m)
            nbytes += size
        taken += i
    return GetResult(_status(msgs, removed), msgs, queue_offset + taken, lo, hi, skipped)


_TAKE_DONE, _TAKE_FULL, _TAKE_OTHER_FILE = (0, 1, 2) if read_check.NATIVE is None else (
    read_check.NATIVE.TAKE_DONE, read_check.NATIVE.TAKE_FULL, read_check.NATIVE.TAKE_OTHER_FILE)


class MessageBatch:
    """Messages of one queue for bulk consumers; bodies are views into the mapped store.

    ``bodies[i]`` is a memoryview valid until the next poll (decompressed bytes for a compressed
    body); ``queue_offsets``, ``store_timestamps_ms`` and ``body_lengths`` are int64 arrays (the
    last two gathered from the records on first use, for all messages at once); ``b[i]`` builds a
    MessageExt on demand.
    """

    def __init__(self, queue: MessageQueue, queue_offsets: np.ndarray, files: list, file_index,
                 rel_pos: np.ndarray, sizes: np.ndarray, status: GetStatus = GetStatus.FOUND,
                 next_offset: int = 0, skipped: int = 0) -> None:
        self.queue = queue
        self.queue_offsets = queue_offsets
        self.status = status
        self.next_offset = next_offset
        self.skipped = skipped          # records passed over because they cannot be decoded (read_check)
        self._files = files            # MappedFiles the messages live in
        self._file = file_index        # per message index into _files, or None: all in _files[0]
        self._pos = rel_pos            # record position inside its file
        self._sizes = sizes
        self._cache: dict[str, np.ndarray] = {}
        self._bodies: _Bodies | None = None

    @property
    def bodies(self) -> "_Bodies":
        """The bodies, ``bodies[i]`` a view (made on first use: a batch whose bodies are taken with
        ``bodies_joined`` holds no reference cycle, so its arrays go back to the allocator when it
        goes, still warm in the cache, instead of waiting for the garbage collector)."""
        if self._bodies is None:
            self._bodies = _Bodies(self)
        return self._bodies

    def __len__(self) -> int:
        return len(self.queue_offsets)

    def _field(self, name: str, at: int, width: int) -> np.ndarray:
        v = self._cache.get(name)
        if v is None:
            if self._file is None:
                v = self._files[0].read_be(self._pos + at, width).astype(np.int64) if len(self) else \
                    np.empty(0, np.int64)
            else:
                v = np.empty(len(self), np.int64)
                for k, mf in enumerate(self._files):
                    sel = self._file == k
                    v[sel] = mf.read_be(self._pos[sel] + at, width)
            self._cache[name] = v
        return v

    @property
    def store_timestamps_ms(self) -> np.ndarray:
        return self._field("store_ts", _STORE_TS_AT, 8)

    @property
    def body_lengths(self) -> np.ndarray:
        return self._field("body_len", _BODY_LEN_AT, 4)

    @property
    def sys_flags(self) -> np.ndarray:
        return self._field("sys_flag", _SYSFLAG_AT, 4)

    def _mm(self, i: int):
        return self._files[0 if self._file is None else int(self._file[i])].mm

    def __getitem__(self, i: int) -> MessageExt:
        p = int(self._pos[i])
        return MessageExt(self._mm(i)[p:p + int(self._sizes[i])], self.queue.broker)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def headers(self) -> np.ndarray:
        """Every message's record header, gathered at once into a ``records.MSG_HEADER_DTYPE`` array."""
        n, size = len(self), R.MSG_HEADER.size
        out = np.empty(n, R.MSG_HEADER_DTYPE)
        raw = out.view(np.uint8).reshape(n, size)
        span = np.arange(size, dtype=np.int64)
        for k, mf in enumerate(self._files):
            sel = slice(None) if self._file is None else self._file == k
            raw[sel] = np.frombuffer(mf.mm, np.uint8)[self._pos[sel][:, None] + span]
        return out

    def bodies_and_properties(self, headers: np.ndarray, topic_bytes: int) -> tuple[list, list]:
        """Each message's body (decompressed if it was) and encoded properties, as bytes; the topic
        length is the queue's (every record of a queue carries its topic)."""
        blen = headers["body_length"].astype(np.int64)
        body_at = self._pos + R.MSG_HEADER.size
        props_len_at = body_at + blen + R.TOPIC_LEN.size + topic_bytes
        plen = np.empty(len(self), np.int64)
        for k, mf in enumerate(self._files):
            sel = slice(None) if self._file is None else self._file == k
            buf = np.frombuffer(mf.mm, np.uint8)
            at = props_len_at[sel]
            plen[sel] = buf[at].astype(np.int64) * 256 + buf[at + 1]
        props_at = props_len_at + R.PROPS_LEN.size
        which = [0] * len(self) if self._file is None else self._file.tolist()
        mms = [mf.mm for mf in self._files]
        bodies = [mms[f][s:s + n] for f, s, n in zip(which, body_at.tolist(), blen.tolist())]
        compressed = np.flatnonzero(headers["sys_flag"] & R.SYSFLAG_COMPRESSED)
        for i in compressed.tolist():
            bodies[i] = R.decompress_body(bodies[i])
        props = [mms[f][s:s + n] for f, s, n in zip(which, props_at.tolist(), plen.tolist())]
        return bodies, props

    def bodies_joined(self) -> tuple[np.ndarray, np.ndarray]:
        """Every body in one uint8 array (compressed ones inflated) and ``len(b) + 1`` int64 offsets:
        body ``i`` is ``joined[offsets[i]:offsets[i + 1]]``. One copy for the whole batch and no Python
        object per message (``hostmq/store/_read.c`` copies; numpy where it was not built) — the
        columnar way to read a batch's bodies; the copy outlives the next poll."""
        n = len(self)
        if read_check.NATIVE is not None and self._file is None and n:
            offsets = np.empty(n + 1, np.int64)
            mm = self._files[0].mm
            total = read_check.NATIVE.body_offsets(mm, self._pos, self._sizes, offsets)
            if total >= 0:              # one file, nothing compressed: two passes in C
                joined = np.empty(total, np.uint8)
                read_check.NATIVE.copy_bodies(mm, self._pos, offsets, joined)
                return joined, offsets
        stored = self.body_lengths
        lens = stored.copy()
        compressed = np.flatnonzero(self.sys_flags & R.SYSFLAG_COMPRESSED).tolist() if n else []
        inflated = {i: self.bodies[i] for i in compressed}
        for i, data in inflated.items():
            lens[i] = len(data)
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(lens, out=offsets[1:])
        joined = np.empty(int(offsets[-1]), np.uint8)
        starts = self._pos + R.MSG_HEADER.size
        plain = np.ones(n, bool)
        plain[compressed] = False
        for k, mf in enumerate(self._files):
            sel = plain if self._file is None else plain & (self._file == k)
            s, ln, at = (np.ascontiguousarray(x[sel], np.int64) for x in (starts, stored, offsets[:-1]))
            if read_check.NATIVE is not None:
                read_check.NATIVE.gather(mf.mm, s, ln, at, joined)
            elif len(s):
                total = int(ln.sum())
                shift = np.repeat(s - (np.cumsum(ln) - ln), ln)         # per byte: source - destination rank
                rank = np.arange(total, dtype=np.int64)
                joined[np.repeat(at - (np.cumsum(ln) - ln), ln) + rank] = mf.u8[shift + rank]
        for i, data in inflated.items():
            joined[offsets[i]:offsets[i + 1]] = np.frombuffer(data, np.uint8)
        return joined, offsets

    def record_view(self, i: int) -> memoryview:
        p = int(self._pos[i])
        return memoryview(self._mm(i))[p:p + int(self._sizes[i])]


class _Bodies:
    """Sequence of body views, built on access so a batch of 4096 costs no per-message objects."""

    def __init__(self, batch: MessageBatch) -> None:
        self._b = batch

    def __len__(self) -> int:
        return len(self._b)

    def __getitem__(self, i: int):
        b = self._b
        if i < 0:
            i += len(b)
        if not 0 <= i < len(b):
            raise IndexError(i)
        start = int(b._pos[i]) + R.MSG_HEADER.size
        view = memoryview(b._mm(i))[start:start + int(b.body_lengths[i])]
        if b.sys_flags[i] & R.SYSFLAG_COMPRESSED:
            return R.decompress_body(bytes(view))
        return view

    def __iter__(self):
        b = self._b
        lens, flags = b.body_lengths.tolist(), b.sys_flags
        starts = (b._pos + R.MSG_HEADER.size).tolist()
        views = [memoryview(mf.mm) for mf in b._files]
        if b._file is None and not (flags & R.SYSFLAG_COMPRESSED).any():     # one file, nothing to inflate
            v = views[0] if views else None
            return iter([v[s:s + n] for s, n in zip(starts, lens)])
        return self._each(views, starts, lens, flags.tolist())

    def _each(self, views, starts, lens, flags):
        b = self._b
        which = [0] * len(b) if b._file is None else b._file.tolist()
        for f, s, n, fl in zip(which, starts, lens, flags):
            v = views[f][s:s + n]
            yield R.decompress_body(bytes(v)) if fl & R.SYSFLAG_COMPRESSED else v


def get_batch(cq, commitlog, queue: MessageQueue, queue_offset: int, max_count: int) -> MessageBatch:
    """Up to ``max_count`` messages from ``queue_offset`` as a zero-copy :class:`MessageBatch`."""
    empty = np.empty(0, np.int64)
    if cq is None:
        return MessageBatch(queue, empty, [], None, empty, empty, GetStatus.NO_MESSAGE_IN_QUEUE, 0)
    early = check_offset(queue_offset, cq.min_offset(), cq.max_offset())
    if early:
        return MessageBatch(queue, empty, [], None, empty, empty, *early)
    ents = cq.entries(queue_offset, max_count)
    scanned = len(ents)
    if not scanned:                 # no consume-queue file holds the offset: nothing to read here
        return MessageBatch(queue, empty, [], None, empty, empty, GetStatus.NO_MESSAGE_IN_QUEUE, queue_offset)
    nxt = queue_offset + scanned
    cl_min = commitlog.min_offset()
    if read_check.NATIVE is not None:       # the common case in one pass (hostmq/store/_read.c batch_rows)
        if ents.dtype != R.CQ_ENTRY or not ents.flags.c_contiguous:    # tail entries joined: native order
            ents = np.ascontiguousarray(ents, R.CQ_ENTRY)
        mf = commitlog.mfq.find(_CQ_PHYS.unpack_from(ents.data, 0)[0])
        if mf is not None:
            rel, sizes, offsets = (np.empty(scanned, np.int64) for _ in range(3))
            ok = np.empty(scanned, bool)
            topic_b = queue.topic.encode()
            refused = read_check.NATIVE.batch_rows(ents, mf.mm, mf.file_from_offset, mf.file_end_offset, cl_min,
                                                   queue_offset, topic_b, queue.queue_id, rel, sizes, offsets, ok)
            if refused >= 0:
                skipped = _skips(queue, mf, rel, sizes, offsets, ok, refused)
                if skipped:
                    rel, sizes, offsets = rel[ok], sizes[ok], offsets[ok]
                status = GetStatus.FOUND if len(offsets) else GetStatus.NO_MATCHED_MESSAGE
                return MessageBatch(queue, offsets, [mf], None, rel, sizes, status, nxt, skipped)
    phys = ents["phys_offset"].astype(np.int64)
    sizes = ents["size"].astype(np.int64)
    offsets = np.arange(queue_offset, queue_offset + scanned, dtype=np.int64)
    mf = commitlog.mfq.find(int(phys[0]))
    if mf is not None and phys[0] >= cl_min and (phys >= mf.file_from_offset).all() and \
            (phys < mf.file_end_offset).all():
        rel = phys - mf.file_from_offset
        ok, skipped = _checked(queue, mf, rel, sizes, offsets)
        if skipped:
            rel, sizes, offsets = rel[ok], sizes[ok], offsets[ok]
        status = GetStatus.FOUND if len(offsets) else GetStatus.NO_MATCHED_MESSAGE
        return MessageBatch(queue, offsets, [mf], None, rel, sizes, status, nxt, skipped)
    # Spans commitlog files, or starts in data retention already deleted.
    files = commitlog.mfq.files
    starts = np.fromiter((f.file_from_offset for f in files), dtype=np.int64, count=len(files))
    fidx = np.searchsorted(starts, phys, side="right") - 1
    live = (fidx >= 0) & (phys >= cl_min)
    phys, sizes, fidx, offsets = phys[live], sizes[live], fidx[live], offsets[live]
    rel = phys - starts[fidx]
    ok, skipped = np.ones(len(rel), bool), 0
    for k in np.unique(fidx).tolist():
        sel = np.flatnonzero(fidx == k)
        ok[sel], n = _checked(queue, files[k], rel[sel], sizes[sel], offsets[sel])
        skipped += n
    if skipped:
        rel, sizes, fidx, offsets = rel[ok], sizes[ok], fidx[ok], offsets[ok]
    used = np.unique(fidx)
    status = GetStatus.FOUND if len(offsets) else \
        GetStatus.NO_MATCHED_MESSAGE if skipped else GetStatus.MESSAGE_WAS_REMOVING
    return MessageBatch(queue, offsets, [files[k] for k in used.tolist()], np.searchsorted(used, fidx), rel,
                        sizes, status, nxt, skipped)


def _checked(queue: MessageQueue, mf, rel: np.ndarray, sizes: np.ndarray,
             offsets: np.ndarray) -> tuple[np.ndarray, int]:
    """Mask of the rows of mapped file ``mf`` that decode (``read_check.check_rows``) and how many
    do not; those are logged once (``read_check.SKIPPED``)."""
    ok = check_rows(mf, rel, sizes, offsets, queue.topic.encode(), queue.queue_id)
    return ok, _skips(queue, mf, rel, sizes, offsets, ok, None)


def _skips(queue: MessageQueue, mf, rel: np.ndarray, sizes: np.ndarray, offsets: np.ndarray, ok: np.ndarray,
           refused: int | None) -> int:
    """How many rows ``ok`` refuses, each logged once with its commitlog offset (``read_check.SKIPPED``;
    rows of ``mf``, so ``mf.file_from_offset + rel``). ``refused``: how many
    the native check left undecided (``batch_rows``) — the spec judges those first, as ``check_rows``
    does (None: ``ok`` is already the verdict)."""
    topic_b = queue.topic.encode()
    if refused:
        for r in np.flatnonzero(~ok).tolist():
            ok[r] = read_check.py_check_one(mf.mm, int(rel[r]), int(sizes[r]), topic_b, queue.queue_id,
                                            int(offsets[r]), "").__class__ is MessageExt
    elif refused is not None:
        return 0
    bad = np.flatnonzero(~ok).tolist()
    for i in bad:
        why = why_not(mf, int(rel[i]), int(sizes[i]), topic_b, queue.queue_id, int(offsets[i]))
        read_check.SKIPPED.note(queue.broker, queue.topic, queue.queue_id, int(offsets[i]),
                                mf.file_from_offset + int(rel[i]), why)
    return len(bad)


def store_ts_at(commitlog, phys_offset: int) -> int:
    mf = commitlog.mfq.find(phys_offset)
    return struct.unpack_from(">q", mf.mm, phys_offset - mf.file_from_offset + _STORE_TS_AT)[0]
