"""Fault injection for hostmq: kill trials against real clusters and fuzzers (``hostmq faults``,
``bench/faults.py``).

What each module does (one owner per module):

* ``harness``, ``workload``, ``aim``, ``verify``, ``report`` — the Jepsen-style kill harness: producers
  and consumers record every acknowledgement, a fault (SIGKILL / SIGSTOP of one process, possibly aimed
  inside a narrow window) is injected, what a supervisor would restart is restarted, and the store is
  verified (every acknowledged message stored exactly once, reachable by queue, key and id; nothing
  outside the root; nothing left in /dev/shm). ``plan`` (fault kinds, configurations, the trial plan),
  ``workers`` (the harness's handles on the workload processes), ``failover`` (the ``master:promote``
  kind: promote the slave, rejoin the old master, give the roles back) and ``runner`` (a whole run,
  then the fuzzers) complete it.
* ``store_fuzz`` — bit flips, truncation and zeroing in every store file kind followed by abnormal
  recovery.
* ``ring_fuzz`` — a hostile producer: random bytes and bit flips in an ingress ring.
* ``frame_fuzz`` — random control frames against a live broker and NameServer.

Every fuzzer is ``run(workdir, cases, seed) -> list[FuzzResult]``, registered in :data:`FUZZERS`.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FuzzResult:
    """What one fuzzer kind found: ``failures`` holds one line per case that broke a promise."""

    kind: str                    # e.g. "ring", "frames", "store:commitlog"
    cases: int
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


# name -> "module:function"; each function is run(workdir: str, cases: int, seed: int) -> list[FuzzResult]
FUZZERS = {
    "store": "hostmq.faults.store_fuzz:run",
    "ring": "hostmq.faults.ring_fuzz:run",
    "frames": "hostmq.faults.frame_fuzz:run",
}
