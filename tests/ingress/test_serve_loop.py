"""The writer's loop in C (``_step.c`` serve_loop, ``step.serve_loop``) against its spec: the writer's
Python loop body, ``step.serve_once`` with every follow-up, a batch per ring with frames.

Two worlds (tests/ingress/test_native_step.py's: a producer ring, a commitlog, state words, a queue
table) get the same frames; one is served by the native loop, handing a batch back to
``serve_once``'s Python steps where the loop says so (as ``Writer.serve_loop`` does), the other by
``serve_once`` alone; every byte either could write is compared after every round. Then each way the
loop hands back to Python, its waiting flags and its sleep on the doorbell, the deferred dispatcher
wake-up, and arguments that disagree (a typed error, nothing written).
"""
from __future__ import annotations

import os
import struct
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostmq import records as R
from hostmq.errors import RingCorruptError
from hostmq.ingress import step
from hostmq.shm.signal import notify_if_waiting
from hostmq.shm.futex import FutexWord
from hostmq.waiting import SLEEP, IdleStrategy, poll_until
from tests.ingress.test_native_step import OTHER, TOPIC, World, record
from tests.shm import ShmNames

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not step.USE_NATIVE_LOOP, reason="hostmq/ingress/_step.c not built, or turned off")]
W = R.STATE_WORD
SLOT, GEN = 3, 7
LIMITS = step.Limits(1 << 16, 1 << 12, 1 << 20)
QUEUES = {TOPIC: 2, OTHER: 1}


def loop(wd: World, doorbell: np.ndarray, *, until_s: float | None = None, idle=SLEEP, due_s: float = 0.0,
         delay_s: float = 0.001, sessions: int = 0, topics: int = 0) -> step.LoopResult:
    return step.serve_loop([(SLOT, GEN, wd.w)], wd.words, doorbell, wd.wake, wd.cl, LIMITS,
                           sessions_seen=sessions, topics_seen=topics,
                           until_s=time.monotonic() if until_s is None else until_s, dispatch_due_s=due_s,
                           dispatch_delay_s=delay_s, idle=idle, busy_idle=idle, busy_window_s=0.002,
                           last_work_s=0.0)


def new_world(tmp_path, name: str, file_bytes: int = 4096, **kw) -> World:
    wd = World(ShmNames(str(tmp_path), name), str(tmp_path / name), 16384, 8, QUEUES, file_bytes)
    wd.words[W["confirmed_pos"]] = -1           # as a broker's state starts: no replication confirms
    return wd


FRAMES = st.lists(st.one_of(
    st.tuples(st.just("msg"), st.binary(min_size=1, max_size=200), st.integers(0, 2),
              st.sampled_from([TOPIC, TOPIC, OTHER, b"unknown"])),
    st.tuples(st.just("batch"), st.integers(1, 4), st.integers(0, 1), st.sampled_from([TOPIC, OTHER])),
    st.tuples(st.just("bad"), st.sampled_from(["crc", "props"]), st.just(0), st.just(TOPIC)),
    st.tuples(st.just("big"), st.sampled_from([900, 1500]), st.just(0), st.just(TOPIC)),
), min_size=1, max_size=6)


def payload(kind, a, qid, topic) -> tuple[int, bytes, int]:
    if kind == "msg":
        return R.FRAME_MESSAGE, record(topic, a, qid=qid), 1
    if kind == "batch":
        return R.FRAME_BATCH, b"".join(record(topic, bytes([i]) * (8 + i), qid=qid) for i in range(a)), a
    if kind == "big":
        return R.FRAME_MESSAGE, record(body=b"B" * a), 1
    rec = bytearray(record(body=b"bad"))
    if a == "crc":
        rec[R.FIELD["body_crc"] + 3] ^= 1
        return R.FRAME_MESSAGE, bytes(rec), 1
    return R.FRAME_MESSAGE, record(TOPIC, b"p", b"a\x01b\x02a\x01c\x02"), 1     # a key twice: Python judges


def test_the_loop_writes_what_serve_once_with_its_follow_ups_writes(tmp_path_factory):
    exits: set = set()

    @settings(max_examples=60, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(rounds=st.lists(FRAMES, min_size=1, max_size=8), read=st.lists(st.booleans(), min_size=8, max_size=8))
    def check(rounds, read):
        tmp = tmp_path_factory.mktemp("loop")
        a, b = new_world(tmp, "loop"), new_world(tmp, "spec")
        bell = np.zeros(1, np.int64)
        seq = 0
        try:
            for i, frames in enumerate(rounds):
                for f in frames:
                    kind, data, count = payload(*f)
                    for wd in (a, b):
                        wd.p.try_write(kind, seq, data, count)
                    seq += 1
                while a.w.has_frames() or b.w.has_frames():
                    r = loop(a, bell)
                    exits.add(r.exit)
                    if r.exit == step.LoopExit.FALLBACK:        # what Writer.serve_loop does with it
                        assert r.ring == 0
                        step.serve_once(a.w, SLOT, GEN, a.words, a.cl, LIMITS, QUEUES, int(time.time() * 1000),
                                        follow=step.follow_of(True, a.wake, True))
                    if b.w.has_frames():
                        step.serve_once(b.w, SLOT, GEN, b.words, b.cl, LIMITS, QUEUES, int(time.time() * 1000),
                                        follow=step.follow_of(True, b.wake, True))
                    sa, sb = a.snapshot(), b.snapshot()
                    for k in ("header", "cursors", "wake", "table", "wrote"):
                        assert sa[k] == sb[k], k
                    assert untimed(a.w._comp) == untimed(b.w._comp)
                    assert without_ts(a.words) == without_ts(b.words)
                    assert a.words[W["step_started_ns"]] <= a.words[W["step_woke_ns"]] <= time.monotonic_ns()
                    if a.words[W["step_woke_ns"]]:      # the CPU it woke them from, plus one
                        assert 1 <= a.words[W["step_cpu"]] <= os.cpu_count()
                    assert sa["files"].keys() == sb["files"].keys()
                    for name in sa["files"]:    # the store time may differ by the ms the two calls straddle
                        assert strip_times(sa["files"][name]) == strip_times(sb["files"][name]), name
                if read[i % len(read)]:         # the producers read their answers (or leave the ring full)
                    assert [c[:5] for c in a.p.completion_tuples()] == [c[:5] for c in b.p.completion_tuples()]
            assert bell[0] == 0
        finally:
            a.close()
            b.close()

    check()
    assert exits == {step.LoopExit.DEADLINE, step.LoopExit.FALLBACK}, exits     # served, and handed back


def untimed(completions: np.ndarray) -> list:
    """Completion entries without their store time (each side read its own clock)."""
    return completions[[n for n in R.COMPLETION.names if n != "store_ts_ms"]].tolist()


def without_ts(words: np.ndarray) -> list[int]:
    """The words with the clock readings left out: the store time, and the wake-up stamps as
    "stamped or not" (each side stamps its own clock)."""
    out = words.tolist()
    out[W["last_store_ts_ms"]] = 0
    for k in ("step_started_ns", "step_woke_ns", "step_cpu"):
        out[W[k]] = out[W[k]] > 0
    return out


def strip_times(data: bytes) -> bytes:
    """The file with each record's store time zeroed (the rest must be equal byte for byte)."""
    out = bytearray(data)
    pos = 0
    while pos + 8 <= len(out):
        size, magic = struct.unpack_from(">iI", out, pos)
        if magic != R.MAGIC_CODE or size < R.MIN_RECORD_BYTES:
            break
        out[pos + R.FIELD["store_ts_ms"]:pos + R.FIELD["store_ts_ms"] + 8] = bytes(8)
        pos += size
    return bytes(out)


def test_each_way_the_loop_hands_back_and_what_it_served_first(tmp_path):
    wd = new_world(tmp_path, "exits")
    bell = np.zeros(1, np.int64)
    try:
        # nothing to do: the deadline, nothing written
        before = wd.snapshot()
        r = loop(wd, bell, until_s=time.monotonic() + 0.02)
        assert (r.exit, r.ring, r.frames, r.appended) == (step.LoopExit.DEADLINE, -1, 0, 0)
        assert wd.snapshot() == before
        # a good frame, then one with a bad CRC: the first served and answered, the second handed
        # back untouched (Python refuses it)
        assert wd.p.try_write(R.FRAME_MESSAGE, 1, record(), 1)
        r = loop(wd, bell)
        assert (r.exit, r.frames, r.appended) == (step.LoopExit.DEADLINE, 1, 1)
        assert [c[:3] for c in wd.p.completion_tuples()] == [(1, R.COMPLETION_SEND_OK, 1)]
        assert wd.words[W["committed_pos"]] == wd.words[W["write_pos"]] > 0
        bad = bytearray(record())
        bad[R.FIELD["body_crc"] + 3] ^= 1
        assert wd.p.try_write(R.FRAME_MESSAGE, 2, bytes(bad), 1)
        hpos = wd.w._hpos
        r = loop(wd, bell)
        assert (r.exit, r.ring, r.frames) == (step.LoopExit.FALLBACK, 0, 0) and wd.w._hpos == hpos
        step.serve_once(wd.w, SLOT, GEN, wd.words, wd.cl, LIMITS, QUEUES, 5, follow=step.follow_of(True, wd.wake, True))
        assert [c[:3] for c in wd.p.completion_tuples()] == [(2, R.COMPLETION_BAD_RECORD, 1)]
        # a word the writer's policy reads moved: back before serving anything
        for word, value in (("sessions_version", 1), ("topics_version", 1), ("flush_error", 5), ("fenced_epoch", 2),
                            ("ha_slaves", 1), ("confirmed_pos", 0)):
            saved = int(wd.words[W[word]])
            wd.words[W[word]] = value
            assert wd.p.try_write(R.FRAME_MESSAGE, 3, record(), 1)
            r = loop(wd, bell, until_s=time.monotonic() + 5)
            assert (r.exit, r.frames) == (step.LoopExit.CHANGED, 0), word
            wd.words[W[word]] = saved
            assert loop(wd, bell).frames == 1
        # a corrupt frame header: Python's step raises for it
        assert wd.p.try_write(R.FRAME_MESSAGE, 4, record(), 1)
        start = (wd.p._wpos - ((R.FRAME_HEADER.size + len(record()) + 7) & ~7)) & wd.p._mask
        struct.pack_into("=I", wd.p._data, start + 4, 9)        # an unknown frame kind
        r = loop(wd, bell)
        assert r.exit == step.LoopExit.FALLBACK
        with pytest.raises(RingCorruptError):
            step.serve_once(wd.w, SLOT, GEN, wd.words, wd.cl, LIMITS, QUEUES, 5)
    finally:
        wd.close()


def test_the_loop_sleeps_with_its_flags_up_and_serves_what_wakes_it(tmp_path):
    """As the writer's wait: the waiting flags (the state's and the ring's) up while it sleeps on the
    doorbell, a producer that sees them rings it, the frame is served and answered at once."""
    wd = new_world(tmp_path, "sleep")
    bell = np.zeros(1, np.int64)
    doorbell = FutexWord(bell, 0)
    out: list = []
    t = threading.Thread(target=lambda: out.append(loop(wd, bell, until_s=time.monotonic() + 20)))
    try:
        t.start()
        poll_until(lambda: wd.p.writer_waiting.is_set() and wd.words[W["writer_waiting"]] == 1, 10,
                   "the loop's waiting flags", step_s=0.001)
        assert wd.p.try_write(R.FRAME_MESSAGE, 9, record(), 1)
        assert notify_if_waiting(wd.p.writer_waiting, doorbell)         # the producer's side
        poll_until(lambda: len(wd.p.completion_tuples()) == 1, 10, "the answer", step_s=0.001)
        wd.words[W["sessions_version"]] += 1            # a session came: back to Python
        doorbell.post()
        t.join(10)
        assert not t.is_alive()
        assert (out[0].exit, out[0].frames, out[0].appended) == (step.LoopExit.CHANGED, 1, 1)
        assert not wd.p.writer_waiting.is_set() and wd.words[W["writer_waiting"]] == 0
    finally:
        wd.words[W["sessions_version"]] += 1
        doorbell.post()
        t.join(10)
        wd.close()


@pytest.mark.parametrize("idle", [SLEEP, IdleStrategy("spin", 200), IdleStrategy("yield", 200),
                                  IdleStrategy("backoff", 200)])
def test_the_deferred_dispatcher_wake_up_comes_once_it_is_due(tmp_path, idle):
    wd = new_world(tmp_path, "due")
    bell = np.zeros(1, np.int64)
    try:
        wd.words[W["dispatcher_waiting"]] = 1
        assert wd.p.try_write(R.FRAME_MESSAGE, 1, record(), 1)
        r = loop(wd, bell, until_s=time.monotonic() + 0.05, idle=idle, delay_s=0.002)
        assert (r.exit, r.appended, r.dispatch_due_s) == (step.LoopExit.DEADLINE, 1, 0.0)
        assert wd.words[W["dispatch_wake"]] == 1
        # a dispatcher that does not wait is not woken; a wake-up not yet due comes back to Python
        wd.words[W["dispatcher_waiting"]] = 0
        assert wd.p.try_write(R.FRAME_MESSAGE, 2, record(), 1)
        r = loop(wd, bell, delay_s=10.0)
        assert r.appended == 1 and r.dispatch_due_s > time.monotonic() + 5
        assert wd.words[W["dispatch_wake"]] == 1
    finally:
        wd.close()


def test_the_loop_hands_back_once_the_file_passes_its_preallocation_mark(tmp_path):
    from hostmq.store.commitlog import CommitLog
    from hostmq.store.queue_table import QueueTable
    wd = new_world(tmp_path, "prealloc")
    bell = np.zeros(1, np.int64)
    try:
        wd.cl.close()
        wd.cl = CommitLog(str(tmp_path / "prealloc2"), 4096, store_host=b"HOSTHOST", preallocate_at=0.5)
        wd.cl.mfq.load()
        wd.cl._room_for(0)
        wd.cl.topic_queue_table = QueueTable()
        wd.cl.topic_queue_table.set_topics(QUEUES)
        exits = []
        for i in range(30):
            assert wd.p.try_write(R.FRAME_MESSAGE, i, record(body=b"m" * 100), 1)
            r = loop(wd, bell)
            exits.append(r.exit)
            if r.exit == step.LoopExit.FALLBACK:     # the roll
                break
            wd.p.completion_tuples()                # the producer reads its answer
        assert exits.count(step.LoopExit.PREALLOC) == 1, exits      # once per file, not once per batch after it
        assert wd.cl.mfq._next is not None
        poll_until(lambda: wd.cl.mfq._next[2], 20, "the preallocated file")
    finally:
        wd.close()


def test_arguments_that_disagree_are_a_typed_error_and_write_nothing(tmp_path, monkeypatch):
    wd = new_world(tmp_path, "args")
    bell = np.zeros(1, np.int64)
    try:
        assert wd.p.try_write(R.FRAME_MESSAGE, 1, record(), 1)
        before = wd.snapshot()
        with pytest.raises(ValueError):         # a ring tuple of the wrong shape
            step.NATIVE_STEP.serve_loop(((wd.w._q, wd.w._data),), wd.words, bell, wd.cl._cur.wmm, bytearray(64),
                                        b"", bytearray(8), bytearray(8), b"HOSTHOST", wd.wake, *([0] * 19))
        with pytest.raises(ValueError):         # state words too short for the words the loop reads
            step.serve_loop([(SLOT, GEN, wd.w)], wd.words[:8], bell, wd.wake, wd.cl, LIMITS, sessions_seen=0,
                            topics_seen=0, until_s=0.0, dispatch_due_s=0.0, dispatch_delay_s=0.0,
                            idle=SLEEP, busy_idle=SLEEP, busy_window_s=0.0, last_work_s=0.0)
        with pytest.raises(ValueError):         # a geometry the ring does not have
            monkeypatch.setattr(wd.w, "capacity", 12345)
            loop(wd, bell)
        monkeypatch.undo()
        monkeypatch.setitem(step.IDLE_CODES, "sleep", 9)
        with pytest.raises(ValueError):         # an idle code out of range
            loop(wd, bell)
        monkeypatch.undo()
        with pytest.raises(TypeError):
            step.NATIVE_STEP.serve_loop(())
        assert wd.snapshot() == before
        assert loop(wd, bell).appended == 1     # and the same frame is served once the arguments agree
    finally:
        wd.close()


def test_a_writer_turns_the_loop_off_with_the_environment(tmp_path):
    import subprocess
    import sys
    code = "from hostmq.ingress import step; print(step.USE_NATIVE_LOOP)"
    env = {**os.environ, "HOSTMQ_NATIVE_LOOP": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
