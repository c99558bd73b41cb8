"""The producer's side of a send in C (``_step.c`` ring_write, await_completion) against its spec:
``IngressRing.try_write`` + ``signal.notify_if_waiting``, and ``signal.wait_for`` on the completion
cursor (what ``ProducerSession`` did before).

Two rings get the same frames — one through ``write_and_ring``, one through ``try_write`` — and
every byte of both (header words, data ring) and the producer's cursors are compared after each,
with frames that wrap (a SKIP frame first), rings with no room, completions read or not; then the
doorbell (rung only while the writer says it waits), payloads the native call hands back, and the
wait: a completion, a dropped ring, the deadline, the waiting flag while it sleeps.
"""
from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hostmq import records as R
from hostmq.errors import RingCorruptError, ValidationError
from hostmq.ingress import ring as ring_mod
from hostmq.ingress.ring import IngressRing
from hostmq.waiting import SLEEP, IdleStrategy, poll_until
from tests.ingress.test_native_step import record
from tests.shm import ShmNames

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not ring_mod.USE_NATIVE_SEND, reason="hostmq/ingress/_step.c not built, or off")]
_ids = itertools.count()


def cursors(r: IngressRing) -> tuple:
    return r._wpos, r._rpos_seen, r._committed_frames, r._crpos


OPS = st.lists(st.one_of(
    st.tuples(st.just("msg"), st.integers(1, 900)),
    st.tuples(st.just("batch"), st.integers(1, 5)),
    st.tuples(st.just("serve"), st.integers(0, 8)),
), min_size=1, max_size=60)


def test_write_and_ring_writes_what_try_write_writes(tmp_path_factory):
    seen: set = set()

    @settings(max_examples=80, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(ops=OPS)
    @example(ops=[("msg", 900), ("serve", 1)] * 6 + [("batch", 5), ("msg", 700)] * 3)    # wraps: SKIP frames
    def check(ops):
        one(tmp_path_factory, ops, seen)

    check()
    # written, no room, frames past the ring's end; completions read natively as the spec reads them
    assert seen == {True, False, "wrapped", "read", "none"}, seen


def one(tmp_path_factory, ops, seen: set) -> None:
    shm = ShmNames(str(tmp_path_factory.mktemp("ring")), "native-send")
    a = IngressRing.create(shm.name("a", next(_ids)), 4096, 8)
    b = IngressRing.create(shm.name("b", next(_ids)), 4096, 8)
    wa, wb = IngressRing.from_fd(a.segment.fd), IngressRing.from_fd(b.segment.fd)
    bell = np.zeros(1, np.int64)
    seq = 0
    try:
        for op, n in ops:
            if op == "serve":       # the writer takes, completes and releases every frame; the producers
                answers = []            # read their answers (natively and by the spec), or not (the ring fills)
                for p, w in ((a, wa), (b, wb)):
                    frames = w.frames()
                    if frames:
                        w.complete([(f.seq, (R.COMPLETION_SEND_OK, R.COMPLETION_NO_TOPIC, 3)[f.seq % 3],
                                     f.record_count, f.seq * 7, (f.seq << 33) + 1, 1_700_000_000_000 + f.seq)
                                    for f in frames])
                        w.release()
                    if n:
                        answers.append(p.completion_tuples() if p is a else p.py_completion_tuples())
                if answers:
                    assert answers[0] == answers[1]
                    seen.add("read" if answers[0] else "none")
                assert cursors(a) == cursors(b)
                assert bytes(a.segment.buf[:R.RING_HEADER.itemsize]) == bytes(b.segment.buf[:R.RING_HEADER.itemsize])
                continue
            if op == "msg":
                kind, payload, count = R.FRAME_MESSAGE, record(body=b"m" * n), 1
            else:
                kind, count = R.FRAME_BATCH, n
                payload = b"".join(record(body=bytes([i]) * 9) for i in range(n))
            seq += 1
            got = a.write_and_ring(kind, seq, payload, count, bell)
            want = b.try_write(kind, seq, payload, count)
            assert got is not None and got == want
            seen.add(got)
            if a._wpos > a.capacity:
                seen.add("wrapped")
            assert cursors(a) == cursors(b)
            assert bytes(a.segment.buf[:R.RING_HEADER.itemsize]) == bytes(b.segment.buf[:R.RING_HEADER.itemsize])
            assert bytes(a._data) == bytes(b._data)
        assert bell[0] == 0             # the writer never said it waits
    finally:
        for r in (wa, wb, a, b):
            r.close()


def test_the_doorbell_rings_only_while_the_writer_waits_and_odd_frames_go_to_python(tmp_path):
    shm = ShmNames(str(tmp_path), "bell")
    p = IngressRing.create(shm.name("r", 0), 4096, 8)
    w = IngressRing.from_fd(p.segment.fd)
    bell = np.zeros(1, np.int64)
    try:
        assert p.write_and_ring(R.FRAME_MESSAGE, 1, record(), 1, bell) is True and bell[0] == 0
        w.writer_waiting.set()
        assert p.write_and_ring(R.FRAME_MESSAGE, 2, bytearray(record()), 1, bell) is True and bell[0] == 1
        before = bytes(p.segment.buf[:R.RING_HEADER.itemsize]), bytes(p._data), cursors(p)
        # handed back with nothing written: ring.py judges (and raises) these
        assert p.write_and_ring(R.FRAME_MESSAGE, 3, memoryview(record()), 1, bell) is None
        assert p.write_and_ring(R.FRAME_MESSAGE, 3, record(), 2, bell) is None          # a MESSAGE of 2 records
        assert p.write_and_ring(9, 3, record(), 1, bell) is None                         # an unknown kind
        assert p.write_and_ring(R.FRAME_MESSAGE, 3, b"x" * (p.max_payload_bytes + 1), 1, bell) is None
        assert (bytes(p.segment.buf[:R.RING_HEADER.itemsize]), bytes(p._data), cursors(p)) == before
        assert bell[0] == 1
        with pytest.raises(ValidationError):
            p.try_write(R.FRAME_MESSAGE, 3, record(), 2)
        with pytest.raises(ValueError):         # a doorbell that is not an aligned int64 word
            p.write_and_ring(R.FRAME_MESSAGE, 3, record(), 1, np.zeros(3, np.uint8))
    finally:
        w.close()
        p.close()


def test_take_completions_hands_cursors_that_disagree_to_the_spec_which_raises(tmp_path):
    shm = ShmNames(str(tmp_path), "takec")
    p = IngressRing.create(shm.name("r", 0), 4096, 8)
    w = IngressRing.from_fd(p.segment.fd)
    try:
        assert p.write_and_ring(R.FRAME_MESSAGE, 1, record(), 1, np.zeros(1, np.int64)) is True
        w.complete([(f.seq, R.COMPLETION_SEND_OK, 1, 5, 99, 7) for f in w.frames()])
        assert p.completion_tuples() == [(1, R.COMPLETION_SEND_OK, 1, 5, 99, 7)] and p.completion_tuples() == []
        word = R.RING_WORD["completion_write_pos"]
        for bad in (p._crpos + p.completion_entries + 1, p._crpos - 1):     # more than the ring holds; backwards
            w._q[word] = bad
            before = bytes(p.segment.buf[:R.RING_HEADER.itemsize]), cursors(p)
            assert ring_mod._NATIVE.take_completions(p._q, p._comp, p._crpos, p.completion_entries) is None
            with pytest.raises(RingCorruptError):
                p.completion_tuples()
            assert (bytes(p.segment.buf[:R.RING_HEADER.itemsize]), cursors(p)) == before
        with pytest.raises(ValueError):                 # a completion buffer smaller than its entries
            ring_mod._NATIVE.take_completions(p._q, p._comp[:4], p._crpos, p.completion_entries)
    finally:
        w.close()
        p.close()


@pytest.mark.parametrize("idle", [SLEEP, IdleStrategy("spin", 300), IdleStrategy("yield", 300),
                                  IdleStrategy("backoff", 300)])
def test_await_completion_wakes_for_a_completion_or_a_dropped_ring_and_times_out(tmp_path, idle):
    shm = ShmNames(str(tmp_path), "await")
    p = IngressRing.create(shm.name("r", 0), 4096, 8)
    w = IngressRing.from_fd(p.segment.fd)
    try:
        assert p.await_completion(time.monotonic() + 0.01, idle) is False          # nothing: the deadline
        assert not p.producer_waiting.is_set()
        assert p.write_and_ring(R.FRAME_MESSAGE, 1, record(), 1, np.zeros(1, np.int64))
        out: list = []
        t = threading.Thread(target=lambda: out.append(p.await_completion(time.monotonic() + 30, idle)))
        t.start()
        if idle is SLEEP:           # it sleeps with its flag up, as wait_for does
            poll_until(p.producer_waiting.is_set, 10, "the producer's waiting flag", step_s=0.001)
        frames = w.frames()
        w.complete([(f.seq, R.COMPLETION_SEND_OK, 1, 0, 0, 0) for f in frames])
        w.release()
        w.completion_word.wake()            # as step.release does when the flag is up
        t.join(10)
        assert out == [True] and not p.producer_waiting.is_set()
        assert p.await_completion(time.monotonic() + 5, idle) is True      # not read yet: at once
        p.completion_tuples()
        w.mark_dropped()                    # a dropped ring ends the wait too
        assert p.await_completion(time.monotonic() + 5, idle) is True
        with pytest.raises(ValueError):
            ring_mod._NATIVE.await_completion(p._q, 0, 0, 7, 0)
    finally:
        w.close()
        p.close()
