"""The writer's batch protocol: one bounded step over one producer's ring (layer L3).

:func:`serve_once` is everything the writer does with one batch of one ring, in this order:

1. **copy** — ``ring.frames(max_bytes)``: the visible frames (at most ``batch_bytes`` of ring, and no
   more than the completion ring has room for) copied to private memory; only the copy is parsed, so
   the producer cannot change what is checked (``ring_writer.WriterSide.frames``);
2. **intent** — the broker state's intent words (slot, generation, ``phys_start`` = ``write_pos``,
   the batch's data end and completion end), then ``intent_valid = 1``;
3. **check + append** — per frame, every record is checked (``record_check``; a bad record refuses
   the whole frame, nothing of it stored) and so is its queue (``queues``: the topic's writable
   queues), then the frame is appended to the commitlog; an OS error rolls it back and refuses it;
4. **stage** — one completion per frame in the ring, not yet visible to the producer;
5. **publish** — ``write_pos``: one aligned store makes the whole batch readable at once (then
   ``on_publish``, the writer's own follow-ups: ``committed_pos`` or the pool's commit, replication);
   the store time and the appended count follow;
6. **journal** — in the ring (``appended_data_pos``, ``staged_completion_pos``), then
   ``intent_valid = 0``;
7. **release** — :func:`release`: the completions published, the ring bytes given back, the producer
   woken. The writer calls it at once or, under SYNC_FLUSH / SYNC_MASTER, once the batch is durable
   or acknowledged (its policy, not the protocol's).

A writer killed after any step is replaced by one that first cuts the commitlog back to the published
``write_pos`` (``CommitLog.continue_at``), then :func:`resolve_intent`: a batch whose ``write_pos`` was
published but whose journal was not is journalled now. Rings then resume from their journals: frames
below ``appended_data_pos`` are never appended again, frames above it once; completions staged below
``staged_completion_pos`` are published (:func:`unreleased`). So no acknowledged message is lost or
duplicated, and an unacknowledged one is stored at most once. ``tests/ingress/test_ring.py`` kills
this step after each of its steps (``trace``) under hypothesis and checks exactly that;
``tests/broker/test_loop_bodies.py`` does the same through the whole writer process's loop body.

Pure of policy: no clock but ``now_ms``, no logging but the refusal of a frame, no waiting.

**The native step.** When ``hostmq/ingress/_step.c`` is built (``NATIVE_STEP``) and ``USE_NATIVE`` is
on (the default; ``HOSTMQ_NATIVE_STEP=0`` in the environment turns it off), :func:`serve_once` first
offers the batch to it: steps 1–6 in one call with the GIL released, over the ring, the state words,
the current commitlog file and the commitlog's :class:`~hostmq.store.queue_table.QueueTable` (the
queue offsets and, since :meth:`QueueTable.set_topics` was given this very ``queues`` dict, the
topics' queue counts). It serves batches whose records all pass the checks (MESSAGE and BATCH
frames); anything else — a file roll, a record to refuse or to check further, a corrupt ring — comes
back as a :class:`StepStatus` with nothing written, and the Python steps below serve the batch. The
result is the same bytes either way (tests/ingress/test_native_step.py); the one difference is that
``on_publish`` runs after the journal rather than before it (nothing it does is read by the
journal or by a successor's recovery). ``trace``, ``refusal`` and state words that are not a buffer
(a test counting the stores) always take the Python steps.
"""
from __future__ import annotations

import enum
import logging
import os
import time
from typing import Callable, NamedTuple

import numpy as np

from .. import records as R
from .. import waiting
from ..errors import RingCorruptError, ValidationError
from ..record_check import frame_records, single_record
from ..shm.futex import FutexWord
from ..shm.signal import fence, notify_if_waiting
from ..store.queue_table import QueueTable

try:
    from . import _step as NATIVE_STEP
except ImportError:         # not built (no compiler at install time): the Python steps serve
    NATIVE_STEP = None
if NATIVE_STEP is not None:
    R.layout_check(NATIVE_STEP.LAYOUT == R.step_layout_flat(), "hostmq/ingress/_step.c's layout differs from "
                   "records.STEP_LAYOUT (rebuild it: pip install -e . or tools/test.sh)")
    from ..record_fields import _RESERVED_MARKS
    NATIVE_STEP._bind(reserved_property_marks=_RESERVED_MARKS)
USE_NATIVE = NATIVE_STEP is not None and os.environ.get("HOSTMQ_NATIVE_STEP", "1").lower() not in ("0", "off", "false")
"""Whether :func:`serve_once` offers batches to the native step (a module-level switch: tests flip it)."""


class StepStatus(enum.IntEnum):
    """What ``_step.serve`` did: served nothing (no frame), served the batch, or left it to Python (why)."""

    EMPTY = 0
    DONE = 1
    FALLBACK_CORRUPT = 2        # impossible cursors or frame headers: Python raises RingCorruptError
    FALLBACK_FILE = 3           # a record does not fit the current file: Python rolls it
    FALLBACK_CHECK = 4          # a record to refuse, or whose properties check_properties must judge
    FALLBACK_SCRATCH = 5        # the batch is larger than the private copy the native step keeps


if NATIVE_STEP is not None:
    R.layout_check(all(getattr(NATIVE_STEP, s.name) == s.value for s in StepStatus),
                   "hostmq/ingress/_step.c's statuses differ from step.StepStatus")

log = logging.getLogger("hostmq.broker.writer")

_W = R.STATE_WORD
I_VALID, I_SLOT, I_GEN = _W["intent_valid"], _W["intent_slot"], _W["intent_generation"]
I_PHYS, I_DATA_END, I_CW_END = _W["intent_phys_start"], _W["intent_data_end"], _W["intent_cw_end"]
W_WRITE_POS, W_LAST_TS, W_APPENDED = _W["write_pos"], _W["last_store_ts_ms"], _W["appended_records"]

STEPS = ("copy", "intent", "append", "stage", "publish", "journal", "answer")
"""The points ``trace`` is called at: after each step of :func:`serve_once`, and in :func:`release`
between publishing the completions ("answer") and giving the ring bytes back."""


class Limits(NamedTuple):
    """What the broker allows (``store.max_message_bytes``, ``store.max_properties_bytes``) and how
    much ring one step takes (``broker.writer_batch_bytes``)."""

    max_body: int
    max_props: int
    batch_bytes: int


class Batch(NamedTuple):
    """What one :func:`serve_once` did: frames taken, records appended, the completions staged in
    ``[cw_start, cw_end)``, the ring data they cover (to ``data_end``) and the published ``write_pos``;
    ``followed``: the :class:`Follow` ups the native step did too (0: none, the caller does them)."""

    frames: int
    appended: int
    cw_start: int
    cw_end: int
    data_end: int
    phys_end: int
    followed: int = 0


class Follow(NamedTuple):
    """Follow-ups of a served batch the native step may do in the same call (``_step.c``
    ``follow_up``), in the writer's order, when nothing else must come first: ``committed``
    (``committed_pos`` = ``write_pos``: no transient pool, no replication following the appends —
    ``on_publish`` is then not called), ``queue_wake`` (the state's queue wake words: bumped and
    woken for the batch's queues; ``woken`` stays empty) and ``release`` (step 7, :func:`release`)."""

    committed: bool
    queue_wake: np.ndarray | None
    release: bool
    bits: int = 0           # the native step's flags for the three (follow_of fills them: made once, used per batch)


def follow_of(committed: bool, queue_wake: np.ndarray | None, release: bool) -> Follow:
    """A :class:`Follow` with its ``bits``."""
    return Follow(committed, queue_wake, release,
                  (FOLLOW_COMMITTED if committed else 0) | (FOLLOW_WAKE if queue_wake is not None else 0)
                  | (FOLLOW_RELEASE if release else 0))


FOLLOW_COMMITTED, FOLLOW_WAKE, FOLLOW_RELEASE = 1, 2, 4
W_COMMITTED = _W["committed_pos"]


def serve_once(ring, slot: int, generation: int, words, log_, limits: Limits, queues: dict[bytes, int],
               now_ms: int, *, refusal: int = 0, io_failed: Callable[[OSError, int], int] | None = None,
               woken: set | None = None, on_publish: Callable[[int, int], None] | None = None,
               trace: Callable[[str], None] | None = None, follow: Follow | None = None) -> Batch | None:
    """One batch of ``ring`` (the writer's end of a producer's ingress ring, attached as ``slot`` of
    ``generation``) into the commitlog ``log_``, through the broker state ``words``; None when the
    ring had no frame. See the module docstring for the steps.

    ``refusal``: a completion status that refuses every frame (disk full, fenced, …) instead of
    appending. ``io_failed(error, frame_start)`` rolls back a failed append and returns the status that
    refuses the frame (and is used for the rest of the batch). ``woken`` collects the queue wake words
    of the queues appended to. ``on_publish(write_pos, appended)`` runs right after ``write_pos`` is
    published. ``trace(step)`` after each step (tests kill the step there). Raises RingCorruptError
    (before any step) when the ring's cursors or frame headers are impossible."""
    if USE_NATIVE and trace is None and not refusal and type(words) in _NATIVE_WORDS:
        qt = log_.topic_queue_table
        if type(qt) is QueueTable and qt.queues is queues:
            b = _serve_native(ring, slot, generation, words, log_, limits, qt, now_ms, woken, on_publish, follow)
            if b is not _FALLBACK:
                return b
    bits = follow.bits if follow is not None else 0
    if bits & FOLLOW_WAKE:
        woken = set()                       # this call wakes them (follow_up); the caller's set stays empty
    started_ns = time.monotonic_ns()
    frames = ring.frames(limits.batch_bytes)
    n = len(frames)
    if n == 0:
        return None
    if trace is not None:
        trace("copy")
    phys_start = words[W_WRITE_POS]
    cw_start = ring.staged_position
    data_end = ring.handed_position
    words[I_SLOT], words[I_GEN], words[I_PHYS] = slot, generation, phys_start
    words[I_DATA_END], words[I_CW_END] = data_end, cw_start + n
    words[I_VALID] = 1
    if trace is not None:
        trace("intent")
    rows, appended = append_frames(frames, log_, limits, queues, now_ms, refusal, io_failed, woken)
    del frames                              # the private copy goes with the last view of it
    if trace is not None:
        trace("append")
    if n <= 8:
        for row in rows:
            ring.stage_one(*row)
    else:
        ring.stage(np.array(rows, R.COMPLETION))
    if trace is not None:
        trace("stage")
    end = log_.max_offset() if appended else phys_start
    words[W_WRITE_POS] = end                # publish the whole batch at once
    if on_publish is not None and not bits & FOLLOW_COMMITTED:
        on_publish(end, appended)
    words[W_LAST_TS] = log_.last_store_ts_ms
    words[W_APPENDED] += appended
    if trace is not None:
        trace("publish")
    ring.journal(data_end, ring.staged_position)
    words[I_VALID] = 0
    if trace is not None:
        trace("journal")
    b = Batch(n, appended, cw_start, ring.staged_position, data_end, end, bits)
    if bits:
        follow_up(words, ring, b, follow, woken, started_ns)
    return b


def follow_up(words, ring, b: Batch, follow: Follow, woken: set | None, started_ns: int = 0) -> None:
    """The ``follow`` ups of a served batch ``b`` (the spec of ``_step.c``'s ``follow_up``): committed_pos,
    then the queue wake words of ``woken`` bumped, the stamps (``stamp_wake``) and the wake-ups, then
    step 7. ``started_ns``: when the step began (``time.monotonic_ns``)."""
    if follow.committed:
        words[W_COMMITTED] = words[W_WRITE_POS]
    qw = follow.queue_wake
    if qw is not None and woken:
        for i in woken:
            qw[i] += 1
        stamp_wake(words, started_ns)
        fence()
        for i in woken:
            FutexWord(qw, i).wake()
    if follow.release:
        release(ring, b.cw_end, b.data_end)


W_STEP_STARTED, W_STEP_WOKE, W_STEP_CPU = _W["step_started_ns"], _W["step_woke_ns"], _W["step_cpu"]


def _cpu_source() -> Callable[[], int]:
    """``sched_getcpu()`` of the C library (the CPU this thread runs on; -1 where it cannot tell)."""
    try:
        import ctypes
        f = ctypes.CDLL(None).sched_getcpu
        f.restype, f.argtypes = ctypes.c_int, []
        return f
    except (OSError, AttributeError):
        return lambda: -1


current_cpu = _cpu_source()


def stamp_wake(words, started_ns: int) -> None:
    """Measurement only (the latency bench's breakdown of a delivery): when the step whose queues are
    about to be woken began, and now (CLOCK_MONOTONIC ns, ``time.perf_counter_ns`` of other
    processes), and the CPU that wakes them, plus one (0: not known)."""
    words[W_STEP_STARTED] = started_ns
    words[W_STEP_WOKE] = time.monotonic_ns()
    words[W_STEP_CPU] = current_cpu() + 1


_FALLBACK = object()
_NATIVE_WORDS = (memoryview, np.ndarray)       # state words the native step can write (not a test's stand-in)
_SCRATCH_SLACK = 64 * 1024


def _serve_native(ring, slot: int, generation: int, words, log_, limits: Limits, qt: QueueTable, now_ms: int,
                  woken: set | None, on_publish: Callable[[int, int], None] | None, follow: Follow | None = None):
    """Steps 1–6 in C (see the module docstring), and the ``follow`` ups: a Batch, None (no frame) or
    ``_FALLBACK``."""
    mf = log_._cur
    files = log_.mfq.files
    if mf is None or not files or files[-1] is not mf or mf.wmm is None:
        return _FALLBACK
    scratch = qt.scratch
    if scratch is None or len(scratch) < 2 * limits.batch_bytes + _SCRATCH_SLACK:
        scratch = qt.scratch = bytearray(2 * limits.batch_bytes + _SCRATCH_SLACK)
    cw_start = ring._cstaged
    names, table, offsets, ntopics = qt.pins
    bits = follow.bits if follow is not None else 0
    status, n, appended, hpos, cstaged, wrote, last_ts, wake = NATIVE_STEP.serve(
        ring._q, ring._data, ring._comp_bytes, words, mf.wmm, scratch, names, table, offsets, log_.store_host,
        ring.capacity, ring.completion_entries, ring.max_frame_bytes, ring._hpos, ring._rpos, ring._cwpos,
        cw_start, ring._uncompleted, slot, generation, mf.file_from_offset, mf.wrote_pos, log_.file_bytes,
        limits.max_body, limits.max_props, limits.batch_bytes, now_ms, log_.last_store_ts_ms, ntopics,
        follow.queue_wake if bits & FOLLOW_WAKE else None, bits)
    if status > 1:
        return _FALLBACK
    ring._hpos = hpos
    if not status:
        return None
    ring._cstaged = cstaged
    if bits & FOLLOW_RELEASE:               # step 7 done in C: the ring's own view of its cursors follows
        ring._cwpos, ring._rpos = cstaged, hpos
    log_.last_store_ts_ms = last_ts
    end = int(words[W_WRITE_POS])
    if appended:
        mf.wrote_pos = wrote
        mf.store_ts_ms = last_ts
        if wrote >= log_._prealloc_pos:
            log_.mfq.preallocate_next(wrote)
        if woken is not None and not bits & FOLLOW_WAKE:
            while wake:
                low = wake & -wake
                woken.add(low.bit_length() - 1)
                wake ^= low
    if on_publish is not None and not bits & FOLLOW_COMMITTED:
        on_publish(end, appended)
    return Batch(n, appended, cw_start, cstaged, hpos, end, bits)


# -- the writer's loop in C (``_step.c`` serve_loop) ----------------------------------------------------

USE_NATIVE_LOOP = NATIVE_STEP is not None and hasattr(NATIVE_STEP, "serve_loop") \
    and os.environ.get("HOSTMQ_NATIVE_LOOP", "1").lower() not in ("0", "off", "false")
"""Whether the writer hands its loop to :func:`serve_loop` when it may (``HOSTMQ_NATIVE_LOOP=0`` turns
it off; ``HOSTMQ_NATIVE_STEP=0`` too, with the step)."""


class LoopExit(enum.IntEnum):
    """Why :func:`serve_loop` handed back to Python."""

    DEADLINE = 0        # ``until_s`` passed: the writer's own timers (housekeeping, stop)
    FALLBACK = 1        # ``LoopResult.ring``'s batch needs the Python steps (a file roll, a record to refuse, …)
    CHANGED = 2         # sessions, topics, a flush error, fencing or replication moved: the writer's policy decides
    PREALLOC = 3        # the file passed its preallocation mark (preallocated here, before returning)
    SIGNAL = 4          # a signal interrupted the sleep (its handler runs when the call returns)


if NATIVE_STEP is not None and USE_NATIVE_LOOP:
    R.layout_check(all(getattr(NATIVE_STEP, "LOOP_" + e.name) == e.value for e in LoopExit)
                   and all(getattr(NATIVE_STEP, "IDLE_" + k.upper()) == v for k, v in waiting.IDLE_CODES.items()),
                   "hostmq/ingress/_step.c's loop exits or idle codes differ from step.LoopExit / waiting.IDLE_CODES")


class LoopResult(NamedTuple):
    """What one :func:`serve_loop` call did: its exit, the ring index that needs Python (FALLBACK,
    else -1), frames and records served, and the writer's timers as it left them (monotonic
    seconds; ``dispatch_due_s`` 0 when no dispatcher wake-up is deferred)."""

    exit: LoopExit
    ring: int
    frames: int
    appended: int
    dispatch_due_s: float
    last_work_s: float


IDLE_CODES = waiting.IDLE_CODES
"""``waiting.IdleStrategy.kind`` as the native loop's idle codes."""


def loop_allowed(log_, queues: dict[bytes, int]) -> bool:
    """Whether the commitlog is in the state :func:`serve_loop` serves (as :func:`_serve_native` checks
    per batch): the current file mapped and last, the native queue table over these ``queues``."""
    if not USE_NATIVE_LOOP or not USE_NATIVE:           # (a test that turns the native step off turns this off too)
        return False
    mf = log_._cur
    files = log_.mfq.files
    qt = log_.topic_queue_table
    return mf is not None and bool(files) and files[-1] is mf and mf.wmm is not None \
        and type(qt) is QueueTable and qt.queues is queues


def serve_loop(rings, words, doorbell_words, queue_wake, log_, limits: Limits, *, sessions_seen: int,
               topics_seen: int, until_s: float, dispatch_due_s: float, dispatch_delay_s: float, idle, busy_idle,
               busy_window_s: float, last_work_s: float) -> LoopResult:
    """The writer's loop — every ring with frames served a batch at a time and followed up in the same
    call (:class:`Follow` with all three), the deferred dispatcher wake-up, the wait on the doorbell
    under the idle strategy — in C with the GIL released, until a :class:`LoopExit`. ``rings``: the
    writer's ``(slot, generation, ring)`` in serving order. The caller checked :func:`loop_allowed` and
    that nothing else must come between a batch and its answer (``Writer.loop_ready``). The rings'
    cursors and the commitlog's file state are brought up to date before it returns; the step it runs
    is :func:`serve_once`'s, so the bytes are the same (tests/ingress/test_serve_loop.py)."""
    qt = log_.topic_queue_table
    mf = log_._cur
    scratch = qt.scratch
    if scratch is None or len(scratch) < 2 * limits.batch_bytes + _SCRATCH_SLACK:
        scratch = qt.scratch = bytearray(2 * limits.batch_bytes + _SCRATCH_SLACK)
    names, table, offsets, ntopics = qt.pins
    mark = log_._prealloc_pos
    if mf.wrote_pos >= mark:            # crossed already: asked for the next file once, no exit per batch
        log_.mfq.preallocate_next(mf.wrote_pos)
        mark = 1 << 62
    args = tuple((r._q, r._data, r._comp_bytes, r.capacity, r.completion_entries, r.max_frame_bytes, r._hpos, r._rpos,
                  r._cwpos, r._cstaged, r._uncompleted, slot, gen) for slot, gen, r in rings)
    ex, ring, frames, appended, wrote, last_ts, due_ns, work_ns, cursors = NATIVE_STEP.serve_loop(
        args, words, doorbell_words, mf.wmm, scratch, names, table, offsets, log_.store_host, queue_wake,
        mf.file_from_offset, mf.wrote_pos, log_.file_bytes, mark, limits.max_body, limits.max_props,
        limits.batch_bytes, log_.last_store_ts_ms, ntopics, sessions_seen, topics_seen, int(until_s * 1e9),
        int(dispatch_due_s * 1e9), int(dispatch_delay_s * 1e9), IDLE_CODES[idle.kind], int(idle.spin_s * 1e9),
        int(busy_idle.spin_s * 1e9), int(busy_window_s * 1e9), int(last_work_s * 1e9))
    for (_, _, r), (hpos, rpos, cwpos, cstaged) in zip(rings, cursors):
        r._hpos, r._rpos, r._cwpos, r._cstaged = hpos, rpos, cwpos, cstaged
    if appended:
        mf.wrote_pos = wrote
        mf.store_ts_ms = last_ts
        log_.last_store_ts_ms = last_ts
        if wrote >= log_._prealloc_pos:
            log_.mfq.preallocate_next(wrote)
    return LoopResult(LoopExit(ex), ring, frames, appended, due_ns / 1e9, work_ns / 1e9)


def append_frames(frames, log_, limits: Limits, queues: dict[bytes, int], now_ms: int, refusal: int = 0,
                  io_failed: Callable[[OSError, int], int] | None = None,
                  woken: set | None = None) -> tuple[list[tuple], int]:
    """Check and append each frame's records (step 3); a completion row per frame and the records
    appended. The payloads are the writer's private copies (``IngressRing.frames``)."""
    max_body, max_props = limits.max_body, limits.max_props
    appended = 0
    rows = []
    for f in frames:
        if refusal:
            rows.append((f.seq, refusal, f.record_count, 0, 0, 0))
            continue
        frame_start = log_.max_offset()
        try:
            if f.record_count == 1:
                topic_b, qid, size = single_record(f.payload, max_body, max_props)
                if qid >= queues.get(topic_b, 0):
                    rows.append((f.seq, R.COMPLETION_NO_TOPIC, 1, 0, 0, 0))
                    continue
                r = log_.append_record(topic_b.decode(), qid, f.payload, size, now_ms)
                rows.append((f.seq, R.COMPLETION_SEND_OK, 1, r.queue_offset, r.phys_offset, r.store_ts_ms))
            else:
                fr = frame_records(f.payload, f.record_count, max_body, max_props)
                topic_b, qid = fr.topic_b, fr.queue_id
                if qid >= queues.get(topic_b, 0):
                    rows.append((f.seq, R.COMPLETION_NO_TOPIC, f.record_count, 0, 0, 0))
                    continue
                r = log_.append_batch(topic_b.decode(), qid, f.payload, fr.starts, fr.sizes,
                                      now_ms=now_ms, patch_host=True)
                rows.append((f.seq, R.COMPLETION_SEND_OK, f.record_count, r.queue_offset,
                             int(r.phys_offsets[0]), r.store_ts_ms))
            if woken is not None:
                woken.add(R.queue_wake_word(topic_b, qid))
        except ValidationError as e:
            log.debug("writer: refused frame %d: %s", f.seq, e)
            rows.append((f.seq, R.COMPLETION_BAD_RECORD, f.record_count, 0, 0, 0))
            continue
        except OSError as e:
            if io_failed is None:
                raise
            refusal = io_failed(e, frame_start)
            rows.append((f.seq, refusal, f.record_count, 0, 0, 0))
            continue
        appended += f.record_count
    return rows, appended


def release(ring, cw_end: int, data_end: int, trace: Callable[[str], None] | None = None) -> None:
    """Step 7: completions below ``cw_end`` visible to the producer, its ring bytes below ``data_end``
    given back, the producer woken if it sleeps on its completions."""
    ring.publish_completions(cw_end)
    if trace is not None:
        trace("answer")
    ring.release_to(data_end)
    notify_if_waiting(ring.producer_waiting, ring.completion_word, bump=False)


def resolve_intent(words, slot: int, generation: int, ring) -> bool:
    """After a writer's death, with the commitlog already cut back to the published ``write_pos``: if
    the intent names this ring and its batch was published (``write_pos > phys_start``), journal it
    now, as the dead writer's step 6 would have — True, and the caller re-opens the ring so its
    cursors resume from the journal. The caller clears ``intent_valid`` once every ring is resolved."""
    if not (words[I_VALID] and words[I_SLOT] == slot and words[I_GEN] == generation
            and words[W_WRITE_POS] > words[I_PHYS]):
        return False
    ring.journal(words[I_DATA_END], words[I_CW_END])
    return True


def unreleased(ring) -> bool:
    """Whether a predecessor staged completions it did not publish or kept ring bytes it did not give
    back (a successor releases them: at once, or after the group commit)."""
    return ring.staged_position != ring.published_position or ring.handed_position != ring.released_position


__all__ = ["Batch", "LoopExit", "LoopResult", "USE_NATIVE_LOOP", "loop_allowed", "serve_loop", "FOLLOW_COMMITTED", "FOLLOW_RELEASE", "FOLLOW_WAKE", "Follow", "Limits", "NATIVE_STEP", "STEPS",
           "StepStatus", "USE_NATIVE", "append_frames", "follow_of", "follow_up", "release", "stamp_wake", "resolve_intent", "serve_once",
           "unreleased", "RingCorruptError"]
