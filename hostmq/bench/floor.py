"""The latency bench's floor rows (issue 29): ``hostmq/bench/relay_floor.c``, built here with the system
compiler, moves the same 100-byte stamped messages at the same pacing with nothing but the hand-offs —
processes, shared memory, futex wake-ups the way ``hostmq.shm`` makes them, and (``c_relay``) a
middle process that copies and CRCs each message as hostmq's writer does. What hostmq costs above
``c_relay`` is its own work, not the design's three processes.

* ``c_ring``: producer → consumer (one hop, the raw ring in C);
* ``c_relay``: producer → writer → consumer (two hops, hostmq's shape);
* ``c_ring_split``, ``c_relay_split``: the same, placed — the producer (and the writer) pinned to one
  CPU, the consumer to another (the first two this process may use), so the last hop always wakes a
  reader on the other CPU: the floor of the placement the kernel gives hostmq's consumer on most
  runs of a 2-vCPU VM, where waking a halted vCPU is most of the cost. Skipped with fewer than two
  CPUs (:func:`split_why`);
* ``echo`` (the send table's floor column): an acknowledged send — the producer writes a frame of 1
  or 100 messages, the writer copies, CRCs and appends each and answers, the producer sends the next
  frame at once (:func:`measure_echo`); ``echo_split`` the same with producer and writer pinned to
  two CPUs.

Readers sleep on the futex at once (``sleep``, the 2-vCPU default), or spin ``--floor-spin`` µs first.
"""
from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "relay_floor.c")
ROWS = {"c_ring": "direct", "c_relay": "relay", "c_ring_split": "direct_split", "c_relay_split": "relay_split"}
SPLIT_ROWS = ("c_ring_split", "c_relay_split")
BUILD_TIMEOUT_S = 120


def build(tmp: str) -> tuple[str | None, str]:
    """``(path of the built program, "")``, or ``(None, why not)``."""
    cc = shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler on PATH (cc, gcc or $CC)"
    exe = os.path.join(tmp, "relay_floor")
    try:
        p = subprocess.run([cc, "-O2", "-o", exe, SOURCE, "-lz"], capture_output=True, text=True,
                           timeout=BUILD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{cc} failed: {e}"
    if p.returncode != 0:
        return None, f"{cc} failed: {p.stderr.strip()[-300:]}"
    return exe, ""


def split_why() -> str:
    """Why the split rows cannot run here ("" when they can): they need two CPUs to place on."""
    n = len(os.sched_getaffinity(0))
    return "" if n >= 2 else f"the split rows need two CPUs; this process may use {n}"


def measure(exe: str, row: str, messages: int, warmup: int, period_s: float, spin_us: int, tmp: str,
            timeout_s: float) -> np.ndarray:
    """One floor row: the measured latencies in µs (arrival order). Raises RuntimeError on a failure."""
    return _run(row, [exe, ROWS[row], str(messages), str(warmup), str(max(1, round(period_s * 1e6))), str(spin_us)],
                os.path.join(tmp, f"{row}.lat"), timeout_s)


def measure_echo(exe: str, batch: int, round_trips: int, warmup: int, spin_us: int, tmp: str,
                 timeout_s: float, split: bool = False) -> np.ndarray:
    """Acknowledged sends of ``batch`` messages, back to back: each round trip in µs (``split``: the
    producer pinned to one CPU and the writer to another, so both hand-offs cross CPUs — see
    :func:`split_why`). Raises RuntimeError."""
    mode = "echo_split" if split else "echo"
    return _run(f"{mode} of {batch}", [exe, mode, str(round_trips), str(warmup), str(batch), str(spin_us)],
                os.path.join(tmp, f"{mode}{batch}.lat"), timeout_s)


def _run(what: str, args: list[str], out: str, timeout_s: float) -> np.ndarray:
    """Run the floor program writing its latencies to ``out``; them in µs (the file removed)."""
    try:
        p = subprocess.run(args + [out], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what}: the floor program ran past {timeout_s:.0f} s") from None
    if p.returncode != 0:
        raise RuntimeError(f"{what}: the floor program exited {p.returncode}: {p.stderr.strip()[-300:]}")
    try:
        return np.fromfile(out, dtype=np.uint64).astype(np.float64) / 1000.0
    finally:
        os.unlink(out)
