"""send_async's open frames in C (``hostmq.store._encode.Gather``) against their spec in Python
(``store.gather.PyGather`` with ``client.async_sends.AsyncSends._add_py``).

A hypothesis state machine drives two ``AsyncSends`` of one started producer — one native, one the
spec — with the same unique-id counter and host: it adds messages (plain ones and every hostile kind
of tests/store/test_encode_native.py, on two topics and bad ones), takes the due frame, one topic's
frame or all of them (what publishing does), and answers frames in flight. After every step both
must agree: the same outcome of each add (a view at the same place, or the same error), the same due
frame, the same open frames with the same records byte for byte (the born timestamp, read from the
clock on each side, compared within a second), the same frames in flight and the same ids drawn.
Python encodes with ``store.encode.py_encode_messages`` here (the C encoder is Gather's own code).
Nothing is published: the producer runs on a root with no servers.
"""
from __future__ import annotations

import itertools
import time

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import hostmq
from hostmq import records as R
from hostmq.client.async_sends import AsyncFrame, AsyncSends, SendFuture
from hostmq.store.gather import PyGather
from hostmq.errors import ValidationError
from hostmq.message import Message
from hostmq.store import encode as E
from tests.store.test_encode_native import KINDS, T, messages

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(E.NATIVE is None, reason="hostmq/store/_encode.c is not built")]
HOST = b"\x7f\x00\x00\x01\x00\x00\x10\x00"
PREFIX = "0A0B0C0D00001234"
BORN = R.FIELD["born_ts_ms"]


@pytest.fixture(scope="module")
def producer(tmp_path_factory):
    p = hostmq.Producer(str(tmp_path_factory.mktemp("gather-root")), compress_over_bytes=50).start()
    yield p
    p.shutdown()


def records(buf: bytes, sizes: list[int]) -> list[tuple[bytes, int]]:
    """Each record with its born timestamp cut out, and the timestamp."""
    out, at = [], 0
    for size in sizes:
        rec = bytes(buf[at:at + size])
        out.append((rec[:BORN] + rec[BORN + 8:], int.from_bytes(rec[BORN:BORN + 8], "big")))
        at += size
    assert at == len(buf)
    return out


def same_frame(a: AsyncFrame | None, b: AsyncFrame | None) -> None:
    assert (a is None) == (b is None)
    if a is None:
        return
    assert a.topic == b.topic and a.sizes == b.sizes
    ra, rb = records(a.buf, a.sizes), records(b.buf, b.sizes)
    assert [r for r, _ in ra] == [r for r, _ in rb]
    assert all(abs(ta - tb) <= 1000 for (_, ta), (_, tb) in zip(ra, rb))


def outcome(f):
    try:
        return "ok", f()
    except (ValidationError, AttributeError, TypeError) as e:
        return "error", type(e)


class Gathering(RuleBasedStateMachine):
    producer: hostmq.Producer = None
    max_messages = 4

    def __init__(self) -> None:
        super().__init__()
        start = int(time.time()) << 20
        self.counts = {}
        self.sides = {}
        for name, native in (("native", True), ("spec", False)):
            c = itertools.count(start)
            drawn = []

            def nxt(c=c, drawn=drawn) -> int:
                v = next(c)
                drawn.append(v)
                return v
            self.counts[name] = drawn
            self.sides[name] = AsyncSends(self.producer, max_messages=self.max_messages, max_bytes=600,
                                          native=native, uid_source=[(PREFIX, nxt)], host=[HOST])
        assert isinstance(self.sides["spec"].gather, PyGather)
        assert not isinstance(self.sides["native"].gather, PyGather)
        self.taken: list[tuple[AsyncFrame, AsyncFrame]] = []

    def _add(self, name: str, msg):
        s = self.sides[name]
        view = s.gather.add(msg)
        if view is None:
            view = s._add_py(msg, 3.0)
        return view

    @rule(msg=st.one_of(messages(), st.builds(lambda m: (setattr(m, "topic", "Other"), m)[1], messages()),
                        st.sampled_from(KINDS).flatmap(messages)))
    def add(self, msg) -> None:
        got = {name: outcome(lambda name=name: self._add(name, msg)) for name in self.sides}
        a, b = got["native"], got["spec"]
        assert a[0] == b[0]
        if a[0] == "error":
            assert a[1] == b[1]
            return
        va, vb = a[1], b[1]
        assert (va is None) == (vb is None)
        if va is not None:
            assert isinstance(va, SendFuture) and isinstance(vb, SendFuture)
            assert (va._frame.topic, va._index) == (vb._frame.topic, vb._index)
            assert va._frame is self.sides["native"].gather.open[va._frame.topic]

    @rule()
    def take_due(self) -> None:
        fa, fb = (self.sides[n].gather.take_due() for n in ("native", "spec"))
        same_frame(fa, fb)
        if fa is not None:
            self.taken.append((fa, fb))

    @rule(topic=st.sampled_from([T, "Other", "Nowhere"]))
    def take(self, topic) -> None:
        fa, fb = (self.sides[n].gather.take(topic) for n in ("native", "spec"))
        same_frame(fa, fb)
        if fa is not None:
            self.taken.append((fa, fb))

    @rule()
    def take_all(self) -> None:
        la, lb = (sorted(self.sides[n].gather.take_all(), key=lambda f: f.topic) for n in ("native", "spec"))
        assert len(la) == len(lb)
        for fa, fb in zip(la, lb):
            same_frame(fa, fb)
            self.taken.append((fa, fb))

    @rule()
    def answer(self) -> None:
        if self.taken:
            self.taken.pop(0)
        for s in self.sides.values():
            s.gather.answered()

    @invariant()
    def agree(self) -> None:
        ga, gb = self.sides["native"].gather, self.sides["spec"].gather
        assert sorted(ga.open) == sorted(gb.open)
        for topic in ga.open:
            same_frame(ga.open[topic], gb.open[topic])
        same_frame(ga.due, gb.due)
        assert ga.inflight == gb.inflight
        assert self.counts["native"] == self.counts["spec"]


def test_native_gathering_agrees_with_the_spec(producer, monkeypatch):
    # Python encodes with the spec itself, not store.encode's native call (which shares C with Gather)
    monkeypatch.setattr("hostmq.client.async_sends.encode_messages", E.py_encode_messages)
    Gathering.producer = producer
    Gathering.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
    Gathering.TestCase().runTest()


def test_a_native_add_is_a_record_the_store_accepts_and_names_its_frame(producer):
    s = AsyncSends(producer, max_messages=10, native=True)
    s._add_py(Message("Shape", b"first"), 3.0)         # opens the frame (Python), then C appends
    views = [s.gather.add(Message("Shape", b"body %d" % i, tags="tg")) for i in range(3)]
    assert all(isinstance(v, SendFuture) for v in views) and [v._index for v in views] == [1, 2, 3]
    fr = s.gather.open["Shape"]
    assert all(v._frame is fr for v in views) and len(fr.sizes) == 4
    at = 0
    for i, size in enumerate(fr.sizes):
        assert R.check_record(bytes(fr.buf), at, len(fr.buf)) == (R.RecordKind.MESSAGE, size)
        at += size
    # nothing in flight: the first add marked its frame due
    assert s.gather.due is fr and s.gather.take_due() is fr and s.gather.inflight == 1
    assert s.gather.add(Message("Shape", b"x")) is None        # no open frame: Python opens the next
    s.gather.answered()
    assert s.gather.inflight == 0
