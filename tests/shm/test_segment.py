"""Segments: layouts, create/attach and their typed errors, owner liveness, stale reclaim."""
from __future__ import annotations

import os
import time

import numpy as np
import posix_ipc
import psutil
import pytest

from hostmq import records as R
from hostmq.errors import HostMQError, SegmentError, SegmentExistsError, SegmentNotFoundError
from hostmq.shm import (Segment, list_segments, list_semaphores, read_info, reclaim_stale)
from hostmq.shm.segment import boot_id, process_alive, process_start_ticks
from tests.shm import SPAWN, broker_that_dies, kill, owner_child

pytestmark = pytest.mark.timeout(60)


def test_layout_sizes_and_alignment():
    assert R.SEGMENT_HEADER.itemsize == 128
    assert R.RING_HEADER.itemsize == 256
    assert R.FRAME_HEADER.size == R.FRAME_HEADER_DTYPE.itemsize == 24
    assert R.COMPLETION.itemsize == 40
    assert R.SEGMENT_PAYLOAD_OFFSET % 4096 == 0
    assert R.FRAME_HEADER_DTYPE.fields["seq"][1] % 8 == 0
    for name in ("queue_offset", "phys_offset", "store_ts_ms", "seq"):
        assert R.COMPLETION.fields[name][1] % 8 == 0
    # each side's words sit on its own 64-byte line
    line = {n: R.RING_HEADER.fields[n][1] // 64 for n in R.RING_HEADER.names}
    producer = {"data_write_pos", "completion_read_pos", "producer_waiting", "producer_state"}
    writer = {"data_read_pos", "completion_write_pos", "writer_waiting", "writer_state"}
    assert {line[n] for n in producer} == {1} and {line[n] for n in writer} == {2}
    assert all(R.RING_HEADER.fields[n][1] % 8 == 0 for n in R.RING_HEADER.names)


def test_create_attach_round_trip(shm):
    name = shm.name("probe")
    seg = Segment.create(name, 10_000, "probe", 3)
    try:
        assert seg.size == len(seg.buf) == len(seg.u8) == 10_000
        seg.u8[:5] = [1, 2, 3, 4, 5]
        other = Segment.attach(name, "probe", 3)
        assert bytes(other.buf[:5]) == b"\x01\x02\x03\x04\x05"
        other.buf[9_999] = 7
        assert seg.u8[9_999] == 7
        info = other.info()
        assert (info.kind, info.layout_version, info.owner_pid) == ("probe", 3, os.getpid())
        assert info.boot_id == boot_id()
        assert info.owner_start_ticks == process_start_ticks() > 0
        assert info.size_bytes == R.SEGMENT_PAYLOAD_OFFSET + 10_000
        assert info.generation == seg.generation == other.generation
        assert seg.is_owner and not other.is_owner and other.owner_alive()
        assert read_info(name) == info
        other.close()
        other.close()                               # idempotent
    finally:
        seg.close()
        seg.unlink()
    assert list_segments(shm.prefix) == []


def test_generation_changes_when_recreated(shm):
    name = shm.name("probe")
    with Segment.create(name, 64, "probe", 1) as a:
        gen = a.generation
        a.unlink()
    with Segment.create(name, 64, "probe", 1) as b:
        assert b.generation != gen
        b.unlink()


def test_typed_errors(shm):
    name = shm.name("probe")
    with pytest.raises(SegmentNotFoundError) as e:
        Segment.attach(name, "probe", 1)
    assert isinstance(e.value, HostMQError) and e.value.name == name
    seg = Segment.create(name, 64, "probe", 1)
    try:
        with pytest.raises(SegmentExistsError):
            Segment.create(name, 64, "probe", 1)
        with pytest.raises(SegmentError, match="'probe' segment, expected 'ingress'"):
            Segment.attach(name, "ingress", 1)
        with pytest.raises(SegmentError, match="layout version 1, this code reads 2"):
            Segment.attach(name, "probe", 2)
        with pytest.raises(SegmentError, match="kind"):
            Segment.create(shm.name("other"), 64, "x" * 17, 1)
    finally:
        seg.close()
        seg.unlink()


def test_foreign_or_unfinished_segment_is_refused(shm):
    name = shm.name("foreign")
    raw = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, size=8192)      # all zeros: no magic
    raw.close_fd()
    try:
        with pytest.raises(SegmentError, match="magic"):
            Segment.attach(name, "probe", 1)
        with pytest.raises(SegmentError, match="magic"):
            read_info(name)
        assert reclaim_stale(shm.prefix) == []               # young: its creator may be mid-create
        assert reclaim_stale(shm.prefix, grace_s=-1) == [name]
    finally:
        if name in list_segments(shm.prefix):
            raw.unlink()


def test_tiny_foreign_segment_is_refused(shm):
    name = shm.name("tiny")
    raw = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, size=100)
    raw.close_fd()
    try:
        with pytest.raises(SegmentError, match="smaller than a segment header"):
            Segment.attach(name, "probe", 1)
    finally:
        raw.unlink()


def test_free_space_is_reported():
    from hostmq.shm import shm_free_bytes
    assert 0 <= shm_free_bytes() <= os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize


def test_no_space_is_reported_up_front_and_leaves_nothing(shm):
    st = os.statvfs("/dev/shm")
    total = st.f_blocks * st.f_frsize
    if not 0 < total < (1 << 42):
        pytest.skip("/dev/shm has no size limit below 4 TiB")
    with pytest.raises(SegmentError, match="no space"):
        Segment.create(shm.name("huge"), 1 << 42, "probe", 1)
    assert list_segments(shm.prefix) == []


def test_close_with_live_views_defers_unmap(shm):
    seg = Segment.create(shm.name("probe"), 4096, "probe", 1)
    view = seg.buf[:4]
    arr = seg.array(np.uint8, 4)
    view[:] = b"abcd"
    seg.close()                          # must not raise; the mapping stays for the views
    assert bytes(view) == b"abcd" and bytes(arr) == b"abcd"
    seg.unlink()
    del view, arr


def test_owner_alive_checks_start_ticks_and_boot_id(shm):
    seg = Segment.create(shm.name("probe"), 64, "probe", 1)
    try:
        assert seg.owner_alive()
        seg._hdr[0]["owner_start_ticks"] -= 100           # same pid, other process (pid reuse)
        assert not seg.owner_alive()
        seg._hdr[0]["owner_start_ticks"] += 100
        seg._hdr[0]["boot_id"] = b"\x01" * 16              # left over from another boot
        assert not seg.owner_alive()
        seg._hdr[0]["boot_id"] = boot_id()
        seg._hdr[0]["owner_pid"] = 0
        assert not seg.owner_alive()
    finally:
        seg.close()
        seg.unlink()


def test_killed_owner_is_stale_and_reclaimed_live_one_kept(shm, spawn):
    dead_name, live_name = shm.name("probe", 1), shm.name("probe", 2)
    parent_conn, child_conn = SPAWN.Pipe()
    child = spawn(owner_child, dead_name, child_conn)
    assert parent_conn.poll(30) and parent_conn.recv() == "ready"
    live = Segment.create(live_name, 64, "probe", 1)
    stale_sem = posix_ipc.Semaphore(dead_name, posix_ipc.O_CREX)     # as an older version left them
    stale_sem.close()
    try:
        seg = Segment.attach(dead_name, "probe", 1)
        assert seg.owner_alive() and seg.info().owner_pid == child.pid
        assert reclaim_stale(shm.prefix) == []
        kill(child)
        assert not seg.owner_alive()
        assert reclaim_stale(shm.prefix) == [dead_name]
        assert list_segments(shm.prefix) == [live_name]
        assert list_semaphores(shm.prefix) == []               # the dead one's semaphore went with it
        assert seg.buf[0] == 0                                 # our mapping outlives the name
        seg.close()
    finally:
        live.close()
        live.unlink()


def test_orphan_semaphores_only_on_request(shm):
    seg_name, orphan = shm.name("probe"), shm.name("writer")
    seg = Segment.create(seg_name, 64, "probe", 1)
    for n in (seg_name, orphan):                             # semaphores of an older version
        posix_ipc.Semaphore(n, posix_ipc.O_CREX).close()
    try:
        assert reclaim_stale(shm.prefix) == []
        assert reclaim_stale(shm.prefix, orphan_semaphores=True) == [orphan]
        assert list_semaphores(shm.prefix) == [seg_name]
    finally:
        for n in (seg_name, orphan):
            try:
                posix_ipc.unlink_semaphore(n)
            except posix_ipc.ExistentialError:
                pass
        seg.close()
        seg.unlink()


def test_liveness_uses_boot_relative_ticks(shm):
    me = process_start_ticks()
    assert me > 0 and process_alive(os.getpid(), me)
    assert not process_alive(os.getpid(), me + 1)
    with open(f"/proc/{os.getpid()}/stat", "rb") as f:
        assert int(f.read().rsplit(b")", 1)[1].split()[19]) == me
    assert process_start_ticks(2 ** 22 + 12345) == 0 and not process_alive(2 ** 22 + 12345, me)


def test_a_wall_clock_step_does_not_make_live_owners_look_dead(shm):
    """Stepping the clock (NTP, an operator) moved psutil's create_time and made every live process
    look dead; the recorded start ticks are boot-relative. A real step of 30 s, and back."""
    seg = Segment.create(shm.name("probe"), 64, "probe", 1)
    before = psutil.Process().create_time()
    t0 = time.clock_gettime(time.CLOCK_REALTIME)
    try:
        time.clock_settime(time.CLOCK_REALTIME, t0 + 30.0)
    except PermissionError:
        seg.close()
        seg.unlink()
        pytest.skip("stepping the clock needs CAP_SYS_TIME")
    try:
        moved = psutil.Process().create_time() - before     # what the old liveness check compared
        with Segment.attach(seg.name, "probe", 1) as other:
            alive = seg.owner_alive(), other.owner_alive()
    finally:
        time.clock_settime(time.CLOCK_REALTIME, time.clock_gettime(time.CLOCK_REALTIME) - 30.0)
        seg.close()
        seg.unlink()
    assert moved > 25.0, "the step did not take"
    assert alive == (True, True)


def test_memfd_segment_is_sealed_and_checked(shm):
    seg = Segment.create_memfd("ring.test", 8192, "probe", 1)
    try:
        with pytest.raises(OSError):
            os.ftruncate(seg.fd, 4096)                          # sealed: nobody can shrink it
        other = Segment.from_fd(seg.fd, "probe", 1)
        assert other.generation == seg.generation and other.size == 8192
        other.close()
        with pytest.raises(SegmentError, match="expected"):
            Segment.from_fd(seg.fd, "other", 1)
        with pytest.raises(SegmentError, match="layout version"):
            Segment.from_fd(seg.fd, "probe", 2)
    finally:
        seg.close()
    assert list_segments(shm.prefix) == []                     # a memfd has no name to leave behind


def test_an_unsealed_or_foreign_descriptor_is_refused(tmp_path):
    path = tmp_path / "plain"
    path.write_bytes(b"\0" * 8192)
    fd = os.open(path, os.O_RDWR)
    try:
        with pytest.raises(SegmentError, match="sealable"):
            Segment.from_fd(fd, "probe", 1)
    finally:
        os.close(fd)
    fd = os.memfd_create("unsealed", os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, 8192)
        with pytest.raises(SegmentError, match="F_SEAL_SHRINK"):
            Segment.from_fd(fd, "probe", 1)
    finally:
        os.close(fd)


def test_a_test_session_leaves_a_just_killed_brokers_segments_to_its_restart(shm, spawn):
    """The test session's clean-up of killed runs (tests/conftest.py) must not take the state segment
    and transient-pool buffers of a broker killed moments ago — they hold what it acknowledged until
    its restart commits it (broker/pool_salvage.py); once its heartbeats are old, they are junk."""
    from tests.conftest import RECENT_BROKER_S, reclaim_killed_runs
    state, pool = shm.name("state"), shm.name("pool")
    parent, child = SPAWN.Pipe()
    p = spawn(broker_that_dies, state, pool, int(time.time() * 1000), child)
    assert parent.poll(30) and parent.recv() == "made"
    p.join(30)
    assert p.exitcode == 0                                  # its owner is dead now
    assert reclaim_killed_runs(shm.prefix) == []            # ... but it beat a moment ago
    assert sorted(list_segments(shm.prefix)) == sorted([state, pool])
    from hostmq.live.state import BrokerState
    st = BrokerState.attach(state)
    st.set("control_heartbeat_ms", int((time.time() - RECENT_BROKER_S - 60) * 1000))
    st.close()
    assert sorted(reclaim_killed_runs(shm.prefix)) == sorted([pool, state])
    assert list_segments(shm.prefix) == []
