"""The tail's per-queue entries in C (``hostmq/store/_read.c`` ``TailQueues``) against the spec
(``store/tail.py`` ``PyTailQueues``): a hypothesis state machine drives both with the same operations —
rows appended, entries dropped below a commitlog offset, everything cleared, counts and rows read,
malformed input included — and compares what they hold and answer after every step."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from hostmq.live.state import W_COMMITTED_POS, W_CONFIRMED_POS, W_DISPATCHED_POS, W_WRITE_POS
from hostmq.records import CQ_ENTRY
from hostmq.store import read_check
from hostmq.store.tail import PyTailQueues, new_queues

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(read_check.NATIVE is None, reason="the native read side is not built")]

TOPICS = ["T0", "T1", "%RETRY%g"]
QIDS = st.integers(0, 2)
I32 = st.integers(-(1 << 31), (1 << 31) - 1)


def _outcome(fn, *args):
    """What a call returned, or the kind of error it raised (both sides must agree on which)."""
    try:
        return "ok", fn(*args)
    except (KeyError, ValueError, TypeError, OverflowError) as e:
        return "error", type(e).__name__


class NativeAgainstSpec(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.spec = PyTailQueues()
        self.native = read_check.NATIVE.TailQueues()
        self.phys = 0                   # commitlog offsets only grow, as a scan finds them
        self.next_qoff: dict[tuple[str, int], int] = {}

    @rule(topic=st.sampled_from(TOPICS), qid=QIDS, n=st.integers(1, 40), size=st.integers(1, 300),
          tag=st.integers(-(1 << 31), (1 << 31) - 1), gap=st.sampled_from([0, 0, 0, 1, -1, 5]))
    def append(self, topic, qid, n, size, tag, gap):
        """A run of one queue's records (queue offsets consecutive, or with a jump or a repeat, as a
        store that was truncated and written again may show)."""
        key = (topic, qid)
        qoff = max(0, self.next_qoff.get(key, 0) + gap)
        rows = []
        for k in range(n):
            rows.append((topic, qid, qoff + k, self.phys, size, tag))
            self.phys += size
        self.next_qoff[key] = qoff + n
        self.spec.extend(rows)
        self.native.extend(rows)

    @rule(data=st.data())
    def interleaved(self, data):
        rows = []
        for _ in range(data.draw(st.integers(1, 30))):
            key = (data.draw(st.sampled_from(TOPICS)), data.draw(QIDS))
            q = self.next_qoff.get(key, 0)
            size = data.draw(st.integers(1, 200))
            rows.append((*key, q, self.phys, size, data.draw(I32)))
            self.phys += size
            self.next_qoff[key] = q + 1
        self.spec.extend(rows)
        self.native.extend(iter(rows))          # any iterable

    @rule(frac=st.floats(0, 1.2))
    def drop_below(self, frac):
        below = int(self.phys * frac)
        self.spec.drop_below(below)
        self.native.drop_below(below)

    @rule()
    def clear(self):
        self.spec.clear()
        self.native.clear()

    @rule(topic=st.sampled_from(TOPICS + ["none"]), qid=QIDS, delta=st.integers(-3, 3))
    def count_after(self, topic, qid, delta):
        first = self.spec.entries(topic, qid)[0][0] if (topic, qid) in self.spec.keys() else 0
        cq_max = first + delta
        assert self.native.count_after(topic, qid, cq_max) == self.spec.count_after(topic, qid, cq_max)

    @rule(topic=st.sampled_from(TOPICS + ["none"]), qid=QIDS, delta=st.integers(-2, 50), count=st.integers(-1, 60))
    def rows(self, topic, qid, delta, count):
        first = self.spec.entries(topic, qid)[0][0] if (topic, qid) in self.spec.keys() else 0
        got = _outcome(self.native.rows, topic, qid, first + delta, count)
        assert got == _outcome(self.spec.rows, topic, qid, first + delta, count)
        if got[0] == "ok":
            assert np.frombuffer(got[1], CQ_ENTRY).shape[0] == len(got[1]) // CQ_ENTRY.itemsize

    @rule(bad=st.sampled_from([[("T0", 0, 1, 2, 3)], [(b"T0", 0, 1, 2, 3, 4)], [("T0", 0, 1, 2, 1 << 31, 4)],
                               [("T0", "x", 1, 2, 3, 4)], [7], None]))
    def hostile_rows(self, bad):
        """Malformed rows are refused with a typed error on both sides; whatever the native side
        appended before the bad row is what the spec appended too (the tail clears on any error)."""
        spec_err = _outcome(self.spec.extend, bad)
        native_err = _outcome(self.native.extend, bad)
        assert spec_err[0] == native_err[0] == "error"
        self.spec.clear()
        self.native.clear()

    @invariant()
    def same(self):
        keys = sorted(self.spec.keys())
        assert sorted(self.native.keys()) == keys
        assert len(self.native) == len(self.spec) == len(keys)
        for topic, qid in keys:
            assert self.native.entries(topic, qid) == self.spec.entries(topic, qid)


TestNativeAgainstSpec = NativeAgainstSpec.TestCase
TestNativeAgainstSpec.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])


def test_the_tail_holds_its_entries_in_c_where_the_native_read_side_is_built():
    assert type(new_queues()).__name__ == "TailQueues"
    assert isinstance(PyTailQueues(), PyTailQueues)


@settings(max_examples=300, deadline=None)
@given(entries=st.lists(st.tuples(st.integers(-(1 << 63), (1 << 63) - 1), I32), max_size=24),
       start=st.integers(0, 24), span=st.integers(0, 30), limit=st.integers(0, 1 << 40),
       noise=st.binary(max_size=19))
def test_native_consume_queue_look_agrees_with_the_spec(entries, start, span, limit, noise):
    """``_read.cq_readable`` and ``readonly.readable_entries`` (the spec) stop at the same entry of
    any consume-queue bytes: sizes ≤ 0, records past the bound, huge phys offsets, a torn end."""
    from hostmq.store import readonly
    rows = np.zeros(len(entries), CQ_ENTRY)
    for i, (phys, size) in enumerate(entries):
        rows[i] = (phys, size, i)
    buf = rows.tobytes() + noise
    pos = min(start, len(entries)) * CQ_ENTRY.itemsize
    end = min(len(buf), pos + span * CQ_ENTRY.itemsize)
    got = read_check.NATIVE.cq_readable(buf, pos, end, limit)
    assert got == readonly.readable_entries(buf, pos, end, limit)
    assert pos <= got <= end and (got - pos) % CQ_ENTRY.itemsize == 0


class TailRounds(RuleBasedStateMachine):
    """Two consumers' views of one live store read with ``StoreReader.read_tail``: one by the native
    round (``_read.tail_read``), one by the spec's steps (``CommitlogTail.advance``, ``count_after``,
    the general ``get`` with ``read_check.NATIVE`` off). Records are appended (good ones, ones only the
    spec decides, the schedule topic's, records damaged before the dispatcher reaches them), dispatched
    part way, and read at each consumer's position or anywhere, under small tail bounds and commitlog
    files that roll; after every read both views return the same max offset and messages and hold the
    same tail (its offsets, bound, stop and every queue's entries)."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile
        from hostmq.store import MessageStore
        from hostmq.store.readonly import StoreReader
        from .conftest import small_config
        self.dir = tempfile.mkdtemp(prefix="hq-tr-")
        path = self.dir + "/store"
        self.store = MessageStore(path, small_config(message_index_enable=False))
        self.views = [StoreReader(path, small_config(), scan_queues=False,
                                  limit_phys=lambda: self.store.dispatched_phys,
                                  tail_limit=lambda: self.store.commitlog.max_offset()) for _ in range(2)]
        # two consumers' rounds for one queue (PullConsumer._read_news): in one native call
        # (_read.tail_poll), and by its spec (pull_consumer.tail_round) with the native read side off
        self.rounds = [StoreReader(path, small_config(), scan_queues=False,
                                   limit_phys=lambda: self.store.dispatched_phys,
                                   tail_limit=lambda: self.store.commitlog.max_offset()) for _ in range(2)]
        self.seen: dict[tuple[int, int], tuple] = {}
        self.states = [words_state(), words_state()]    # the broker state words woken_poll and its spec read
        self.pos = {}
        self.round_pos: dict[int, int] = {}
        self.n = 0

    @rule(queue_id=st.integers(0, 2), count=st.integers(1, 30), body=st.integers(0, 3000),
          kind=st.sampled_from(["good"] * 12 + ["schedule", "schedule", "not-ascii-tags", "bad-topic", "torn"]))
    def put(self, queue_id, count, body, kind):
        from hostmq import records as R
        from hostmq.message import Message
        from hostmq.store.dispatch import SCHEDULE_TOPIC
        for _ in range(count):
            self.n += 1
            if kind == "good":
                self.store.put(Message("TR", b"m%d." % self.n + b"x" * (body % 700), tags="t%d" % (self.n % 3)),
                               queue_id=queue_id)
                continue
            topic, props = "TR", b"TAGS\x01a\x02"
            if kind == "schedule":
                topic = SCHEDULE_TOPIC
            elif kind == "not-ascii-tags":
                props = b"TAGS\x01\xc3\xa9\x02"
            rec = R.encode_record(topic.encode(), b"r%d" % self.n * 3, props, queue_id=queue_id)
            blob, starts = R.encode_batch([rec])
            self.store.append_encoded(topic, queue_id, blob, starts, now_ms=1_700_000_000_000 + self.n)
            cl = self.store.commitlog
            mf = cl.mfq.last()
            at = cl.max_offset() - len(blob) - mf.file_from_offset
            if kind == "torn" and at >= 0:          # a byte of its header changed: the tail stops there
                mf.wu8[at + 4] ^= 0xFF
            elif kind == "bad-topic" and at >= 0:   # its topic no longer a name: the spec skips it
                t = bytes(mf.mm[at:at + len(blob)]).rfind(b"\x02TR")
                mf.wu8[at + t + 1] = ord(" ")

    @rule(frac=st.floats(0, 1))
    def dispatch(self, frac):
        cl = self.store.commitlog
        end = cl.max_offset()
        reqs, _ = cl.scan(self.store.dispatched_phys, end, 1 << 20)
        bounds = [r.phys_offset for r in reqs] + [cl.scan(self.store.dispatched_phys, end, 1 << 20)[1]]
        self.store.cq_store.dispatch(bounds[int(frac * (len(bounds) - 1))])

    @rule(max_bytes=st.sampled_from([1 << 20, 4096, 700, 100]))
    def bound(self, max_bytes):
        for v in self.views + self.rounds:
            v.tail.max_bytes = max_bytes

    @rule(queue_id=st.integers(0, 2), follow=st.booleans(), anywhere=st.integers(0, 400),
          max_count=st.sampled_from([1, 3, 32]))
    def read(self, queue_id, follow, anywhere, max_count):
        offset = self.pos.get(queue_id, 0) if follow else anywhere
        fast, spec = self.views
        hi, g = fast.read_tail("TR", queue_id, offset, max_count)
        if g is None:
            g = fast.get("TR", queue_id, offset, max_count)
        saved, read_check.NATIVE = read_check.NATIVE, None
        try:
            spec_hi, spec_g = spec.read_tail("TR", queue_id, offset, max_count)
            assert spec_g is None
            spec_g = spec.get("TR", queue_id, offset, max_count)
        finally:
            read_check.NATIVE = saved
        assert hi == spec_hi
        assert (g.status, g.next_offset, g.min_offset, g.max_offset, g.skipped) == \
            (spec_g.status, spec_g.next_offset, spec_g.min_offset, spec_g.max_offset, spec_g.skipped)
        assert [(m.queue_offset, m.commitlog_offset, m.body, m.tags) for m in g.messages] == \
            [(m.queue_offset, m.commitlog_offset, m.body, m.tags) for m in spec_g.messages]
        if follow and g.messages:
            self.pos[queue_id] = g.next_offset
        assert tail_state(fast.tail) == tail_state(spec.tail)

    @rule(queue_id=st.integers(0, 2), follow=st.booleans(), anywhere=st.integers(0, 400),
          max_count=st.sampled_from([1, 3, 32]), word=st.sampled_from([None, 0, 1]), woken=st.booleans(),
          write_ahead=st.booleans(), moved=st.booleans())
    def consumer_round(self, queue_id, follow, anywhere, max_count, word, woken, write_ahead, moved):
        """The consumer's round in C and by its spec, with the round's ends (stored, readable) read from
        the store and a queue wake word: the same skip, max offset, messages, next position, seen
        entry and tail. ``woken``: the native side is ``_read.woken_poll`` (a consumer's round as it
        wakes), which reads the queue's wake word (if any) and the ends from the broker's words
        itself; the spec reads the ends with ``BrokerState.consumer_ends`` from the same words (the
        write position ahead of the committed one, or behind it): the same ends, and the same
        ``_shown_end`` after. A wake word that has not ``moved`` since the sleep: woken_poll reads
        nothing and applies nothing (False)."""
        from hostmq.client.pull_consumer import tail_round
        pos = self.round_pos.get(queue_id, 0) if follow else anywhere
        mark, readable = self.store.commitlog.max_offset(), self.store.dispatched_phys
        if woken:
            for state in self.states:
                w = state.w
                w[W_WRITE_POS], w[W_COMMITTED_POS] = (mark + 64, mark) if write_ahead else (mark, mark + 64)
                w[W_DISPATCHED_POS], w[W_CONFIRMED_POS] = readable, -1
            wake = memoryview(bytearray(8 * 4)).cast("q")
            if word is not None:
                wake[2] = word
            if word is not None and not moved:      # nothing came for this queue: nothing read, nothing applied
                before, shown = tail_state(self.rounds[0].tail), self.states[0]._shown_end
                st_ = self.states[0]
                f = (VIEW, self.rounds[0].poll_context(), st_, st_.w, "TR", queue_id, W_WRITE_POS, W_COMMITTED_POS,
                     W_CONFIRMED_POS, W_DISPATCHED_POS, wake, 2, word)
                out: list = []
                assert read_check.NATIVE.woken_poll(f, pos, self.seen.get((0, queue_id)), max_count, out) is False
                assert out == [] and tail_state(self.rounds[0].tail) == before and st_._shown_end == shown
                return
        answers = []
        for k, reader in enumerate(self.rounds):
            seen, out, t = self.seen.get((k, queue_id)), [], None
            saved = read_check.NATIVE
            try:
                if k == 0 and woken:
                    st_ = self.states[0]
                    t = saved.woken_poll((VIEW, reader.poll_context(), st_, st_.w, "TR", queue_id, W_WRITE_POS,
                                          W_COMMITTED_POS, W_CONFIRMED_POS, W_DISPATCHED_POS,
                                          None if word is None else wake, 2, -1 if word is None else word - 1),
                                         pos, seen, max_count, out)
                elif k == 0:
                    t = saved.tail_poll(reader.poll_context(), VIEW, seen, pos, max_count, mark, readable, word,
                                        "TR", queue_id, out)
                else:
                    if woken:
                        assert self.states[1].consumer_ends() == (mark, readable)
                    read_check.NATIVE = None
                if t is None:           # the spec (for the native call: not its case, as the consumer does)
                    t = tail_round(reader, VIEW, seen, pos, max_count, mark, readable, word, "TR", queue_id, out)
                answers.append((t, consumer_answer(reader, t, queue_id, pos, max_count, out)))
            finally:
                read_check.NATIVE = saved
            if t is not False:
                assert t[0][0] is VIEW
                self.seen[(k, queue_id)] = t[0]
        (t, got), (u, spec_got) = answers
        assert (t is False) == (u is False)
        if t is not False:
            assert t[0][1:] == u[0][1:] and t[1] == u[1]
        assert got == spec_got
        assert tail_state(self.rounds[0].tail) == tail_state(self.rounds[1].tail)
        if woken:
            assert self.states[0]._shown_end == self.states[1]._shown_end
        if follow and got is not None and got[1] is not None:
            self.round_pos[queue_id] = got[1]

    def teardown(self):
        import shutil
        for v in self.views + self.rounds:
            v.close()
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


VIEW = object()          # the consumer's view of the store, as its seen entries name it


def words_state():
    """A BrokerState over private words (what ``consumer_ends`` reads: no SYNC_FLUSH, nothing shown yet)."""
    from hostmq import records as R
    from hostmq.live.state import BrokerState
    s = BrokerState.__new__(BrokerState)
    s.w = memoryview(bytearray(R.BROKER_STATE.itemsize)).cast("q")
    s.sync_flush = False
    s._shown_end = 0
    return s


def consumer_answer(reader, t, queue_id: int, pos: int, max_count: int, out: list):
    """What PullConsumer._read_news makes of a round's answer ``t``: None (skipped, or at the queue's
    end), else the messages and the next position (None where it stays)."""
    from hostmq.store.reader import GetStatus
    if t is False:
        return None
    if t[2] is not None:
        msgs, nxt = out, t[2]
    elif pos == t[1]:
        return None
    else:
        g = reader.get("TR", queue_id, pos, max_count)
        stays = g.status in (GetStatus.NO_MESSAGE_IN_QUEUE, GetStatus.OFFSET_OVERFLOW_ONE)
        msgs, nxt = g.messages, None if stays else g.next_offset
    return [(m.queue_offset, m.commitlog_offset, m.body, m.tags) for m in msgs], nxt


def tail_state(t) -> tuple:
    return (t.start, t.cursor, t.limit, t.capped, t.stopped_at,
            {k: t.queues.entries(*k) for k in sorted(t.queues.keys())})


TestTailRounds = TailRounds.TestCase
TestTailRounds.settings = settings(max_examples=100, stateful_step_count=50, deadline=None,
                                   suppress_health_check=[HealthCheck.too_slow])


def test_woken_poll_leaves_a_replication_bound_to_consumer_ends(tmp_path):
    """A confirmed position (a replication process bounds what consumers read): woken_poll answers None
    having applied nothing — no message, the tail and ``_shown_end`` as they were — and the consumer's
    general round (``consumer_ends``) bounds the ends; with no bound it reads what came."""
    from hostmq.client.pull_consumer import tail_round
    from hostmq.message import Message
    from hostmq.store import MessageStore
    from hostmq.store.readonly import StoreReader
    from .conftest import small_config
    store = MessageStore(str(tmp_path / "store"), small_config(message_index_enable=False))
    reader = StoreReader(str(tmp_path / "store"), small_config(), scan_queues=False,
                         limit_phys=lambda: store.dispatched_phys, tail_limit=lambda: store.commitlog.max_offset())
    try:
        for i in range(3):
            store.put(Message("TR", b"m%d" % i), queue_id=0)
        out: list = []
        t = tail_round(reader, VIEW, None, 0, 32, store.commitlog.max_offset(), store.dispatched_phys, None, "TR", 0,
                       out)
        assert t[2] == 3 and [m.body for m in out] == [b"m0", b"m1", b"m2"]
        seen = t[0]
        for i in range(3, 6):
            store.put(Message("TR", b"m%d" % i), queue_id=0)
        end = store.commitlog.max_offset()
        state = words_state()
        w = state.w
        w[W_WRITE_POS] = w[W_COMMITTED_POS] = end
        w[W_DISPATCHED_POS] = store.dispatched_phys
        w[W_CONFIRMED_POS] = 0
        before = tail_state(reader.tail)
        f = (VIEW, reader.poll_context(), state, w, "TR", 0, W_WRITE_POS, W_COMMITTED_POS, W_CONFIRMED_POS,
             W_DISPATCHED_POS, None, -1, -1)
        out = []
        assert read_check.NATIVE.woken_poll(f, 3, seen, 32, out) is None
        assert out == [] and state._shown_end == 0 and tail_state(reader.tail) == before
        assert state.consumer_ends() == (0, 0)          # bounded by what the replication confirmed
        state._shown_end = 0
        w[W_CONFIRMED_POS] = -1                         # no bound: the round reads the three new messages
        t = read_check.NATIVE.woken_poll(f, 3, seen, 32, out)
        assert t is not None and t[2] == 6 and [m.body for m in out] == [b"m3", b"m4", b"m5"]
        assert state._shown_end == end
    finally:
        reader.close()
        store.close()


@pytest.mark.parametrize("bad", ["short tuple", "index past the words", "negative index", "words not a buffer",
                                 "wake index past the wake words", "negative wake index", "wake words not a buffer"])
def test_woken_poll_refuses_a_malformed_round_with_a_typed_error(bad):
    state = words_state()
    wake = memoryview(bytearray(8 * 4)).cast("q")
    f = [VIEW, None, state, state.w, "TR", 0, W_WRITE_POS, W_COMMITTED_POS, W_CONFIRMED_POS, W_DISPATCHED_POS,
         wake, 1, 5]
    err: type[Exception] = ValueError
    if bad == "short tuple":
        f, err = f[:12], TypeError
    elif bad == "index past the words":
        f[9] = len(state.w)
    elif bad == "negative index":
        f[6] = -1
    elif bad == "wake index past the wake words":
        f[11] = 4
    elif bad == "negative wake index":
        f[11] = -1
    elif bad == "wake words not a buffer":
        f[10], err = 7, TypeError
    else:
        f[3], err = 12345, TypeError
    with pytest.raises(err):
        read_check.NATIVE.woken_poll(tuple(f), 0, None, 32, [])
    assert state._shown_end == 0
