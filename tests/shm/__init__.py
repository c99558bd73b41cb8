"""Payload helpers and spawned-process targets shared by the shm and ingress tests (their fixtures
``shm`` and ``spawn`` are in ``tests/conftest.py``). Process targets live here (not in the test
modules) so a spawned child imports only this light module.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import time
import zlib
from dataclasses import dataclass

import numpy as np

from hostmq import records as R
from hostmq.root import shm_name, shm_prefix
from hostmq.ingress.ring import IngressRing
from hostmq.shm import FutexWord, Segment, WaitStats, list_segments, list_semaphores, notify_if_waiting, wait_for

SPAWN = multiprocessing.get_context("spawn")
TOPIC = b"shm-test"


@dataclass(frozen=True)
class ShmNames:
    root: str
    broker: str

    def name(self, kind: str, n: int | str = 0) -> str:
        return shm_name(self.root, self.broker, kind, n)

    @property
    def prefix(self) -> str:
        return shm_prefix(self.root, self.broker)


def leftovers(prefix: str) -> list[str]:
    return list_segments(prefix) + [f"sem:{s}" for s in list_semaphores(prefix)]


# -- payloads ---------------------------------------------------------------------------------
def body_for(seq: int, part: int = 0) -> bytes:
    """A body that names its frame and part, of a length that varies with them."""
    n = 8 + (seq * 7 + part * 13) % 120
    return (seq.to_bytes(8, "little") + bytes([(seq + part) & 0xFF]) * n)[:n]


def frame_payload(seq: int) -> tuple[int, int, bytes]:
    """``(kind, record_count, payload)`` of frame ``seq``: every 10th a BATCH of 3 records."""
    if seq % 10 == 9:
        recs = [R.encode_record(TOPIC, body_for(seq, i), b"") for i in range(3)]
        return R.FRAME_BATCH, 3, b"".join(recs)
    return R.FRAME_MESSAGE, 1, R.encode_record(TOPIC, body_for(seq), b"")


def check_frame(frame) -> int:
    """Validate the records of a frame against what ``frame_payload`` encodes; returns bytes used."""
    payload = frame.payload
    pos = 0
    for part in range(frame.record_count):
        kind, total = R.check_record(payload, pos, len(payload))    # verifies the body CRC
        _, topic, body, _ = R.decode_record(payload, pos, pos + total)
        assert kind == R.RecordKind.MESSAGE and topic == TOPIC.decode()
        assert body == body_for(frame.seq, part if frame.record_count > 1 else 0)
        pos += total
    assert pos == len(payload)
    return pos


# -- descriptors shared between processes -------------------------------------------------------
def open_fd_of(pid: int, fd: int) -> int:
    """Our own descriptor of what process ``pid`` holds as ``fd`` (how the broker's writer opens rings)."""
    return os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)


def make_doorbell() -> tuple[Segment, FutexWord]:
    """A one-page sealed memfd with a futex word: the writer's wake-up, as the broker makes it."""
    seg = Segment.create_memfd("doorbell", R.DOORBELL_BYTES, R.DOORBELL_KIND, R.DOORBELL_VERSION)
    return seg, FutexWord(seg.array(np.int64, 1), R.DOORBELL_WRITER_WORD)


def open_doorbell_of(pid: int, fd: int) -> tuple[Segment, FutexWord]:
    own = open_fd_of(pid, fd)
    try:
        seg = Segment.from_fd(own, R.DOORBELL_KIND, R.DOORBELL_VERSION)
    finally:
        os.close(own)
    return seg, FutexWord(seg.array(np.int64, 1), R.DOORBELL_WRITER_WORD)


def open_ring_of(pid: int, fd: int) -> IngressRing:
    own = open_fd_of(pid, fd)
    try:
        return IngressRing.from_fd(own)
    finally:
        os.close(own)


# -- spawned targets ---------------------------------------------------------------------------
def owner_child(seg_name: str, conn) -> None:
    """Create a segment, report, then live until killed."""
    Segment.create(seg_name, 4096, "probe", 1)
    conn.send("ready")
    time.sleep(120)


def stream_producer(doorbell_ref: tuple[int, int], nframes: int, data_bytes: int, entries: int,
                    conn) -> None:
    """Producer session: write ``nframes`` frames, check every completion, report a checksum."""
    ring = IngressRing.create("ring.stream", data_bytes, entries)
    _, wake = open_doorbell_of(*doorbell_ref)
    conn.send(("ready", os.getpid(), ring.segment.fd))
    crc = seq = got = records = phys = 0
    stats = WaitStats()
    pending = None
    while got < nframes:
        if seq < nframes:
            if pending is None:
                pending = frame_payload(seq)
            kind, count, payload = pending
            if ring.try_write(kind, seq, payload, count):
                crc = zlib.crc32(payload, crc)
                seq += 1
                pending = None
                notify_if_waiting(ring.writer_waiting, wake)
                continue
        comps = ring.completions()
        for c in comps:
            assert c["seq"] == got and c["status"] == R.COMPLETION_SEND_OK, c
            assert c["queue_offset"] == records and c["phys_offset"] == phys, c
            kind, count, payload = frame_payload(got)
            assert c["record_count"] == count
            records += count
            phys += len(payload)
            got += 1
        if len(comps) == 0:
            need = len(pending[2]) if pending else 0
            ok = wait_for(lambda: ring.has_completions() or (pending is not None and ring.can_reserve(need)),
                          ring.completion_word, time.monotonic() + 20, flag=ring.producer_waiting, stats=stats)
            assert ok, "producer waited 20 s for the writer"
    conn.send(("done", crc, records, stats.__dict__))
    conn.recv()                     # parent is finished with the ring
    ring.mark_closed()
    ring.close()


def endless_producer(doorbell_ref: tuple[int, int], data_bytes: int, conn) -> None:
    """Write frames forever (reading completions as needed) until SIGKILLed."""
    ring = IngressRing.create("ring.endless", data_bytes, 1024)
    _, wake = open_doorbell_of(*doorbell_ref)
    conn.send(("ready", os.getpid(), ring.segment.fd))
    seq = 0
    while True:
        kind, count, payload = frame_payload(seq)
        if ring.try_write(kind, seq, payload, count):
            seq += 1
            if seq == 2000:
                conn.send("2000")
            notify_if_waiting(ring.writer_waiting, wake)
        else:
            ring.completions()
            wait_for(lambda: ring.has_completions() or ring.can_reserve(len(payload)), ring.completion_word,
                     time.monotonic() + 1, flag=ring.producer_waiting)


def half_written_producer(conn) -> None:
    """Publish 3 frames, then reserve a 4th that wraps (a SKIP header is written) and fill half of
    it without committing; report (with the ring's descriptor) and wait to be killed."""
    ring = IngressRing.create("ring.half", 4096, 16)
    for seq in range(3):
        kind, count, payload = frame_payload(seq)
        assert ring.try_write(kind, seq, payload, count)
    view = ring.reserve(ring.max_payload_bytes - 8)       # does not fit before the end: wraps
    assert view is not None
    view[:len(view) // 2] = b"\xAB" * (len(view) // 2)
    conn.send(("mid-write", os.getpid(), ring.segment.fd))
    time.sleep(120)


PP_PING, PP_PONG, PP_PARENT_WAITING, PP_CHILD_WAITING = 0, 8, 16, 24     # int64 words, own lines


def pingpong_child(seg_name: str, n: int, spin_s: float, conn) -> None:
    """Answer ``n`` pings: wait for ping >= i, store pong = i, wake the parent if it waits. Each side
    sleeps on the futex of the word the other one publishes."""
    from hostmq.shm import Flag
    seg = Segment.attach(seg_name, "pingpong", 1)
    words = seg.buf[:256].cast("q")
    arr = seg.array(np.int64, 32)
    ping, pong = FutexWord(arr, PP_PING), FutexWord(arr, PP_PONG)
    mine = Flag(words, PP_CHILD_WAITING)
    parent = Flag(words, PP_PARENT_WAITING)
    stats = WaitStats()
    failures = 0
    conn.send("ready")
    for i in range(1, n + 1):
        if not wait_for(lambda: words[PP_PING] >= i, ping, time.monotonic() + 5, flag=mine,
                        spin_s=spin_s, stats=stats):
            failures += 1
        words[PP_PONG] = i
        notify_if_waiting(parent, pong, bump=False)
    conn.send((failures, stats.__dict__))
    mine.release()
    parent.release()
    words.release()
    seg.close()


def kill(p) -> None:
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)


def broker_that_dies(state_name: str, pool_name: str, heartbeat_ms: int, conn) -> None:
    """A 'broker' that creates its state segment (heartbeat ``heartbeat_ms``) and a pool segment, says
    so, and exits without unlinking them — what a SIGKILLed broker leaves."""
    from hostmq.live.state import BrokerState
    st = BrokerState.create(state_name, store_host=b"\0" * 8, commitlog_file_bytes=1 << 20,
                            consume_queue_file_entries=1000, index_slots=100, index_entries=100,
                            sync_flush=False, start_pos=0, last_store_ts_ms=0)
    st.set("control_heartbeat_ms", heartbeat_ms)
    pool = Segment.create(pool_name, 4096, "pool", 1)
    st.close()
    pool.close()
    conn.send("made")
    conn.close()
