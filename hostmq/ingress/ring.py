"""Ingress ring: one producer session → the broker's writer, in one sealed memfd segment
(docs/internals.md: processes, shared-memory rules).

Layout (declared in :mod:`hostmq.records`, "Shared-memory layouts"): segment header page, then the
ring header (cursors, waiting flags, states — one cache line per side), the completion ring
(``COMPLETION`` entries, writer → producer) and the page-aligned data ring (``FRAME``\\ s, producer →
writer). Capacities are powers of two; cursors are monotonic int64 counters (bytes for data,
entries for completions) and the index into a ring is ``pos & (capacity - 1)``.

Ownership — who writes what (every word has exactly one writer):

* the **producer** (creator and owner of the segment) writes frames, ``data_write_pos``,
  ``completion_read_pos``, ``producer_waiting`` and ``producer_state``;
* the **writer** (attacher; the only commitlog appender) writes completion entries,
  ``data_read_pos``, ``completion_write_pos``, ``writer_waiting`` and ``writer_state``.

Publishing: bytes first (payload, then frame header, with ``pack_into``/slice copies), then the
cursor with one aligned int64 store (docs/internals.md fact 14). A reader trusts only what lies below the
cursor it loaded — and not even that: the producer can still change published bytes, so
:meth:`IngressRing.frames` first copies the range it hands out into private memory and parses and
validates only the copy (a check of ring memory followed by a copy of it would let a producer swap
the bytes in between).

Wake-ups: the producer wakes the writer through the broker's doorbell (a futex word in a memfd the
broker shares with its clients); the writer wakes the producer through the futex of the
``completion_write_pos`` word itself (:attr:`IngressRing.completion_word`), which it changes by
publishing completions. The ring never overwrites: a producer's :meth:`IngressRing.reserve` returns None
when the data ring lacks room *or* when as many frames are awaiting completion as the completion
ring holds; the writer's :meth:`IngressRing.frames` independently never hands out a frame it would
have no completion slot for, so a misbehaving producer cannot make it overwrite completions.

Frames are never split: a frame that does not fit before the end of the ring is preceded by a
SKIP frame padding to the end (or, if fewer than 24 bytes remain, by an implicit skip with no
header), and starts at offset 0. Capacity is at least twice the largest frame.

Writer protocol per ring: ``batch = ring.frames()`` (views of a private copy) → append the records
→ ``ring.complete(entries)`` (one entry per frame, in order) → ``ring.release()`` →
``notify_if_waiting(ring.producer_waiting, ring.completion_word, bump=False)``. (The broker's
writer adds a journal, ``hostmq.broker.writer``, which makes a writer restart exactly-once.) Without
the journal, a writer killed between complete and release re-appends the unreleased frames after its
restart (at-least-once, like a RocketMQ retry) and the producer sees a second completion for a seq it
already resolved — it must ignore completions for seqs it no longer waits for. Such duplicates
only make the producer's in-flight count low; the writer's own completion-slot check still keeps
the completion ring from being overrun (that ring then waits for the producer to read).

The segment is a memfd sealed against shrinking (``Segment.create_memfd``): the producer passes its
descriptor to the broker, which maps it with ``Segment.from_fd`` — a producer cannot truncate it
under the writer (a SIGBUS there would kill the writer), and nothing is left in ``/dev/shm``.

Crash policy: a SIGKILLed producer leaves at most a partly written frame *above* the published
``data_write_pos``; the writer reads every committed frame and nothing else. The writer validates
every frame header and the cursors; anything impossible raises
:class:`~hostmq.errors.RingCorruptError`, after which the writer should ``mark_dropped()`` and
detach that ring (the producer sees ``dropped`` and fails its sends). The broker learns that a
producer died from its session connection (``hostmq.broker.session_server``), not from the ring.

Threads: the ring is single-producer/single-consumer; a producer process with several sending
threads must serialise producer-side calls (reserve/commit/try_write/completions) with its own lock.
"""
from __future__ import annotations

import os

import numpy as np

from .. import records as R
from ..errors import RingCorruptError, ValidationError
from ..shm.futex import FutexWord
from .ring_writer import Frame, FrameBatch, WriterSide  # noqa: F401 (Frame, FrameBatch re-exported)
from ..shm.segment import Segment
from ..shm.signal import Flag
from ..waiting import IDLE_CODES

try:
    from . import _step as _NATIVE
except ImportError:         # not built: the Python paths below
    _NATIVE = None
USE_NATIVE_SEND = _NATIVE is not None and hasattr(_NATIVE, "ring_write") \
    and os.environ.get("HOSTMQ_NATIVE_SEND", "1").lower() not in ("0", "off", "false")
"""Whether a producer writes its frames, waits for its completions and reads them in C (``_step.c``
ring_write, await_completion, take_completions); ``HOSTMQ_NATIVE_SEND=0`` turns it off."""

DEFAULT_DATA_BYTES = 16 * 1024 * 1024
DEFAULT_COMPLETION_ENTRIES = 32768
MIN_DATA_BYTES = 4096
HDR = R.FRAME_HEADER.size
_W = R.RING_WORD
_WRITE_POS = _W["data_write_pos"]
_READ_POS = _W["data_read_pos"]
_COMP_READ_POS = _W["completion_read_pos"]
_COMP_WRITE_POS = _W["completion_write_pos"]
_pack_header = R.FRAME_HEADER.pack_into
_EMPTY_COMPLETIONS = np.empty(0, dtype=R.COMPLETION)
_PAGE = 4096


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def ring_geometry(data_bytes: int, completion_entries: int) -> tuple[int, int, int]:
    """``(completion_offset, data_offset, payload_bytes)`` of a ring segment (pure)."""
    if not _pow2(data_bytes) or data_bytes < MIN_DATA_BYTES:
        raise ValidationError(f"ring data_bytes {data_bytes} must be a power of two >= {MIN_DATA_BYTES}")
    if not _pow2(completion_entries):
        raise ValidationError(f"completion_entries {completion_entries} must be a power of two")
    comp_off = R.RING_HEADER.itemsize
    data_off = -(-(comp_off + completion_entries * R.COMPLETION.itemsize) // _PAGE) * _PAGE
    return comp_off, data_off, data_off + data_bytes


def _drop_header(seg: Segment) -> None:
    """Mark a ring dropped and wake its producer through the header words alone (its geometry may be
    impossible, so no :class:`IngressRing` can be built over it)."""
    words = seg.array(np.int64, R.RING_HEADER.itemsize // 8)
    words[_W["writer_state"]] = R.RING_STATE_DROPPED
    FutexWord(words, _COMP_WRITE_POS).wake()
    del words


class IngressRing(WriterSide):
    """A producer's ingress ring (see module docstring). Build with :meth:`create` or :meth:`from_fd`."""

    def __init__(self, segment: Segment) -> None:
        self.segment = segment
        self.name = segment.name
        geo = segment.array(R.RING_HEADER, count=1)[0]
        self.data_offset = int(geo["data_offset"])
        self.capacity = int(geo["data_bytes"])
        self.completion_offset = int(geo["completion_offset"])
        self.completion_entries = int(geo["completion_entries"])
        self.max_frame_bytes = int(geo["max_frame_bytes"])
        del geo
        self._check_geometry()
        self.max_payload_bytes = self.max_frame_bytes - HDR     # largest payload one frame carries
        self._mask = self.capacity - 1
        self._cmask = self.completion_entries - 1
        self._q = segment.buf[:R.RING_HEADER.itemsize].cast("q")
        self._data = segment.buf[self.data_offset:self.data_offset + self.capacity]
        self._comp = segment.array(R.COMPLETION, self.completion_entries, self.completion_offset)
        # The completion ring's bytes, for the writer's native step (ingress/_step.c)
        self._comp_bytes = segment.buf[self.completion_offset:
                                       self.completion_offset + self.completion_entries * R.COMPLETION.itemsize]
        self.producer_waiting = Flag(self._q, _W["producer_waiting"])
        self.writer_waiting = Flag(self._q, _W["writer_waiting"])
        self.completion_word = FutexWord(segment.array(np.int64, R.RING_HEADER.itemsize // 8), _COMP_WRITE_POS)
        q = self._q
        # Producer-side locals (the producer is the only writer of these cursors).
        self._wpos = q[_W["data_write_pos"]]
        self._rpos_seen = q[_W["data_read_pos"]]
        self._crpos = q[_W["completion_read_pos"]]
        self._committed_frames = self._crpos   # frames published; producer sessions start at 0
        self._pending: tuple[int, int, int, int] | None = None
        # Writer-side locals. A writer that attaches resumes from the journal a predecessor left:
        # frames below ``appended_data_pos`` are already in the commitlog and are not handed out again.
        self._rpos = q[_W["data_read_pos"]]     # released
        self._cwpos = q[_W["completion_write_pos"]]
        self._hpos = max(self._rpos, q[_W["appended_data_pos"]])       # handed out by frames()
        self._cstaged = max(self._cwpos, q[_W["staged_completion_pos"]])
        self._uncompleted = 0                   # handed out, no completion staged yet

    # -- construction ----------------------------------------------------------------------------
    @classmethod
    def create(cls, name: str, data_bytes: int = DEFAULT_DATA_BYTES,
               completion_entries: int = DEFAULT_COMPLETION_ENTRIES) -> "IngressRing":
        """Create a ring (a sealed memfd labelled ``name``) owned by this (producer) process; its
        descriptor is ``ring.segment.fd`` until :meth:`Segment.close_fd`."""
        comp_off, data_off, payload = ring_geometry(data_bytes, completion_entries)

        def init(seg: Segment) -> None:
            h = seg.array(R.RING_HEADER, count=1)
            h[0]["data_offset"] = data_off
            h[0]["data_bytes"] = data_bytes
            h[0]["completion_offset"] = comp_off
            h[0]["completion_entries"] = completion_entries
            h[0]["max_frame_bytes"] = data_bytes // 2

        seg = Segment.create_memfd(name, payload, R.RING_KIND, R.RING_LAYOUT_VERSION, init=init)
        return cls(seg)

    @classmethod
    def from_fd(cls, fd: int, name: str = "ring", *, drop_corrupt: bool = False) -> "IngressRing":
        """Map a producer's ring from its descriptor (writer side; ``fd`` stays the caller's);
        SegmentError / RingCorruptError if it is not a sealed ring of a possible geometry.

        ``drop_corrupt`` (the writer attaching a registered ring): a ring whose header or cursors
        fail the checks is also marked dropped and its producer woken — the producer may have written
        them after registering, and must get an answer rather than wait for a writer that never reads.
        """
        seg = Segment.from_fd(fd, R.RING_KIND, R.RING_LAYOUT_VERSION, name=name)
        ring = None
        try:
            ring = cls(seg)
            ring.writer_waiting.clear()     # a previous writer may have died while blocked
            ring._check_journal()
        except BaseException as e:
            if drop_corrupt and isinstance(e, RingCorruptError):
                _drop_header(seg)
            if ring is not None:
                ring.close()                # its views too (closes the segment)
            seg.close()
            raise
        return ring

    def _check_journal(self) -> None:
        q = self._q
        w, cr = q[_W["data_write_pos"]], q[_W["completion_read_pos"]]
        if not (0 <= self._rpos <= self._hpos <= w and self._hpos - self._rpos <= self.capacity
                and self._hpos & 7 == 0
                and 0 <= cr <= self._cwpos <= self._cstaged <= cr + self.completion_entries):
            raise self._corrupt(self._rpos, f"impossible cursors: read {self._rpos}, appended {self._hpos}, "
                                            f"write {w}, completions read {cr} / published {self._cwpos} "
                                            f"/ staged {self._cstaged}")

    def _check_geometry(self) -> None:
        size = self.segment.size
        ok = (_pow2(self.capacity) and self.capacity >= MIN_DATA_BYTES and _pow2(self.completion_entries)
              and self.completion_offset >= R.RING_HEADER.itemsize and self.completion_offset % 8 == 0
              and self.completion_offset + self.completion_entries * R.COMPLETION.itemsize
              <= self.data_offset and self.data_offset % _PAGE == 0
              and self.data_offset + self.capacity <= size
              and HDR + R.MIN_RECORD_BYTES <= self.max_frame_bytes <= self.capacity // 2)
        if not ok:
            raise RingCorruptError(self.name, 0, "impossible ring geometry in the header")

    def _corrupt(self, pos: int, why: str) -> RingCorruptError:
        return RingCorruptError(self.name, pos, why)

    # -- producer side --------------------------------------------------------------------------
    def _room(self, nbytes: int) -> tuple[int, int] | None:
        """``(skip, total)`` ring bytes a frame of ``nbytes`` payload needs now, None if no room."""
        if not 0 <= nbytes <= self.max_payload_bytes:
            raise ValidationError(f"frame payload of {nbytes} bytes; a ring of {self.capacity} bytes "
                                  f"carries at most {self.max_payload_bytes}")
        if self._committed_frames - self._crpos >= self.completion_entries:
            return None
        need = (HDR + nbytes + 7) & ~7
        cap, wpos = self.capacity, self._wpos
        to_end = cap - (wpos & self._mask)
        skip = to_end if need > to_end else 0
        total = skip + need
        if cap - (wpos - self._rpos_seen) < total:
            self._rpos_seen = self._q[_READ_POS]
            if cap - (wpos - self._rpos_seen) < total:
                return None
        return skip, total

    def can_reserve(self, nbytes: int) -> bool:
        """Whether :meth:`reserve` of ``nbytes`` would succeed now (a wait predicate)."""
        return self._room(nbytes) is not None

    def free_bytes(self) -> int:
        """Free data-ring bytes as of the writer's last published read position."""
        self._rpos_seen = self._q[_W["data_read_pos"]]
        return self.capacity - (self._wpos - self._rpos_seen)

    @property
    def in_flight(self) -> int:
        """Frames published whose completion the producer has not read yet (duplicate completions
        after a writer restart can make this an underestimate; never below 0)."""
        return max(0, self._committed_frames - self._crpos)

    def reserve(self, nbytes: int) -> memoryview | None:
        """Room for a frame of ``nbytes`` payload: a writable view to fill, or None if the ring is full.

        Nothing is visible to the writer until :meth:`commit`. A second reserve replaces the first.
        """
        room = self._room(nbytes)
        if room is None:
            return None
        skip, total = room
        start = self._place(skip)
        self._pending = (skip, start, nbytes, total)
        return self._data[start + HDR:start + HDR + nbytes]

    def _place(self, skip: int) -> int:
        """Write the SKIP header (if the frame wraps) and return the frame's offset in the ring."""
        pos = self._wpos
        if skip >= HDR:
            _pack_header(self._data, pos & self._mask, skip, R.FRAME_SKIP, 0, 0, 0)
        return (pos + skip) & self._mask

    def commit(self, kind: int, seq: int, record_count: int, flags: int = 0,
               nbytes: int | None = None) -> None:
        """Publish the reserved frame (``nbytes`` may shrink it to what was actually written)."""
        if self._pending is None:
            raise RuntimeError("commit() without a reserve()")
        skip, start, reserved, _ = self._pending
        n = reserved if nbytes is None else nbytes
        if not 0 <= n <= reserved:
            raise ValidationError(f"commit of {n} bytes exceeds the {reserved} reserved")
        self._publish(skip, start, n, kind, seq, record_count, flags)

    def _publish(self, skip: int, start: int, n: int, kind: int, seq: int, count: int, flags: int) -> None:
        if not (count == 1 if kind == R.FRAME_MESSAGE else kind == R.FRAME_BATCH and count >= 1) \
                or count * R.MIN_RECORD_BYTES > n:
            raise ValidationError(f"frame kind {kind} with {count} records in {n} bytes")
        _pack_header(self._data, start, HDR + n, kind, seq, count, flags)
        self._pending = None
        self._wpos += skip + ((HDR + n + 7) & ~7)
        self._q[_WRITE_POS] = self._wpos                    # publish: bytes above, cursor last
        self._committed_frames += 1

    def try_write(self, kind: int, seq: int, payload_parts, record_count: int, flags: int = 0) -> bool:
        """Copy ``payload_parts`` — one bytes-like object (bytes, memoryview, uint8 array) or a list or
        tuple of them, copied back to back — into one frame and publish it.

        False (nothing written) when the ring is full.
        """
        if not isinstance(payload_parts, (list, tuple)):
            n = len(payload_parts)
            room = self._room(n)
            if room is None:
                return False
            skip, _ = room
            start = self._place(skip)
            self._data[start + HDR:start + HDR + n] = payload_parts
        else:
            n = 0
            for p in payload_parts:
                n += len(p)
            room = self._room(n)
            if room is None:
                return False
            skip, _ = room
            start = self._place(skip)
            o = start + HDR
            for p in payload_parts:
                k = len(p)
                self._data[o:o + k] = p
                o += k
        self._publish(skip, start, n, kind, seq, record_count, flags)
        return True

    def write_and_ring(self, kind: int, seq: int, payload, record_count: int, doorbell: np.ndarray) -> bool | None:
        """:meth:`try_write` of one ``bytes``/``bytearray`` payload, then the writer's doorbell rung if
        it waits (``signal.notify_if_waiting``), in one native call (``_step.c`` ring_write): True
        written and rung, False no room (nothing written), None where the native call does not take
        it (not built, another payload type, a frame the rules refuse) — then :meth:`try_write`."""
        if not USE_NATIVE_SEND or (payload.__class__ is not bytes and payload.__class__ is not bytearray):
            return None
        status, wpos, seen, _ = _NATIVE.ring_write(self._q, self._data, payload, doorbell, kind, seq, record_count, 0,
                                                   self.capacity, self.max_payload_bytes, self.completion_entries,
                                                   self._wpos, self._rpos_seen, self._committed_frames, self._crpos)
        if status == 2:
            return None
        self._rpos_seen = seen
        if not status:
            return False
        self._wpos = wpos
        self._pending = None
        self._committed_frames += 1
        return True

    def await_completion(self, deadline_s: float, idle) -> bool | None:
        """Wait (native, the GIL released) until the writer published a completion not read yet or
        dropped the ring — True —, ``deadline_s`` (``time.monotonic()``) passed — False —, or a
        signal came — None; ``idle`` (``waiting.IdleStrategy``) first, then the producer's waiting
        flag and a sleep on the completion cursor. What ``shm.signal.wait_for`` does with
        ``has_completions() or dropped``."""
        r = _NATIVE.await_completion(self._q, self._crpos, int(deadline_s * 1e9), IDLE_CODES[idle.kind],
                                     int(idle.spin_s * 1e9))
        return None if r < 0 else bool(r)

    def has_completions(self) -> bool:
        """Whether the writer published completions not read yet (a wait predicate)."""
        return self._q[_COMP_WRITE_POS] != self._crpos

    def completions(self) -> np.ndarray:
        """Completion entries (``records.COMPLETION``) published since the last call, oldest first."""
        w = self._q[_W["completion_write_pos"]]
        n = w - self._crpos
        if n == 0:
            return _EMPTY_COMPLETIONS
        if not 0 < n <= self.completion_entries:
            raise self._corrupt(self._crpos, f"completion cursor {w} with read cursor {self._crpos}")
        i = self._crpos & self._cmask
        first = min(n, self.completion_entries - i)
        out = np.empty(n, dtype=R.COMPLETION)
        out[:first] = self._comp[i:i + first]
        out[first:] = self._comp[:n - first]
        self._crpos = w
        self._q[_W["completion_read_pos"]] = w
        return out

    def completion_tuples(self) -> list[tuple]:
        """Like :meth:`completions`, as ``(seq, status, record_count, queue_offset, phys_offset,
        store_ts_ms)`` tuples (cheaper for the few completions a sync sender sees): in one native call
        (``_step.c`` take_completions) where it is built, else :meth:`py_completion_tuples`, its spec."""
        if USE_NATIVE_SEND:
            got = _NATIVE.take_completions(self._q, self._comp, self._crpos, self.completion_entries)
            if got is not None:
                self._crpos = got[0]
                return got[1]
        return self.py_completion_tuples()

    def py_completion_tuples(self) -> list[tuple]:
        """:meth:`completion_tuples` in Python (the spec of the native call; it also raises the ring's
        corruption error where the cursors disagree)."""
        w = self._q[_COMP_WRITE_POS]
        n = w - self._crpos
        if n == 0:
            return []
        if not 0 < n <= self.completion_entries:
            raise self._corrupt(self._crpos, f"completion cursor {w} with read cursor {self._crpos}")
        i = self._crpos & self._cmask
        first = min(n, self.completion_entries - i)
        out = self._comp[i:i + first].tolist()
        if n > first:
            out += self._comp[:n - first].tolist()
        self._crpos = w
        self._q[_COMP_READ_POS] = w
        return out

    def mark_closed(self) -> None:
        """Producer: tell the writer this session ended cleanly (it may detach after draining)."""
        self._q[_W["producer_state"]] = R.RING_STATE_CLOSED

    @property
    def closed_by_producer(self) -> bool:
        return self._q[_W["producer_state"]] == R.RING_STATE_CLOSED

    @property
    def dropped(self) -> bool:
        """True once the writer gave up on this ring (producer: fail pending and new sends)."""
        return self._q[_W["writer_state"]] == R.RING_STATE_DROPPED

    # -- lifetime -------------------------------------------------------------------------------
    def close(self) -> None:
        """Release this object's views and unmap (idempotent; never unlinks)."""
        if self.segment.closed:
            return
        self._comp = self.completion_word = None
        self._comp_bytes.release()
        self.producer_waiting.release()
        self.writer_waiting.release()
        self._data.release()
        self._q.release()
        self.segment.close()

    def __enter__(self) -> "IngressRing":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"IngressRing({self.name!r}, capacity={self.capacity}, entries={self.completion_entries})"
