"""The broker state segment: header, position words, futex words and the session table."""
from __future__ import annotations

import os
import struct
import time

import pytest

from hostmq import records as R
from hostmq.live.state import W_COMMITTED_POS, W_DISPATCHED_POS, W_FLUSHED_POS, W_WRITE_POS, BrokerState, pid_alive
from hostmq.errors import BrokerBusyError, SegmentError, SegmentExistsError, SegmentNotFoundError
from hostmq.shm.segment import Segment

pytestmark = pytest.mark.timeout(60)


def make(shm, sync_flush=False, **kw) -> BrokerState:  # noqa: F811
    return BrokerState.create(shm.name("state"), store_host=b"\x01\x02\x03\x04\x00\x00\x00\x09",
                              commitlog_file_bytes=1 << 20, consume_queue_file_entries=1000, index_slots=101,
                              index_entries=400, sync_flush=sync_flush, start_pos=4096,
                              last_store_ts_ms=123, **kw)


def test_create_then_attach_sees_the_same_header_and_words(shm):  # noqa: F811
    owner = make(shm, session_slots=4, doorbell_fd=17)
    try:
        reader = BrokerState.attach(shm.name("state"), readonly=True)
        try:
            assert (reader.session_slots, reader.doorbell_fd, reader.broker_pid) == (4, 17, os.getpid())
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
    st = make(shm, session_slots=2)
    try:
        v0 = st.get("sessions_version")
        a = st.open_slot("ring-a", 7, 111, 20)
        b = st.open_slot("ring-b", 8, 222, 21)
        assert (a, b) == (0, 1) and st.get("sessions_version") == v0 + 2
        assert st.slot(b) == (R.SLOT_ACTIVE, 8, 222, 21, "ring-b")
        with pytest.raises(BrokerBusyError, match="2 producer session slots"):
            st.open_slot("ring-c", 9, 333, 22)
        st.set_slot_state(a, R.SLOT_FREE)
        st.attached[a] = 1                            # the writer has not detached yet: not reusable
        with pytest.raises(BrokerBusyError):
            st.open_slot("ring-c", 9, 333, 22)
        st.attached[a] = 0
        assert st.open_slot("ring-c", 9, 333, 22) == a
        assert st.active_slots() == [0, 1]
        st.set_slot_state(a, R.SLOT_FREE)
        long = "n" * (R.STATE_SLOT_NAME_BYTES + 10)
        assert st.slot(st.open_slot(long, 1, 1, 1))[4] == long[:R.STATE_SLOT_NAME_BYTES]   # a label, cut
    finally:
        st.close()
        st.unlink()


def test_futex_words_of_the_state_wake_a_read_only_attacher(shm):  # noqa: F811
    """Consumers sleep on dispatch_seq through a read-only mapping; the dispatcher changes it and wakes."""
    import threading
    owner = make(shm)
    reader = BrokerState.attach(owner.name, readonly=True)
    try:
        token = reader.dispatch_seq_word.arm()

        def publish():
            owner.w[R.STATE_WORD["dispatch_seq"]] += 1
            owner.dispatch_seq_word.wake()
        threading.Timer(0.05, publish).start()
        t0 = time.monotonic()
        assert reader.dispatch_seq_word.sleep(token, 10.0) and time.monotonic() - t0 < 5.0
        before = owner.get("dispatch_wake"), owner.get("flush_wake")
        owner.dispatch_wake.post()
        owner.flush_wake.post()
        assert (owner.get("dispatch_wake"), owner.get("flush_wake")) == (before[0] + 1, before[1] + 1)
    finally:
        reader.close()
        owner.close()
        owner.unlink()


def test_attaching_something_that_is_not_a_state_segment_fails(shm):  # noqa: F811
    with pytest.raises(SegmentError):
        BrokerState.attach(shm.name("state"))          # does not exist


# -- layout: the documented byte offsets (records.BROKER_STATE / shm_layouts) --------------------------------
def _word(st: BrokerState, byte_offset: int) -> int:
    return struct.unpack_from("=q", st.segment.buf, byte_offset)[0]


def test_the_segment_has_the_documented_size_and_header(shm):  # noqa: F811
    before_ms = int(time.time() * 1000)
    st = make(shm, sync_flush=True, session_slots=4, doorbell_fd=9)
    after_ms = int(time.time() * 1000)
    try:
        # header, sessions, attach words, flush latency histogram, queue wake words
        assert st.segment.size == 640 + 72 * 4 + 8 * R.FLUSH_HISTOGRAM_BUCKETS + 8 * R.QUEUE_WAKE_WORDS
        assert st.flush_histogram.ctypes.data - st.segment.u8.ctypes.data == 640 + 72 * 4
        assert st.queue_wake.ctypes.data - st.segment.u8.ctypes.data == 640 + 72 * 4 + 8 * R.FLUSH_HISTOGRAM_BUCKETS
        assert _word(st, 0) == 1                                 # flush_disk_type: SYNC
        assert (_word(st, 8), _word(st, 16), _word(st, 24)) == (4, 9, os.getpid())
        assert bytes(st.segment.buf[32:40]) == b"\x01\x02\x03\x04\x00\x00\x00\x09"
        assert (_word(st, 40), _word(st, 56)) == (1 << 20, 1000)
        assert before_ms <= _word(st, 48) <= after_ms            # started_ms
        assert (_word(st, 384), _word(st, 392)) == (101, 400)    # index slots / entries
        assert _word(st, 64) == R.BROKER_STARTING == 0           # broker_state
        # Every position starts at start_pos: write, dispatched, flushed, cq flushed, flush request.
        assert [_word(st, off) for off in (128, 256, 320, 288, 176)] == [4096] * 5
        assert _word(st, 152) == 123                             # last_store_ts_ms
        assert st.get("flush_request_pos") == 4096 and st.get("cq_flushed_pos") == 4096
    finally:
        st.close()
        st.unlink()


def test_position_words_are_the_documented_lines(shm):  # noqa: F811
    st = make(shm)
    try:
        st.w[W_WRITE_POS], st.w[W_DISPATCHED_POS], st.w[W_FLUSHED_POS] = 11, 22, 33
        st.set("topics_version", 44)
        st.set("scheduler_pid", 55)
        assert [_word(st, off) for off in (128, 256, 320, 64 + 16, 448)] == [11, 22, 33, 44, 55]
        st.writer_waiting.set()
        st.flusher_waiting.set()
        assert (_word(st, 128 + 16), _word(st, 256 + 16), _word(st, 320 + 16)) == (1, 0, 1)
        st.flusher_waiting.clear()
        assert _word(st, 320 + 16) == 0 and st.writer_waiting.is_set() and not st.dispatcher_waiting.is_set()
    finally:
        st.close()
        st.unlink()


def test_get_set_bump_and_snapshot(shm):  # noqa: F811
    st = make(shm)
    try:
        assert st.get("topics_version") == 0
        assert st.bump("topics_version") == 1 and st.bump("topics_version") == 2
        assert st.get("topics_version") == 2
        st.set("dispatched_records", -7)                 # any int64
        st.set("appended_records", 2 ** 63 - 1)
        snap = st.snapshot()
        assert snap["topics_version"] == 2 and snap["dispatched_records"] == -7
        assert snap["appended_records"] == 2 ** 63 - 1 and snap["store_host"] == "0102030400000009"
        assert snap["write_pos"] == 4096 and snap["broker_pid"] == os.getpid()
        assert {"intent_valid", "scheduler_heartbeat_ms", "offsets_reset_version"} <= set(snap)
        with pytest.raises(KeyError):
            st.get("no_such_word")
        with pytest.raises(KeyError):
            st.set("no_such_word", 1)
    finally:
        st.close()
        st.unlink()


def test_a_read_write_attacher_shares_the_words_both_ways(shm):  # noqa: F811
    owner = make(shm)
    try:
        writer = BrokerState.attach(owner.name)
        try:
            writer.w[W_WRITE_POS] = 5000
            writer.set("writer_pid", 4242)
            assert owner.get("write_pos") == 5000 and owner.get("writer_pid") == 4242
            owner.bump("sessions_version")
            assert writer.get("sessions_version") == 1
            writer.writer_waiting.set()
            assert owner.writer_waiting.is_set()
        finally:
            writer.close()
        assert owner.get("write_pos") == 5000              # closing an attacher changes nothing
    finally:
        owner.close()
        owner.unlink()


def test_stored_pos_is_the_write_pos_capped_by_the_flushed_pos_only_under_sync_flush(shm):  # noqa: F811
    st = make(shm, sync_flush=False)
    try:
        st.w[W_WRITE_POS], st.w[W_FLUSHED_POS], st.w[W_DISPATCHED_POS] = 9000, 5000, 4000
        st.w[W_COMMITTED_POS] = 7000                       # transient store pool: 2000 bytes not in the file
        assert st.stored_pos() == 7000 and st.committed_end() == 7000
        st.w[W_COMMITTED_POS] = 9100                       # a roll's commit may pass the published write_pos
        assert st.committed_end() == 9000
        assert not st.sync_flush and st.stored_pos() == 9000 and st.readable_pos() == 4000
        st.w[W_DISPATCHED_POS] = 9000
        assert st.readable_pos() == 9000                  # ASYNC: flushing does not hold readers back
    finally:
        st.close()
        st.unlink()
    st = make(shm, sync_flush=True)
    try:
        st.w[W_WRITE_POS], st.w[W_FLUSHED_POS], st.w[W_COMMITTED_POS] = 9000, 5000, 9000
        assert st.stored_pos() == 5000
        st.w[W_FLUSHED_POS] = 9500                         # the flusher may pass a stale write_pos read
        assert st.stored_pos() == 9000
    finally:
        st.close()
        st.unlink()


def test_slot_rows_are_at_the_documented_offsets_and_names_use_all_32_bytes(shm):  # noqa: F811
    st = make(shm, session_slots=2)
    try:
        name32 = "n" * 31 + "Z"
        s = st.open_slot(name32, 2 ** 63 + 5, 777, 42)               # generation is a u64
        assert s == 0 and st.slot(0) == (R.SLOT_ACTIVE, 2 ** 63 + 5, 777, 42, name32)
        row = 640 + 64 * 0
        assert _word(st, row) == R.SLOT_ACTIVE and _word(st, row + 16) == 777 and _word(st, row + 24) == 42
        assert bytes(st.segment.buf[row + 32:row + 64]) == name32.encode()
        st.attached[1] = 99                                # the writer's attach table follows the sessions
        assert _word(st, 640 + 64 * 2 + 8) == 99
        st.attached[1] = 0
    finally:
        st.close()
        st.unlink()


def test_closing_rows_are_still_active_and_state_changes_bump_the_version(shm):  # noqa: F811
    st = make(shm, session_slots=3)
    try:
        for i in range(3):
            st.open_slot(f"s{i}", i, i, i)
        v = st.get("sessions_version")
        st.set_slot_state(1, R.SLOT_CLOSING)
        assert st.get("sessions_version") == v + 1
        assert st.active_slots() == [0, 1, 2]        # CLOSING is not free yet
        with pytest.raises(BrokerBusyError):
            st.open_slot("s3", 3, 3, 3)
        st.set_slot_state(1, R.SLOT_FREE)
        assert st.active_slots() == [0, 2] and st.get("sessions_version") == v + 2
        assert st.open_slot("s3", 3, 3, 3) == 1
        assert st.slot(1) == (R.SLOT_ACTIVE, 3, 3, 3, "s3")     # the old name is overwritten
    finally:
        st.close()
        st.unlink()


def test_a_read_only_attacher_cannot_write_words_or_flags(shm):  # noqa: F811
    owner = make(shm)
    try:
        reader = BrokerState.attach(owner.name, readonly=True)
        try:
            with pytest.raises(TypeError):
                reader.set("topics_version", 1)
            with pytest.raises(TypeError):
                reader.writer_waiting.set()
            with pytest.raises((TypeError, ValueError)):
                reader.sessions[0]["state"] = R.SLOT_ACTIVE
            assert owner.get("topics_version") == 0 and not owner.writer_waiting.is_set()
        finally:
            reader.close()
    finally:
        owner.close()
        owner.unlink()


def test_owner_liveness_follows_the_recorded_pid_and_start_time(shm):  # noqa: F811
    st = make(shm)
    try:
        assert st.owner_alive()
        st.segment._hdr[0]["owner_start_ticks"] = 1          # same pid, other start time: a reused pid
        assert not st.owner_alive()
    finally:
        st.close()
        st.unlink()
    assert pid_alive(os.getpid())
    with open("/proc/sys/kernel/pid_max") as f:
        assert not pid_alive(int(f.read()) + 1)              # no process can have this pid


def test_close_is_idempotent_and_unlink_removes_the_name(shm):  # noqa: F811
    st = make(shm)
    st.close()
    st.close()
    assert st.segment.closed
    again = BrokerState.attach(st.name)                       # closing never unlinks
    again.close()
    st.unlink()
    with pytest.raises(SegmentNotFoundError):
        BrokerState.attach(st.name)


def test_a_second_create_of_the_same_name_is_refused(shm):  # noqa: F811
    st = make(shm)
    try:
        with pytest.raises(SegmentExistsError):
            make(shm)
        assert st.get("write_pos") == 4096                    # the first one is untouched
    finally:
        st.close()
        st.unlink()


def test_segments_of_another_kind_or_version_are_refused(shm):  # noqa: F811
    other = Segment.create(shm.name("state"), 8192, "ingress", R.BROKER_STATE_VERSION)
    try:
        with pytest.raises(SegmentError, match="is a 'ingress' segment, expected 'broker'"):
            BrokerState.attach(other.name)
    finally:
        other.close()
        other.unlink()
    old = Segment.create(shm.name("state"), 8192, R.BROKER_STATE_KIND, R.BROKER_STATE_VERSION - 1)
    try:
        with pytest.raises(SegmentError, match="layout version"):
            BrokerState.attach(old.name)
    finally:
        old.close()
        old.unlink()


@pytest.mark.parametrize("sessions,size", [(4, 640), (4, R.broker_state_bytes(4)[-1] - 1),
                                           (0, 4096), (-1, 4096)])
def test_a_header_whose_tables_do_not_fit_is_refused_on_attach(shm, sessions, size):  # noqa: F811
    def init(seg):
        h = seg.array(R.BROKER_STATE, count=1)
        h[0]["session_slots"] = sessions

    seg = Segment.create(shm.name("state"), size, R.BROKER_STATE_KIND, R.BROKER_STATE_VERSION, init=init)
    try:
        with pytest.raises(SegmentError, match="do not fit"):
            BrokerState.attach(seg.name)
    finally:
        seg.close()
        seg.unlink()


def test_a_header_with_tables_that_exactly_fit_is_accepted(shm):  # noqa: F811
    def init(seg):
        h = seg.array(R.BROKER_STATE, count=1)
        h[0]["session_slots"] = 4

    seg = Segment.create(shm.name("state"), R.broker_state_bytes(4)[-1],
                         R.BROKER_STATE_KIND, R.BROKER_STATE_VERSION, init=init)
    try:
        st = BrokerState.attach(seg.name)
        assert st.session_slots == 4 and len(st.sessions) == 4
        st.close()
    finally:
        seg.close()
        seg.unlink()
