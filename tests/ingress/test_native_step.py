"""The writer's native step (hostmq/ingress/_step.c) against its spec, the Python steps of
hostmq/ingress/step.py.

A hypothesis state machine keeps two worlds fed the same frames: a producer ring, the writer's end of
it, a commitlog directory, broker state words and a queue table each; one world is served with the
native step on, the other with it off. After every step it compares what each step returned and
every byte either could have written: the ring header words, the completion ring, the writer's
private cursors, the commitlog files, the state words, the queue offsets and the store time. Frames
include hostile ones: records that fail their checks, lying sizes, unknown topics, queues out of
range, BATCH frames, records that do not fit the current file, impossible frame headers; and
``now_ms`` goes backwards, refusals come and go, completions are read or not.
"""
from __future__ import annotations

import itertools
import os
import struct
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hostmq import records as R
from hostmq.errors import RingCorruptError, ValidationError
from hostmq.ingress import step
from hostmq.ingress.ring import IngressRing
from hostmq.shm import Segment
from hostmq.store.commitlog import CommitLog
from hostmq.store.queue_table import QueueTable
from tests.shm import ShmNames

pytestmark = pytest.mark.timeout(300)
needs_native = pytest.mark.skipif(step.NATIVE_STEP is None, reason="hostmq/ingress/_step.c not built")
TOPIC = b"shm-test"
OTHER = b"other-topic"
FILE_BYTES = 4096
HDR = R.FRAME_HEADER.size
_names = itertools.count()
_roots: list[str] = []


def test_native_step_is_built():
    """pip builds hostmq/ingress/_step.c on install; if this fails the Python step serves every batch."""
    assert step.NATIVE_STEP is not None, "hostmq.ingress._step is not built: pip install -e . (needs a C compiler)"


def test_the_committed_step_layout_header_is_the_one_records_py_generates():
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           R.STEP_LAYOUT_HEADER)) as f:
        assert f.read() == R.step_layout_header(), "hostmq/include/step_layout.h is stale: run tools/gen_layout.py"


def test_a_moved_word_changes_the_generated_step_header():
    moved = {**R.STEP_LAYOUT, "STATE_WORD": {**R.STEP_LAYOUT["STATE_WORD"], "write_pos": 99}}
    assert "SW_WRITE_POS = 99," in R.step_layout_header(moved)
    assert R.step_layout_header(moved) != R.step_layout_header()


@needs_native
def test_the_built_step_carries_the_declared_layout():
    assert step.NATIVE_STEP.LAYOUT == R.step_layout_flat()


def test_the_queue_table_is_a_mapping_whichever_side_holds_a_key():
    t = QueueTable({("a", 0): 5, ("a", 7): 2, ("b", 1): 1})
    t.set_topics({b"a": 4})
    assert dict(t) == {("a", 0): 5, ("a", 7): 2, ("b", 1): 1}
    assert t.get(("a", 1)) is None and t.get(("a", 1), 0) == 0
    t[("a", 1)] = 3
    assert t.offsets.tolist()[:2] == [5, 3]
    del t[("a", 0)]
    assert ("a", 0) not in t and len(t) == 3
    t.set_topics({b"b": 2})
    assert dict(t) == {("a", 7): 2, ("b", 1): 1, ("a", 1): 3} and t.offsets.tolist() == [-1, 1]
    assert t.pop(("b", 1)) == 1 and t == {("a", 7): 2, ("a", 1): 3}


def record(topic: bytes = TOPIC, body: bytes = b"x" * 20, props: bytes = b"", qid: int = 0) -> bytes:
    return R.encode_record(topic, body, props, queue_id=qid)


class World:
    """One producer ring, the writer's end, a commitlog, state words and a queue table."""

    def __init__(self, shm: ShmNames, root: str, data_bytes: int, entries: int, queues: dict,
                 file_bytes: int = FILE_BYTES) -> None:
        self.p = IngressRing.create(shm.name("ingress", next(_names)), data_bytes, entries)
        self.w = IngressRing.from_fd(self.p.segment.fd)
        self.state = Segment.create_memfd("state", 4096, "test-state", 1)
        self.words = self.state.array(np.int64, max(R.STATE_WORD.values()) + 1)
        self.cl = CommitLog(root, file_bytes, store_host=b"HOSTHOST")
        self.cl.mfq.load()
        self.cl._room_for(0)            # the first file, current (else the first batch is Python's to place)
        self.cl.topic_queue_table = QueueTable()
        self.cl.topic_queue_table.set_topics(queues)
        self.wake = np.zeros(R.QUEUE_WAKE_WORDS, np.int64)     # the state's queue wake words (step.Follow)
        self.dropped = False

    def close(self) -> None:
        self.w.close()
        self.p.close()
        self.cl.close()
        del self.words
        self.state.close()

    def snapshot(self) -> dict:
        files = {os.path.basename(mf.path): bytes(mf.mm[:]) for mf in self.cl.mfq.files}
        w = self.w
        words = self.words.copy()
        at = [R.STATE_WORD[k] for k in ("step_started_ns", "step_woke_ns", "step_cpu")]
        # The wake-up stamps are clock and CPU readings (each side its own): compared as "stamped or not"
        words[at] = words[at] > 0
        return {"header": bytes(self.p.segment.buf[:R.RING_HEADER.itemsize]),
                "completions": self.w._comp.tobytes(),
                "cursors": (w._hpos, w._cstaged, w._uncompleted, w._rpos, w._cwpos),
                "files": files, "words": words.tobytes(), "wake": self.wake.tobytes(),
                "table": dict(self.cl.topic_queue_table), "ts": self.cl.last_store_ts_ms,
                "wrote": [(mf.file_from_offset, mf.wrote_pos) for mf in self.cl.mfq.files]}


class NativeAgainstPython(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        root = tempfile.mkdtemp(dir=_roots[-1])
        shm = ShmNames(root, "native")
        self.queues = {TOPIC: 2, OTHER: 1}
        self.native = World(shm, os.path.join(root, "a"), 16384, 8, self.queues)
        self.python = World(shm, os.path.join(root, "b"), 16384, 8, self.queues)
        self.seq = 0
        self.now = 1_700_000_000_000
        self.served: list = []

    def teardown(self) -> None:
        self.native.close()
        self.python.close()

    def _write(self, kind: int, payload: bytes, count: int) -> None:
        for wd in (self.native, self.python):
            if wd.p.dropped:
                continue
            try:
                wd.p.try_write(kind, self.seq, payload, count)
            except ValidationError:         # the producer's own check (a count its bytes cannot hold)
                pass
        self.seq += 1

    @rule(body=st.binary(min_size=1, max_size=300), qid=st.integers(0, 3),
          topic=st.sampled_from([TOPIC] * 4 + [OTHER, b"unknown", b""]),
          props=st.sampled_from([b""] * 4 + [b"a\x01b\x02"] * 4 + [b"KEYS\x01k\x02", b"a\x01b\x02a\x01c\x02",
                                                                 b"\xff\x01b\x02"]))
    def message(self, body, qid, topic, props):
        self._write(R.FRAME_MESSAGE, record(topic, body, props, qid), 1)

    @rule(body=st.binary(min_size=1, max_size=64),
          how=st.sampled_from(["crc", "size", "magic", "blen", "qid", "trail"]), now=st.integers(0, 3))
    def bad_message(self, body, how, now):
        if now:         # (hostile frames send their batch to Python: a quarter of the time)
            return
        rec = bytearray(record(body=body))
        if how == "crc":
            rec[R.FIELD["body_crc"] + 3] ^= 1
        elif how == "size":
            struct.pack_into(">i", rec, 0, len(rec) - 1)
        elif how == "magic":
            rec[5] ^= 0x10
        elif how == "blen":
            struct.pack_into(">i", rec, R.FIELD["body_length"], len(body) + 5)
        elif how == "qid":
            struct.pack_into(">i", rec, R.FIELD["queue_id"], -3)
        else:
            rec += b"\0" * 4
        self._write(R.FRAME_MESSAGE, bytes(rec), 1)

    @rule(n=st.integers(1, 4), qid=st.integers(0, 2), topic=st.sampled_from([TOPIC, OTHER, b"unknown"]),
          odd=st.sampled_from([None] * 10 + ["topic", "qid", "empty-topic", "crc", "count", "props"]))
    def batch(self, n, qid, topic, odd):
        """A BATCH frame: one topic and queue, or a record that differs (another topic or queue, no
        topic, a bad CRC, a count that lies, properties to check further)."""
        recs = [bytearray(record(topic, bytes([i]) * (10 + i), qid=qid)) for i in range(n)]
        if odd == "topic":
            recs[-1] = bytearray(record(b"other", b"o" * 10, qid=qid))
        elif odd == "qid":
            recs[-1] = bytearray(record(topic, b"q" * 10, qid=qid + 1))
        elif odd == "empty-topic":
            recs[-1] = bytearray(record(b"", b"e" * 10, qid=qid))
        elif odd == "crc":
            recs[-1][R.FIELD["body_crc"] + 3] ^= 1
        elif odd == "props":
            recs[-1] = bytearray(record(topic, b"p" * 10, b"KEYS\x01k\x02", qid=qid))
        count = n + 1 if odd == "count" else n
        self._write(R.FRAME_BATCH, b"".join(bytes(r) for r in recs), count)

    @rule(size=st.sampled_from([900, 1500, 1900]))
    def big(self, size):
        """Records a few of which fill a 4 KiB file: rolls."""
        self._write(R.FRAME_MESSAGE, record(body=b"B" * size), 1)

    @rule(how=st.sampled_from(["kind", "bytes", "count"]), now=st.integers(0, 5))
    def hostile_header(self, how, now):
        """A frame whose header the writer must refuse (the ring is dropped: a sixth of the time)."""
        if now:
            return
        for wd in (self.native, self.python):
            if wd.p.dropped:
                continue
            payload = record()
            if not wd.p.try_write(R.FRAME_MESSAGE, self.seq, payload, 1):
                continue
            p = wd.p
            start = (p._wpos - ((HDR + len(payload) + 7) & ~7)) & p._mask
            if how == "kind":
                struct.pack_into("=I", p._data, start + 4, 9)
            elif how == "bytes":
                struct.pack_into("=I", p._data, start, 5000)
            else:
                struct.pack_into("=I", p._data, start + 16, 2)
        self.seq += 1

    @rule(batch_bytes=st.sampled_from([1, 200, 1 << 20]), dt=st.integers(-5, 5),
          refusal=st.sampled_from([0, 0, 0, 0, R.COMPLETION_STORE_FULL]), release=st.booleans(),
          follow=st.sampled_from([None, None, (True, True, True), (True, True, False), (False, True, True),
                                  (True, False, True), (False, False, False)]))
    def serve(self, batch_bytes, dt, refusal, release, follow):
        """One batch; with ``follow`` the writer's follow-ups too (step.Follow: committed_pos, queue
        wake words, step 7), in the same native call on one side and by step.follow_up on the other."""
        self.now += dt
        out = []
        for wd, native in ((self.native, True), (self.python, False)):
            if wd.dropped:
                out.append("dropped")
                continue
            woken: set = set()
            published: list = []
            saved = step.USE_NATIVE
            step.USE_NATIVE = native
            try:
                fw = None if follow is None else step.follow_of(follow[0], wd.wake if follow[1] else None, follow[2])
                b = step.serve_once(wd.w, 3, 7, wd.words, wd.cl, step.Limits(1 << 16, 1 << 12, batch_bytes),
                                    self.queues, self.now, refusal=refusal, woken=woken,
                                    on_publish=lambda end, n: published.append((end, n)), follow=fw)
            except RingCorruptError:
                wd.w.mark_dropped()
                wd.dropped = True
                out.append("corrupt")
                continue
            finally:
                step.USE_NATIVE = saved
            if b is not None and release and not b.followed & step.FOLLOW_RELEASE:
                step.release(wd.w, b.cw_end, b.data_end)
            out.append((b, sorted(woken), published))
        assert out[0] == out[1]

    @rule()
    def read(self):
        a = self.native.p.completion_tuples() if not self.native.p.dropped else []
        b = self.python.p.completion_tuples() if not self.python.p.dropped else []
        assert a == b

    @invariant()
    def same_bytes(self):
        a, b = self.native.snapshot(), self.python.snapshot()
        for k in a:
            assert a[k] == b[k], k


@needs_native
def test_the_native_step_writes_what_the_python_step_writes(tmp_path, monkeypatch):
    _roots.append(str(tmp_path))
    statuses: list[int] = []
    batches: list[bool] = []        # a served batch that appended more records than frames: BATCH frames
    serve = step.NATIVE_STEP.serve

    def counted(*args):
        out = serve(*args)
        statuses.append(out[0])
        batches.append(out[0] == step.StepStatus.DONE and out[2] > out[1])
        return out

    monkeypatch.setattr(step.NATIVE_STEP, "serve", counted)
    try:
        NativeAgainstPython.TestCase.settings = settings(
            # derandomize: the same 300 programs every run, so the coverage checks below (BATCH
            # frames served natively, every fallback) hold every run, not most.
            max_examples=300, stateful_step_count=50, deadline=None, derandomize=True,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
        NativeAgainstPython.TestCase().runTest()
    finally:
        _roots.pop()
    # both sides of the switch were exercised: batches the C step served, and each fallback
    seen = {step.StepStatus(s) for s in statuses}
    assert seen == set(step.StepStatus) - {step.StepStatus.FALLBACK_SCRATCH}, seen
    assert any(batches), "the native step served BATCH frames too"


@needs_native
def test_a_frame_larger_than_the_native_steps_copy_is_served_by_the_python_step(tmp_path, monkeypatch):
    """The native step keeps a private copy of about twice ``batch_bytes``: a larger frame goes to the
    Python step (FALLBACK_SCRATCH), and the next small one to the native step again."""
    statuses: list[int] = []
    serve = step.NATIVE_STEP.serve
    monkeypatch.setattr(step.NATIVE_STEP, "serve", lambda *a: statuses.append((out := serve(*a))[0]) or out)
    queues = {TOPIC: 1}
    wd = World(ShmNames(str(tmp_path), "scratch"), str(tmp_path / "log"), 1 << 18, 8, queues, 1 << 20)
    try:
        limits = step.Limits(1 << 20, 1 << 12, 1)
        big = record(body=b"L" * 70_000)
        for payload in (big, record()):
            assert wd.p.try_write(R.FRAME_MESSAGE, 1, payload, 1)
            b = step.serve_once(wd.w, 0, 1, wd.words, wd.cl, limits, queues, 5)
            assert (b.frames, b.appended) == (1, 1)
            step.release(wd.w, b.cw_end, b.data_end)
        assert statuses == [step.StepStatus.FALLBACK_SCRATCH, step.StepStatus.DONE]
        rows = wd.p.completion_tuples()
        assert [r[1:4] for r in rows] == [(R.COMPLETION_SEND_OK, 1, 0), (R.COMPLETION_SEND_OK, 1, 1)]
    finally:
        wd.close()
