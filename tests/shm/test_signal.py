"""Wake-ups: futex words, wait_for wakes promptly, times out, stops; notify wakes only waiters; no
lost wake-ups across processes; waits on several words at once; wake through a read-only mapping."""
from __future__ import annotations

import mmap
import threading
import time

import numpy as np
import pytest

from hostmq.shm import Flag, FutexWord, Segment, WaitStats, notify_if_waiting, wait_for
from hostmq.shm.futex import sleep_any
from tests.shm import PP_CHILD_WAITING, PP_PARENT_WAITING, PP_PING, PP_PONG, SPAWN, pingpong_child

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def arr(seg):
    return seg.array(np.int64, 32)


def test_flag_needs_int64_words(words):
    f = Flag(words, 2)
    assert not f.is_set()
    f.set()
    assert words[2] == 1 and f.is_set()
    f.clear()
    assert words[2] == 0
    with pytest.raises(ValueError):
        Flag(memoryview(bytearray(16)), 0)


def test_futex_word_arms_sleeps_and_posts(arr):
    w = FutexWord(arr, 3)
    token = w.arm()
    assert not w.sleep(token, 0.02)             # nothing changed: a timeout
    assert w.sleep(token + 1, 5.0)              # the value is not the token: no sleep at all
    w.post()
    assert arr[3] == 1 and w.arm() == 1 and w.sleep(token, 5.0)
    with pytest.raises(ValueError):
        FutexWord(arr, 32)
    with pytest.raises(ValueError):
        FutexWord(arr.astype(np.int32), 0)


def test_futex_wakes_through_a_read_only_mapping(seg, arr, shm):
    """A client maps the broker state read-only: it must be able to sleep on it and be woken."""
    import posix_ipc
    shm_obj = posix_ipc.SharedMemory(seg.name, read_only=True)
    ro = mmap.mmap(shm_obj.fd, 4096 + 4096, access=mmap.ACCESS_READ)
    shm_obj.close_fd()
    ro_arr = np.frombuffer(ro, np.int64, count=32, offset=4096)
    reader, writer = FutexWord(ro_arr, 5), FutexWord(arr, 5)
    token = reader.arm()
    threading.Timer(0.05, writer.post).start()
    t0 = time.monotonic()
    assert reader.sleep(token, 10.0) and time.monotonic() - t0 < 5.0
    del reader, ro_arr
    ro.close()


def test_sleep_any_wakes_on_any_word(arr):
    a, b = FutexWord(arr, 0), FutexWord(arr, 8)
    tokens = [a.arm(), b.arm()]
    assert not sleep_any([a, b], tokens, 0.02)
    threading.Timer(0.05, b.post).start()
    t0 = time.monotonic()
    assert sleep_any([a, b], tokens, 10.0) and time.monotonic() - t0 < 5.0
    assert sleep_any([a, b], tokens, 10.0)      # b already differs from its token


def test_wait_for_true_predicate_returns_at_once(arr):
    st = WaitStats()
    assert wait_for(lambda: True, FutexWord(arr, 0), time.monotonic() - 1, stats=st)
    assert (st.immediate, st.blocked) == (1, 0)


def test_wait_for_times_out_at_the_deadline(arr, words):
    flag = Flag(words, 1)
    st = WaitStats()
    t0 = time.monotonic()
    assert not wait_for(lambda: False, FutexWord(arr, 0), t0 + 0.1, flag=flag, block_slice_s=0.01, stats=st)
    elapsed = time.monotonic() - t0
    assert 0.1 <= elapsed < 0.5
    assert st.timeouts == 1 and st.slice_timeouts >= 5 and not flag.is_set()


def test_wait_for_returns_promptly_when_woken(arr, words):
    flag = Flag(words, 1)
    wake = FutexWord(arr, 0)
    seen_waiting = []
    st = WaitStats()

    def poster():
        deadline = time.monotonic() + 5
        while not flag.is_set() and time.monotonic() < deadline:    # wait until the waiter blocks
            time.sleep(0.001)
        seen_waiting.append(flag.is_set())
        words[2] = 1
        seen_waiting.append(notify_if_waiting(flag, wake))

    t = threading.Thread(target=poster)
    t.start()
    t0 = time.monotonic()
    # block_slice_s of 5 s: only the wake can end this wait quickly
    assert wait_for(lambda: words[2] == 1, wake, t0 + 10, flag=flag, block_slice_s=5.0, stats=st)
    woke_after = time.monotonic() - t0
    t.join()
    assert seen_waiting == [True, True]
    assert woke_after < 1.0 and st.wakeups == 1 and st.slice_timeouts == 0
    assert not flag.is_set()


def test_spin_sees_a_store_without_blocking(arr):
    st = WaitStats()
    calls = []

    def pred():
        calls.append(1)
        return len(calls) >= 5
    assert wait_for(pred, FutexWord(arr, 0), time.monotonic() + 5, spin_s=1.0, stats=st)
    assert st.spin_hits == 1 and st.blocked == 0


def test_stop_ends_a_wait(arr):
    stop = threading.Event()
    threading.Timer(0.05, stop.set).start()
    t0 = time.monotonic()
    assert not wait_for(lambda: False, FutexWord(arr, 0), t0 + 20, stop=stop)
    assert time.monotonic() - t0 < 1.0


def test_notify_wakes_only_when_the_peer_waits(arr, words):
    flag = Flag(words, 3)
    wake = FutexWord(arr, 0)
    assert not notify_if_waiting(flag, wake) and arr[0] == 0
    flag.set()
    assert notify_if_waiting(flag, wake) and arr[0] == 1
    assert notify_if_waiting(lambda: True, wake) and arr[0] == 2
    assert notify_if_waiting(lambda: True, wake, bump=False) and arr[0] == 2     # the cursor moved itself


@pytest.mark.parametrize("spin_s", [0.0, 50e-6])
def test_no_lost_wakeup_in_20000_ping_pongs(shm, spawn, spin_s):
    n = 20_000
    name = shm.name("pingpong")
    seg = Segment.create(name, 4096, "pingpong", 1)
    words = seg.buf[:256].cast("q")
    arr = seg.array(np.int64, 32)
    ping, pong = FutexWord(arr, PP_PING), FutexWord(arr, PP_PONG)
    try:
        parent_conn, child_conn = SPAWN.Pipe()
        child = spawn(pingpong_child, name, n, spin_s, child_conn)
        assert parent_conn.poll(30) and parent_conn.recv() == "ready"     # start-up is not measured
        mine, peer = Flag(words, PP_PARENT_WAITING), Flag(words, PP_CHILD_WAITING)
        st = WaitStats()
        failures = 0
        t0 = time.monotonic()
        for i in range(1, n + 1):
            words[PP_PING] = i
            notify_if_waiting(peer, ping, bump=False)
            if not wait_for(lambda: words[PP_PONG] >= i, pong, time.monotonic() + 5, flag=mine,
                            spin_s=spin_s, stats=st):
                failures += 1
        elapsed = time.monotonic() - t0
        assert parent_conn.poll(30)
        child_failures, child_stats = parent_conn.recv()
        child.join(10)
        assert failures == 0 and child_failures == 0
        timeouts = st.slice_timeouts + child_stats["slice_timeouts"]
        rescued = st.rescued + child_stats["rescued"]
        blocked = st.blocked + child_stats["blocked"]
        print(f"\nping-pong x{n} spin_s={spin_s}: {elapsed / n * 1e6:.1f} us/round trip; blocked waits "
              f"{blocked}, slices timed out {timeouts}, of which found the predicate already true "
              f"(a late or lost wake-up) {rescued}")
        # A futex armed before the last check cannot lose a wake-up: a rescued wait would be a bug.
        assert rescued == 0
        mine.release()
        peer.release()
    finally:
        words.release()
        seg.close()
        seg.unlink()
