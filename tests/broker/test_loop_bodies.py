"""The broker's processes driven through their loop bodies in this process (issue 28, item 5).

``LocalBroker`` sets up what the broker process sets up before it spawns its children
(``supervisor.Broker.start``, in its order): the store recovered and closed, the doorbell memfd, the
state segment, the control service and the session server — its socket bound and its thread
running — but no child. Each test constructs ``Writer``, ``Dispatcher`` and ``Flusher`` itself, as
the spawned processes do, and calls their ``run_once``. Producers are real ``ProducerSession``\\ s:
their rings are handed over ``session.sock`` and the writer opens the broker's descriptor of them
through ``/proc/PID/fd``; frames are encoded by the client's own code (``Producer.record``,
``encode_records``). Nothing of hostmq's is mocked; the crash tests only make a writer raise at a
chosen step of a batch (``CrashingWriter``) and leave what it wrote behind, as a kill would.
"""
from __future__ import annotations

import dataclasses
import gc
import itertools
import os
import time

import numpy as np
import pytest

from hostmq import Message
from hostmq import records as R
from hostmq.broker.dispatcher import Dispatcher
from hostmq.broker.flusher import Flusher
from hostmq.broker.service import BrokerService
from hostmq.broker.session_server import SessionServer
from hostmq.broker.writer import Writer, writer_wakes_queues
from hostmq.client.producer import Producer
from hostmq.config import Config
from hostmq.errors import NoRouteError
from hostmq.fsutil import ensure_dir
from hostmq.ingress import step
from hostmq.ingress.session import ProducerSession, Waiter
from hostmq.live.runtime import BrokerRuntime
from hostmq.live.state import BrokerState
from hostmq.message import MessageQueue, SendStatus
from hostmq.protocol.codes import RequestCode, ResponseCode
from hostmq.protocol.frames import Frame
from hostmq.shm import FutexWord, Segment, list_segments, list_semaphores, unlink_semaphore, unlink_segment
from hostmq.store import MessageStore
from hostmq.store.checkpoint import StoreCheckpoint
from hostmq.store.commitlog import CommitLog
from hostmq.store.encode import encode_records, properties_bytes
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(60)

TOPIC = "loops"
FILE_BYTES = 1 << 20
STORE = {"commitlog_file_bytes": FILE_BYTES, "consume_queue_file_entries": 1000, "index_slots": 101,
         "index_entries": 400}
SEND_S = 10.0                   # a producer's deadline for one answer (the writer runs in this thread)
_STATE_NAMES = {i: name for name, i in R.STATE_WORD.items()}


# -- the broker process without its children ---------------------------------------------------------
class LocalBroker:
    """A broker process up to the point where it spawns its children (see the module docstring);
    ``overrides``: ``{"store": {...}, "broker": {...}}`` over the small store these tests use."""

    def __init__(self, root: str, overrides: dict) -> None:
        cfg = Config().with_overrides({"store": {**STORE, **overrides.get("store", {})},
                                       "broker": {"session_slots": 8, **overrides.get("broker", {})}})
        self.rt = BrokerRuntime(root, "broker-a", 0, cfg)
        self.state: BrokerState | None = None
        self.doorbell: Segment | None = None
        self.service: BrokerService | None = None
        self.sessions: SessionServer | None = None
        self.handlers: dict = {}
        self.children: list = []            # writers, dispatchers, flushers in the order made
        self.producers: list[ProducerSession] = []
        self._ids = itertools.count(1)

    def open(self) -> "LocalBroker":
        rt = self.rt
        ensure_dir(rt.broker_dir)
        ensure_dir(rt.config_dir)
        store_host = R.host_bytes(os.getpid())
        with MessageStore(rt.store_dir, rt.config, broker=rt.name, store_host=store_host) as store:
            end, last_ts = store.commitlog.max_offset(), store.commitlog.last_store_ts_ms
            self.rt = rt = dataclasses.replace(rt, config=dataclasses.replace(rt.config, store=store.config))
        self.doorbell = Segment.create_memfd("doorbell", R.DOORBELL_BYTES, R.DOORBELL_KIND, R.DOORBELL_VERSION)
        word = FutexWord(self.doorbell.array(np.int64, 1), R.DOORBELL_WRITER_WORD)
        s = rt.config.store
        self.state = BrokerState.create(rt.state_name, store_host=store_host,
                                        commitlog_file_bytes=s.commitlog_file_bytes,
                                        consume_queue_file_entries=s.consume_queue_file_entries,
                                        index_slots=s.index_slots, index_entries=s.index_entries,
                                        sync_flush=s.flush_disk_type == "SYNC_FLUSH", start_pos=end,
                                        last_store_ts_ms=last_ts, session_slots=rt.config.broker.session_slots,
                                        doorbell_fd=self.doorbell.fd, queue_wakes=writer_wakes_queues(s))
        self.service = BrokerService(rt, self.state, doorbell=word)
        self.handlers = self.service.handlers()
        self.sessions = SessionServer(rt, self.state, word, self.doorbell.fd, self.service.session_fields)
        self.sessions.bind()
        self.sessions.start()
        self.state.set("broker_state", R.BROKER_RUNNING)
        return self

    # -- what the tests use -----------------------------------------------------------------------------
    def request(self, code: int, **fields):
        """Call the control handler of ``code`` with a real frame (no socket: no reply token)."""
        return self.handlers[code](Frame(code, next(self._ids), fields, (), False), None)

    def create_topic(self, topic: str = TOPIC, queues: int = 2) -> None:
        reply = self.request(RequestCode.UPDATE_AND_CREATE_TOPIC, topic=topic, read_queues=queues,
                             write_queues=queues)
        assert reply.fields == {"topic": topic, "created": True}

    def child(self, cls, *args):
        """A Writer, Dispatcher or Flusher (or a subclass) as its process makes it; closed at the end."""
        c = cls(self.rt, *args)
        self.children.append(c)
        return c

    def kill(self, child) -> None:
        """What killing a writer leaves: its files, segments and words as they are. Only this process's
        mappings of them are released (no drain, no commit, no flush, no word written)."""
        self.children.remove(child)
        for a in list(child.rings.values()):
            a.ring.close()
        child.cl.mfq.close()                # unmaps (no file was preallocated: preallocate_next_file is off)
        child.doorbell_segment.close()
        child.state.close()

    def producer(self) -> ProducerSession:
        p = ProducerSession(self.rt, self.rt.name, self.rt.address, data_bytes=1 << 16, completion_entries=64,
                            spin_s=0.0)
        self.producers.append(p)
        return p

    def close(self) -> None:
        """Stop as the broker stops: producers end their sessions, the writer drains them, the
        children stop writer → dispatcher → flusher, then sessions, service, doorbell and state."""
        for p in self.producers:
            p.close(timeout_s=0.0)
        self.producers = []
        writers = [c for c in self.children if isinstance(c, Writer)]
        try:
            if writers and self.state is not None:
                wait_until(lambda: writers[-1].run_once() >= 0 and not self.state.active_slots(), 10,
                           "the writer to drain the closed sessions and the session server to free them")
        finally:
            order = {Writer: 0, Dispatcher: 1, Flusher: 2}
            for c in sorted(self.children, key=lambda c: next(v for k, v in order.items() if isinstance(c, k))):
                c.close()
            self.children = []
            if self.sessions is not None:
                self.sessions.close()
            if self.service is not None:
                self.service.close()
            if self.doorbell is not None:
                self.doorbell.close()
            if self.state is not None:
                self.state.set("broker_state", R.BROKER_STOPPED)
                self.state.unlink()
                self.state.close()
            self.sessions = self.service = self.doorbell = self.state = None


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture
def broker(tmp_path, request):
    """``broker(**overrides)``: an opened LocalBroker; at the end everything it made is closed, and no
    shared memory under its names nor (after a test that passed) any descriptor is left."""
    made: list[LocalBroker] = []
    failed = request.session.testsfailed
    gc.collect()
    fds = _open_fds()

    def _make(**overrides) -> LocalBroker:
        b = LocalBroker(str(tmp_path / f"r{len(made)}"), overrides)
        made.append(b)
        return b.open()

    yield _make
    left = _close(made)
    assert not left, f"shared memory left behind: {left}"
    made.clear()                # a mapping is unmapped once the views on it are collected
    gc.collect()
    new = {n: _link(n) for n in _open_fds() - fds}
    # A failed test's traceback keeps its frames, and the segments their objects map, alive.
    assert not new or request.session.testsfailed > failed, f"descriptors left open: {new}"


def _close(made: list[LocalBroker]) -> list[str]:
    """Close every broker; the shared-memory names under theirs that are left (then unlinked)."""
    for b in made:
        b.close()
    left = [n for b in made for n in list_segments(b.rt.shm_prefix)]
    sems = [s for b in made for s in list_semaphores(b.rt.shm_prefix)]
    for n in left:
        unlink_segment(n)
    for s in sems:
        unlink_semaphore(s)
    return left + [f"sem:{s}" for s in sems]


def _link(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"


# -- producer side: frames as the client encodes them --------------------------------------------------
class Sent:
    """One frame a producer published: its waiter and what it holds."""

    def __init__(self, p: ProducerSession, queue_id: int, bodies: list[bytes], topic: str = TOPIC) -> None:
        self.queue = MessageQueue(topic, p.broker, queue_id)
        self.bodies = bodies
        topic_b = topic.encode()
        msgs = [Message(topic, b) for b in bodies]
        props = [properties_bytes(m, R.new_unique_id(), p.max_properties_bytes) for m in msgs]
        if len(bodies) == 1:            # Producer.send
            payload = Producer.record(topic_b, bodies[0], props[0], 0, self.queue, msgs[0], p)
            self.kind = R.FRAME_MESSAGE
            self.waiter = Waiter(self.queue)
        else:                           # Producer.send_batch
            payload, sizes = encode_records(topic_b, bodies, props, queue_id=queue_id, flags=[0] * len(bodies),
                                            born_ts_ms=int(time.time() * 1000), born_host=R.host_bytes(),
                                            store_host=p.store_host)
            self.kind = R.FRAME_BATCH
            self.waiter = Waiter(self.queue, sizes)
        self.seq = p.submit(self.kind, payload, len(bodies), self.waiter, time.monotonic() + SEND_S)
        self.p = p

    def result(self):
        """The SendResult (or the refusal raised), read by the producer's own completion path."""
        return self.p.result(self.waiter, time.monotonic() + SEND_S)


def ring_word(p: ProducerSession, name: str) -> int:
    return int(p.ring.segment.array(np.int64, R.RING_HEADER.itemsize // 8)[R.RING_WORD[name]])


def completion_rows(p: ProducerSession, start: int, end: int) -> list[tuple]:
    """Completion entries [start, end) as the writer left them in the ring (read or not)."""
    comp = p.ring.segment.array(R.COMPLETION, p.ring.completion_entries, p.ring.completion_offset)
    return [tuple(comp[i % p.ring.completion_entries].tolist()) for i in range(start, end)]


# -- what is in the store -------------------------------------------------------------------------------
def stored(b: LocalBroker) -> list[tuple]:
    """Every record of the commitlog below the published ``write_pos``, read back through a reader of
    its own: ``(phys, size, topic, queue_id, queue_offset, body)``; the bytes after it must be zero."""
    end = b.state.get("write_pos")
    cl = CommitLog(b.rt.store_dir, FILE_BYTES, writable=False)
    try:
        cl.mfq.refresh()
        out, phys = [], 0
        while phys < end:
            raw = cl.record_at(phys)
            h, topic, body, _ = R.decode_record(raw)
            assert h.phys_offset == phys
            out.append((phys, len(raw), topic, h.queue_id, h.queue_offset, body))
            phys += len(raw)
        assert phys == end and cl.record_size_at(end) == 0, "bytes past the published write_pos"
        return out
    finally:
        cl.close()


def phys_of(msg_id: str) -> list[int]:
    return [R.decode_msg_id(m)[1] for m in msg_id.split(",")]


# -- the writer ---------------------------------------------------------------------------------------
def test_writer_appends_a_producers_frames_and_answers_each_with_its_status_and_offsets(broker):
    b = broker()
    b.create_topic(queues=2)
    w = b.child(Writer)
    p = b.producer()
    assert w.run_once() == 0 and list(w.rings) == [p.slot]         # the session table's new row: attached
    assert b.state.attached[p.slot] == p.generation
    sent = [Sent(p, 0, [b"first"]), Sent(p, 1, [b"second"]), Sent(p, 1, [b"b0", b"b1", b"b2"]),
            Sent(p, 7, [b"no such queue"]), Sent(p, 0, [b"last"])]
    assert w.run_once() == 5
    records = stored(b)
    assert [(r[3], r[4], r[5]) for r in records] == [(0, 0, b"first"), (1, 0, b"second"), (1, 1, b"b0"),
                                                     (1, 2, b"b1"), (1, 3, b"b2"), (0, 1, b"last")]
    st = b.state
    end = records[-1][0] + records[-1][1]
    assert st.get("write_pos") == st.get("committed_pos") == end and st.get("appended_records") == 6
    assert st.get("intent_valid") == 0 and st.get("last_store_ts_ms") > 0
    # The completions, one per frame in order, as the writer published them in the ring.
    rows = completion_rows(p, 0, 5)
    phys = {r[5]: r[0] for r in records}
    ok, no_topic = R.COMPLETION_SEND_OK, R.COMPLETION_NO_TOPIC
    assert [r[:4] for r in rows] == [(sent[0].seq, ok, 1, 0), (sent[1].seq, ok, 1, 0), (sent[2].seq, ok, 3, 1),
                                     (sent[3].seq, no_topic, 1, 0), (sent[4].seq, ok, 1, 1)]
    assert [r[4] for r in rows] == [phys[b"first"], phys[b"second"], phys[b"b0"], 0, phys[b"last"]]
    assert all(r[5] > 0 for i, r in enumerate(rows) if i != 3)
    # The journal: every frame appended and answered, the ring given back.
    assert ring_word(p, "completion_write_pos") == ring_word(p, "staged_completion_pos") == 5
    assert ring_word(p, "data_read_pos") == ring_word(p, "appended_data_pos") == ring_word(p, "data_write_pos")
    # ... and what the producer makes of them.
    results = [s.result() for s in sent if s is not sent[3]]
    assert {r.status for r in results} == {SendStatus.SEND_OK}
    assert [(r.queue.queue_id, r.queue_offset) for r in results] == [(0, 0), (1, 0), (1, 1), (0, 1)]
    assert phys_of(results[2].msg_id) == [phys[b"b0"], phys[b"b1"], phys[b"b2"]]
    assert phys_of(results[3].msg_id) == [phys[b"last"]]
    with pytest.raises(NoRouteError):
        sent[3].result()
    assert w.run_once() == 0                                        # nothing new


@pytest.mark.skipif(step.NATIVE_STEP is None or not step.USE_NATIVE, reason="the native step is off or not built")
def test_the_writer_serves_its_batches_with_the_native_step(broker, monkeypatch):
    """The writer process's own loop takes the native step (ingress/_step.c) once a file is current,
    and what it stores and answers is what the Python step would: offsets go on from the Python
    step's, a queue out of range is refused, the queue table stays the commitlog's one table."""
    statuses: list[int] = []
    serve = step.NATIVE_STEP.serve

    def counted(*args):
        out = serve(*args)
        statuses.append(out[0])
        return out

    monkeypatch.setattr(step.NATIVE_STEP, "serve", counted)
    b = broker()
    b.create_topic(queues=2)
    w = b.child(Writer)
    p = b.producer()
    w.run_once()
    first = Sent(p, 1, [b"first"])
    assert w.run_once() == 1 and step.StepStatus.DONE not in statuses     # the first append makes the file
    sent = [Sent(p, 1, [b"second"]), Sent(p, 1, [b"b0", b"b1"]), Sent(p, 9, [b"no such queue"]), Sent(p, 0, [b"q0"])]
    assert w.run_once() == 4
    assert statuses[-1] == step.StepStatus.DONE
    results = [s.result() for s in [first] + sent if s is not sent[2]]
    assert [(r.queue.queue_id, r.queue_offset) for r in results] == [(1, 0), (1, 1), (1, 2), (0, 0)]
    with pytest.raises(NoRouteError):
        sent[2].result()
    assert [r[5] for r in stored(b)] == [b"first", b"second", b"b0", b"b1", b"q0"]
    assert sorted(v for _, v in w.cl.topic_queue_table.items()) == [1, 4]
    st = b.state
    assert st.get("intent_valid") == 0 and st.get("appended_records") == 5
    assert st.get("write_pos") == st.get("committed_pos") == w.cl.max_offset()


def test_writer_takes_a_new_topic_when_the_service_publishes_it_and_stages_large_batches_at_once(broker):
    b = broker()
    w = b.child(Writer)
    p = b.producer()
    early = Sent(p, 0, [b"before the topic"])
    assert w.run_once() == 1
    with pytest.raises(NoRouteError):
        early.result()
    version = b.state.get("topics_version")
    b.create_topic(queues=4)                                        # the service writes topics.json, bumps the word
    assert b.state.get("topics_version") == version + 1
    sent = [Sent(p, i % 4, [b"m%02d" % i]) for i in range(12)]      # more than 8 frames: ring.stage(array)
    assert w.run_once() == 12
    results = [s.result() for s in sent]
    assert [(r.queue.queue_id, r.queue_offset) for r in results] == [(i % 4, i // 4) for i in range(12)]
    assert [r[5] for r in stored(b)] == [b"m%02d" % i for i in range(12)]


def test_a_closed_sessions_last_frames_are_appended_before_its_slot_is_freed(broker):
    b = broker()
    b.create_topic()
    w = b.child(Writer)
    p = b.producer()
    w.run_once()
    slot, gen = p.slot, p.generation
    Sent(p, 0, [b"last words"])
    Sent(p, 1, [b"w0", b"w1"])
    b.producers.remove(p)
    p.close(timeout_s=0.0)              # gone without waiting for its answers (the ring stays with the broker)
    wait_until(lambda: b.state.slot(slot)[0] == R.SLOT_CLOSING, 5, "the session server to mark the slot CLOSING")
    assert w.run_once() == 0            # the CLOSING slot is drained inside the session sync
    assert b.state.attached[slot] == ~gen and slot not in w.rings
    assert [(r[3], r[5]) for r in stored(b)] == [(0, b"last words"), (1, b"w0"), (1, b"w1")]
    wait_until(lambda: b.state.slot(slot)[0] == R.SLOT_FREE, 5, "the session server to free the drained slot")
    w.run_once()
    assert b.state.attached[slot] == 0


# -- crash points of one batch ----------------------------------------------------------------------
class Crash(Exception):
    """The writer 'killed' before a step."""


class Steps:
    """Every step the writer takes while armed — a store into a word of the broker state, an append
    to the commitlog, a writer-side call on a ring — named, and ``Crash`` raised instead of step
    ``at`` (1-based; 0 never)."""

    def __init__(self) -> None:
        self.armed, self.at, self.seen = False, 0, []

    def __call__(self, what: str) -> None:
        if self.armed:
            self.seen.append(what)
            if len(self.seen) == self.at:
                raise Crash(f"step {self.at}: {what}")

    def arm(self, at: int) -> None:
        self.armed, self.at, self.seen = True, at, []

    def disarm(self) -> None:
        self.armed = False


class _CountedWords:
    """The writer's view of the state words: stores are steps."""

    def __init__(self, w, steps: Steps) -> None:
        self._w, self._steps = w, steps

    def __getitem__(self, i):
        return self._w[i]

    def __setitem__(self, i, v) -> None:
        self._steps(f"state.{_STATE_NAMES[i]} = {v}")
        self._w[i] = v

    def __getattr__(self, name):
        return getattr(self._w, name)


def _counted(steps: Steps, what: str, fn):
    def step(*args, **kw):
        steps(what)
        return fn(*args, **kw)
    return step


RING_STEPS = ("stage", "stage_one", "journal", "restatus", "publish_completions", "release_to")


class CrashingWriter(Writer):
    """The real writer, whose steps are counted (``Steps``): it raises ``Crash`` at the armed one."""

    def __init__(self, rt: BrokerRuntime, steps: Steps) -> None:
        self.steps = steps
        super().__init__(rt)
        self.state.w = _CountedWords(self.state.w, steps)
        for name in ("append_record", "append_batch"):
            setattr(self.cl, name, _counted(steps, f"commitlog.{name}", getattr(self.cl, name)))

    def _attach(self, slot: int, gen: int):
        a = super()._attach(slot, gen)
        if a is not None:
            for name in RING_STEPS:
                setattr(a.ring, name, _counted(self.steps, f"ring.{name}", getattr(a.ring, name)))
        return a


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
def test_a_writer_killed_before_any_step_of_a_batch_stores_and_answers_every_frame_exactly_once(broker, flush):
    """One batch — three messages, a batch of three, a frame for a queue that does not exist — per
    round; round k kills the writer before the k-th step of the batch's life (up to its completions
    being published and its ring bytes given back, through the flusher's group commit under
    SYNC_FLUSH), a new writer starts as the broker's supervisor would restart it, and the producer
    must get exactly one answer per frame with every message stored exactly once."""
    b = broker(store={"flush_disk_type": flush})
    b.create_topic(queues=2)
    steps = Steps()
    flusher = b.child(Flusher) if flush == "SYNC_FLUSH" else None
    w = b.child(CrashingWriter, steps)
    p = b.producer()
    w.run_once()
    expected: list[bytes] = []          # every message acknowledged so far, in commitlog order
    offsets = {0: 0, 1: 0}              # each queue's next offset
    answered = 0                        # completions the writer published in p's ring

    def batch(k: int) -> list[Sent]:
        return [Sent(p, 0, [b"r%02d-a" % k]), Sent(p, 1, [b"r%02d-b" % k]),
                Sent(p, 1, [b"r%02d-c%d" % (k, i) for i in range(3)]), Sent(p, 5, [b"r%02d-refused" % k]),
                Sent(p, 0, [b"r%02d-d" % k])]

    def turn() -> bool:
        """One turn of the writer's loop (and the flusher's), until the batch is answered."""
        w.run_once()
        if flusher is not None:
            flusher.run_once(time.monotonic())
        return ring_word(p, "completion_write_pos") >= answered + 5

    def check(frames: list[Sent], k: int, what: str) -> None:
        nonlocal answered
        assert ring_word(p, "completion_write_pos") == answered + 5, f"round {k} ({what}): one answer per frame"
        rows = completion_rows(p, answered, answered + 5)
        answered += 5
        assert [r[0] for r in rows] == [f.seq for f in frames]
        assert ring_word(p, "data_read_pos") == ring_word(p, "data_write_pos")
        with pytest.raises(NoRouteError):
            frames[3].result()
        for f in frames[:3] + frames[4:]:
            r = f.result()
            assert r.status == SendStatus.SEND_OK, f"round {k} ({what})"
            assert r.queue_offset == offsets[f.queue.queue_id], f"round {k} ({what}): {f.bodies}"
            offsets[f.queue.queue_id] += len(f.bodies)
            expected.extend(f.bodies)
        records = stored(b)
        assert [r[5] for r in records] == expected, f"round {k} ({what}): the commitlog"
        for q in (0, 1):
            assert [r[4] for r in records if r[3] == q] == list(range(offsets[q]))
        st = b.state
        assert st.get("intent_valid") == 0 and st.get("write_pos") == st.get("committed_pos")

    # Round 0 counts the steps of a batch that nothing interrupts.
    steps.arm(0)
    frames = batch(0)
    wait_until(turn, 10, "the batch to be answered")
    life = list(steps.seen)
    steps.disarm()
    check(frames, 0, "no crash")
    # From the intent to the ring bytes given back (the order within is the writer's business; the
    # rounds below check that no order it takes loses or doubles anything).
    assert life[0] == "state.intent_slot = %d" % p.slot and "state.intent_valid = 0" in life
    assert "state.write_pos = %d" % b.state.get("write_pos") in life and life.count("commitlog.append_record") == 3
    assert life[-2:] == ["ring.publish_completions", "ring.release_to"]
    for k in range(1, len(life) + 1):
        frames = batch(k)
        steps.arm(k)
        with pytest.raises(Crash) as crash:
            wait_until(turn, 10, "the writer to reach the step it is killed at")
        steps.disarm()
        b.kill(w)
        w = b.child(CrashingWriter, steps)          # the restart: recovery in the constructor
        wait_until(turn, 10, f"the restarted writer to answer the batch after {crash.value}")
        check(frames, k, str(crash.value))
    # The consume queues the dispatcher builds from it hold each message once.
    d = b.child(Dispatcher)
    d.run_once()
    records = stored(b)
    for q in (0, 1):
        cq = d.cqs.consume_queue(TOPIC, q)
        assert [cq.entry(i)[0] for i in range(cq.max_offset())] == [r[0] for r in records if r[3] == q]
    assert b.state.get("dispatched_pos") == b.state.get("write_pos")


# -- the dispatcher -----------------------------------------------------------------------------------
def test_dispatcher_builds_consume_queues_and_publishes_how_far(broker):
    b = broker()
    b.create_topic(queues=2)
    w = b.child(Writer)
    p = b.producer()
    w.run_once()
    sent = [Sent(p, 0, [b"d0"]), Sent(p, 1, [b"d1", b"d2"]), Sent(p, 0, [b"d3"])]
    w.run_once()
    results = [s.result() for s in sent]
    d = b.child(Dispatcher)
    st = b.state
    assert st.get("dispatched_pos") == 0 and st.get("dispatch_seq") == 0
    assert d.run_once() == 4
    assert st.get("dispatched_pos") == st.get("write_pos") and st.get("dispatch_seq") == 1
    assert st.get("dispatched_records") == 4 and st.get("dispatch_error_pos") == -1
    records = {r[5]: r for r in stored(b)}
    q0, q1 = d.cqs.consume_queue(TOPIC, 0), d.cqs.consume_queue(TOPIC, 1)
    assert (q0.max_offset(), q1.max_offset()) == (2, 2)
    assert [q0.entry(i)[:2] for i in range(2)] == [records[b"d0"][:2], records[b"d3"][:2]]
    assert [q1.entry(i)[:2] for i in range(2)] == [records[b"d1"][:2], records[b"d2"][:2]]
    assert q0.entry(1)[0] == phys_of(results[2].msg_id)[0]
    assert d.run_once() == 0 and st.get("dispatch_seq") == 1       # nothing new: nothing published
    more = Sent(p, 1, [b"d4"])
    w.run_once()
    more.result()
    assert d.run_once() == 1 and st.get("dispatch_seq") == 2 and q1.max_offset() == 3
    assert st.get("dispatched_pos") == st.get("write_pos")
    d.flush()
    assert st.get("cq_flushed_pos") == st.get("dispatched_pos")
    # A restarted dispatcher resumes at dispatched_pos: nothing is dispatched twice.
    b.children.remove(d)
    d.close()
    d = b.child(Dispatcher)
    assert d.run_once() == 0 and d.cqs.consume_queue(TOPIC, 1).max_offset() == 3


# -- the flusher --------------------------------------------------------------------------------------
def test_flusher_flushes_what_the_async_policy_asks_for_and_writes_the_checkpoint(broker):
    b = broker(store={"flush_interval_ms": 0, "flush_least_pages": 4, "flush_thorough_interval_ms": 600_000})
    b.create_topic()
    w = b.child(Writer)
    f = b.child(Flusher)
    p = b.producer()
    w.run_once()
    st = b.state
    Sent(p, 0, [b"x" * 100])
    w.run_once()
    assert 0 < st.get("write_pos") < 4 * 4096
    assert not f.run_once(time.monotonic()) and st.get("flushed_pos") == 0 and st.get("flush_count") == 0
    for i in range(6):                                              # past 4 dirty pages
        Sent(p, i % 2, [bytes([i]) * 3000])
    w.run_once()
    end = st.get("write_pos")
    assert end > 4 * 4096
    assert f.run_once(time.monotonic())
    assert st.get("flushed_pos") == end and st.get("flush_count") == 1 and st.get("last_flush_ms") > 0
    assert sum(st.flush_histogram) == 1
    assert not f.run_once(time.monotonic()) and st.get("flush_count") == 1       # nothing dirty
    st.set("cq_flushed_pos", end)
    f.run_once(time.monotonic() + 3600)                             # the checkpoint is due
    cp = StoreCheckpoint(os.path.join(b.rt.store_dir, "checkpoint")).load()
    assert cp.commitlog_flushed_offset == end and cp.cq_flushed_phys_offset == end
    assert st.get("checkpoint_ms") > 0


def test_sync_flush_answers_a_batch_once_the_flusher_made_it_durable(broker):
    b = broker(store={"flush_disk_type": "SYNC_FLUSH"})
    b.create_topic()
    w = b.child(Writer)
    f = b.child(Flusher)
    p = b.producer()
    w.run_once()
    st = b.state
    sent = [Sent(p, 0, [b"durable-0"]), Sent(p, 1, [b"durable-1"])]
    assert w.run_once() == 2
    end = st.get("write_pos")
    assert end > 0 and st.get("flush_request_pos") == end and st.get("flushed_pos") == 0
    assert ring_word(p, "completion_write_pos") == 0 and ring_word(p, "staged_completion_pos") == 2
    assert w.run_once() == 0 and ring_word(p, "completion_write_pos") == 0      # still waiting for the flush
    assert f.run_once(time.monotonic())
    assert st.get("flushed_pos") == end and st.get("flush_count") == 1
    assert not f.run_once(time.monotonic()) and st.get("flush_count") == 1      # nothing requested
    w.run_once()
    assert ring_word(p, "completion_write_pos") == 2
    assert [s.result().status for s in sent] == [SendStatus.SEND_OK] * 2


def test_sync_flush_without_a_flusher_answers_flush_disk_timeout_and_keeps_the_message(broker):
    b = broker(store={"flush_disk_type": "SYNC_FLUSH", "sync_flush_timeout_ms": 50})
    b.create_topic()
    w = b.child(Writer)
    p = b.producer()
    w.run_once()
    s = Sent(p, 0, [b"late"])
    w.run_once()
    wait_until(lambda: w.run_once() >= 0 and ring_word(p, "completion_write_pos") == 1, 5,
               "the group commit to time out")
    assert s.result().status == SendStatus.FLUSH_DISK_TIMEOUT
    assert [r[5] for r in stored(b)] == [b"late"]


# -- the control service ----------------------------------------------------------------------------
def test_service_creates_topics_serves_pulls_and_keeps_offsets(broker):
    b = broker()
    b.create_topic("svc", queues=2)
    topics = b.request(RequestCode.GET_ALL_TOPIC_CONFIG).fields["topics"]
    assert topics["svc"]["write_queues"] == 2
    with open(b.rt.config_file("topics.json")) as fh:
        assert '"svc"' in fh.read()
    pull = dict(topic="svc", queue_id=1, offset=0, max_count=8, local=False)
    reply = b.request(RequestCode.PULL_MESSAGE, **pull)
    assert reply.code == ResponseCode.PULL_NOT_FOUND and reply.fields["max_offset"] == 0
    w = b.child(Writer)
    p = b.producer()
    w.run_once()
    sent = [Sent(p, 1, [b"s0"], topic="svc"), Sent(p, 1, [b"s1", b"s2"], topic="svc")]
    w.run_once()
    results = [s.result() for s in sent]
    reply = b.request(RequestCode.PULL_MESSAGE, **pull)
    assert reply.code == ResponseCode.PULL_NOT_FOUND                 # stored, not dispatched: not readable yet
    d = b.child(Dispatcher)
    assert d.run_once() == 3
    reply = b.request(RequestCode.PULL_MESSAGE, **pull)
    assert reply.code == ResponseCode.SUCCESS
    assert (reply.fields["count"], reply.fields["next_offset"], reply.fields["max_offset"]) == (3, 3, 3)
    assert [R.decode_record(raw)[2] for raw in reply.bodies] == [b"s0", b"s1", b"s2"]
    reply = b.request(RequestCode.PULL_MESSAGE, **{**pull, "offset": 2, "local": True})
    assert reply.fields["count"] == 1 and reply.bodies == []
    assert b.request(RequestCode.GET_MAX_OFFSET, topic="svc", queue_id=1).fields == {"offset": 3}
    assert b.request(RequestCode.GET_MIN_OFFSET, topic="svc", queue_id=1).fields == {"offset": 0}
    view = b.request(RequestCode.VIEW_MESSAGE_BY_ID, msg_id=results[0].msg_id)
    assert R.decode_record(view.bodies[0])[2] == b"s0"
    query = dict(group="g1", topic="svc", queue_id=1)
    assert b.request(RequestCode.QUERY_CONSUMER_OFFSET, **query).code == ResponseCode.QUERY_NOT_FOUND
    assert b.request(RequestCode.UPDATE_CONSUMER_OFFSET, **query, offset=2).fields == {"ignored": False}
    reply = b.request(RequestCode.QUERY_CONSUMER_OFFSET, **query)
    assert reply.code == ResponseCode.SUCCESS and reply.fields == {"offset": 2}
    stats = b.request(RequestCode.GET_CONSUME_STATS, group="g1").fields["rows"]
    assert stats == [{"topic": "svc", "queue_id": 1, "broker_offset": 3, "consumer_offset": 2}]
    with pytest.raises(NoRouteError):
        b.request(RequestCode.PULL_MESSAGE, **{**pull, "topic": "nope"})
    assert b.request(RequestCode.DELETE_TOPIC_IN_BROKER, topic="svc").fields == {"deleted": True}
    assert b.request(RequestCode.QUERY_CONSUMER_OFFSET, **query).code == ResponseCode.QUERY_NOT_FOUND
