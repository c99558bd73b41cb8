"""Wake-up signals between processes: named POSIX semaphores plus waiting flags (OS_NOTES 2, 7, 15-16).

A :class:`Signal` is a named ``posix_ipc.Semaphore`` used ONLY to wake a sleeping peer — never as
a mutex, so a process killed at any point wedges nobody. The data itself is always found through
cursors in shared memory; a post just says "look again".

Protocol (spin, then block, post only if the peer waits):

* waiter — :func:`wait_for`: check the predicate; spin re-checking it for up to ``spin_s``; then
  set its *waiting flag* (an aligned int64 in shared memory, :class:`Flag`), fence, re-check, and
  block on the semaphore in slices of ``block_slice_s`` (~2 ms) until the predicate holds, the
  deadline passes or ``stop`` is set; then clear the flag and drain stale posts.
* notifier — :func:`notify_if_waiting`: after publishing its cursor, fence, read the peer's flag
  and post only if it is set. A busy peer therefore costs no system call at all.

Both sides execute :func:`fence` between their store (flag / cursor) and their load (cursor /
flag): pure Python has no memory barrier, and x86 may otherwise let each side read the other's old
value — the lost wake-up of OS_NOTES 16. ``fence`` acquires and releases a ``threading.Lock``,
whose glibc implementation is an atomic read-modify-write (a full barrier on x86). The slice
timeout remains as the backstop: a wait never sleeps more than ``block_slice_s`` without
re-checking, and :class:`WaitStats` counts the slices that had to time out.

Naming: a signal is named like the segment it belongs to (``root.shm_name``); POSIX keeps
semaphores in a separate namespace (``/dev/shm/sem.<name>``), so an ingress ring and its
producer's completion signal share one name, and ``segment.reclaim_stale`` removes both. The
broker-wide writer wake-up signal is created by the broker (holder of the broker lock, which may
replace it: OS_NOTES 3) and opened by every producer.

Draining assumes one waiting thread per signal (the writer loop; a producer's completion reader).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import posix_ipc

from ..errors import SegmentError, SegmentExistsError, SegmentNotFoundError
from .segment import DEFAULT_MODE

DEFAULT_SPIN_S = 50e-6
DEFAULT_BLOCK_SLICE_S = 0.002
_MAX_DRAIN = 4096        # posts a burst can leave behind (one per frame while the waiter wakes)
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

    def __repr__(self) -> str:
        return f"Flag(word={self._index}, set={self.is_set()})"


class Signal:
    """A named POSIX semaphore used as a wake-up signal (never a mutex)."""

    __slots__ = ("name", "sem", "is_owner")

    def __init__(self, sem: posix_ipc.Semaphore, name: str, owner: bool) -> None:
        self.sem = sem
        self.name = name
        self.is_owner = owner

    @classmethod
    def create(cls, name: str, *, replace: bool = False, mode: int = DEFAULT_MODE) -> "Signal":
        """Create ``name`` with value 0. ``replace`` first unlinks an existing one (lock holders only)."""
        if replace:
            try:
                posix_ipc.unlink_semaphore(name)
            except posix_ipc.ExistentialError:
                pass
        try:
            sem = posix_ipc.Semaphore(name, posix_ipc.O_CREX, mode=mode, initial_value=0)
        except posix_ipc.ExistentialError:
            raise SegmentExistsError(name, "semaphore already exists") from None
        except (ValueError, posix_ipc.PermissionsError) as e:
            raise SegmentError(name, str(e)) from None
        return cls(sem, name, owner=True)

    @classmethod
    def open(cls, name: str) -> "Signal":
        """Open an existing signal (SegmentNotFoundError if there is none)."""
        try:
            sem = posix_ipc.Semaphore(name)
        except posix_ipc.ExistentialError:
            raise SegmentNotFoundError(name, "semaphore does not exist") from None
        except (ValueError, posix_ipc.PermissionsError) as e:
            raise SegmentError(name, str(e)) from None
        return cls(sem, name, owner=False)

    def post(self) -> None:
        self.sem.release()

    def acquire(self, timeout_s: float) -> bool:
        """Consume one post, waiting at most ``timeout_s`` (0 = poll). False on timeout or EINTR."""
        try:
            self.sem.acquire(timeout_s)
            return True
        except (posix_ipc.BusyError, posix_ipc.SignalError):
            return False

    def drain(self, limit: int = _MAX_DRAIN) -> int:
        """Consume pending posts without blocking; returns how many."""
        n = 0
        while n < limit:
            try:
                self.sem.acquire(0)
            except (posix_ipc.BusyError, posix_ipc.SignalError):
                break
            n += 1
        return n

    @property
    def value(self) -> int:
        return self.sem.value

    def close(self) -> None:
        try:
            self.sem.close()
        except posix_ipc.ExistentialError:
            pass

    def unlink(self) -> None:
        """Remove the name (idempotent)."""
        try:
            posix_ipc.unlink_semaphore(self.name)
        except posix_ipc.ExistentialError:
            pass

    def __repr__(self) -> str:
        return f"Signal({self.name!r}, owner={self.is_owner})"


@dataclass
class WaitStats:
    """Counters a caller may pass to :func:`wait_for` to see how its waits went."""

    calls: int = 0            # wait_for invocations
    immediate: int = 0        # predicate already true on entry
    spin_hits: int = 0        # became true while spinning
    blocked: int = 0          # waits that reached the semaphore
    slices: int = 0           # semaphore waits (acquire calls with a timeout)
    wakeups: int = 0          # acquire returned a post
    slice_timeouts: int = 0   # acquire timed out
    rescued: int = 0          # predicate true right after a timed-out slice (a late or lost wake-up)
    timeouts: int = 0         # wait_for returned False


def _flags(flag) -> tuple:
    if flag is None:
        return ()
    if isinstance(flag, Flag):
        return (flag,)
    return tuple(flag)


def wait_for(predicate: Callable[[], object], signal: Signal, deadline_s: float, *,
             flag: Flag | Iterable[Flag] | None = None, spin_s: float = DEFAULT_SPIN_S,
             block_slice_s: float = DEFAULT_BLOCK_SLICE_S, stop=None,
             stats: WaitStats | None = None) -> bool:
    """Wait until ``predicate()`` is true; False when ``deadline_s`` (``time.monotonic()``) passes
    or ``stop`` (anything with ``is_set()``) is set first.

    ``flag`` is the waiter's waiting flag (or several: the writer sets its flag in every ring it
    serves); it is set only while blocked and always cleared on return.
    """
    st = stats if stats is not None else _NO_STATS
    st.calls += 1
    if predicate():
        st.immediate += 1
        return True
    now = time.monotonic()
    if spin_s > 0:
        spin_end = min(now + spin_s, deadline_s)
        while now < spin_end:
            if predicate():
                st.spin_hits += 1
                return True
            now = time.monotonic()
    flags = _flags(flag)
    st.blocked += 1
    for f in flags:
        f.set()
    try:
        return _block(predicate, signal, deadline_s, block_slice_s, stop, st)
    finally:
        for f in flags:
            f.clear()
        # Posts that raced with our own re-check would wake the next wait for nothing.
        signal.drain()


def _block(predicate, signal: Signal, deadline_s: float, block_slice_s: float, stop, st) -> bool:
    sem = signal.sem
    fence()
    while True:
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
        try:
            sem.acquire(min(block_slice_s, remaining))
            st.wakeups += 1
            # A notifier posts once per publish while our flag is still set: collapse the burst
            # so later slices do not return at once for posts that carry no news.
            signal.drain()
        except posix_ipc.BusyError:
            st.slice_timeouts += 1
            if predicate():
                st.rescued += 1
                return True
        except posix_ipc.SignalError:
            pass


def notify_if_waiting(flag_getter: Flag | Callable[[], object], signal: Signal) -> bool:
    """Post ``signal`` if the peer's waiting flag is set (call after publishing a cursor).

    ``flag_getter`` is the peer's :class:`Flag` or a callable returning its value. Returns whether
    it posted.
    """
    fence()
    waiting = flag_getter.is_set() if isinstance(flag_getter, Flag) else flag_getter()
    if waiting:
        signal.sem.release()
        return True
    return False


class _Discard(WaitStats):
    """Stats sink for callers that pass none (attribute writes are cheap and ignored)."""


_NO_STATS = _Discard()
