"""The writer's side of an ingress ring (``hostmq.ingress.ring``): taking frames, completing them,
releasing ring bytes, and the journal that makes a writer restart exactly-once.

Kept apart from the producer's side only for size: :class:`WriterSide` is a part of
:class:`~hostmq.ingress.ring.IngressRing` and uses its geometry and cursors. Every word written here is a
writer-owned word of the ring header (``records.RING_HEADER`` line 2) or a completion entry.
"""
from __future__ import annotations

from typing import Iterable, NamedTuple

import numpy as np

from .. import records as R

HDR = R.FRAME_HEADER.size
_W = R.RING_WORD
_WRITE_POS = _W["data_write_pos"]
_COMP_READ_POS = _W["completion_read_pos"]


def _align8(n: int) -> int:
    return (n + 7) & ~7


class Frame(NamedTuple):
    """One frame handed to the writer; ``payload`` is a writable view of a private copy of the ring
    bytes (the producer cannot change it any more)."""

    kind: int
    seq: int
    record_count: int
    payload: memoryview
    flags: int


class FrameBatch(list):
    """Frames returned by one :meth:`IngressRing.frames` call; ``nbytes`` = ring bytes they cover."""

    nbytes: int = 0


class WriterSide:
    """Writer-side methods of :class:`~hostmq.ingress.ring.IngressRing` (see the module docstring)."""

    def has_frames(self) -> bool:
        """Whether :meth:`frames` would return something now (the writer's wait predicate): frames
        beyond what was handed out are visible and a completion slot is free for them."""
        q = self._q
        return q[_WRITE_POS] != self._hpos and \
            self._cstaged - q[_COMP_READ_POS] + self._uncompleted < self.completion_entries

    def frames(self, max_bytes: int = 1 << 62) -> FrameBatch:
        """Every visible frame not handed out yet (at least one, then up to ``max_bytes`` of ring).

        The ring bytes are first copied to private memory and only the copy is parsed: payloads are
        views of that copy, which the producer can no longer change (and the writer may patch).
        Raises RingCorruptError for impossible cursors or frame headers.
        """
        q = self._q
        w = q[_WRITE_POS]
        pos = start = self._hpos
        out = FrameBatch()
        if w == pos:
            return out
        if w < pos or w - self._rpos > self.capacity or w & 7:
            raise self._corrupt(pos, f"write cursor {w} with read cursor {self._rpos}")
        cr = q[_COMP_READ_POS]
        cw_used = self._cstaged - cr
        if not 0 <= cw_used <= self.completion_entries or cr > self._cwpos:
            raise self._corrupt(pos, f"completion read cursor {cr} with write cursor {self._cwpos}")
        budget = self.completion_entries - cw_used - self._uncompleted
        mask, cap, unpack = self._mask, self.capacity, R.FRAME_HEADER.unpack_from
        max_fb, min_rec, append, new = self.max_frame_bytes, R.MIN_RECORD_BYTES, out.append, tuple.__new__
        # The copy covers [base, copied); a frame that reaches past it gets a fresh copy from its own
        # start (earlier frames keep their views of the earlier copy).
        base, copied = start, min(w, start + max_bytes)
        priv = self._copy(base, copied)
        view = memoryview(priv)
        recopies = 0
        while pos < w and budget > 0 and (not out or pos - start < max_bytes):
            off = pos & mask
            to_end = cap - off
            if to_end < HDR:
                if w - pos <= to_end:
                    raise self._corrupt(pos, "write cursor inside the unused tail of the ring")
                pos += to_end
                continue
            if w - pos < HDR:
                raise self._corrupt(pos, "write cursor cuts a frame header")
            if pos + HDR > copied:
                base, copied = pos, min(w, pos + max(HDR, max_bytes - (pos - start)))
                priv = self._copy(base, copied)
                view = memoryview(priv)
            fb, kind, seq, count, flags = unpack(priv, pos - base)
            if kind == R.FRAME_SKIP:
                if fb != to_end or count != 0 or w - pos < to_end:
                    raise self._corrupt(pos, f"skip frame of {fb} bytes with {to_end} to the end")
                pos += to_end
                continue
            if not (HDR < fb <= to_end and fb <= max_fb and ((fb + 7) & ~7) <= w - pos
                    and (count == 1 if kind == R.FRAME_MESSAGE else kind == R.FRAME_BATCH and count >= 1)
                    and count * min_rec <= fb - HDR):
                raise self._corrupt(pos, self._bad_header(fb, kind, count, to_end, w - pos))
            if pos + fb > copied:       # the frame reaches past the copy: copy it whole, parse again
                recopies += 1
                if recopies > 2:        # its header keeps changing: the producer rewrites published bytes
                    raise self._corrupt(pos, "frame header changed while it was being copied")
                base, copied = pos, min(w, pos + max(fb, max_bytes - (pos - start)))
                priv = self._copy(base, copied)
                view = memoryview(priv)
                continue
            recopies = 0
            rel = pos - base
            append(new(Frame, (kind, seq, count, view[rel + HDR:rel + fb], flags)))
            pos += (fb + 7) & ~7
            budget -= 1
        self._hpos = pos
        self._uncompleted += len(out)
        out.nbytes = pos - start
        return out

    def _copy(self, start: int, end: int) -> bytearray:
        """Ring bytes of positions [start, end) as a private bytearray (two pieces if they wrap)."""
        n = end - start
        buf = bytearray(n)
        off = start & self._mask
        first = min(n, self.capacity - off)
        buf[:first] = self._data[off:off + first]
        if n > first:
            buf[first:] = self._data[:n - first]
        return buf

    def _bad_header(self, fb: int, kind: int, count: int, to_end: int, visible: int) -> str:
        if kind not in (R.FRAME_MESSAGE, R.FRAME_BATCH):
            return f"unknown frame kind {kind}"
        if not HDR < fb <= min(to_end, self.max_frame_bytes) or _align8(fb) > visible:
            return f"frame of {fb} bytes does not fit (to end {to_end}, published {visible})"
        if count < 1 or (kind == R.FRAME_MESSAGE and count != 1) or count * R.MIN_RECORD_BYTES > fb - HDR:
            return f"{count} records in a kind {kind} frame of {fb} bytes"
        return ""

    def release(self, nbytes: int | None = None) -> None:
        """Give ring bytes back to the producer: everything handed out, or the first ``nbytes`` of it
        (a sum of whole frames' ring bytes, e.g. an earlier batch's ``nbytes``)."""
        new = self._hpos if nbytes is None else self._rpos + nbytes
        if not self._rpos <= new <= self._hpos:
            raise ValueError(f"release of {nbytes} bytes; {self._hpos - self._rpos} handed out")
        self._rpos = new
        self._q[_W["data_read_pos"]] = new                 # publish

    def release_to(self, data_pos: int) -> None:
        """Give ring bytes back up to the absolute data position ``data_pos`` (a frame boundary at or
        below what was handed out, e.g. a journalled ``handed_position``)."""
        self.release(data_pos - self._rpos)

    def restatus(self, start: int, end: int, status: int) -> None:
        """Change the status of staged, unpublished completions in [start, end) that say SEND_OK
        (SYNC_FLUSH: FLUSH_DISK_TIMEOUT after the group commit timed out)."""
        if not self._cwpos <= start <= end <= self._cstaged:
            raise ValueError(f"restatus [{start}, {end}) outside staged [{self._cwpos}, {self._cstaged})")
        statuses = self._comp["status"]
        for pos in range(start, end):
            if statuses[pos & self._cmask] == R.COMPLETION_SEND_OK:
                statuses[pos & self._cmask] = status

    def stage(self, entries: np.ndarray | Iterable[tuple]) -> None:
        """Write completions (``records.COMPLETION`` array or tuples), one per frame handed out, in
        frame order, WITHOUT publishing them: the producer sees them after :meth:`publish_completions`."""
        arr = entries if isinstance(entries, np.ndarray) else np.array(list(entries), dtype=R.COMPLETION)
        n = len(arr)
        if n > self._uncompleted:
            raise ValueError(f"{n} completions for {self._uncompleted} uncompleted frames")
        if n == 0:
            return
        i = self._cstaged & self._cmask
        first = min(n, self.completion_entries - i)
        self._comp[i:i + first] = arr[:first]
        if n > first:
            self._comp[:n - first] = arr[first:]
        self._cstaged += n
        self._uncompleted -= n

    def stage_one(self, seq: int, status: int, record_count: int, queue_offset: int,
                  phys_offset: int, store_ts_ms: int) -> None:
        """Stage one completion without building an array."""
        if self._uncompleted < 1:
            raise ValueError("no uncompleted frame")
        self._comp[self._cstaged & self._cmask] = (seq, status, record_count, queue_offset, phys_offset,
                                                    store_ts_ms)
        self._cstaged += 1
        self._uncompleted -= 1

    @property
    def staged_position(self) -> int:
        """End of the staged completions (a value for :meth:`publish_completions`)."""
        return self._cstaged

    @property
    def handed_position(self) -> int:
        """Data position up to which frames were handed out (a value for :meth:`journal`)."""
        return self._hpos

    @property
    def published_position(self) -> int:
        """End of the completions the producer can see."""
        return self._cwpos

    @property
    def released_position(self) -> int:
        """Data position up to which ring bytes were given back to the producer."""
        return self._rpos

    def publish_completions(self, upto: int | None = None) -> None:
        """Make staged completions visible to the producer, all of them or those below ``upto``."""
        new = self._cstaged if upto is None else upto
        if not self._cwpos <= new <= self._cstaged:
            raise ValueError(f"publish up to {new}: published {self._cwpos}, staged {self._cstaged}")
        self._cwpos = new
        self._q[_W["completion_write_pos"]] = new          # publish

    def journal(self, appended_data_pos: int, staged_completion_pos: int) -> None:
        """Record (writer-owned words) that frames below ``appended_data_pos`` are in the commitlog and
        their completions are staged below ``staged_completion_pos``; a successor writer resumes there."""
        self._q[_W["staged_completion_pos"]] = staged_completion_pos
        self._q[_W["appended_data_pos"]] = appended_data_pos

    def complete(self, entries: np.ndarray | Iterable[tuple]) -> None:
        """Stage and publish completions at once."""
        self.stage(entries)
        self.publish_completions()

    def complete_one(self, seq: int, status: int, record_count: int, queue_offset: int,
                     phys_offset: int, store_ts_ms: int) -> None:
        """Publish one completion without building an array."""
        self.stage_one(seq, status, record_count, queue_offset, phys_offset, store_ts_ms)
        self.publish_completions()

    def mark_dropped(self) -> None:
        """Writer: stop serving this ring (after RingCorruptError); the producer sees ``dropped`` and,
        if it sleeps on its completion word, is woken — without moving that word: it is the
        completion cursor, and a bump would hand the producer a stale completion slot as an answer."""
        self._q[_W["writer_state"]] = R.RING_STATE_DROPPED
        self.completion_word.wake()
