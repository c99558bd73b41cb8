"""A live view's queue end never goes back below a position its consumer reached (fault run fce7182,
trial 456: a consumer tailing ahead of the dispatcher was sent back to offset 0 of a queue).

The view decides which consume-queue entries are readable from the entries themselves (their
record must end within the readable bound), so it also looks at the entry the dispatcher is storing
right now. ``ConsumeQueue.put_one`` stores it with ``struct.pack_into``: the 20 bytes zeroed, then
the phys offset, then the size (docs/internals.md fact 14). A view that loads the phys offset first
can see the old phys offset (0) with the new size — an entry "ending" at ``size``, well within the
bound — and count it. The queue's max then stops short of the tail's entries (they continue the
queue from that entry, not after it) and falls below the consumer's position while the view
believes it knows the end: RocketMQ's OFFSET_OVERFLOW_BADLY correction sent the position to 0.

``TornLoads`` replays that interleaving deterministically: the view's loads from the entry's slot
go field by field, and the dispatcher's stores land after the first of them.
"""
from __future__ import annotations

import re
import struct

import pytest

from hostmq.message import Message
from hostmq.records import CQ_ENTRY
from hostmq.store import MessageStore, readonly
from hostmq.store.reader import GetStatus
from hostmq.store.readonly import StoreReader

from .conftest import small_config

pytestmark = pytest.mark.timeout(60)

KEY = ("T0", 0)


class Live:
    """A store whose dispatcher runs ahead of what it has published to the view (``published``)."""

    def __init__(self, path: str) -> None:
        self.store = MessageStore(path, small_config())
        self.published = 0
        self.reader = StoreReader(path, small_config(), scan_queues=False, limit_phys=lambda: self.published,
                                  tail_limit=lambda: self.store.commitlog.max_offset())

    def put(self, n: int) -> None:
        for i in range(n):
            self.store.put(Message(KEY[0], b"m%04d" % i), queue_id=KEY[1])

    def record_end(self, k: int) -> int:
        """End of the k-th record of the queue (records start at 0)."""
        reqs, _ = self.store.commitlog.scan(0, self.store.commitlog.max_offset(), 1 << 20)
        return reqs[k].phys_offset + reqs[k].size

    def dispatch(self, n: int, publish: bool = True) -> None:
        """Write the consume-queue entries of the first ``n`` records (and publish them)."""
        self.store.cq_store.dispatch(self.record_end(n - 1))
        if publish:
            self.published = self.store.cq_store.dispatched_phys

    def read_all(self, pos: int) -> int:
        while True:
            self.reader.refresh_queue(*KEY)
            g = self.reader.get(*KEY, pos, 5)
            if not g.messages:
                return pos
            assert [m.queue_offset for m in g.messages] == list(range(pos, pos + len(g.messages)))
            pos = g.next_offset

    def close(self) -> None:
        self.reader.close()
        self.store.close()


class TornLoads:
    """Every ``unpack_from`` of a struct of ``hostmq.store.readonly`` that touches consume-queue slot
    ``[lo, hi)`` of map ``mm`` loads the struct's fields one by one; ``store()`` (the dispatcher
    writing that slot) runs right after the first field load inside the slot."""

    def __init__(self, monkeypatch, mm, lo: int, store) -> None:
        self.mm, self.lo, self.hi, self.store = mm, lo, lo + CQ_ENTRY.itemsize, store
        self.stored = False
        for name, value in list(vars(readonly).items()):
            if isinstance(value, struct.Struct):
                monkeypatch.setattr(readonly, name, self._wrap(value))
        # The spec's loads (the native cq_readable loads in the same order, with fences between)
        monkeypatch.setattr(readonly, "_readable_entries", readonly.readable_entries)

    def _wrap(self, real: struct.Struct):
        order, codes = real.format[0], re.findall(r"\d*[a-zA-Z?]", real.format[1:])
        fields, at = [], 0
        for c in codes:
            f = struct.Struct(order + c)
            fields.append((at, f))
            at += f.size
        torn = self

        class Loads:
            size, format = real.size, real.format

            @staticmethod
            def unpack_from(buf, offset=0):
                if buf is not torn.mm or offset + real.size <= torn.lo or offset >= torn.hi:
                    return real.unpack_from(buf, offset)
                out = []
                for at, f in fields:
                    out.append(f.unpack_from(buf, offset + at)[0])
                    if not torn.stored and torn.lo <= offset + at < torn.hi:
                        torn.stored = True
                        torn.store()
                return tuple(out)

            pack_into = staticmethod(real.pack_into)
        return Loads


def test_an_entry_being_stored_is_not_readable_before_it_is_published(tmp_path, monkeypatch):
    live = Live(str(tmp_path / "s"))
    try:
        live.put(12)
        live.dispatch(10)                       # entries 0..9 published; 10 and 11 only in the commitlog
        pos = live.read_all(0)
        assert pos == 12                        # 10 from the consume queue, 2 from the tail
        cq = live.reader.queues[KEY]
        slot = 10 * CQ_ENTRY.itemsize
        torn = TornLoads(monkeypatch, cq.mfq.find(slot).mm, slot, lambda: live.dispatch(11, publish=False))
        # The bound has not moved since read_all: the view would not look at its consume queue again
        # (StoreReader._cq_refreshed). Forget that, as a bound moved by earlier entries makes it look.
        live.reader._cq_refreshed.clear()
        m = live.reader.refresh_queue(*KEY)     # loads slot 10 while the dispatcher stores it
        assert torn.stored
        assert m == 12, "the view counted entry 10 before its record was published"
        g = live.reader.get(*KEY, pos, 5)
        assert (g.status, g.next_offset) == (GetStatus.OFFSET_OVERFLOW_ONE, 12)
    finally:
        live.close()


def test_a_new_view_ends_a_queue_at_its_bound_when_a_newer_file_has_entries_past_it(tmp_path):
    """Under SYNC_FLUSH the dispatcher runs ahead of the flushed position consumers may read to. A
    view opened after it started the queue's next consume-queue file took the newer file's start as
    the queue's max: entries past the bound counted (read before they were flushed), and the tail's
    entries, which continue the queue from the bound, left out."""
    live = Live(str(tmp_path / "s"))
    try:
        per_file = small_config()["consume_queue_file_entries"]
        live.put(per_file + 6)
        live.dispatch(per_file + 6, publish=False)      # two consume-queue files written
        live.published = live.record_end(per_file - 5)  # readable: the first per_file - 4 records
        with StoreReader(str(tmp_path / "s"), small_config(), limit_phys=live.published) as scan:
            assert scan.max_offset(*KEY) == per_file - 4
        assert live.reader.refresh_queue(*KEY) == per_file + 6      # the rest from the tail
        assert live.reader.max_offset(*KEY) == per_file - 4
        assert live.read_all(0) == per_file + 6
    finally:
        live.close()


def test_a_view_keeps_a_position_at_or_below_an_end_it_showed(tmp_path, caplog):
    """Whatever makes a live view's end of a queue go back (here its tail drops the entries while it
    still counts as caught up), a position at or below an end the view showed was reached
    legitimately — a live consume queue never shrinks — and OFFSET_OVERFLOW_BADLY leaves it where
    it is (no message yet). A position the view never showed is corrected as RocketMQ does."""
    live = Live(str(tmp_path / "s"))
    try:
        live.put(12)
        live.dispatch(10)
        pos = live.read_all(0)
        assert pos == 12
        r = live.reader
        r.tail.queues.clear()                       # the view's own mistake: its end goes back to 10
        assert r.refresh_queue(*KEY) == 10 and r.knows_end()
        g, b = r.get(*KEY, pos, 5), r.get_batch(*KEY, pos, 5)
        assert (g.status, g.next_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, pos)
        assert (b.status, b.next_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, pos)
        assert "ends before offset 12, which it showed readable" in caplog.text
        g = r.get(*KEY, pos + 1, 5)                 # never shown: past the end the view knows
        assert (g.status, g.next_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 0)
        live.dispatch(12)
        assert r.refresh_queue(*KEY) == 12
        assert r.get(*KEY, pos, 5).status == GetStatus.OFFSET_OVERFLOW_ONE
    finally:
        live.close()


def test_an_entry_being_dropped_at_a_dispatcher_start_is_not_counted(tmp_path, monkeypatch):
    """A dispatcher that starts after a kill drops the consume-queue entries past its dispatched
    position (``truncate_dirty``) while consumers' views may be loading them. Zeroed forward, an
    entry could read as (phys 0, its size) — a record "ending" below the bound, counted, and then
    skipped by the consumer as undecodable. Sizes are zeroed first now, and the view loads the size
    again after the phys offset: the entry is not counted."""
    live = Live(str(tmp_path / "s"))
    try:
        live.put(12)
        live.dispatch(12, publish=False)
        live.published = live.record_end(9)             # entries 10 and 11 lie past what is readable
        with StoreReader(str(tmp_path / "s"), small_config(), scan_queues=False,
                         limit_phys=lambda: live.published) as view:
            cq = live.store.cq_store.consume_queue(*KEY)
            slot = 10 * CQ_ENTRY.itemsize
            assert view.refresh_queue(*KEY) == 10
            torn = TornLoads(monkeypatch, view.queues[KEY].mfq.find(slot).mm, slot,
                             lambda: cq.truncate_dirty(live.published))
            view._cq_refreshed.clear()          # look again at the same bound (see the test above)
            assert view.refresh_queue(*KEY) == 10, "the view counted an entry being dropped"
            assert torn.stored and cq.max_offset() == 10
    finally:
        live.close()


def test_a_view_that_replaced_an_earlier_run_continues_a_cut_queue_from_its_end(tmp_path, caplog):
    """Fault run 599c713, trial 485: a consumer read a SYNC_MASTER's queue to offset 12006, the master
    was killed and its slave — which held the queue to 12005 — promoted. The consumer's new view knew
    the end (12005), had never shown 12006 itself, and RocketMQ's OFFSET_OVERFLOW_BADLY correction sent
    the position to the queue's first offset: 12,005 messages again. A view that replaced the view
    which showed the position (``carry_shown``) continues from the new end, where the new master
    writes its next message; one that did not still corrects as RocketMQ does."""
    earlier = Live(str(tmp_path / "old"))
    cut = Live(str(tmp_path / "new"))
    try:
        earlier.put(12)
        earlier.dispatch(12)
        pos = earlier.read_all(0)
        assert pos == 12
        cut.put(9)                                  # the promoted slave held 9 of them
        cut.dispatch(9)
        r = cut.reader
        assert r.refresh_queue(*KEY) == 9 and r.knows_end()
        assert r.get(*KEY, pos, 5).next_offset == 0         # no earlier run: RocketMQ's correction
        r.carry_shown(earlier.reader)
        g, b = r.get(*KEY, pos, 5), r.get_batch(*KEY, pos, 5)
        assert (g.status, g.next_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 9)
        assert (b.status, b.next_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 9)
        assert "ends at 9, before offset 12 an earlier run of it showed readable" in caplog.text
        assert r.get(*KEY, pos + 1, 5).next_offset == 0     # never shown by any run: corrected
        cut.put(2)                                  # the new master's next messages, at 9 and 10
        cut.dispatch(11)
        assert r.refresh_queue(*KEY) == 11
        assert [m.body for m in r.get(*KEY, 9, 5).messages] == [b"m0000", b"m0001"]
    finally:
        earlier.close()
        cut.close()
