"""Signals: wait_for wakes promptly, times out, stops; notify posts only to waiters; no lost wake-ups."""
from __future__ import annotations

import threading
import time

import pytest

from hostmq.errors import SegmentExistsError, SegmentNotFoundError
from hostmq.shm import Flag, Segment, Signal, WaitStats, notify_if_waiting, wait_for
from tests.shm import (PP_CHILD_WAITING, PP_PARENT_WAITING, PP_PING, PP_PONG, SPAWN, pingpong_child, shm,
                       spawn)  # noqa: F401  (fixtures)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def signal_factory(shm):
    made = []

    def _make(kind="sig", n=0):
        s = Signal.create(shm.name(kind, n))
        made.append(s)
        return s

    yield _make
    for s in made:
        s.close()
        s.unlink()


@pytest.fixture
def words(shm):
    """Four int64 words in a real segment (flags live in shared memory)."""
    seg = Segment.create(shm.name("words"), 4096, "words", 1)
    w = seg.buf[:64].cast("q")
    yield w
    w.release()
    seg.close()
    seg.unlink()


def test_create_open_errors(shm, signal_factory):
    with pytest.raises(SegmentNotFoundError):
        Signal.open(shm.name("sig"))
    s = signal_factory()
    with pytest.raises(SegmentExistsError):
        Signal.create(s.name)
    other = Signal.open(s.name)
    other.post()
    assert s.acquire(0) and not s.acquire(0)
    other.close()
    replaced = Signal.create(s.name, replace=True)          # lock holder recreating it
    assert replaced.value == 0
    replaced.close()


def test_flag_needs_int64_words(words):
    f = Flag(words, 2)
    assert not f.is_set()
    f.set()
    assert words[2] == 1 and f.is_set()
    f.clear()
    assert words[2] == 0
    with pytest.raises(ValueError):
        Flag(memoryview(bytearray(16)), 0)


def test_wait_for_true_predicate_returns_at_once(signal_factory):
    s = signal_factory()
    st = WaitStats()
    assert wait_for(lambda: True, s, time.monotonic() - 1, stats=st)
    assert (st.immediate, st.blocked) == (1, 0)


def test_wait_for_times_out_at_the_deadline(signal_factory, words):
    s = signal_factory()
    flag = Flag(words, 0)
    st = WaitStats()
    t0 = time.monotonic()
    assert not wait_for(lambda: False, s, t0 + 0.1, flag=flag, stats=st)
    elapsed = time.monotonic() - t0
    assert 0.1 <= elapsed < 0.5
    assert st.timeouts == 1 and st.slice_timeouts >= 10 and not flag.is_set()


def test_wait_for_returns_promptly_when_signalled(signal_factory, words):
    s = signal_factory()
    flag = Flag(words, 0)
    seen_waiting = []
    st = WaitStats()

    def poster():
        deadline = time.monotonic() + 5
        while not flag.is_set() and time.monotonic() < deadline:    # wait until the waiter blocks
            time.sleep(0.001)
        seen_waiting.append(flag.is_set())
        words[1] = 1
        seen_waiting.append(notify_if_waiting(flag, s))

    t = threading.Thread(target=poster)
    t.start()
    t0 = time.monotonic()
    # block_slice_s of 5 s: only the post can end this wait quickly
    assert wait_for(lambda: words[1] == 1, s, t0 + 10, flag=flag, block_slice_s=5.0, stats=st)
    woke_after = time.monotonic() - t0
    t.join()
    assert seen_waiting == [True, True]
    assert woke_after < 1.0 and st.wakeups == 1 and st.slice_timeouts == 0
    assert not flag.is_set() and s.value == 0


def test_spin_sees_a_store_without_blocking(signal_factory, words):
    s = signal_factory()
    st = WaitStats()
    calls = []

    def pred():
        calls.append(1)
        return len(calls) >= 5
    assert wait_for(pred, s, time.monotonic() + 5, spin_s=1.0, stats=st)
    assert st.spin_hits == 1 and st.blocked == 0


def test_stop_ends_a_wait(signal_factory):
    s = signal_factory()
    stop = threading.Event()
    threading.Timer(0.05, stop.set).start()
    t0 = time.monotonic()
    assert not wait_for(lambda: False, s, t0 + 20, stop=stop)
    assert time.monotonic() - t0 < 1.0


def test_notify_posts_only_when_the_peer_waits(signal_factory, words):
    s = signal_factory()
    flag = Flag(words, 3)
    assert not notify_if_waiting(flag, s) and s.value == 0
    flag.set()
    assert notify_if_waiting(flag, s) and s.value == 1
    assert notify_if_waiting(lambda: True, s) and s.value == 2
    assert s.drain() == 2 and s.value == 0


def test_wait_drains_stale_posts(signal_factory):
    s = signal_factory()
    for _ in range(3):
        s.post()
    assert wait_for(lambda: False, s, time.monotonic() + 0.01, spin_s=0) is False
    assert s.value == 0


@pytest.mark.parametrize("spin_s", [0.0, 50e-6])
def test_no_lost_wakeup_in_20000_ping_pongs(shm, spawn, spin_s):
    n = 20_000
    name = shm.name("pingpong")
    seg = Segment.create(name, 4096, "pingpong", 1)
    words = seg.buf[:256].cast("q")
    to_parent, to_child = Signal.create(name + "-p"), Signal.create(name + "-c")
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
            notify_if_waiting(peer, to_child)
            if not wait_for(lambda: words[PP_PONG] >= i, to_parent, time.monotonic() + 5, flag=mine,
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
        # A timed-out slice costs ~2 ms; more than one in a thousand waits would mean lost wake-ups.
        assert rescued <= n // 1000
    finally:
        words.release()
        seg.close()
        seg.unlink()
        for s in (to_parent, to_child):
            s.close()
            s.unlink()
