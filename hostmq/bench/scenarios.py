"""The sweep of ``hostmq bench`` (pure: no processes, no files).

A hostmq *config* is one combination of the store's tuning switches; every config runs for every
message size and producer count, and each run has two phases that give the two consumer positions:

* ``caught_up`` — producers send for ``duration_s`` while one consumer reads as messages arrive
  (end-to-end latency = consumer receive time − producer send time, both CLOCK_MONOTONIC);
* ``lagging``  — the broker is stopped, its store files are flushed and dropped from the page cache,
  the broker starts again, and producers send for ``duration_s`` while a consumer of a new group
  reads everything from the first offset: the reads miss the page cache, which is what a consumer
  lagging by more than the page cache sees (writing more than the machine's RAM per run would not
  fit a bounded sweep).
"""
from __future__ import annotations

import dataclasses
import itertools

SIZES_BYTES = (100, 1024, 16 * 1024)
FLUSH_MODES = ("ASYNC_FLUSH", "SYNC_FLUSH")
PRODUCERS = (1, 2, 4)
PHASES = ("caught_up", "lagging")
PEERS = ("redis", "zmq_ipc", "mp_queue")
# madvise policy of every store file kind (commitlog head and cold files, consume queues)
MADVISE_POLICIES = ("NORMAL", "SEQUENTIAL", "RANDOM")


@dataclasses.dataclass(frozen=True)
class TuningConfig:
    flush: str = "ASYNC_FLUSH"
    pool: bool = False          # transient store pool
    warm: bool = False          # warm_mapped_file + preallocate_next_file (made and pre-faulted ahead)
    madvise: str = "NORMAL"

    @property
    def label(self) -> str:
        parts = ["sync" if self.flush == "SYNC_FLUSH" else "async"]
        if self.pool:
            parts.append("pool")
        if self.warm:
            parts.append("warm")
        if self.madvise != "NORMAL":
            parts.append(self.madvise.lower())
        return "+".join(parts)

    def store_config(self, commitlog_file_bytes: int) -> dict:
        return {"commitlog_file_bytes": commitlog_file_bytes, "flush_disk_type": self.flush,
                "transient_store_pool_enable": self.pool, "warm_mapped_file": self.warm,
                "preallocate_next_file": self.warm, "madvise_commitlog_head": self.madvise,
                "madvise_commitlog_cold": self.madvise, "madvise_consume_queue": self.madvise}


@dataclasses.dataclass(frozen=True)
class Sweep:
    configs: tuple[TuningConfig, ...]
    sizes_bytes: tuple[int, ...]
    producers: tuple[int, ...]
    peers: tuple[str, ...]
    duration_s: float
    commitlog_file_bytes: int

    def runs(self) -> list[tuple[TuningConfig, int, int]]:
        """(config, size, producers) of every hostmq run (each run yields both phases)."""
        return list(itertools.product(self.configs, self.sizes_bytes, self.producers))

    def peer_runs(self) -> list[tuple[str, int, int]]:
        return list(itertools.product(self.peers, self.sizes_bytes, self.producers))

    def estimated_s(self, hostmq_overhead_s: float = 7.0, peer_overhead_s: float = 1.5) -> float:
        return (len(self.runs()) * (2 * self.duration_s + hostmq_overhead_s)
                + len(self.peer_runs()) * (self.duration_s + peer_overhead_s))


def all_configs() -> tuple[TuningConfig, ...]:
    """Every combination of flush mode × pool × warm-up × madvise policy. The pool applies to
    ASYNC_FLUSH only (as in RocketMQ), so SYNC_FLUSH has no pool variants."""
    out = []
    for flush, pool, warm, advice in itertools.product(FLUSH_MODES, (False, True), (False, True), MADVISE_POLICIES):
        if flush == "SYNC_FLUSH" and pool:
            continue
        out.append(TuningConfig(flush, pool, warm, advice))
    return tuple(out)


def full_sweep(duration_s: float = 3.0) -> Sweep:
    return Sweep(all_configs(), SIZES_BYTES, PRODUCERS, PEERS, duration_s, 256 << 20)


def quick_sweep(duration_s: float = 0.5) -> Sweep:
    """About a minute (58 s measured; a hostmq run costs ≈ 6 s of cluster starts and stops beside its
    phases): the default, the pool and SYNC_FLUSH; two sizes; one producer."""
    configs = (TuningConfig(), TuningConfig(pool=True), TuningConfig(flush="SYNC_FLUSH"))
    return Sweep(configs, (100, 16 * 1024), (1,), PEERS, duration_s, 16 << 20)
