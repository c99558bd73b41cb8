"""Ingress ring: properties against a reference model, corruption, two-process streaming, kills."""
from __future__ import annotations

import itertools
import os
import tempfile
import time
import zlib
from collections import deque
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostmq import records as R
from hostmq.errors import RingCorruptError, ValidationError
from hostmq.config import StoreConfig
from hostmq.ingress import step
from hostmq.ingress.ring import DEFAULT_COMPLETION_ENTRIES, DEFAULT_DATA_BYTES, IngressRing
from hostmq.shm import Segment
from hostmq.store.commitlog import CommitLog
from hostmq.store.queue_table import QueueTable
from hostmq.store.readonly import queue_offsets_table
from hostmq.shm import notify_if_waiting, wait_for
from tests.shm import (SPAWN, TOPIC, body_for, check_frame, frame_payload, endless_producer, half_written_producer, kill, make_doorbell,
                       open_ring_of, stream_producer)

pytestmark = pytest.mark.timeout(60)
HDR = R.FRAME_HEADER.size
_names = itertools.count()


def align8(n: int) -> int:
    return (n + 7) & ~7


def pattern(seq: int, n: int) -> bytes:
    return ((np.arange(n, dtype=np.uint32) * 131 + seq * 7) & 0xFF).astype(np.uint8).tobytes()


@pytest.fixture
def ring_pair(shm):
    """Factory ``ring_pair(data_bytes, entries) -> (producer, writer)``; closed after."""
    made = []

    def _make(data_bytes=4096, entries=8):
        p = IngressRing.create(shm.name("ingress", next(_names)), data_bytes, entries)
        w = IngressRing.from_fd(p.segment.fd)
        made.append((p, w))
        return p, w

    yield _make
    for p, w in made:
        w.close()
        p.close()


def header_words(ring: IngressRing) -> np.ndarray:
    return ring.segment.array(R.RING_HEADER, 1)


# -- geometry and simple cases ----------------------------------------------------------------
def test_defaults_and_geometry(ring_pair):
    p, w = ring_pair(DEFAULT_DATA_BYTES, DEFAULT_COMPLETION_ENTRIES)
    assert p.capacity == w.capacity == 16 * 1024 * 1024
    assert p.completion_entries == w.completion_entries == DEFAULT_COMPLETION_ENTRIES
    assert p.max_frame_bytes * 2 == p.capacity and p.max_payload_bytes == p.max_frame_bytes - HDR
    assert (p.segment.buf.obj is not None) and p.data_offset % 4096 == 0
    assert p.free_bytes() == p.capacity


@pytest.mark.parametrize("data_bytes, entries", [(3000, 8), (2048, 8), (4096, 6), (4096, 0)])
def test_bad_geometry_is_refused(shm, data_bytes, entries):
    with pytest.raises(ValidationError):
        IngressRing.create(shm.name("ingress"), data_bytes, entries)


def test_producer_argument_errors(ring_pair):
    p, _ = ring_pair()
    with pytest.raises(ValidationError):
        p.reserve(p.max_payload_bytes + 1)
    with pytest.raises(RuntimeError):
        p.commit(R.FRAME_MESSAGE, 0, 1)
    p.reserve(200)
    with pytest.raises(ValidationError):
        p.commit(R.FRAME_MESSAGE, 0, 2)                 # a MESSAGE frame holds one record
    with pytest.raises(ValidationError):
        p.commit(R.FRAME_BATCH, 0, 3)                   # 3 records cannot fit in 200 bytes
    with pytest.raises(ValidationError):
        p.commit(R.FRAME_SKIP, 0, 0)
    with pytest.raises(ValidationError):
        p.commit(R.FRAME_MESSAGE, 0, 1, nbytes=201)


def test_commit_may_shrink_the_reservation(ring_pair):
    p, w = ring_pair()
    view = p.reserve(1000)
    view[:150] = pattern(0, 150)
    p.commit(R.FRAME_MESSAGE, 42, 1, flags=5, nbytes=150)
    (f,) = w.frames()
    assert (f.kind, f.seq, f.record_count, f.flags, bytes(f.payload)) == (R.FRAME_MESSAGE, 42, 1, 5,
                                                                          pattern(0, 150))
    assert p.free_bytes() == p.capacity - align8(HDR + 150)


def test_skip_frame_and_implicit_tail_skip(ring_pair):
    p, w = ring_pair(4096, 64)
    # 4096 = 3 × 1360 + 16: after three 1336-byte payloads only 16 bytes remain — no room for a
    # SKIP header, so both sides skip them implicitly.
    for seq in range(3):
        assert p.try_write(R.FRAME_MESSAGE, seq, pattern(seq, 1336), 1)
    got = w.frames()
    assert [f.seq for f in got] == [0, 1, 2]
    w.complete([(f.seq, 0, 1, 0, 0, 0) for f in got])
    del got
    w.release()
    assert p.try_write(R.FRAME_MESSAGE, 3, pattern(3, 100), 1)          # lands at offset 0
    (f,) = w.frames()
    assert bytes(f.payload) == pattern(3, 100)
    assert header_words(w)[0]["data_write_pos"] == 4096 + 128
    del f
    # Now a frame that needs more than the 3968 bytes up to the end: an explicit SKIP frame.
    w.complete([(3, 0, 1, 0, 0, 0)])
    w.release()
    assert p.try_write(R.FRAME_MESSAGE, 4, pattern(4, 2000), 1)
    assert not p.try_write(R.FRAME_MESSAGE, 5, pattern(5, 2000), 1)     # would need skip + frame
    (f,) = w.frames()
    assert f.seq == 4 and bytes(f.payload) == pattern(4, 2000)
    del f
    w.complete([(4, 0, 1, 0, 0, 0)])
    w.release()
    assert p.try_write(R.FRAME_MESSAGE, 5, pattern(5, 2000), 1)
    (f,) = w.frames()
    assert f.seq == 5 and bytes(f.payload) == pattern(5, 2000)
    assert header_words(w)[0]["data_write_pos"] == 2 * 4096 + align8(HDR + 2000)     # after a SKIP


def test_completion_ring_bounds_frames_in_flight(ring_pair):
    p, w = ring_pair(4096, 4)
    for seq in range(4):
        assert p.try_write(R.FRAME_MESSAGE, seq, pattern(seq, 100), 1)
    assert p.in_flight == 4 and not p.can_reserve(100)
    assert not p.try_write(R.FRAME_MESSAGE, 4, pattern(4, 100), 1)      # data room, no completion slot
    batch = w.frames()
    w.complete([(f.seq, 0, 1, f.seq, 0, 0) for f in batch])
    del batch
    w.release()
    assert not p.can_reserve(100)                       # slots free only once completions are read
    assert list(p.completions()["seq"]) == [0, 1, 2, 3] and p.in_flight == 0
    assert p.try_write(R.FRAME_MESSAGE, 4, pattern(4, 100), 1)


def test_writer_never_takes_a_frame_it_cannot_complete(ring_pair):
    p, w = ring_pair(4096, 4)
    p._crpos += 100                 # a buggy producer that believes it read 100 completions
    for seq in range(6):
        assert p.try_write(R.FRAME_MESSAGE, seq, pattern(seq, 100), 1)
    assert [f.seq for f in w.frames()] == [0, 1, 2, 3]
    assert len(w.frames()) == 0                        # completion ring would overflow
    w.complete([(s, 0, 1, 0, 0, 0) for s in range(4)])
    with pytest.raises(ValueError):
        w.complete([(9, 0, 1, 0, 0, 0)])
    header_words(p)[0]["completion_read_pos"] = 4      # the producer finally reads them
    assert [f.seq for f in w.frames()] == [4, 5]


def test_max_bytes_limits_a_batch_but_returns_at_least_one(ring_pair):
    p, w = ring_pair(1 << 16, 64)
    for seq in range(10):
        assert p.try_write(R.FRAME_MESSAGE, seq, pattern(seq, 1000), 1)
    first = w.frames(max_bytes=1)
    assert [f.seq for f in first] == [0] and first.nbytes == align8(HDR + 1000)
    rest = w.frames(max_bytes=3000)
    assert [f.seq for f in rest] == [1, 2, 3]
    w.release(first.nbytes)
    assert header_words(w)[0]["data_read_pos"] == first.nbytes
    with pytest.raises(ValueError):
        w.release(10 * 1024)


# -- property test against a reference model --------------------------------------------------
@dataclass
class Model:
    """What the ring must do, computed independently: positions, room, expected reads."""

    cap: int
    entries: int
    wpos: int = 0
    seq: int = 0
    completions_read: int = 0
    committed: int = 0

    def __post_init__(self):
        self.unread = deque()          # (seq, kind, count, payload, frame_start, frame_end)
        self.batches = deque()         # (FrameBatch, [expected...]) handed out, not released
        self.uncompleted = deque()     # (seq, count) handed out, not completed
        self.completed = deque()       # rows the producer has not read yet

    def fits(self, n: int, rpos: int) -> tuple[bool, int, int]:
        need = align8(HDR + n)
        to_end = self.cap - self.wpos % self.cap
        skip = to_end if need > to_end else 0
        ok = self.cap - (self.wpos - rpos) >= skip + need and self.committed - self.completions_read < self.entries
        return ok, skip, need


OPS = st.one_of(
    st.tuples(st.just("write"), st.integers(R.MIN_RECORD_BYTES, 2024), st.booleans()),
    st.tuples(st.just("read"), st.integers(1, 8192)),
    st.tuples(st.just("release"), st.just(0)),
    st.tuples(st.just("complete"), st.integers(1, 6)),
    st.tuples(st.just("completions"), st.just(0)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(OPS, max_size=120), entries=st.sampled_from([4, 8, 64]))
def test_ring_matches_reference_model(shm, ops, entries):
    p = IngressRing.create(shm.name("ingress", next(_names)), 4096, entries)
    w = IngressRing.from_fd(p.segment.fd)
    m = Model(4096, entries)
    hdr = header_words(w)
    try:
        for op, arg, *more in ops:
            _apply(p, w, m, hdr, op, arg, *more)
        for _ in range(4 * len(ops) + 10):         # drain: everything written comes out, in order
            if not (m.unread or m.batches or m.uncompleted or m.completed):
                break
            for op in ("read", "complete", "release", "completions"):
                _apply(p, w, m, hdr, op, 1 << 20 if op in ("read", "complete") else 0)
        assert not (m.unread or m.batches or m.uncompleted or m.completed)
        assert p.in_flight == 0 and not w.has_frames()
    finally:
        m.batches.clear()
        del hdr
        w.close()
        p.close()


def _apply(p, w, m: Model, hdr, op, arg, batch=False):
    if op == "write":
        n = arg
        count = min(n // R.MIN_RECORD_BYTES, 5) if batch else 1
        kind = R.FRAME_BATCH if batch else R.FRAME_MESSAGE
        payload = pattern(m.seq, n)
        ok, skip, need = m.fits(n, int(hdr[0]["data_read_pos"]))
        assert p.try_write(kind, m.seq, [payload[:n // 3], payload[n // 3:]], count) == ok
        if ok:
            start = m.wpos + skip
            m.unread.append((m.seq, kind, count, payload, start, start + need))
            m.wpos, m.seq, m.committed = start + need, m.seq + 1, m.committed + 1
        assert int(hdr[0]["data_write_pos"]) == m.wpos
    elif op == "read":
        budget = m.entries - (len(m.completed) + len(m.uncompleted))
        got = w.frames(max_bytes=arg)
        expected = [m.unread.popleft() for _ in range(len(got))]
        for f, (seq, kind, count, payload, _, _) in zip(got, expected):
            assert (f.seq, f.kind, f.record_count, bytes(f.payload)) == (seq, kind, count, payload)
            m.uncompleted.append((seq, count))
        if m.unread and len(got) < budget:
            assert got and got.nbytes >= arg                # stopped only because of max_bytes
        if got:
            m.batches.append((got, expected))
    elif op == "release" and m.batches:
        got, expected = m.batches.popleft()
        for f, (_, _, _, payload, _, _) in zip(got, expected):
            assert bytes(f.payload) == payload              # nothing overwrote a handed-out frame
        w.release(got.nbytes)
        rpos = int(hdr[0]["data_read_pos"])
        assert expected[-1][5] <= rpos <= (m.unread[0][4] if m.unread else m.wpos)
    elif op == "complete":
        rows = [m.uncompleted.popleft() for _ in range(min(arg, len(m.uncompleted)))]
        rows = [(seq, 0, count, seq * 10, seq * 100, 7) for seq, count in rows]
        w.complete(np.array(rows, dtype=R.COMPLETION))
        m.completed.extend(rows)
    elif op == "completions":
        got = p.completions()
        assert [tuple(x) for x in got.tolist()] == list(m.completed)
        m.completions_read += len(m.completed)
        m.completed.clear()


# -- corruption ---------------------------------------------------------------------------------
def _one_frame(ring_pair):
    p, w = ring_pair(4096, 8)
    assert p.try_write(R.FRAME_MESSAGE, 0, pattern(0, 100), 1)          # frame_bytes 124, ring 128
    return p, w


@pytest.mark.parametrize("fields, why", [
    ({"kind": 0}, "unknown frame kind 0"),
    ({"kind": 7}, "unknown frame kind 7"),
    ({"frame_bytes": 24}, "does not fit"),
    ({"frame_bytes": 0}, "does not fit"),
    ({"frame_bytes": 200}, "does not fit"),
    ({"frame_bytes": 0xFFFFFFFF}, "does not fit"),
    ({"record_count": 2}, "records in a kind 1"),
    ({"record_count": 0}, "records in a kind 1"),
    ({"kind": R.FRAME_BATCH, "record_count": 9}, "records in a kind 2"),
    ({"kind": R.FRAME_SKIP}, "skip frame"),
    ({"frame_bytes": 0, "kind": 0, "seq": 0, "record_count": 0}, "unknown frame kind"),   # zeroed
])
def test_garbage_frame_header_raises(ring_pair, fields, why):
    p, w = _one_frame(ring_pair)
    vals = dict(zip(R.FRAME_HEADER_DTYPE.names, R.FRAME_HEADER.unpack_from(p._data, 0)))
    vals.update(fields)
    R.FRAME_HEADER.pack_into(p._data, 0, *vals.values())
    with pytest.raises(RingCorruptError, match=why) as e:
        w.frames()
    assert e.value.pos == 0 and e.value.name == w.name
    w.mark_dropped()
    assert p.dropped


@pytest.mark.parametrize("write_pos, why", [
    (64, "does not fit"),                  # cursor inside the frame
    (16, "cuts a frame header"),
    (130, "write cursor 130"),             # unaligned
    (2 * 4096, "write cursor 8192"),       # more than a ring ahead of the reader
])
def test_impossible_write_cursor_raises(ring_pair, write_pos, why):
    p, w = _one_frame(ring_pair)
    header_words(p)[0]["data_write_pos"] = write_pos
    with pytest.raises(RingCorruptError, match=why):
        w.frames()


def test_cursors_going_backwards_raise(ring_pair):
    p, w = _one_frame(ring_pair)
    assert len(w.frames()) == 1
    header_words(p)[0]["data_write_pos"] = 0
    with pytest.raises(RingCorruptError, match="write cursor 0"):
        w.frames()
    p2, w2 = _one_frame(ring_pair)
    header_words(p2)[0]["completion_read_pos"] = 1000
    with pytest.raises(RingCorruptError, match="completion read cursor"):
        w2.frames()
    for garbage in (9, -1):                          # more than the ring holds; backwards
        header_words(w2)[0]["completion_write_pos"] = garbage             # producer side checks too
        with pytest.raises(RingCorruptError, match="completion cursor"):
            p2.completions()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=st.binary(min_size=24, max_size=24), write_pos=st.sampled_from([128, 256, 4096]))
def test_random_header_is_rejected_or_sane(ring_pair, header, write_pos):
    p, w = ring_pair(4096, 8)
    for seq in range(write_pos // 128 if write_pos < 4096 else 1):
        assert p.try_write(R.FRAME_MESSAGE, seq, pattern(seq, 100), 1)
    p._data[0:24] = header
    header_words(p)[0]["data_write_pos"] = write_pos
    try:
        got = w.frames()
    except RingCorruptError:
        return
    for f in got:
        assert f.kind in (R.FRAME_MESSAGE, R.FRAME_BATCH) and f.record_count >= 1
        assert HDR + len(f.payload) <= w.max_frame_bytes
        assert f.record_count * R.MIN_RECORD_BYTES <= len(f.payload)
    assert got.nbytes <= write_pos


# -- two processes ------------------------------------------------------------------------------
@dataclass
class WriterState:
    frames: int = 0
    records: int = 0
    phys: int = 0
    crc: int = 0


def writer_pass(ring: IngressRing, state: WriterState) -> int:
    """One writer wake-up: take every visible frame, verify, complete, release, notify."""
    batch = ring.frames()
    n = len(batch)
    if n == 0:
        return 0
    rows = np.empty(n, dtype=R.COMPLETION)
    for i, f in enumerate(batch):
        assert f.seq == state.frames, (f.seq, state.frames)
        nbytes = check_frame(f)
        state.crc = zlib.crc32(f.payload, state.crc)
        rows[i] = (f.seq, R.COMPLETION_SEND_OK, f.record_count, state.records, state.phys, 0)
        state.records += f.record_count
        state.phys += nbytes
        state.frames += 1
    del batch, f
    ring.complete(rows)
    ring.release()
    notify_if_waiting(ring.producer_waiting, ring.completion_word, bump=False)
    return n


def _start_producer(spawn, target, *args):
    """A producer process with its ring; the ring opened here through /proc as the broker's writer
    does, and the doorbell (ours) it rings."""
    doorbell, wake = make_doorbell()
    parent_conn, child_conn = SPAWN.Pipe()
    child = spawn(target, (os.getpid(), doorbell.fd), *args, child_conn)
    assert parent_conn.poll(30), "producer did not start"
    tag, pid, fd = parent_conn.recv()
    assert tag == "ready"
    ring = open_ring_of(pid, fd)
    return doorbell, wake, ring, child, parent_conn


def test_two_processes_stream_200k_frames_with_completions(shm, spawn):
    n = 200_000
    doorbell, wake, ring, child, conn = _start_producer(spawn, stream_producer, n, 256 * 1024, 1024)
    state = WriterState()
    wakeups = 0
    try:
        t0 = time.monotonic()
        while state.frames < n:
            if writer_pass(ring, state) == 0:
                wakeups += 1
                assert wait_for(ring.has_frames, wake, time.monotonic() + 20, flag=ring.writer_waiting)
        elapsed = time.monotonic() - t0
        assert conn.poll(30)
        tag, crc, records, stats = conn.recv()
        assert (tag, crc, records) == ("done", state.crc, state.records)
        assert state.records == n + 2 * (n // 10)
        print(f"\n200k frames in {elapsed:.2f} s ({n / elapsed:,.0f} frames/s, checked record by record); "
              f"writer waits {wakeups}; producer waits {stats['blocked']}, slice timeouts "
              f"{stats['slice_timeouts']} (late/lost wake-ups {stats['rescued']})")
        conn.send("bye")
        child.join(30)
        assert child.exitcode == 0
    finally:
        ring.close()
        doorbell.close()


def test_producer_killed_while_writing_leaves_a_readable_ring(shm, spawn):
    doorbell, wake, ring, child, conn = _start_producer(spawn, endless_producer, 64 * 1024)
    state = WriterState()
    try:
        deadline = time.monotonic() + 30
        while not conn.poll(0):
            assert time.monotonic() < deadline
            if writer_pass(ring, state) == 0:
                wait_for(ring.has_frames, wake, time.monotonic() + 0.05, flag=ring.writer_waiting)
        kill(child)
        while writer_pass(ring, state):             # everything committed, nothing else, no error
            pass
        assert state.frames >= 1000 and not ring.has_frames()
        assert not ring.segment.owner_alive()
    finally:
        ring.close()
        doorbell.close()


def test_producer_killed_mid_frame_exposes_only_committed_frames(shm, spawn):
    parent_conn, child_conn = SPAWN.Pipe()
    child = spawn(half_written_producer, child_conn)
    assert parent_conn.poll(30)
    tag, pid, fd = parent_conn.recv()
    assert tag == "mid-write"
    ring = open_ring_of(pid, fd)          # held before the kill, as the broker holds a session's ring
    kill(child)
    try:
        got = ring.frames()
        assert [f.seq for f in got] == [0, 1, 2]
        for f in got:
            check_frame(f)
        del got, f
        assert len(ring.frames()) == 0 and not ring.segment.owner_alive()
    finally:
        ring.close()


def test_writer_restart_between_complete_and_release_duplicates_but_corrupts_nothing(ring_pair):
    p, w = ring_pair(4096, 8)
    for seq in range(3):
        assert p.try_write(R.FRAME_MESSAGE, seq, pattern(seq, 100), 1)
    got = w.frames()
    w.complete([(f.seq, 0, 1, f.seq, 0, 0) for f in got])
    del got
    w.close()                                          # killed before release()
    w2 = IngressRing.from_fd(p.segment.fd)
    try:
        again = w2.frames()
        assert [f.seq for f in again] == [0, 1, 2]         # re-read from the released position
        w2.complete([(f.seq, 0, 1, f.seq, 0, 0) for f in again])
        del again
        w2.release()
        assert list(p.completions()["seq"]) == [0, 1, 2, 0, 1, 2]
        assert p.in_flight == 0
        for seq in range(3, 20):                           # and the session goes on
            assert p.try_write(R.FRAME_MESSAGE, seq, pattern(seq, 100), 1)
            assert [f.seq for f in w2.frames()] == [seq]
            w2.complete([(seq, 0, 1, seq, 0, 0)])
            w2.release()
            assert list(p.completions()["seq"]) == [seq]
    finally:
        w2.close()


def test_writer_waits_while_the_completion_ring_is_full(ring_pair):
    p, w = ring_pair(4096, 4)
    p._crpos += 4                                      # producer's count is low (after duplicates)
    for seq in range(6):
        assert p.try_write(R.FRAME_MESSAGE, seq, pattern(seq, 100), 1)
    assert w.has_frames() and len(w.frames()) == 4
    w.complete([(s, 0, 1, s, 0, 0) for s in range(4)])
    w.release()
    assert not w.has_frames()                          # visible, but no completion slot: wait
    header_words(p)[0]["completion_read_pos"] = 4
    assert w.has_frames()


# -- the writer's journal: restarts are exactly-once ----------------------------------------------------
def _restart(p: IngressRing, w: IngressRing) -> IngressRing:
    """The writer dies (its views go with it) and a successor attaches to the same ring."""
    w.close()
    return IngressRing.from_fd(p.segment.fd)


def _write(p: IngressRing, seqs, n: int = 100) -> None:
    for seq in seqs:
        assert p.try_write(R.FRAME_MESSAGE, seq, pattern(seq, n), 1)


def _rows(seqs, base: int = 0) -> list[tuple]:
    """One completion per seq with values that say which writer produced it."""
    return [(s, R.COMPLETION_SEND_OK, 1, base + s, 1000 * base + s, 7) for s in seqs]


def test_a_journalled_batch_is_not_handed_out_again_and_its_staged_completions_survive(ring_pair):
    p, w = ring_pair(4096, 8)
    _write(p, range(5))
    batch = w.frames()
    assert [f.seq for f in batch] == [0, 1, 2, 3, 4]
    w.stage(_rows(range(5), base=10))
    w.journal(w.handed_position, w.staged_position)
    hdr = header_words(p)[0]
    assert (int(hdr["appended_data_pos"]), int(hdr["staged_completion_pos"])) == (5 * 128, 5)
    del batch, hdr
    w2 = _restart(p, w)
    try:
        assert (w2.handed_position, w2.staged_position) == (5 * 128, 5)
        assert not w2.has_frames() and len(w2.frames()) == 0       # not re-appended
        assert not p.has_completions()                              # staged, still unpublished
        w2.publish_completions()
        assert p.completion_tuples() == _rows(range(5), base=10)    # the dead writer's rows, once
        assert p.free_bytes() == 4096 - 5 * 128
        w2.release_to(w2.handed_position)
        assert p.free_bytes() == 4096 and p.in_flight == 0
        _write(p, [5])                                              # and the session goes on
        assert [f.seq for f in w2.frames()] == [5]
    finally:
        w2.close()


def test_frames_staged_but_not_journalled_are_handed_out_again(ring_pair):
    p, w = ring_pair(4096, 8)
    _write(p, range(3))
    batch = w.frames()
    w.stage(_rows(range(3), base=10))                      # staged, killed before the journal
    del batch
    w2 = _restart(p, w)
    try:
        assert (w2.handed_position, w2.staged_position) == (0, 0)
        again = w2.frames()
        assert [(f.seq, bytes(f.payload)) for f in again] == [(s, pattern(s, 100)) for s in range(3)]
        del again
        w2.stage(_rows(range(3), base=20))                 # overwrites the stale rows in place
        w2.publish_completions()
        w2.release()
        assert p.completion_tuples() == _rows(range(3), base=20)
        assert p.completion_tuples() == []
    finally:
        w2.close()


def test_only_the_batches_after_the_last_journal_are_replayed(ring_pair):
    p, w = ring_pair(1 << 16, 16)
    _write(p, range(4))
    first = w.frames()
    w.stage(_rows(range(4), base=1))
    w.journal(w.handed_position, w.staged_position)        # batch 1: in the commitlog
    journalled = w.handed_position
    _write(p, range(4, 7))
    second = w.frames()
    assert [f.seq for f in second] == [4, 5, 6]
    w.stage(_rows(range(4, 7), base=1))                    # batch 2: staged, never journalled
    del first, second
    w2 = _restart(p, w)
    try:
        assert w2.handed_position == journalled and w2.staged_position == 4
        assert [f.seq for f in w2.frames()] == [4, 5, 6]
        w2.stage(_rows(range(4, 7), base=2))
        w2.publish_completions()
        w2.release()
        assert p.completion_tuples() == _rows(range(4), base=1) + _rows(range(4, 7), base=2)
        assert p.in_flight == 0 and p.free_bytes() == 1 << 16
    finally:
        w2.close()


def test_published_completions_are_not_published_again_after_a_restart(ring_pair):
    p, w = ring_pair(4096, 8)
    _write(p, range(3))
    batch = w.frames()
    w.stage(_rows(range(3)))
    w.journal(w.handed_position, w.staged_position)
    w.publish_completions()                                # killed before release_to
    del batch
    assert [r[0] for r in p.completion_tuples()] == [0, 1, 2]
    w2 = _restart(p, w)
    try:
        assert len(w2.frames()) == 0
        w2.publish_completions()                           # what a successor does on resume: nothing new
        w2.release_to(w2.handed_position)
        assert p.completion_tuples() == [] and p.in_flight == 0 and p.free_bytes() == 4096
    finally:
        w2.close()


def test_a_successor_cannot_stage_completions_for_journalled_frames(ring_pair):
    p, w = ring_pair(4096, 8)
    _write(p, range(2))
    batch = w.frames()
    w.stage(_rows(range(2)))
    w.journal(w.handed_position, w.staged_position)
    del batch
    w2 = _restart(p, w)
    try:
        with pytest.raises(ValueError, match="2 completions for 0 uncompleted frames"):
            w2.stage(_rows(range(2)))
        with pytest.raises(ValueError, match="no uncompleted frame"):
            w2.stage_one(0, 0, 1, 0, 0, 0)
        assert w2.staged_position == 2
    finally:
        w2.close()


def test_a_stale_journal_below_the_released_position_is_harmless(ring_pair):
    p, w = ring_pair(4096, 8)
    _write(p, range(3))
    w.frames()
    w.stage(_rows(range(3)))
    w.journal(128, 1)                                      # an old journal: one frame, one completion
    w.publish_completions()
    w.release()                                            # everything released past it
    p.completion_tuples()
    _write(p, [3])
    w2 = _restart(p, w)
    try:
        assert (w2.handed_position, w2.staged_position) == (3 * 128, 3)     # read / published win
        assert [f.seq for f in w2.frames()] == [3]
    finally:
        w2.close()


@pytest.mark.parametrize("appended, staged, why", [
    (4 * 128, 0, "appended 512"),            # beyond the producer's write cursor (3 frames)
    (100, 0, "appended 100"),                # not a frame boundary (unaligned)
    (0, 9, "staged 9"),                      # more staged than the completion ring holds (8)
])
def test_an_impossible_journal_refuses_the_attach(ring_pair, appended, staged, why):
    p, w = ring_pair(4096, 8)
    _write(p, range(3))
    w.journal(appended, staged)
    w.close()
    with pytest.raises(RingCorruptError, match=f"impossible cursors.*{why}"):
        IngressRing.from_fd(p.segment.fd)


def test_release_to_gives_room_back_frame_by_frame(ring_pair):
    p, w = ring_pair(4096, 64)
    seq = 0
    while p.try_write(R.FRAME_MESSAGE, seq, pattern(seq, 1000), 1):     # 1024 ring bytes each
        seq += 1
    assert seq == 4 and p.free_bytes() == 0
    got = w.frames()
    w.complete(_rows(f.seq for f in got))
    del got
    assert not p.can_reserve(1000)
    w.release_to(1024)                                     # the first frame only
    assert p.free_bytes() == 1024 and header_words(p)[0]["data_read_pos"] == 1024
    assert p.try_write(R.FRAME_MESSAGE, 4, pattern(4, 1000), 1)
    assert not p.can_reserve(1)
    w.release_to(1024)                                     # no move: allowed, changes nothing
    assert p.free_bytes() == 0
    with pytest.raises(ValueError):
        w.release_to(512)                                  # backwards
    with pytest.raises(ValueError):
        w.release_to(4096 + 1024)                          # beyond what was handed out (frame 4 was not)
    w.release_to(4096)
    assert p.free_bytes() == 3072


def test_publish_completions_up_to_a_position(ring_pair):
    p, w = ring_pair(4096, 8)
    _write(p, range(4))
    w.frames()
    w.stage(_rows(range(4)))
    assert w.staged_position == 4 and not p.has_completions()
    w.publish_completions(2)
    assert [r[0] for r in p.completion_tuples()] == [0, 1]
    with pytest.raises(ValueError, match="publish up to 1"):
        w.publish_completions(1)                           # backwards
    with pytest.raises(ValueError, match="publish up to 5"):
        w.publish_completions(5)                           # beyond what is staged
    w.publish_completions(2)                               # no move: fine
    assert p.completion_tuples() == []
    w.publish_completions()
    assert [r[0] for r in p.completion_tuples()] == [2, 3]


def test_restatus_changes_only_staged_send_ok_completions(ring_pair):
    p, w = ring_pair(4096, 8)
    _write(p, range(5))
    w.frames()
    statuses = [R.COMPLETION_SEND_OK, R.COMPLETION_BAD_RECORD, R.COMPLETION_SEND_OK, R.COMPLETION_NO_TOPIC,
                R.COMPLETION_SEND_OK]
    w.stage([(s, st_, 1, 0, 0, 0) for s, st_ in enumerate(statuses)])
    w.publish_completions(1)
    with pytest.raises(ValueError, match=r"restatus \[0, 3\) outside staged \[1, 5\)"):
        w.restatus(0, 3, R.COMPLETION_FLUSH_DISK_TIMEOUT)  # the first one is already published
    with pytest.raises(ValueError):
        w.restatus(1, 6, R.COMPLETION_FLUSH_DISK_TIMEOUT)  # beyond what is staged
    w.restatus(1, 4, R.COMPLETION_FLUSH_DISK_TIMEOUT)
    w.publish_completions()
    got = [(r[0], r[1]) for r in p.completion_tuples()]
    assert got == [(0, 0), (1, R.COMPLETION_BAD_RECORD), (2, R.COMPLETION_FLUSH_DISK_TIMEOUT),
                   (3, R.COMPLETION_NO_TOPIC), (4, R.COMPLETION_SEND_OK)]
    assert R.COMPLETION_FLUSH_DISK_TIMEOUT == 1 and R.COMPLETION_SEND_OK == 0


def test_restatus_and_completion_tuples_across_the_end_of_the_completion_ring(ring_pair):
    p, w = ring_pair(4096, 4)
    _write(p, range(3))
    w.frames()
    w.complete(_rows(range(3)))
    w.release()
    assert [r[0] for r in p.completion_tuples()] == [0, 1, 2]
    _write(p, range(3, 7))                                 # entries 3, 4 → slots 3, 0, 1, 2
    w.frames()
    w.stage(_rows(range(3, 7)))
    w.restatus(4, 6, R.COMPLETION_FLUSH_DISK_TIMEOUT)      # seqs 4 and 5: slots 0 and 1
    w.publish_completions()
    assert p.completion_tuples() == [(3, 0, 1, 3, 3, 7), (4, 1, 1, 4, 4, 7), (5, 1, 1, 5, 5, 7),
                                     (6, 0, 1, 6, 6, 7)]
    assert p.completion_tuples() == []


def test_completion_tuples_reads_what_completions_reads(ring_pair):
    p, w = ring_pair(4096, 8)
    _write(p, range(6))
    w.frames()
    w.complete(_rows(range(3), base=4))
    assert p.completion_tuples() == _rows(range(3), base=4)
    w.complete(_rows(range(3, 6), base=4))
    assert [tuple(r) for r in p.completions().tolist()] == _rows(range(3, 6), base=4)
    assert header_words(p)[0]["completion_read_pos"] == 6
    header_words(w)[0]["completion_write_pos"] = 5         # backwards: impossible
    with pytest.raises(RingCorruptError, match="completion cursor 5"):
        p.completion_tuples()


# -- the writer's real batch step (ingress.step), killed after each of its steps ----------------------
class Killed(Exception):
    """The writer 'died' at a step."""


class _Log:
    """A real commitlog in a directory of its own, opened the way a restarted writer opens it: cut
    back to the published ``write_pos``, queue offsets rebuilt from the records."""

    TORN = 1 << 16

    def __init__(self, directory: str, queues: dict[bytes, int]) -> None:
        self.dir = directory
        self.queues = queues
        self.cl = CommitLog(directory, 1 << 20)
        self.cl.topic_queue_table = QueueTable()        # as the writer process keeps it (native step)
        self.cl.topic_queue_table.set_topics(queues)

    def restart(self, write_pos: int) -> CommitLog:
        self.cl.close()
        self.cl = CommitLog(self.dir, 1 << 20)
        self.cl.mfq.load()
        self.cl.continue_at(write_pos, self.TORN)
        self.cl.topic_queue_table = QueueTable(queue_offsets_table(self.dir, StoreConfig(), self.cl, 0, write_pos))
        self.cl.topic_queue_table.set_topics(self.queues)
        return self.cl

    def bodies(self, write_pos: int) -> list[bytes]:
        return [R.decode_record(self.cl.record_at(r.phys_offset))[2] for r in self.cl.records_between(0, write_pos)]


SLOT, GEN = 3, 7


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.one_of(
    st.tuples(st.just("write"), st.integers(1, 4)),
    st.tuples(st.just("writer"), st.sampled_from((None,) + step.STEPS), st.integers(1, 1 << 13)),
    st.tuples(st.just("read"), st.booleans()),
), max_size=60), entries=st.sampled_from([4, 8]))
def test_the_writer_step_killed_after_any_step_stores_and_answers_every_frame_exactly_once(shm, tmp_path, ops,
                                                                                           entries):
    """``ingress.step.serve_once`` — the writer's own batch step — over a producer's ring, a real
    commitlog and a state segment, killed after any of its steps (``trace``); the successor recovers
    as the writer process does (commitlog cut back to ``write_pos``, ``resolve_intent``, the ring
    re-opened at its journal, what was staged released) and goes on. Every frame the producer published
    reaches the commitlog exactly once, in order, and the producer reads exactly one completion per
    frame, carrying its queue offset and commitlog position."""
    p = IngressRing.create(shm.name("ingress", next(_names)), 4096, entries)
    w = IngressRing.from_fd(p.segment.fd)
    state = Segment.create_memfd("state", 4096, "test-state", 1)
    words = state.array(np.int64, max(R.STATE_WORD.values()) + 1)
    queues = {TOPIC: 1}
    log = _Log(tempfile.mkdtemp(dir=tmp_path), queues)
    seen: list[tuple] = []              # completions the producer read
    next_seq = 0

    def writer_pass(kill_after, max_bytes) -> bool:
        def trace(what):
            if what == kill_after:
                raise Killed(what)
        try:
            # an uninterrupted pass takes the native step where it is built (trace: the Python steps)
            b = step.serve_once(w, SLOT, GEN, words, log.cl, step.Limits(1 << 20, 1 << 16, max_bytes), queues,
                                1_700_000_000_000, trace=None if kill_after is None else trace)
            if b is not None:
                step.release(w, b.cw_end, b.data_end, trace=trace)
            return False
        except Killed:
            return True

    def restart():
        nonlocal w
        w.close()
        log.restart(words[step.W_WRITE_POS])
        w = IngressRing.from_fd(p.segment.fd)
        if step.resolve_intent(words, SLOT, GEN, w):
            w.close()
            w = IngressRing.from_fd(p.segment.fd)
        words[step.I_VALID] = 0
        if step.unreleased(w):
            step.release(w, w.staged_position, w.handed_position)

    def read(use_tuples):
        rows = p.completion_tuples() if use_tuples else [tuple(r) for r in p.completions().tolist()]
        seen.extend(rows)

    try:
        for op, a, *b in ops:
            if op == "write":
                for _ in range(a):
                    kind, count, payload = frame_payload(next_seq)
                    if not p.try_write(kind, next_seq, payload, count):
                        break
                    next_seq += 1
            elif op == "writer":
                if writer_pass(a, b[0]):
                    restart()
            else:
                read(a)
        for _ in range(4 * next_seq + 4):                  # drain without kills
            read(True)
            if len(seen) == next_seq:
                break
            writer_pass(None, 1 << 20)
        expected = [body_for(s, i if frame_payload(s)[1] > 1 else 0)
                    for s in range(next_seq) for i in range(frame_payload(s)[1])]
        assert log.bodies(words[step.W_WRITE_POS]) == expected
        assert [r[0] for r in seen] == list(range(next_seq))
        assert all(r[1] == R.COMPLETION_SEND_OK for r in seen)
        firsts = list(itertools.accumulate((frame_payload(s)[1] for s in range(next_seq)), initial=0))[:-1]
        assert [r[3] for r in seen] == firsts                     # each frame's first queue offset
        assert [R.decode_record(log.cl.record_at(r[4]))[2] for r in seen] == [body_for(s) for s in range(next_seq)]
        assert p.in_flight == 0 and p.free_bytes() == 4096 and not w.has_frames()
        assert words[step.I_VALID] == 0
    finally:
        w.close()
        p.close()
        log.cl.close()
        state.close()
