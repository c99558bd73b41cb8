"""The consumer's read round in C (hostmq/store/_read.c, issue 29) against its spec, the Python read side.

Both paths read the same store files — good records of varied shapes (tags, keys, properties,
compressed bodies) over several commitlog files, records no consumer can decode, and bytes the test
damages (in the commitlog and in the consume queue's entries) — and must give the same rounds:
``get`` with and without a tag filter, at any offset, count and byte bound (status, next offset,
skipped count, and every message field by field), ``get_batch`` (offsets, bodies, status), and the
one-record check at any position.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from hostmq import records as R
from hostmq.message import Message, MessageExt, MessageQueue
from hostmq.store import read_check
from hostmq.store.message_store import MessageStore, _tag_filter
from hostmq.store.readonly import StoreReader
from hostmq.store.reader import get_batch, get_messages
from tests.store.conftest import put_at, small_config
from tests.store.test_tail import Live

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(read_check.NATIVE is None, reason="hostmq/store/_read.c is not built")]
T = "RN"
NOW_MS = 1_700_000_000_000
FIELDS = ("topic", "body", "tags", "keys", "properties", "delay_level", "flag", "msg_id", "unique_id", "queue_id",
          "queue_offset", "commitlog_offset", "born_timestamp_ms", "store_timestamp_ms", "reconsume_times",
          "sys_flag", "store_size", "queue", "raw", "broker")


def fields(m: MessageExt) -> tuple:
    assert isinstance(m, MessageExt)
    return tuple(getattr(m, f) for f in FIELDS) + (repr(m),)


def append_raw(store: MessageStore, queue_id: int, body: bytes, props: bytes, sys_flag: int = 0) -> None:
    rec = R.encode_record(T.encode(), body, props, queue_id=queue_id, sys_flag=sys_flag)
    blob, starts = R.encode_batch([rec])
    store.append_encoded(T, queue_id, blob, starts, now_ms=NOW_MS)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """~360 records in two queues over several 64 KiB commitlog files, dispatched."""
    s = MessageStore(str(tmp_path_factory.mktemp("rn") / "store"), small_config(consume_queue_file_entries=1000))
    for i in range(360):
        q = i % 2
        if i % 41 == 7:
            append_raw(s, q, b"x" * (i % 5), b"TAGS\x01A\x02n\x01\xff\xfe\x02")          # not UTF-8
        elif i % 43 == 9:
            append_raw(s, q, zlib.compress(b"z%d" % i * 20), b"TAGS\x01B\x02", R.SYSFLAG_COMPRESSED)
        elif i % 47 == 11:
            append_raw(s, q, b"not zlib", b"TAGS\x01A\x02", R.SYSFLAG_COMPRESSED)        # does not inflate
        elif i % 53 == 13:
            append_raw(s, q, b"p", b"a\x01b\x01c\x02\x02TAGS\x01A\x02")                   # valid, not simple
        else:
            props = {"n": str(i), "v": "é" * (i % 7)} if i % 5 else {}
            put_at(s, Message(T, b"b%d" % i * (1 + i % 30), tags=(None, "A", "B")[i % 3],
                              keys=("k%d" % i, "x") if i % 4 else (), properties=props), NOW_MS + i, q)
    s.dispatch()
    assert len(s.commitlog.mfq.files) >= 2
    yield s
    s.close()


def both(fn):
    """``fn()`` on the native path, then on the Python path alone."""
    native = fn()
    saved, read_check.NATIVE = read_check.NATIVE, None
    try:
        python = fn()
    finally:
        read_check.NATIVE = saved
    return native, python


def same_get(a, b) -> None:
    assert (a.status, a.next_offset, a.min_offset, a.max_offset, a.skipped) == \
        (b.status, b.next_offset, b.min_offset, b.max_offset, b.skipped)
    assert [fields(m) for m in a.messages] == [fields(m) for m in b.messages]


def same_batch(a, b) -> None:
    assert (a.status, a.next_offset, a.skipped, a.queue_offsets.tolist()) == \
        (b.status, b.next_offset, b.skipped, b.queue_offsets.tolist())
    bodies = [bytes(x) for x in a.bodies]
    assert bodies == [bytes(x) for x in b.bodies]
    assert [fields(m) for m in a] == [fields(m) for m in b]
    for joined, offsets in both(a.bodies_joined):          # C's gather, and numpy's
        assert offsets[0] == 0 and len(offsets) == len(a) + 1 and offsets[-1] == len(joined)
        assert [joined[offsets[i]:offsets[i + 1]].tobytes() for i in range(len(a))] == bodies


def test_good_records_take_the_native_path(store):
    """Every undamaged, uncompressed, decodable record is accepted by the C check itself (not handed
    back), and is the message the spec builds."""
    cq = store.queues[(T, 0)]
    ents = cq.entries(0, 1000)
    native = 0
    for k, (phys, size) in enumerate(zip(ents["phys_offset"].tolist(), ents["size"].tolist())):
        mf = store.commitlog.mfq.find(phys)
        got = read_check.NATIVE.checked(mf.mm, phys - mf.file_from_offset, size, T.encode(), 0, k, "b")
        want = read_check.py_check_one(mf.mm, phys - mf.file_from_offset, size, T.encode(), 0, k, "b")
        if got is not None:
            native += 1
            assert fields(got) == fields(want)
        elif isinstance(want, MessageExt):
            assert want.sys_flag & R.SYSFLAG_COMPRESSED
    assert native >= 150


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_native_and_python_rounds_agree(store, data):
    queue_id = data.draw(st.integers(0, 1), label="queue_id")
    cq = store.queues[(T, queue_id)]
    ents = cq.entries(0, 1000)
    phys_l, size_l = ents["phys_offset"].tolist(), ents["size"].tolist()
    cq_mf = cq.mfq.files[0]
    saved: list[tuple] = []

    def damage(mf, at: int, value: int) -> None:
        saved.append((mf, at, int(mf.wu8[at])))
        mf.wu8[at] = value

    try:
        for _ in range(data.draw(st.integers(0, 6), label="damages")):
            k = data.draw(st.integers(0, len(phys_l) - 1))
            mf = store.commitlog.mfq.find(phys_l[k])
            rel = phys_l[k] - mf.file_from_offset
            where = data.draw(st.sampled_from(["header", "tail", "anywhere", "entry"]))
            if where == "header":
                at = rel + data.draw(st.integers(0, R.MSG_HEADER.size - 1))
            elif where == "tail":
                at = rel + size_l[k] - data.draw(st.integers(1, min(40, size_l[k])))
            elif where == "anywhere":
                at = rel + data.draw(st.integers(0, size_l[k] - 1))
            else:                       # the consume-queue entry: its phys offset or size
                mf = cq_mf
                at = k * R.CQ_ENTRY.itemsize + data.draw(st.integers(0, 11))
            damage(mf, at, data.draw(st.sampled_from([0, 1, 2, 0x80, 0xC3, 0xED, 0xFF, 0x7F])))
        offset = data.draw(st.integers(0, len(phys_l) + 2), label="offset")
        max_count = data.draw(st.sampled_from([1, 2, 7, 32, 500]), label="max_count")
        max_bytes = data.draw(st.sampled_from([1, 300, 4096, 256 * 1024]), label="max_bytes")
        expression = data.draw(st.sampled_from(["*", "A", "A || B", "C"]), label="expression")
        a, b = both(lambda: get_messages(cq, store.commitlog, offset, max_count, _tag_filter(expression),
                                         max_bytes, "b"))
        same_get(a, b)
        mq = MessageQueue(T, "b", queue_id)
        a, b = both(lambda: get_batch(cq, store.commitlog, mq, offset, max_count))
        same_batch(a, b)
        pos = data.draw(st.integers(0, store.commitlog.file_bytes), label="pos")
        size = data.draw(st.sampled_from([0, 90, 91, 150, 300, 1 << 20]), label="size")
        mf = store.commitlog.mfq.files[0]
        got = read_check.NATIVE.checked(mf.mm, pos, size, T.encode(), queue_id, offset, "b")
        want = read_check.py_check_one(mf.mm, pos, size, T.encode(), queue_id, offset, "b")
        if got is not None:                         # accepted natively: the spec accepts it the same
            assert fields(got) == fields(want)
    finally:
        for mf, at, v in reversed(saved):
            mf.wu8[at] = v


def test_native_messages_are_built_as_the_class_builds_them(store):
    """The C path fills exactly the slots MessageExt.__init__ fills, the same way."""
    cq = store.queues[(T, 0)]
    phys, size = (int(x) for x in cq.entries(0, 1)[0][["phys_offset", "size"]].item())
    mf = store.commitlog.mfq.find(phys)
    got = read_check.NATIVE.checked(mf.mm, phys - mf.file_from_offset, size, T.encode(), 0, 0, "b")
    want = MessageExt(bytes(mf.mm[phys - mf.file_from_offset:phys - mf.file_from_offset + size]), "b")
    assert type(got) is MessageExt
    for slot in MessageExt.__slots__:
        assert getattr(got, slot) == getattr(want, slot), slot
    got.show_as("Other")                            # the slots are writable as on any MessageExt
    assert got.topic == "Other"


def test_gather_refuses_spans_outside_its_buffers():
    out = np.zeros(8, np.uint8)
    i64 = lambda *v: np.array(v, np.int64)      # noqa: E731
    read_check.NATIVE.gather(b"abcdefgh", i64(2, 0), i64(3, 2), i64(0, 6), out)
    assert out.tobytes() == b"cde\0\0\0ab"
    for starts, lens, at in ((i64(7), i64(2), i64(0)), (i64(0), i64(9), i64(0)), (i64(0), i64(2), i64(7)),
                             (i64(-1), i64(1), i64(0)), (i64(0), i64(-1), i64(0)), (i64(0, 1), i64(1), i64(0))):
        with pytest.raises(ValueError):
            read_check.NATIVE.gather(b"abcdefgh", starts, lens, at, out)


def test_batch_rows_is_get_batchs_check_in_one_pass(store):
    """``batch_rows`` fills the rows ``get_batch`` reads (position, size, queue offset) and gives
    ``check_rows``'s verdict, for the entries of one commitlog file; -1 (nothing decided) when an
    entry's record lies in another file or the first is below the commitlog's minimum."""
    cq = store.queues[(T, 0)]
    ents = cq.entries(0, 1000)
    mf = store.commitlog.mfq.files[0]
    n = int(np.searchsorted(ents["phys_offset"].astype(np.int64), mf.file_end_offset))
    assert 10 < n < len(ents)

    def rows(e, cl_min=0, first=0):
        rel, sizes, offs = (np.full(len(e), -7, np.int64) for _ in range(3))
        ok = np.zeros(len(e), bool)
        got = read_check.NATIVE.batch_rows(e, mf.mm, mf.file_from_offset, mf.file_end_offset, cl_min, first,
                                           T.encode(), 0, rel, sizes, offs, ok)
        return got, rel, sizes, offs, ok
    refused, rel, sizes, offs, ok = rows(ents[:n], first=5)
    assert rel.tolist() == (ents["phys_offset"][:n].astype(np.int64) - mf.file_from_offset).tolist()
    assert sizes.tolist() == ents["size"][:n].tolist() and offs.tolist() == list(range(5, 5 + n))
    refused, *_, ok = rows(ents[:n])
    want = read_check.check_rows(mf, rel, sizes, np.arange(n, dtype=np.int64), T.encode(), 0)
    assert refused == int((~ok).sum()) and not (ok & ~want).any()     # what it accepts, the spec accepts
    assert rows(ents[:n + 1])[0] == -1                                 # the next file's record
    assert rows(ents[:n], cl_min=int(ents["phys_offset"][0]) + 1)[0] == -1
    with pytest.raises(ValueError):
        read_check.NATIVE.batch_rows(ents[:2], mf.mm, 0, 1 << 20, 0, 0, b"T", 0, np.empty(2, np.int64),
                                     np.empty(2, np.int64), np.empty(3, np.int64), np.empty(2, bool))


def test_body_offsets_and_copies_stay_inside_their_buffers(store):
    """``body_offsets`` gives up (-1) on a compressed body or a record too short for its header or
    its body; ``copy_bodies`` refuses spans outside either buffer and copies nothing then."""
    i64 = lambda *v: np.array(v, np.int64)      # noqa: E731
    hdr = R.MSG_HEADER.size
    rec = bytearray(R.encode_record(T.encode(), b"hello", b"", queue_id=0))
    offs = np.zeros(2, np.int64)
    assert read_check.NATIVE.body_offsets(bytes(rec), i64(0), i64(len(rec)), offs) == 5 and offs.tolist() == [0, 5]
    assert read_check.NATIVE.body_offsets(bytes(rec), i64(0), i64(hdr + 4), offs) == -1     # body past the size
    assert read_check.NATIVE.body_offsets(bytes(rec), i64(1), i64(len(rec)), offs) == -1    # past the buffer
    flagged = R.encode_record(T.encode(), b"hello", b"", queue_id=0, sys_flag=R.SYSFLAG_COMPRESSED)
    assert read_check.NATIVE.body_offsets(flagged, i64(0), i64(len(flagged)), offs) == -1
    out = np.zeros(5, np.uint8)
    read_check.NATIVE.copy_bodies(bytes(rec), i64(0), i64(0, 5), out)
    assert out.tobytes() == b"hello"
    for rel, o, dst in ((i64(len(rec) - hdr), i64(0, 5), out), (i64(0), i64(0, 6), out),
                        (i64(0), i64(1, 5), out), (i64(0), i64(0, 5), np.zeros(4, np.uint8)), (i64(-1), i64(0, 1), out)):
        with pytest.raises(ValueError):
            read_check.NATIVE.copy_bodies(bytes(rec), rel, o, dst)


_PROP_BYTES = st.lists(st.sampled_from([b"\x00", b"\x01", b"\x02", b"\x03", b"a", b"TAGS", b"\x7f", b"\x80", b"\xc3\xa9",
                                        b"\xe2\x82\xac", b"\xed\xa0\x80", b"\xf0\x9f\x98\x80", b"\xff", b"\xc3",
                                        b"x" * 9, b"\xc3\xa9" * 5]), max_size=24).map(b"".join)


@settings(max_examples=400, deadline=None)
@given(props=_PROP_BYTES)
def test_native_property_check_agrees_with_the_spec(props):
    """The word-at-a-time property scan (separators and UTF-8 in one pass) accepts exactly the
    properties the spec decodes: any mix of separators, ASCII runs, multi-byte, overlong and
    surrogate sequences, and bytes no UTF-8 has."""
    if len(props) > 32767:
        return
    if props and not props.endswith(b"\x02"):
        props += b"\x02"
    rec = R.encode_record(T.encode(), b"body", props, queue_id=3, queue_offset=9)
    got = read_check.NATIVE.checked(rec, 0, len(rec), T.encode(), 3, 9, "b")
    want = read_check.py_check_one(rec, 0, len(rec), T.encode(), 3, 9, "b")
    assert (got is not None) == isinstance(want, MessageExt)
    if got is not None:
        assert fields(got) == fields(want)


def test_take_refuses_entries_in_another_byte_order(store):
    cq = store.queues[(T, 0)]
    little = cq.entries(0, 4).astype([("phys_offset", "<i8"), ("size", "<i4"), ("tag_hash", "<i8")])
    with pytest.raises(TypeError):
        read_check.NATIVE.take(little, 0, None, 0, 0, 0, 0, T.encode(), 0, 1 << 20, 0, "b", [])
    with pytest.raises(ValueError):
        read_check.NATIVE.take(cq.entries(0, 4), 5, None, 0, 0, 0, 0, T.encode(), 0, 1 << 20, 0, "b", [])
    assert np.dtype(R.CQ_ENTRY) == cq.entries(0, 4).dtype


@settings(max_examples=30, deadline=None)
@given(dispatched=st.integers(0, 40), offset=st.integers(0, 42), max_count=st.sampled_from([1, 5, 32]),
       expression=st.sampled_from(["*", "t", "u"]))
def test_native_and_python_agree_on_a_tailing_reader(tmp_path_factory, dispatched, offset, max_count, expression):
    """A consumer's view: the consume queue followed by the commitlog tail's entries (joined in
    another byte order, which the native path converts)."""
    live = Live(str(tmp_path_factory.mktemp("tail") / "s"))
    try:
        for i in range(40):
            live.put(i, key=("T0", 0), tags="t" if i % 3 else "u")
        live.dispatch_to(dispatched)
        r = live.reader
        r.refresh_queue("T0", 0)
        a, b = both(lambda: r.get("T0", 0, offset, max_count, expression))
        same_get(a, b)
        a, b = both(lambda: r.get_batch("T0", 0, offset, max_count))
        same_batch(a, b)
    finally:
        live.close()


class ReadRounds(RuleBasedStateMachine):
    """A store that grows (good, undecodable and compressed records), is dispatched part way and is
    damaged where it was dispatched; after every step a round at any offset, by the broker's store
    and by a consumer's tailing view, gives the same answer on both paths."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="hq-rn-")
        path = os.path.join(self.dir, "store")
        self.store = MessageStore(path, small_config())
        self.view = StoreReader(path, small_config(), scan_queues=False,
                                limit_phys=lambda: self.store.dispatched_phys,
                                tail_limit=lambda: self.store.commitlog.max_offset())
        # two consumers' views read with read_tail, one in C (tail_read), one by the spec's steps
        self.fast, self.spec = (StoreReader(path, small_config(), scan_queues=False,
                                            limit_phys=lambda: self.store.dispatched_phys,
                                            tail_limit=lambda: self.store.commitlog.max_offset())
                                for _ in range(2))
        self.n = 0

    @rule(queue_id=st.integers(0, 1), count=st.integers(1, 12),
          kind=st.sampled_from(["good", "good", "good", "bad-props", "compressed", "bad-zlib"]),
          tags=st.sampled_from([None, "A", "B"]))
    def put(self, queue_id, count, kind, tags):
        for _ in range(count):
            self.n += 1
            tag = b"TAGS\x01" + (tags or "A").encode() + b"\x02"
            if kind == "good":
                put_at(self.store, Message(T, b"m%d" % self.n * (1 + self.n % 9), tags=tags,
                                           properties={"n": str(self.n)}), NOW_MS + self.n, queue_id)
            elif kind == "bad-props":
                append_raw(self.store, queue_id, b"b", tag + b"n\x01\xed\xa0\x80\x02")       # a surrogate
            elif kind == "compressed":
                append_raw(self.store, queue_id, zlib.compress(b"c%d" % self.n * 9), tag, R.SYSFLAG_COMPRESSED)
            else:
                append_raw(self.store, queue_id, b"\x78\x9c no", tag, R.SYSFLAG_COMPRESSED)

    @rule()
    def dispatch(self):
        self.store.dispatch()

    @rule(data=st.data())
    def damage(self, data):
        """A byte of a dispatched record, or of its consume-queue entry, changed for good."""
        queue_id = data.draw(st.integers(0, 1))
        cq = self.store.queues.get((T, queue_id))
        if cq is None or not cq.max_offset():
            return
        k = data.draw(st.integers(0, cq.max_offset() - 1))
        phys, size = (int(x) for x in cq.entries(k, 1)[0][["phys_offset", "size"]].item())
        mf = self.store.commitlog.mfq.find(phys)
        if data.draw(st.booleans()) or mf is None:
            cmf = cq.mfq.find(k * R.CQ_ENTRY.itemsize)
            cmf.wu8[k * R.CQ_ENTRY.itemsize - cmf.file_from_offset + data.draw(st.integers(0, 11))] = \
                data.draw(st.sampled_from([0, 1, 0x7F, 0xFF]))
        else:
            at = phys - mf.file_from_offset + data.draw(st.integers(0, max(0, min(size, mf.file_bytes) - 1)))
            if at < mf.file_bytes:
                mf.wu8[at] = data.draw(st.sampled_from([0, 1, 2, 0x80, 0xC3, 0xED, 0xFF]))

    @rule(data=st.data())
    def rounds_agree(self, data):
        queue_id = data.draw(st.integers(0, 1), label="queue_id")
        offset = data.draw(st.integers(0, self.n + 1), label="offset")
        max_count = data.draw(st.sampled_from([1, 3, 32, 4096]), label="max_count")
        expression = data.draw(st.sampled_from(["*", "A", "B || A", "C"]), label="expression")
        max_bytes = data.draw(st.sampled_from([1, 500, 1 << 20]), label="max_bytes")
        cq = self.store.queues.get((T, queue_id))
        if cq is not None:
            same_get(*both(lambda: get_messages(cq, self.store.commitlog, offset, max_count,
                                                _tag_filter(expression), max_bytes, "b")))
            same_batch(*both(lambda: get_batch(cq, self.store.commitlog, MessageQueue(T, "b", queue_id), offset,
                                               max_count)))
        self.view.refresh_queue(T, queue_id)
        same_get(*both(lambda: self.view.get(T, queue_id, offset, max_count, expression)))
        same_batch(*both(lambda: self.view.get_batch(T, queue_id, offset, max_count)))
        # a tailing consumer's round: the same max offset, result and tail after it, in C and by the spec
        hi, g = self.fast.read_tail(T, queue_id, offset, max_count)
        if g is None:
            g = self.fast.get(T, queue_id, offset, max_count)
        saved, read_check.NATIVE = read_check.NATIVE, None
        try:
            spec_hi, spec_g = self.spec.read_tail(T, queue_id, offset, max_count)
            assert spec_g is None
            spec_g = self.spec.get(T, queue_id, offset, max_count)
        finally:
            read_check.NATIVE = saved
        assert hi == spec_hi
        same_get(g, spec_g)
        assert tail_state(self.fast.tail) == tail_state(self.spec.tail)

    def teardown(self):
        self.fast.close()
        self.spec.close()
        self.view.close()
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def tail_state(t) -> tuple:
    return (t.start, t.cursor, t.limit, t.capped, t.stopped_at,
            {k: t.queues.entries(*k) for k in t.queues.keys()})


TestReadRounds = ReadRounds.TestCase
TestReadRounds.settings = settings(max_examples=25, stateful_step_count=25, deadline=None)


@pytest.fixture(scope="module")
def tail_store(tmp_path_factory):
    """Records the tail scans: several topics (the schedule topic among them), TAGS first, later, absent,
    empty, not ASCII, behind a longer name; a few commitlog files; not dispatched."""
    from hostmq.store.dispatch import SCHEDULE_TOPIC
    s = MessageStore(str(tmp_path_factory.mktemp("tail-scan") / "store"), small_config())
    props = [b"TAGS\x01A\x02", b"a\x01b\x02TAGS\x01xy\x02", b"", b"TAGS\x01\x02",
             b"XTAGS\x01no\x02TAGS\x01yes\x02", b"KEYS\x01k\x02", b"TAGS\x01" + b"t" * 40 + b"\x02"]
    for i in range(700):
        topic = (T, "other-topic", SCHEDULE_TOPIC)[i % 7 % 3] if i % 7 < 3 else T
        prop = b"TAGS\x01\xc3\xa9\x02" if i % 97 == 50 else props[i % len(props)]     # the spec's (not ASCII)
        rec = R.encode_record(topic.encode(), b"b%d" % i * (1 + i % 19), prop, queue_id=i % 2)
        blob, starts = R.encode_batch([rec])
        s.append_encoded(topic, i % 2, blob, starts, now_ms=NOW_MS)
    assert len(s.commitlog.mfq.files) >= 2
    yield s
    s.close()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_native_tail_scan_finds_what_the_dispatchers_scan_finds(tail_store, data):
    """``tail.scan`` with ``tail_scan`` (C) and with the spec alone (``CommitLog.scan``) give the same
    rows, next offset and scan error from any record boundary, under any bound and count, with bytes
    damaged anywhere (headers, topics, properties)."""
    from hostmq.store import tail as TL
    cl = tail_store.commitlog
    bounds = [r.phys_offset for r in cl.records_between(0, cl.max_offset())]
    layout = []                         # per record, undamaged: its file, position, size, topic, properties
    for phys in bounds:
        mf = cl.mfq.find(phys)
        rel = phys - mf.file_from_offset
        tpos = rel + R.MSG_HEADER.size + int.from_bytes(mf.mm[rel + R.FIELD["body_length"]:][:4], "big")
        layout.append((mf, rel, int.from_bytes(mf.mm[rel:rel + 4], "big"), tpos, tpos + 1 + mf.mm[tpos] + 2))
    saved: list[tuple] = []
    try:
        first = len(bounds) - 1
        for _ in range(data.draw(st.integers(0, 4), label="damages")):
            k = data.draw(st.integers(0, len(bounds) - 1))
            first = min(first, k)
            mf, rel, size, tpos, ppos = layout[k]
            where = data.draw(st.sampled_from(["header", "sign", "topic", "last", "props", "anywhere"]))
            at = {"header": lambda: rel + data.draw(st.integers(0, R.MSG_HEADER.size - 1)),
                  "sign": lambda: rel + R.FIELD[data.draw(st.sampled_from(["queue_id", "queue_offset"]))],
                  "topic": lambda: data.draw(st.integers(tpos, ppos - 3)),
                  "last": lambda: rel + size - 1,
                  "props": lambda: data.draw(st.integers(ppos, max(ppos, rel + size - 1))),
                  "anywhere": lambda: rel + data.draw(st.integers(0, size - 1))}[where]()
            saved.append((mf, at, int(mf.wu8[at])))
            mf.wu8[at] = data.draw(st.sampled_from([0, 1, 2, ord("."), 0x80, 0xC3, 0xFF, ord("T")]))
        start = data.draw(st.sampled_from(bounds[:first + 1]), label="start")
        limit = data.draw(st.sampled_from([cl.max_offset()] * 3 + [start + 1, start + 500, start + 5000]), label="limit")
        count = data.draw(st.sampled_from([4096, 4096, 1, 3, 50]), label="count")
        native = TL.scan(cl, start, limit, count), cl.scan_error
        keep, read_check.NATIVE = read_check.NATIVE, None
        try:
            spec = TL.scan(cl, start, limit, count), cl.scan_error
        finally:
            read_check.NATIVE = keep
        assert native == spec
    finally:
        for mf, at, v in reversed(saved):
            mf.wu8[at] = v
