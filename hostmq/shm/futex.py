"""Futex words: wake-ups through a 32-bit word of shared memory (``futex(2)``, ``futex_waitv(2)``).

Why futexes and not named semaphores: a named POSIX semaphore is a small file in ``/dev/shm`` that
every poster maps read-write, so any client allowed to post it could also truncate it — and the
next ``sem_wait`` of the server that maps it dies of SIGBUS. A futex word lives in memory the waiter
already trusts (the broker state segment, a sealed memfd): waking needs only a *read-only* mapping
of it, and nobody can shrink a sealed memfd.

A :class:`FutexWord` is the low 32 bits of an aligned int64 word (little- or big-endian hosts
alike: the address is chosen so the futex compares the bits that change first). Protocol:

* poster: publish the data, :func:`~hostmq.shm.signal.fence`, and if the waiter says it waits,
  :meth:`FutexWord.post` — change the word, then ``FUTEX_WAKE``;
* waiter: ``token = word.arm()`` *before* its last check of the data, then
  ``word.sleep(token, timeout_s)``: the kernel sleeps only while the word still holds ``token``, so
  a post between the check and the sleep is never lost.

Where a word is published by its owner anyway (``dispatch_seq``, a ring's completion cursor), the
owner changes it as part of publishing and only calls :meth:`FutexWord.wake`.

The calls go through ctypes, which releases the GIL while the thread sleeps in the kernel.
"""
from __future__ import annotations

import ctypes
import errno
import platform
import sys
import time

import numpy as np

_SYS = {"x86_64": (202, 449), "aarch64": (98, 449), "arm64": (98, 449)}
SYS_futex, SYS_futex_waitv = _SYS.get(platform.machine(), (202, 449))
FUTEX_WAIT, FUTEX_WAKE = 0, 1           # shared (not FUTEX_PRIVATE_FLAG): the word is in shared memory
FUTEX2_SIZE_U32 = 0x02
CLOCK_MONOTONIC = 1
WAKE_ALL = 0x7FFFFFFF
MAX_WAITV = 128                         # the kernel's FUTEX_WAITV_MAX

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Waitv(ctypes.Structure):
    _fields_ = [("val", ctypes.c_uint64), ("uaddr", ctypes.c_uint64), ("flags", ctypes.c_uint32),
                ("reserved", ctypes.c_uint32)]


def _timespec(seconds: float) -> _Timespec:
    seconds = max(0.0, seconds)
    sec = int(seconds)
    return _Timespec(sec, int((seconds - sec) * 1e9))


class FutexWord:
    """The futex half of one aligned int64 word of a mapping (``words`` is a writable or read-only
    numpy int64 array over shared memory; ``index`` the word)."""

    __slots__ = ("_arr", "_index", "addr")

    def __init__(self, words: np.ndarray, index: int) -> None:
        if words.dtype != np.int64 or not 0 <= index < len(words):
            raise ValueError("FutexWord needs an int64 array and an index inside it")
        self._arr = words
        self._index = index
        base = words.ctypes.data + 8 * index
        if base % 8:
            raise ValueError("futex word must be 8-byte aligned")
        # The half that changes with every increment: the low 32 bits.
        self.addr = base if sys.byteorder == "little" else base + 4

    def value(self) -> int:
        """The word as an int64."""
        return int(self._arr[self._index])

    def arm(self) -> int:
        """The 32-bit value a later :meth:`sleep` waits to change (read before the last check)."""
        return int(self._arr[self._index]) & 0xFFFFFFFF

    def sleep(self, token: int, timeout_s: float) -> bool:
        """Sleep while the word holds ``token``, at most ``timeout_s``; False only on timeout."""
        ts = _timespec(timeout_s)
        r = _syscall(SYS_futex, ctypes.c_void_p(self.addr), FUTEX_WAIT, ctypes.c_uint32(token),
                     ctypes.byref(ts), None, 0)
        return r == 0 or ctypes.get_errno() != errno.ETIMEDOUT

    def wake(self, count: int = WAKE_ALL) -> int:
        """Wake up to ``count`` sleepers (the word was changed by the caller); returns how many."""
        return max(0, _syscall(SYS_futex, ctypes.c_void_p(self.addr), FUTEX_WAKE, count, None, None, 0))

    def post(self) -> None:
        """Change the word (its owner, or anyone allowed to ring it) and wake every sleeper."""
        self._arr[self._index] += 1
        self.wake()

    def __repr__(self) -> str:
        return f"FutexWord(word={self._index}, value={self.value()})"


_waitv_ok = True


def sleep_any(words: list[FutexWord], tokens: list[int], timeout_s: float) -> bool:
    """Sleep until any of ``words`` no longer holds its token (``futex_waitv``, Linux ≥ 5.16), at most
    ``timeout_s``; False only on timeout. Older kernels: sleep on the first word in short slices."""
    global _waitv_ok
    if len(words) == 1:
        return words[0].sleep(tokens[0], timeout_s)
    if _waitv_ok and 0 < len(words) <= MAX_WAITV:
        arr = (_Waitv * len(words))(*[_Waitv(t, w.addr, FUTEX2_SIZE_U32, 0) for w, t in zip(words, tokens)])
        ts = _timespec(time.clock_gettime(time.CLOCK_MONOTONIC) + max(0.0, timeout_s))
        r = _syscall(SYS_futex_waitv, arr, len(words), 0, ctypes.byref(ts), CLOCK_MONOTONIC)
        if r >= 0:
            return True
        err = ctypes.get_errno()
        if err != errno.ENOSYS:
            return err != errno.ETIMEDOUT
        _waitv_ok = False
    if not words:
        time.sleep(max(0.0, timeout_s))
        return False
    if any(w.arm() != t for w, t in zip(words, tokens)):
        return True
    return words[0].sleep(tokens[0], min(timeout_s, 0.002))
