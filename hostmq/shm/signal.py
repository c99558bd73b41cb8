"""Wake-ups between processes: futex words plus waiting flags (docs/internals.md facts 2, 7, 15-16).

Data is always found through cursors in shared memory; a wake-up only says "look again", and is
posted only when the peer says it is waiting. The wake-up itself is a :class:`~hostmq.shm.futex.FutexWord`
in memory the *waiter* trusts (the broker state segment, a sealed memfd): a futex can be waited on
and woken through a read-only mapping and cannot be truncated away under a server, unlike a named
POSIX semaphore (a small ``/dev/shm`` file every poster maps read-write).

Protocol (spin, then block, post only if the peer waits):

* waiter — :func:`wait_for`: check the predicate; re-check it for the idle strategy's budget (spin,
  yield or back off: :class:`~hostmq.waiting.IdleStrategy`; a bare ``spin_s`` is a ``spin``); then
  set its *waiting flag* (an aligned int64 in shared memory, :class:`Flag`), fence, and loop:
  arm the futex word(s), re-check, sleep until a word changes, the deadline passes or ``stop`` is
  set; then clear the flag.
* notifier — :func:`notify_if_waiting`: after publishing its cursor, fence, read the peer's flag
  and, only if it is set, change the futex word and wake. A busy peer costs no system call at all.

Both sides execute :func:`fence` between their store (flag / cursor) and their load (cursor /
flag): pure Python has no memory barrier, and x86 may otherwise let each side read the other's old
value — the lost wake-up of docs/internals.md fact 16. ``fence`` acquires and releases a ``threading.Lock``,
whose glibc implementation is an atomic read-modify-write (a full barrier on x86). Arming the word
before the last re-check closes the remaining window (a post between the check and the sleep
changes the word, and the kernel does not sleep); the slice timeout is only a backstop, and
:class:`WaitStats` counts slices that timed out and waits they rescued — per caller, or in
:data:`process_totals` for every wait of the process whose caller passed none (bench/latency.py
reads it in its consumer processes).
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from ..waiting import IDLE_CODES, SLEEP, IdleStrategy
from .futex import MAX_WAITV, FutexWord, sleep_any

try:
    from . import _futex as _NATIVE
except ImportError:         # not built: wait_changed is wait_for
    _NATIVE = None
USE_NATIVE_WAIT = _NATIVE is not None and os.environ.get("HOSTMQ_NATIVE_WAIT", "1").lower() not in ("0", "off", "false")
"""Whether :func:`wait_changed` waits in C (``hostmq/shm/_futex.c``); ``HOSTMQ_NATIVE_WAIT=0`` turns it off."""
if _NATIVE is not None and USE_NATIVE_WAIT and any(getattr(_NATIVE, "IDLE_" + k.upper()) != v
                                                    for k, v in IDLE_CODES.items()):
    raise ImportError("hostmq/shm/_futex.c's idle codes differ from waiting.IDLE_CODES (rebuild it: pip install -e .)")

DEFAULT_SPIN_S = 50e-6
_DEFAULT_IDLE = IdleStrategy("spin", DEFAULT_SPIN_S * 1e6)
DEFAULT_BLOCK_SLICE_S = 0.05
_FENCE_LOCK = threading.Lock()


def fence() -> None:
    """Full memory barrier between a preceding store and a following load (see module doc)."""
    _FENCE_LOCK.acquire()
    _FENCE_LOCK.release()


class Flag:
    """One aligned int64 word in shared memory used as a boolean (a waiting flag).

    Only its owner sets and clears it; the peer reads it. Stores are aligned native int64 stores.
    """

    __slots__ = ("_words", "_index")

    def __init__(self, words: memoryview, index: int) -> None:
        if words.format != "q":
            raise ValueError("Flag needs a memoryview cast to 'q'")
        self._words = words
        self._index = index

    def set(self) -> None:
        self._words[self._index] = 1

    def clear(self) -> None:
        self._words[self._index] = 0

    def is_set(self) -> bool:
        return self._words[self._index] != 0

    def release(self) -> None:
        """Drop the view of the shared words (before the mapping is closed)."""
        self._words = None

    def __repr__(self) -> str:
        return f"Flag(word={self._index}, set={self.is_set()})"


@dataclass
class WaitStats:
    """Counters a caller may pass to :func:`wait_for` to see how its waits went."""

    calls: int = 0            # wait_for invocations
    immediate: int = 0        # predicate already true on entry
    spin_hits: int = 0        # became true while spinning
    blocked: int = 0          # waits that reached the futex
    slices: int = 0           # futex sleeps (each with a timeout)
    wakeups: int = 0          # a sleep ended because a word changed
    slice_timeouts: int = 0   # a sleep timed out
    rescued: int = 0          # predicate true right after a timed-out slice (a late or lost wake-up)
    timeouts: int = 0         # wait_for returned False


def _flags(flag) -> tuple:
    if flag is None:
        return ()
    if isinstance(flag, Flag):
        return (flag,)
    return tuple(flag)


def wait_for(predicate: Callable[[], object], wake: FutexWord | Iterable[FutexWord], deadline_s: float, *,
             flag: Flag | Iterable[Flag] | None = None, spin_s: float = DEFAULT_SPIN_S,
             block_slice_s: float = DEFAULT_BLOCK_SLICE_S, stop=None,
             stats: WaitStats | None = None, idle: IdleStrategy | None = None) -> bool:
    """Wait until ``predicate()`` is true; False when ``deadline_s`` (``time.monotonic()``) passes
    or ``stop`` (anything with ``is_set()``) is set first.

    ``wake`` is the futex word (or words: a consumer of several brokers) whose change ends a sleep;
    ``flag`` the waiter's waiting flag (or several: the writer sets its flag in every ring it
    serves), set only while blocked and always cleared on return. ``idle`` is how the time before
    the futex sleep is spent; without it, a busy spin of ``spin_s``.
    """
    st = stats if stats is not None else process_totals
    st.calls += 1
    if predicate():
        st.immediate += 1
        return True
    if idle is None:        # a bare spin_s: the spin strategy with that budget
        idle = _DEFAULT_IDLE if spin_s == DEFAULT_SPIN_S else IdleStrategy("spin", spin_s * 1e6) if spin_s > 0 else SLEEP
    if idle.idle(predicate, deadline_s):
        st.spin_hits += 1
        return True
    flags = _flags(flag)
    words = [wake] if isinstance(wake, FutexWord) else list(wake)
    st.blocked += 1
    for f in flags:
        f.set()
    try:
        return _block(predicate, words, deadline_s, block_slice_s, stop, st)
    finally:
        for f in flags:
            f.clear()


def _block(predicate, words: list[FutexWord], deadline_s: float, block_slice_s: float, stop, st) -> bool:
    fence()
    while True:
        tokens = [w.arm() for w in words]
        if predicate():
            return True
        if stop is not None and stop.is_set():
            st.timeouts += 1
            return False
        remaining = deadline_s - time.monotonic()
        if remaining <= 0:
            st.timeouts += 1
            return False
        st.slices += 1
        if sleep_any(words, tokens, min(block_slice_s, remaining)):
            st.wakeups += 1
        else:
            st.slice_timeouts += 1
            if predicate():
                st.rescued += 1
                return True


def wait_changed(seqs: list[tuple[FutexWord, int]], deadline_s: float, *, idle: IdleStrategy,
                 stats: WaitStats | None = None) -> bool:
    """Until a word of ``seqs`` — ``(FutexWord, token)`` pairs, each token what its ``arm()`` returned —
    no longer holds its token (True), or ``deadline_s`` (``time.monotonic()``) passes (False):
    :func:`wait_for` with the predicate "a word moved" and no waiting flag (a consumer's wait on its
    wake words, which the writer wakes unasked), in one native call with the GIL released
    (``_futex.c``): the idle strategy's phase, then one sleep on every word until one moves or the
    deadline. A signal ends it early (False; the handler runs once it returns). ``stats`` counts as
    :func:`wait_for` does (one slice per sleep)."""
    if not USE_NATIVE_WAIT or not seqs or len(seqs) > MAX_WAITV:
        return wait_for(lambda: any(w.arm() != t for w, t in seqs), [w for w, _ in seqs], deadline_s, idle=idle,
                        stats=stats)
    st = stats if stats is not None else process_totals
    st.calls += 1
    r = _NATIVE.wait_changed(seqs, int(min(deadline_s, time.monotonic() + 3600.0) * 1e9), IDLE_CODES[idle.kind],
                             int(idle.spin_s * 1e9))
    if r == 1:
        st.immediate += 1
    elif r == 2:
        st.spin_hits += 1
    elif r == 4:
        st.timeouts += 1
    else:                   # it slept: woken (3), out of time (0) or interrupted (-1)
        st.blocked += 1
        st.slices += 1
        if r == 3:
            st.wakeups += 1
        elif r == 0:
            st.slice_timeouts += 1
            st.timeouts += 1
    return 0 < r < 4


def notify_if_waiting(flag_getter: Flag | Callable[[], object], wake: FutexWord, *, bump: bool = True) -> bool:
    """Wake the peer if its waiting flag is set (call after publishing a cursor).

    ``flag_getter`` is the peer's :class:`Flag` or a callable returning its value. With ``bump`` the
    word is changed first (a doorbell); without, the caller's publish already changed it (the word
    *is* the cursor). Returns whether it woke.
    """
    fence()
    waiting = flag_getter.is_set() if isinstance(flag_getter, Flag) else flag_getter()
    if waiting:
        if bump:
            wake.post()
        else:
            wake.wake()
        return True
    return False


# Every wait of this process whose caller passed no ``stats`` counts here (it was a discarded sink:
# the increments cost the same, and a benchmark can now see its process's slice timeouts and rescued
# waits). Threads may race on an increment; the totals are for measurement, not for logic.
process_totals = WaitStats()
