"""Aimed faults: stop a process inside a narrow window of its work, then kill it there.

A kill at a random moment rarely lands inside a window of a few microseconds (the copy-then-patch
window of a batch append was caught by 1 in 55 random whole-broker kills). So the harness *steps*
the target: SIGSTOP, look at the broker's shared state words (``broker.state``) and the commitlog
files; if the target is inside the window, leave it stopped (the caller kills it); otherwise SIGCONT,
let it run a random fraction of a millisecond, and look again.

Windows, as the words show them (``records.BROKER_STATE``), for the writer unless noted:

* ``mid-append``   an intent is recorded (``intent_valid``) and ``write_pos`` is still at its start:
  records are being copied and patched but not yet published; without the transient store pool the
  commitlog file must already hold bytes at ``write_pos`` (something copied; past ``write_pos`` the
  file is zero until the writer copies there). Whether the record there is still incomplete
  (no magic yet, or PHYSICALOFFSET not yet patched) is reported as ``unpatched``;
* ``mid-patch``    mid-append, and the record at ``write_pos`` is copied but incomplete: the
  copy-then-patch window of a batch append;
* ``mid-journal``  the batch is published (``write_pos`` > ``intent_phys_start``) and the intent not
  yet cleared: the ring journal is being written;
* ``mid-roll``     an intent is recorded and a commitlog file newer than the one the batch started
  in exists: the writer created the next file for this batch and has not finished it;
* ``mid-commit``   (transient store pool) ``committed_pos`` < ``write_pos``: acknowledged bytes sit in
  the pool's buffer, not yet in the file;
* ``mid-flush``    (flusher) awake (``flusher_waiting`` 0) with unflushed bytes (SYNC_FLUSH: a group
  commit requested past ``flushed_pos``);
* ``mid-dispatch`` (dispatcher) awake with undispatched bytes.

The predicates are pure (:func:`in_window`, :func:`approaching`) and take a :class:`Facts` snapshot.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Callable

from .. import records as R

WINDOWS = ("mid-append", "mid-patch", "mid-journal", "mid-roll", "mid-commit", "mid-flush", "mid-dispatch")
# Which broker child runs the code of each window (a whole-broker aim stops the group instead).
WINDOW_PROCESS = {"mid-append": "writer", "mid-patch": "writer", "mid-journal": "writer", "mid-roll": "writer", "mid-commit": "writer",
                  "mid-flush": "flusher", "mid-dispatch": "dispatcher"}
ROLL_APPROACH_BYTES = 64 << 10      # step toward a roll only once write_pos is this close to a file end
ROLL_NEAR_BYTES = 8 << 10           # ... and in the shortest steps this close to it
STEP_MAX_S = 0.0008                 # the target runs up to this long between two looks
STEP_NEAR_S = 0.0002
STOPPED_WAIT_S = 0.5                # a process in a system call stops when the call returns


@dataclass(frozen=True)
class Facts:
    """What the harness sees of a (stopped) broker: every state word and a look at the files."""

    words: dict
    file_bytes: int
    sync_flush: bool = False
    pool: bool = False
    newest_file_start: int = 0      # start offset of the newest commitlog file
    copied: bool = False            # the commitlog file holds a record header at write_pos
    unpatched: bool = False         # ... whose PHYSICALOFFSET is not write_pos (copied, not patched)

    def describe(self) -> str:
        w = self.words
        return (f"write_pos={w['write_pos']} committed_pos={w['committed_pos']} intent_valid={w['intent_valid']} "
                f"intent_phys_start={w['intent_phys_start']} dispatched_pos={w['dispatched_pos']} "
                f"flushed_pos={w['flushed_pos']} flush_request_pos={w['flush_request_pos']} "
                f"newest_file={self.newest_file_start} copied={'yes' if self.copied else 'no'} "
                f"unpatched={'yes' if self.unpatched else 'no'}")


def _end(w: dict) -> int:
    return min(w["write_pos"], w["committed_pos"])


def in_window(window: str, f: Facts) -> bool:
    """Whether a broker in state ``f`` is inside ``window`` (pure)."""
    w = f.words
    if window == "mid-append":
        return w["intent_valid"] == 1 and w["write_pos"] == w["intent_phys_start"] and (f.pool or f.copied)
    if window == "mid-patch":
        return in_window("mid-append", f) and f.unpatched
    if window == "mid-journal":
        return w["intent_valid"] == 1 and w["write_pos"] > w["intent_phys_start"]
    if window == "mid-roll":
        start = w["intent_phys_start"]
        return w["intent_valid"] == 1 and f.newest_file_start > start - start % f.file_bytes
    if window == "mid-commit":
        return f.pool and w["committed_pos"] < w["write_pos"]
    if window == "mid-flush":
        if f.sync_flush:
            return w["flusher_waiting"] == 0 and w["flush_request_pos"] > w["flushed_pos"]
        return w["flusher_waiting"] == 0 and w["flushed_pos"] < _end(w)
    if window == "mid-dispatch":
        return w["dispatcher_waiting"] == 0 and w["dispatched_pos"] < _end(w)
    raise ValueError(f"unknown window {window!r}")


def approaching(window: str, f: Facts) -> bool:
    """Whether stepping is worth it now (a roll is near); otherwise the target runs untouched."""
    if window == "mid-roll":
        return f.file_bytes - f.words["write_pos"] % f.file_bytes <= ROLL_APPROACH_BYTES
    if window == "mid-commit":
        return f.pool
    return True


def step_s(window: str, f: Facts) -> float:
    """Longest run between two looks: short right before a roll (its window opens once per file)."""
    if window == "mid-roll" and f.file_bytes - f.words["write_pos"] % f.file_bytes <= ROLL_NEAR_BYTES:
        return STEP_NEAR_S
    return STEP_MAX_S


def file_facts(commitlog_dir: str, words: dict, file_bytes: int) -> tuple[int, bool, bool]:
    """``(newest file start, copied, unpatched)`` from the commitlog files (read-only, no lock)."""
    try:
        names = [n for n in os.listdir(commitlog_dir) if n.isdecimal()]
    except FileNotFoundError:
        return 0, False, False
    newest = max((int(n) for n in names), default=0)
    pos = words["write_pos"]
    base = pos - pos % file_bytes
    try:
        with open(os.path.join(commitlog_dir, f"{base:020d}"), "rb") as fh:
            head = os.pread(fh.fileno(), R.MSG_HEADER.size, pos - base)
    except FileNotFoundError:
        return newest, False, False
    if len(head) < R.MSG_HEADER.size:
        return newest, False, False
    h = R.RecordHeader._make(R.MSG_HEADER.unpack(head))
    copied = h.total_size != 0          # past write_pos the file is zero until the writer copies
    return newest, copied, copied and (h.magic != R.MAGIC_CODE or h.phys_offset != pos)


# -- signals ------------------------------------------------------------------------------------------------
def proc_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (``T`` stopped, ``D`` in an uninterruptible call …;
    ``X`` once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return "X"
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3].decode() or "X"


class Targets:
    """Processes to signal, held by pidfd: once one dies, the kernel may give its pid to another
    process (pid_max is 32768 here), and a SIGSTOP or SIGKILL meant for the dead one must never
    reach the newcomer — on a shared machine, some other program. ``belongs(pid)`` is checked after
    the pidfd is open (so it speaks of the process the pidfd holds); a pid that fails it, or is
    gone, is left out."""

    def __init__(self, pids: list[int], belongs: Callable[[int], bool] = lambda pid: True) -> None:
        self.pids: list[int] = []
        self._fds: list[int] = []
        for pid in pids:
            if pid <= 0:                    # never 0 or -1: kill(2) would read them as groups
                continue
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            if belongs(pid):
                self.pids.append(pid)
                self._fds.append(fd)
            else:
                os.close(fd)

    def signal(self, sig: int) -> None:
        for fd in self._fds:
            try:
                signal.pidfd_send_signal(fd, sig)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)

    def __enter__(self) -> "Targets":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def wait_stopped(pids: list[int], timeout_s: float = STOPPED_WAIT_S) -> bool:
    """Wait until every process is stopped (or gone); False if one still runs after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        if all(proc_state(p) in "TtXZ" for p in pids):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.0001)


@dataclass(frozen=True)
class AimResult:
    hit: bool
    steps: int
    seconds: float
    detail: str


def step_into(window: str, targets: Targets, look: Callable[[], Facts], timeout_s: float,
              uniform: Callable[[float, float], float]) -> AimResult:
    """Step the processes ``targets`` (SIGSTOP / look / SIGCONT) until ``look()`` shows them inside
    ``window``, for at most ``timeout_s``. They are left STOPPED either way: the caller kills them
    (inside the window on a hit, wherever they are on a miss)."""
    pids = targets.pids
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    steps = 0
    facts = look()
    while time.monotonic() < deadline:
        if not approaching(window, facts):
            time.sleep(0.005)
            facts = look()
            continue
        targets.signal(signal.SIGSTOP)
        wait_stopped(pids)
        steps += 1
        facts = look()
        if in_window(window, facts):
            return AimResult(True, steps, time.monotonic() - t0, facts.describe())
        targets.signal(signal.SIGCONT)
        time.sleep(uniform(0.0, step_s(window, facts)))
    targets.signal(signal.SIGSTOP)
    wait_stopped(pids)
    return AimResult(False, steps, time.monotonic() - t0, look().describe())
