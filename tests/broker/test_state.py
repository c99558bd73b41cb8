"""The broker state segment: header, position words, and the session / waiter tables."""
from __future__ import annotations

import os

import pytest

from hostmq import records as R
from hostmq.broker.state import W_DISPATCHED_POS, W_FLUSHED_POS, W_WRITE_POS, BrokerState
from hostmq.errors import BrokerBusyError, SegmentError
from tests.shm import shm  # noqa: F401 - the fixture (unique names, leak check)

pytestmark = pytest.mark.timeout(60)


def make(shm, sync_flush=False, **kw) -> BrokerState:  # noqa: F811
    return BrokerState.create(shm.name("state"), store_host=b"\x01\x02\x03\x04\x00\x00\x00\x09",
                              commitlog_file_bytes=1 << 20, consume_queue_file_entries=1000, index_slots=101,
                              index_entries=400, sync_flush=sync_flush, start_pos=4096,
                              last_store_ts_ms=123, **kw)


def test_create_then_attach_sees_the_same_header_and_words(shm):  # noqa: F811
    owner = make(shm, session_slots=4, waiter_slots=3)
    try:
        reader = BrokerState.attach(shm.name("state"), readonly=True)
        try:
            assert (reader.session_slots, reader.waiter_slots) == (4, 3)
            assert reader.store_host == b"\x01\x02\x03\x04\x00\x00\x00\x09"
            assert (reader.commitlog_file_bytes, reader.consume_queue_file_entries) == (1 << 20, 1000)
            assert (reader.index_slots, reader.index_entries) == (101, 400)
            assert [reader.w[i] for i in (W_WRITE_POS, W_DISPATCHED_POS, W_FLUSHED_POS)] == [4096] * 3
            assert reader.get("last_store_ts_ms") == 123 and reader.get("broker_pid") == os.getpid()
            owner.w[W_WRITE_POS] = 9000
            owner.w[W_DISPATCHED_POS] = 8000
            assert reader.w[W_WRITE_POS] == 9000 and reader.readable_pos() == 8000
            assert reader.owner_alive() and reader.generation == owner.generation
            assert reader.snapshot()["write_pos"] == 9000
            with pytest.raises(TypeError):
                reader.w[W_WRITE_POS] = 1             # a read-only map refuses writes
        finally:
            reader.close()
    finally:
        owner.close()
        owner.unlink()


def test_under_sync_flush_readers_stop_at_the_flushed_position(shm):  # noqa: F811
    st = make(shm, sync_flush=True)
    try:
        st.w[W_DISPATCHED_POS] = 10_000
        st.w[W_FLUSHED_POS] = 7_000
        assert st.sync_flush and st.readable_pos() == 7_000
        st.w[W_FLUSHED_POS] = 12_000
        assert st.readable_pos() == 10_000
    finally:
        st.close()
        st.unlink()


def test_slots_are_handed_out_reused_and_versioned(shm):  # noqa: F811
    st = make(shm, session_slots=2, waiter_slots=2)
    try:
        v0 = st.get("sessions_version")
        a = st.open_slot("sessions", "ring-a", 7, 111)
        b = st.open_slot("sessions", "ring-b", 8, 222)
        assert (a, b) == (0, 1) and st.get("sessions_version") == v0 + 2
        assert st.slot("sessions", b) == (R.SLOT_ACTIVE, 8, 222, "ring-b")
        with pytest.raises(BrokerBusyError, match="2 sessions slots"):
            st.open_slot("sessions", "ring-c", 9, 333)
        st.set_slot_state("sessions", a, R.SLOT_FREE)
        st.attached[a] = 1                            # the writer has not detached yet: not reusable
        with pytest.raises(BrokerBusyError):
            st.open_slot("sessions", "ring-c", 9, 333)
        st.attached[a] = 0
        assert st.open_slot("sessions", "ring-c", 9, 333) == a
        assert st.active_slots("sessions") == [0, 1] and st.active_slots("waiters") == []
        w = st.open_slot("waiters", "wait-1", 1, 444)
        assert st.slot("waiters", w)[3] == "wait-1" and st.get("waiters_version") == 1
        with pytest.raises(SegmentError, match="longer than"):
            st.open_slot("waiters", "w" * (R.STATE_SLOT_NAME_BYTES + 1), 1, 1)
    finally:
        st.close()
        st.unlink()


def test_attaching_something_that_is_not_a_state_segment_fails(shm):  # noqa: F811
    with pytest.raises(SegmentError):
        BrokerState.attach(shm.name("state"))          # does not exist
