"""What a fault run does: the fault kinds, the cluster configurations, the options and the trial plan
(pure: a seeded plan is the same on every machine).

A fault kind is a target, an action and, for aimed kills, a window (``aim``):

* ``writer`` / ``dispatcher`` / ``flusher`` / ``scheduler`` — one child of the broker (the broker's
  supervisor restarts it); ``broker`` — the broker's whole process group (restarted with
  ``LocalCluster.start_broker``); ``namesrv`` (``LocalCluster.start_namesrv``); ``producer`` — one of the
  producer processes, ``consumer`` — the consumer process (restarted by the harness);
* action ``kill`` (SIGKILL) at a random moment — ``writer:kill``; ``stop`` (SIGSTOP for a while, then
  SIGCONT) — ``writer:stop``; an aimed kill — ``writer@mid-append``. A bare target (``writer``) in
  ``--kinds`` means every kind of that target.

Configurations are separate clusters (a store never changes its file sizes or flush mode): ``async``
(the default store), ``sync`` (SYNC_FLUSH), ``pool`` (the transient store pool) and ``ha`` (a
SYNC_MASTER with a slave on the same root). Replication kinds exist only in ``ha``: ``slave`` — the
slave's whole process group (restarted with ``LocalCluster.start_broker``), ``replica`` — the slave's
writer, the replica (cuts replication from the slave's side; its supervisor restarts it), ``ha`` —
the master's replication process (cuts it from the master's side; it comes back on another port) —
and ``master:promote``, the failover (``failover.py``): the master's whole process group is killed
under load, its slave promoted, the old master started again (it joins as a slave, cutting what the
new master lacks, and catches up) while the load goes on against the promoted master; after the
load the roles are given back (the promoted master stopped gracefully, the old one promoted back,
the slave started again). After every ``ha`` trial the slave must catch up and hold the master's
commitlog byte for byte. ``attack:…`` kinds (``attack_kinds.py``) are a hostile local process at work
during the load — a forged master, replication-slot squatters, a promote racing a recovering master —
verified as the others and counted as ``breaches`` where the attack got what it must not.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from ..errors import FaultHarnessError
from .aim import WINDOW_PROCESS, WINDOWS

TARGETS = ("writer", "dispatcher", "flusher", "scheduler", "broker", "namesrv", "producer", "consumer",
           "slave", "replica", "ha", "master", "attack")
CHILDREN = ("writer", "dispatcher", "flusher", "scheduler", "ha")   # the master's, restarted by its supervisor
HA_TARGETS = ("slave", "replica", "ha", "master", "attack")
ATTACKS = ("forged-master", "squat", "promote-recovering", "member-admin", "relay")      # attack_kinds.py
EVERY_CONFIG_ATTACKS = ("member-admin",)                        # the others need the ha configuration
ACTIONS = {"master": ("promote",), "attack": ATTACKS}   # the actions of a target, when not kill and stop
AIMS = {"writer": ("mid-append", "mid-patch", "mid-journal", "mid-roll", "mid-commit"),
        "dispatcher": ("mid-dispatch",), "flusher": ("mid-flush",),
        "broker": ("mid-append", "mid-patch", "mid-journal", "mid-roll", "mid-commit", "mid-flush",
                   "mid-dispatch")}
# An aimed child is the process that runs the window's code (the broker's group holds them all).
assert all(w in WINDOWS and t in ("broker", WINDOW_PROCESS[w]) for t, ws in AIMS.items() for w in ws)

# Every configuration starts from BASE_CONFIG: small files, so trials roll commitlog, consume-queue
# and index files; fast registration (a restarted NameServer learns the routes within a second) and
# fast transaction check-backs and a short resolve lease (a half left open by a killed producer, or by
# one whose commit a broker kill cut off, is resolved within the trial's settle time).
BASE_CONFIG = {
    "namesrv": {"scan_interval_s": 1.0, "broker_expiry_s": 30.0},
    "broker": {"register_interval_s": 1.0, "transaction_check_interval_s": 1.0, "transaction_timeout_s": 2.0,
               "transaction_resolve_lease_s": 5.0},
    "store": {"commitlog_file_bytes": 512 << 10, "consume_queue_file_entries": 4000, "index_slots": 4000,
              "index_entries": 16000},
}
CONFIGS = {
    "async": {},
    "sync": {"store": {"flush_disk_type": "SYNC_FLUSH"}},
    "pool": {"store": {"transient_store_pool_enable": True}},
    "ha": {"broker": {"role": "SYNC_MASTER", "ha_sync_timeout_ms": 1000, "ha_meta_interval_s": 1.0}},
}
SLAVES = {"ha": 1}              # slaves per broker, by configuration


@dataclass(frozen=True)
class FaultKind:
    target: str
    action: str = "kill"        # kill, stop, promote (the master: kill it and promote its slave), or an attack
    window: str = ""            # aimed window ("" = a random moment)

    @property
    def name(self) -> str:
        return f"{self.target}@{self.window}" if self.window else f"{self.target}:{self.action}"

    def applies(self, config: str) -> bool:
        """mid-commit exists only with the transient store pool, and mid-patch only without it (the
        pool's writer copies into its buffer, not the file the harness looks at)."""
        if self.target in HA_TARGETS:
            return config == "ha" or (self.target == "attack" and self.action in EVERY_CONFIG_ATTACKS)
        if self.window == "mid-commit":
            return config == "pool"
        return self.window != "mid-patch" or config != "pool"


def all_kinds() -> list[FaultKind]:
    out = []
    for t in TARGETS:
        out += [FaultKind(t, a) for a in ACTIONS.get(t, ("kill", "stop"))] + \
            [FaultKind(t, "kill", w) for w in AIMS.get(t, ())]
    return out


def parse_kinds(spec: str | None) -> list[FaultKind]:
    """``writer,broker@mid-append,consumer:kill``: a target name means every kind of that target."""
    kinds = all_kinds()
    if not spec:
        return kinds
    by_name = {k.name: k for k in kinds}
    out: list[FaultKind] = []
    for tok in (t.strip() for t in spec.split(",")):
        if not tok:
            continue
        if tok in TARGETS:
            out += [k for k in kinds if k.target == tok and k not in out]
        elif tok in by_name:
            if by_name[tok] not in out:
                out.append(by_name[tok])
        else:
            raise FaultHarnessError(f"unknown fault kind {tok!r}; targets: {', '.join(TARGETS)}; kinds such as "
                                    f"writer:stop, broker@mid-append (windows: {', '.join(WINDOWS)})")
    return out


def parse_configs(spec: str | None) -> list[str]:
    names = [c.strip() for c in (spec or "async").split(",") if c.strip()]
    bad = [c for c in names if c not in CONFIGS]
    if bad or not names:
        raise FaultHarnessError(f"unknown configuration(s) {bad}; known: {', '.join(CONFIGS)}")
    return list(dict.fromkeys(names))


def cluster_config(name: str) -> dict:
    out = {k: dict(v) for k, v in BASE_CONFIG.items()}
    for section, values in CONFIGS[name].items():
        out.setdefault(section, {}).update(values)
    return out


@dataclass(frozen=True)
class RunOptions:
    trials: int = 16
    kinds: tuple[FaultKind, ...] = ()           # empty: every kind
    configs: tuple[str, ...] = ("async", "pool", "sync")
    seed: int = 0
    work_dir: str | None = None                 # must be fresh; None: a new temp dir, removed afterwards
    fuzz_cases: int = 0                         # per fuzzer; 0: no fuzzing
    load_s: tuple[float, float] = (0.3, 1.0)    # load before a fault at a random moment
    after_s: float = 0.4                        # load after recovery, before the producers stop
    stop_s: tuple[float, float] = (0.2, 2.5)    # how long a SIGSTOP lasts
    aim_timeout_s: float = 12.0                 # stepping toward a window gives up after this
    settle_timeout_s: float = 20.0              # longest wait for stragglers before verifying
    rates: dict = field(default_factory=dict)   # messages per second per send mode (workload.DEFAULT_RATES)

    def __post_init__(self) -> None:
        if not isinstance(self.trials, int) or self.trials < 0:
            raise FaultHarnessError(f"trials must be an int ≥ 0, got {self.trials!r}")
        if self.fuzz_cases < 0:
            raise FaultHarnessError(f"fuzz cases must be ≥ 0, got {self.fuzz_cases!r}")


def make_plan(trials: int, kinds: list[FaultKind], configs: list[str], seed: int) -> list[tuple[str, FaultKind]]:
    """``trials`` (config, kind) pairs: configurations get equal shares (in order), and within one
    every applicable kind comes once per round, rounds shuffled with ``seed``."""
    rng = random.Random(seed)
    out: list[tuple[str, FaultKind]] = []
    for i, config in enumerate(configs):
        share = trials // len(configs) + (1 if i < trials % len(configs) else 0)
        usable = [k for k in kinds if k.applies(config)]
        if not usable:
            continue
        picked: list[FaultKind] = []
        while len(picked) < share:
            round_ = list(usable)
            rng.shuffle(round_)
            picked += round_
        out += [(config, k) for k in picked[:share]]
    return out
