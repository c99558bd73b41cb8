"""The commitlog tail (store/tail.py): a consumer reads records the dispatcher has not covered yet,
exactly once and in queue order, whatever the dispatcher does meanwhile."""
from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostmq.message import Message
from hostmq.store import MessageStore
from hostmq.store.readonly import StoreReader
from hostmq.store.tail import CommitlogTail

from .conftest import small_config

pytestmark = pytest.mark.timeout(120)

KEYS = [("T0", 0), ("T0", 1), ("T1", 0)]


class Live:
    """A store with a tailing reader: readable up to ``dispatched``, tailing up to what is stored."""

    def __init__(self, path: str, **overrides) -> None:
        self.store = MessageStore(path, small_config(**overrides))
        self.sent: dict[tuple[str, int], list[bytes]] = {k: [] for k in KEYS}
        self.reader = StoreReader(path, small_config(**overrides), scan_queues=False,
                                  limit_phys=lambda: self.store.dispatched_phys,
                                  tail_limit=lambda: self.store.commitlog.max_offset())
        self.pos = {k: 0 for k in KEYS}
        self.got: dict[tuple[str, int], list[bytes]] = {k: [] for k in KEYS}

    def put(self, i: int, key=None, tags: str = "t") -> None:
        key = key or KEYS[i % len(KEYS)]
        body = b"m%06d" % i + b"." * (i % 37)
        self.store.put(Message(key[0], body, tags=tags), queue_id=key[1])
        self.sent[key].append(body)

    def dispatch_to(self, k: int) -> None:
        """Dispatch the records before the k-th one put (a record boundary)."""
        ends = self._boundaries()
        if k < len(ends):
            self.store.cq_store.dispatch(ends[k])

    def _boundaries(self) -> list[int]:
        """Where each record starts, and the end."""
        end = self.store.commitlog.max_offset()
        reqs, _ = self.store.commitlog.scan(0, end, 1 << 20)
        return [r.phys_offset for r in reqs] + [end]

    def read(self, key, batch: bool = False, count: int = 7) -> None:
        r = self.reader
        r.refresh_queue(*key)
        if batch:
            b = r.get_batch(key[0], key[1], self.pos[key], count)
            self.got[key] += [bytes(x) for x in b.bodies]
            if len(b) or b.status.name in ("FOUND", "NO_MATCHED_MESSAGE"):
                self.pos[key] = b.next_offset
        else:
            g = r.get(key[0], key[1], self.pos[key], count)
            self.got[key] += [m.body for m in g.messages]
            if g.messages:
                self.pos[key] = g.next_offset

    def drain(self) -> None:
        for key in KEYS:
            for _ in range(1000):
                before = len(self.got[key])
                self.read(key)
                if len(self.got[key]) == before:
                    break

    def close(self) -> None:
        self.reader.close()
        self.store.close()


def test_records_are_readable_before_they_are_dispatched_and_once_after(tmp_path):
    live = Live(str(tmp_path / "s"))
    try:
        for i in range(30):
            live.put(i)
        assert live.store.dispatched_phys == 0
        live.drain()
        assert live.got == live.sent                    # all from the tail: nothing is dispatched
        assert live.reader.max_offset("T0", 0) == 0     # (the consume queues hold nothing yet)
        for i in range(30, 60):
            live.put(i)
        live.dispatch_to(45)                            # part of the new ones dispatched, part not
        live.drain()
        assert live.got == live.sent
        live.store.dispatch()
        for i in range(60, 70):
            live.put(i)
        live.drain()
        assert live.got == live.sent
    finally:
        live.close()


def test_a_new_queue_and_batches_are_read_from_the_tail(tmp_path):
    live = Live(str(tmp_path / "s"))
    try:
        for i in range(12):
            live.put(i, key=("T1", 0))
        live.read(("T1", 0), batch=True, count=5)
        live.read(("T1", 0), batch=True, count=100)
        assert live.got[("T1", 0)] == live.sent[("T1", 0)]
    finally:
        live.close()


def test_a_tag_filter_applies_to_tail_records(tmp_path):
    live = Live(str(tmp_path / "s"))
    try:
        for i in range(10):
            live.put(i, key=("T0", 0), tags="a" if i % 2 else "b")
        live.reader.refresh_queue("T0", 0)
        g = live.reader.get("T0", 0, 0, 32, "a")
        assert [m.body for m in g.messages] == live.sent[("T0", 0)][1::2]
        assert g.next_offset == 10
    finally:
        live.close()


def test_the_tail_stops_at_a_broken_record_and_never_passes_it(tmp_path):
    live = Live(str(tmp_path / "s"))
    try:
        for i in range(6):
            live.put(i, key=("T0", 0))
        ends = live._boundaries()
        mf = live.store.commitlog.mfq.find(ends[3])
        struct.pack_into(">I", mf.mm, ends[3] - mf.file_from_offset + 4, 0xDEADBEEF)   # MAGICCODE
        live.drain()
        assert live.got[("T0", 0)] == live.sent[("T0", 0)][:3]
        assert live.reader.tail.stopped_at is not None and live.reader.tail.stopped_at[0] == ends[3]
    finally:
        live.close()


def test_past_its_bound_the_tail_waits_for_the_dispatcher(tmp_path):
    live = Live(str(tmp_path / "s"))
    live.reader.tail = CommitlogTail(live.reader.commitlog, max_bytes=1000)
    try:
        for i in range(40):
            live.put(i, key=("T0", 0))
        live.drain()
        got = len(live.got[("T0", 0)])
        assert 0 < got < 40 and live.reader.tail.capped
        live.store.dispatch()
        live.drain()
        assert live.got == live.sent
    finally:
        live.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.one_of(st.tuples(st.just("put"), st.integers(1, 9)),
                              st.tuples(st.just("dispatch"), st.integers(0, 60)),
                              st.tuples(st.just("read"), st.integers(0, 2), st.booleans(), st.integers(1, 9))),
                    max_size=40))
def test_any_interleaving_of_appends_dispatch_and_reads_delivers_each_message_once_in_order(tmp_path_factory, ops):
    live = Live(str(tmp_path_factory.mktemp("s") / "s"))
    try:
        n = 0
        for op in ops:
            if op[0] == "put":
                for _ in range(op[1]):
                    live.put(n)
                    n += 1
            elif op[0] == "dispatch":
                live.dispatch_to(op[1])
            else:
                live.read(KEYS[op[1]], batch=op[2], count=op[3])
        live.drain()
        assert live.got == live.sent
    finally:
        live.close()


def test_one_batch_runs_from_the_consume_queue_on_into_the_tail(tmp_path):
    live = Live(str(tmp_path / "s"))
    try:
        for i in range(20):
            live.put(i, key=("T0", 0))
        live.dispatch_to(8)                     # 8 in the consume queue, 12 in the tail
        live.reader.refresh_queue("T0", 0)
        b = live.reader.get_batch("T0", 0, 3, 100)
        assert list(b.queue_offsets) == list(range(3, 20))
        assert [bytes(x) for x in b.bodies] == live.sent[("T0", 0)][3:]
    finally:
        live.close()


def test_a_position_past_a_lagging_view_is_kept_and_one_past_the_true_end_is_corrected(tmp_path):
    """A tailing consumer's position can be past what a view shows (here the tail is at its bound);
    such a view answers OFFSET_OVERFLOW_BADLY without moving the position. A view that has seen
    every stored record corrects a position past the end as RocketMQ does (to 0 while the queue
    starts at 0)."""
    from hostmq.store.reader import GetStatus
    lv = Live(str(tmp_path))
    key = KEYS[0]
    for i in range(30):
        lv.put(i, key)
    r = lv.reader
    r.tail.max_bytes = 600                      # the tail covers a few records only
    m = r.refresh_queue(*key)
    assert 0 < m < 30 and not r.knows_end()
    g = r.get(*key, 29, 4)
    b = r.get_batch(*key, 29, 4)
    assert (g.status, g.next_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 29)
    assert (b.status, b.next_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 29)
    lv.dispatch_to(30)
    assert r.refresh_queue(*key) == 30 and r.knows_end()
    assert [x.body for x in r.get(*key, 29, 4).messages] == [lv.sent[key][29]]
    g = r.get(*key, 1000, 4)
    b = r.get_batch(*key, 1000, 4)
    assert (g.status, g.next_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 0)
    assert (b.status, b.next_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 0)
