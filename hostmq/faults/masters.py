"""One master per broker name, sampled all through a fault run (``harness``; issue "Trust the cluster").

A broker name's instances on the run's root say in their state segments whether they serve as master
or slave (``live/group.py``). A thread of the harness process reads them every ``interval_s`` for
the whole life of a configuration's cluster and counts the samples in which more than one *running*
instance said master: a split brain, whatever caused it (a promote racing a restart, an old master
resumed after a SIGSTOP). The harness takes the count per trial (:meth:`MasterWatch.take`) into the
trial's ``split_brain`` column, so a run shows "one master per name at every instant sampled" as a
column of zeros, not as a claim.

What a sample cannot see: two masters on different roots (another host), and a moment shorter than
the interval. A killed broker's segment outlives it until its next start; ``group.live_state``
counts it as not running (its owner is gone), so a crash is never a second master.

Ownership: the watch only reads segments (read-only attaches, closed after each sample).
"""
from __future__ import annotations

import threading
import time

from ..live.group import running
from ..errors import HostMQError

DEFAULT_INTERVAL_S = 0.02


class MasterWatch:
    """Samples how many running instances of ``name`` on ``root`` say master."""

    def __init__(self, root: str, name: str, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.root, self.name, self.interval_s = root, name, interval_s
        self._lock = threading.Lock()
        self._samples = 0
        self._split: list[str] = []         # since the last take: the first few, in words
        self._split_count = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "MasterWatch":
        self._thread = threading.Thread(target=self._run, name=f"master-watch-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None

    def sample(self) -> list[tuple[str, int]]:
        """The running instances that say master now: ``(instance, epoch)``."""
        masters = []
        for instance, st in running(self.root, self.name):
            try:
                if not st.is_slave:
                    masters.append((instance, st.role_epoch))
            finally:
                st.close()
        return masters

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                masters = self.sample()
            except (HostMQError, OSError, ValueError):     # a segment torn down while read: next sample
                continue
            with self._lock:
                self._samples += 1
                if len(masters) > 1:
                    self._split_count += 1
                    if len(self._split) < 3:
                        who = ", ".join(f"{i} (epoch {e})" for i, e in masters)
                        self._split.append(f"{time.strftime('%H:%M:%S')} {len(masters)} masters of "
                                           f"{self.name}: {who}")

    def take(self) -> tuple[int, int, list[str]]:
        """Since the last take: samples taken, samples with more than one master, the first few of
        those in words."""
        with self._lock:
            out = (self._samples, self._split_count, self._split)
            self._samples, self._split_count, self._split = 0, 0, []
        return out
