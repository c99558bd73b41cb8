"""A wait on futex words in C (``hostmq/shm/_futex.c``, ``signal.wait_changed``) against its spec,
``signal.wait_for`` with the predicate "a word moved": the same answers for words that moved before,
during the idle phase or while it sleeps, for one word and for several (futex_waitv), over a
read-only mapping too; the counters a consumer's ``wait_stats`` shows; bad words refused typed."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from hostmq.shm import FutexWord, WaitStats, signal
from hostmq.waiting import SLEEP, IdleStrategy, poll_until

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not signal.USE_NATIVE_WAIT, reason="hostmq/shm/_futex.c not built, or off")]
IDLES = [SLEEP, IdleStrategy("spin", 300), IdleStrategy("yield", 300), IdleStrategy("backoff", 300)]


def spec(seqs, deadline_s, idle) -> bool:
    return signal.wait_for(lambda: any(w.arm() != t for w, t in seqs), [w for w, _ in seqs], deadline_s,
                           idle=idle, stats=WaitStats())


@pytest.fixture
def arr(seg):
    a = seg.array(np.int64, 32)
    yield a
    del a


@pytest.mark.parametrize("idle", IDLES)
@pytest.mark.parametrize("n", [1, 3])
def test_it_answers_what_wait_for_answers(arr, idle, n):
    words = [FutexWord(arr, i) for i in range(n)]
    # nothing moves: both time out
    seqs = [(w, w.arm()) for w in words]
    st = WaitStats()
    assert signal.wait_changed(seqs, time.monotonic() + 0.02, idle=idle, stats=st) is False
    assert spec(seqs, time.monotonic() + 0.02, idle) is False
    assert (st.calls, st.timeouts, st.wakeups) == (1, 1, 0)
    # a word moved before the wait: both at once
    words[-1].post()
    st = WaitStats()
    assert signal.wait_changed(seqs, time.monotonic() + 5, idle=idle, stats=st) is True
    assert spec(seqs, time.monotonic() + 5, idle) is True
    assert (st.immediate, st.blocked) == (1, 0)


@pytest.mark.parametrize("idle", IDLES)
@pytest.mark.parametrize("n", [1, 3])
def test_a_post_from_another_thread_ends_the_sleep(arr, idle, n):
    words = [FutexWord(arr, i) for i in range(n)]
    seqs = [(w, w.arm()) for w in words]
    st = WaitStats()
    out: list = []
    t = threading.Thread(target=lambda: out.append(signal.wait_changed(seqs, time.monotonic() + 30, idle=idle,
                                                                        stats=st)))
    t.start()
    time.sleep(0.01)        # let it reach its sleep (not required: a post before it is seen at once)
    words[-1].post()
    t.join(10)
    assert out == [True]
    assert st.calls == 1 and st.timeouts == 0
    assert st.immediate + st.spin_hits + st.wakeups == 1


def test_it_sleeps_rather_than_spins_with_sleep(arr):
    """``sleep`` goes to the futex at once: a wait of 0.2 s uses almost no CPU."""
    w = FutexWord(arr, 0)
    t0 = time.process_time()
    assert signal.wait_changed([(w, w.arm())], time.monotonic() + 0.2, idle=SLEEP) is False
    assert time.process_time() - t0 < 0.1


def test_a_read_only_mapping_is_enough(seg, arr):
    ro = np.frombuffer(seg.buf, np.int64, 32)       # not writable, as a consumer maps the broker's state
    ro.flags.writeable = False
    w, writer = FutexWord(ro, 5), FutexWord(arr, 5)
    seqs = [(w, w.arm())]
    out: list = []
    t = threading.Thread(target=lambda: out.append(signal.wait_changed(seqs, time.monotonic() + 30, idle=SLEEP)))
    t.start()
    poll_until(lambda: t.is_alive(), 5, "the waiter")
    writer.post()
    t.join(10)
    assert out == [True]
    del w, seqs, ro


def test_bad_words_are_a_typed_error(arr):
    w = FutexWord(arr, 0)
    for seqs in ([(object(), 0)], [(w,)], [(w, 1 << 40)], [(w, -1)], [(w, 0)] * 129):
        with pytest.raises((ValueError, AttributeError, TypeError)):
            signal._NATIVE.wait_changed(seqs, 0, 3, 0)
    with pytest.raises(ValueError):
        signal._NATIVE.wait_changed([(w, 0)], 0, 9, 0)      # an idle code out of range
    assert signal.wait_changed([], time.monotonic() + 0.01, idle=SLEEP) is False    # no word: the deadline
