"""The read side: consume-queue entries + commitlog bytes → messages (RocketMQ getMessage).

Two shapes: :func:`get_messages` builds one :class:`~hostmq.message.MessageExt` per message (each a
private copy of its record, so it outlives the store); :func:`get_batch` builds a
:class:`MessageBatch` whose bodies are zero-copy views into the mapped commitlog, with offsets and
timestamps as numpy arrays, for bulk consumers. Neither writes anything.
"""
from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field

import numpy as np

from .. import records as R
from ..client.filter import TagFilter
from ..message import MessageExt, MessageQueue

_BODY_LEN_AT = R.FIELD["body_length"]
_STORE_TS_AT = R.FIELD["store_ts_ms"]
_SYSFLAG_AT = R.FIELD["sys_flag"]
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
    msgs: list[MessageExt] = []
    nbytes = 0
    nxt = queue_offset
    removed = 0
    cl_min = commitlog.min_offset()
    mf = None
    while len(msgs) < max_count and nxt < hi:
        ents = cq.entries(nxt, max(max_count - len(msgs), _SCAN_ENTRIES) if not tag_filter.match_all
                          else max_count - len(msgs))
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
            pos = phys - mf.file_from_offset
            m = MessageExt(mf.mm[pos:pos + size], broker)
            if not tag_filter.match_all and not tag_filter.match_tag(m.tags):
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
    if msgs:
        status = GetStatus.FOUND
    elif removed:
        status = GetStatus.MESSAGE_WAS_REMOVING
    else:
        status = GetStatus.NO_MATCHED_MESSAGE
    return GetResult(status, msgs, nxt, lo, hi)


class MessageBatch:
    """Messages of one queue for bulk consumers; bodies are views into the mapped store.

    ``bodies[i]`` is a memoryview valid until the next poll (decompressed bytes for a compressed
    body); ``queue_offsets`` and ``store_timestamps_ms`` are int64 arrays; ``b[i]`` builds a
    MessageExt on demand.
    """

    def __init__(self, queue: MessageQueue, queue_offsets: np.ndarray, store_timestamps_ms: np.ndarray,
                 file_views: list, file_index: np.ndarray, rel_pos: np.ndarray, sizes: np.ndarray,
                 body_lengths: np.ndarray, sys_flags: np.ndarray, status: GetStatus = GetStatus.FOUND,
                 next_offset: int = 0) -> None:
        self.queue = queue
        self.queue_offsets = queue_offsets
        self.store_timestamps_ms = store_timestamps_ms
        self.body_lengths = body_lengths
        self.sys_flags = sys_flags
        self.status = status
        self.next_offset = next_offset
        self._views = file_views
        self._file = file_index
        self._pos = rel_pos
        self._sizes = sizes
        self.bodies = _Bodies(self)

    def __len__(self) -> int:
        return len(self.queue_offsets)

    def __getitem__(self, i: int) -> MessageExt:
        f, p, s = int(self._file[i]), int(self._pos[i]), int(self._sizes[i])
        return MessageExt(bytes(self._views[f][p:p + s]), self.queue.broker)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def record_view(self, i: int) -> memoryview:
        f, p = int(self._file[i]), int(self._pos[i])
        return self._views[f][p:p + int(self._sizes[i])]


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
        view = b._views[int(b._file[i])][start:start + int(b.body_lengths[i])]
        if b.sys_flags[i] & R.SYSFLAG_COMPRESSED:
            return R.decompress_body(bytes(view))
        return view

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def _gather_be(u8: np.ndarray, pos: np.ndarray, at: int, dtype: str) -> np.ndarray:
    """Read one big-endian field at ``pos + at`` for many records at once."""
    width = np.dtype(dtype).itemsize
    return u8[(pos + at)[:, None] + np.arange(width)].view(dtype).ravel()


def get_batch(cq, commitlog, queue: MessageQueue, queue_offset: int, max_count: int) -> MessageBatch:
    """Up to ``max_count`` messages from ``queue_offset`` as a zero-copy :class:`MessageBatch`."""
    empty = np.empty(0, np.int64)

    def nothing(status: GetStatus, nxt: int) -> MessageBatch:
        return MessageBatch(queue, empty, empty, [], empty, empty, empty, empty, empty, status, nxt)

    if cq is None:
        return nothing(GetStatus.NO_MESSAGE_IN_QUEUE, 0)
    early = check_offset(queue_offset, cq.min_offset(), cq.max_offset())
    if early:
        return nothing(*early)
    ents = cq.entries(queue_offset, max_count)
    scanned = len(ents)
    phys = ents["phys_offset"].astype(np.int64)
    sizes = ents["size"].astype(np.int64)
    files = commitlog.mfq.files
    starts = np.fromiter((f.file_from_offset for f in files), dtype=np.int64, count=len(files))
    fidx = np.searchsorted(starts, phys, side="right") - 1
    live = (fidx >= 0) & (phys >= commitlog.min_offset())
    if not live.all():          # entries whose data retention already deleted are skipped
        phys, sizes, fidx, ents = phys[live], sizes[live], fidx[live], ents[live]
    offsets = queue_offset + np.flatnonzero(live).astype(np.int64)
    rel = phys - starts[fidx] if len(fidx) else phys
    n = len(phys)
    blen = np.empty(n, np.int64)
    sts = np.empty(n, np.int64)
    sflag = np.empty(n, np.int64)
    for k in np.unique(fidx).tolist():
        sel = fidx == k
        u8 = files[k].u8
        blen[sel] = _gather_be(u8, rel[sel], _BODY_LEN_AT, ">i4")
        sts[sel] = _gather_be(u8, rel[sel], _STORE_TS_AT, ">i8")
        sflag[sel] = _gather_be(u8, rel[sel], _SYSFLAG_AT, ">i4")
    fmap = {k: i for i, k in enumerate(np.unique(fidx).tolist())}
    views = [memoryview(files[k].mm) for k in fmap]
    local = np.array([fmap[k] for k in fidx.tolist()], np.int64) if len(fmap) > 1 else np.zeros(n, np.int64)
    status = GetStatus.FOUND if n else GetStatus.MESSAGE_WAS_REMOVING
    return MessageBatch(queue, offsets, sts, views, local, rel, sizes, blen, sflag, status,
                        queue_offset + scanned)


def store_ts_at(commitlog, phys_offset: int) -> int:
    mf = commitlog.mfq.find(phys_offset)
    return struct.unpack_from(">q", mf.mm, phys_offset - mf.file_from_offset + _STORE_TS_AT)[0]
