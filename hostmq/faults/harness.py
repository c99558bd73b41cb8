"""The kill harness: trials against a real cluster (``hostmq faults``, ``bench/faults.py``).

One cluster per configuration (``plan.CONFIGS``), on a fresh root, serves every trial of that
configuration; producers and the consumer are long-lived worker processes (``workload``). A trial:

1. the producers start sending messages of the trial (``go T``);
2. the fault: after a random while, SIGKILL or SIGSTOP (for a while) the target — or, aimed, step it
   into a window (``aim``) and SIGKILL it there;
3. restart what a supervisor would: a broker child restarts by itself (the harness waits for the
   new pid in the broker state); a killed broker group with ``LocalCluster.start_broker``, a NameServer
   with ``start_namesrv``; a killed producer or consumer is started again by the harness; for
   ``master:promote`` the slave is promoted and the old master rejoins as its slave (``failover``);
4. more load, then the producers finish what is in flight (``stop T``) — and after a failover the
   roles are given back;
5. verification (``verify``): the workers' logs are read, the commitlog region written since the
   last trial is scanned, the harness waits (bounded) for stragglers — delay messages, transaction
   check-backs, the consumer — then checks every acknowledged message of the trial: stored exactly
   once, reachable by consume queue, key and id, received by the consumer in order per key; and
   whether a server process died that the harness did not kill (the broker log names every child
   the supervisor restarted, with its pid).

At the end of each configuration every acknowledged message of the run is checked once more from a
full scan (``final``), the cluster is stopped, and /dev/shm is checked for names of the root. A whole
run (configurations, fuzzers, the run directory) is ``runner.run``.
"""
from __future__ import annotations

import os
import random
import re
import signal
import time

import numpy as np
import orjson
import psutil

from ..live.state import BrokerState
from ..admin.admin import Admin
from ..cluster import LocalCluster
from ..errors import FaultHarnessError, HostMQError
from ..root import RootPaths, shm_name, shm_prefix
from ..shm import list_segments, list_semaphores, unlink_semaphore, unlink_segment
from .aim import Facts, Targets, file_facts, step_into
from . import as_user
from .attack_kinds import MEMBER_GID, AttackOutcome, run_attack
from .failover import Failover, first_difference, wait_for, wait_group_gone
from .masters import MasterWatch
from .plan import CHILDREN, SLAVES, FaultKind, RunOptions, cluster_config
from .report import TrialRow
from .verify import (EXPECTED, REAL, Ledger, TrialVerdict, check_public, check_reachable, queue_mismatches,
                     recheck, scan_commitlog)
from .workers import WorkerHandle
from .workload import CONSUMER_GROUP, DEFAULT_PRODUCERS, read_events

TOPIC = "hmqf"
QUEUES = 4
BROKER = "broker-a"
SLAVE = "broker-a.1"            # the ha configuration's slave (root.broker_instance)
NAMESRV = "namesrv-0"
FINAL_SAMPLE = 2000             # messages looked up by key and id in the end-of-run check (all by queue)
SCAN_FILES = 16                 # commitlog files per read of the end-of-run scan
PUBLIC_SAMPLE = 3               # messages per trial also looked up through Admin (the rest: store readers)
_RESTARTED = re.compile(r"(\w+) \(pid (\d+)\) exited with (\S+)(?: \([^)]*\))?; restarting")


class Fault:
    """What was done to whom, when."""

    def __init__(self, kind: FaultKind, pids: list[int], handle: WorkerHandle | None = None) -> None:
        self.kind, self.pids, self.handle = kind, pids, handle
        self.wall = time.time()
        self.aim = None
        self.failover: Failover | None = None       # master:promote (and a promote an attack won)
        self.attack: AttackOutcome | None = None


class ClusterUnderTest:
    """One configuration's cluster, workers and ledger; :meth:`trial` runs one trial."""

    def __init__(self, base_dir: str, config: str, opts: RunOptions, rng: random.Random) -> None:
        self.config, self.opts, self.rng = config, opts, rng
        self.root = os.path.join(base_dir, "fence", "root")
        self.log_dir = os.path.join(base_dir, "logs")
        os.makedirs(self.root)
        os.makedirs(self.log_dir)
        cfg = cluster_config(config)
        if not as_user.available():     # a hostile member of the root's group (attack:member-admin)
            cfg["access"] = {"group": str(MEMBER_GID)}
        self.cluster = LocalCluster(self.root, config=cfg, slaves=SLAVES.get(config, 0))
        self.store_dir = RootPaths(self.cluster.root).store_dir(BROKER)
        self.has_slave = bool(SLAVES.get(config, 0))
        self.state: BrokerState | None = None
        self.slave_state: BrokerState | None = None
        self.slave_checked = 0          # the slave's commitlog is known identical to the master's below this
        self.admin: Admin | None = None
        self.producers: list[WorkerHandle] = []
        self.consumer: WorkerHandle | None = None
        self.ledger = Ledger()
        self.scan_pos = 0
        self._log_offsets: dict[str, int] = {}
        self._server_log_pos = {BROKER: 0, NAMESRV: 0, SLAVE: 0}
        self._fault: Fault | None = None
        self._first_ack_after = float("nan")
        self.trials: list[int] = []
        self.leftovers: list[str] = []
        self.watch: MasterWatch | None = None   # with a slave: one master per name, sampled all along

    # -- life ---------------------------------------------------------------------------------------------
    def start(self) -> "ClusterUnderTest":
        self.cluster.start()
        if self.has_slave:
            self.watch = MasterWatch(self.cluster.root, BROKER).start()
        self.admin = Admin(self.cluster.root)
        self.admin.create_topic(TOPIC, queues=QUEUES)
        self._attach()
        self.scan_pos = self.state.stored_pos()
        rates = orjson.dumps(self.opts.rates).decode()
        for i, modes in enumerate(DEFAULT_PRODUCERS):
            self.producers.append(WorkerHandle(f"p{i}", "producer", self.cluster.root, self.log_dir,
                                               ["--topic", TOPIC, "--modes", ",".join(modes), "--rates", rates]))
        self.consumer = WorkerHandle("c0", "consumer", self.cluster.root, self.log_dir, ["--topic", TOPIC])
        for w in self.producers + [self.consumer]:
            w.start()
        return self

    def _attach(self) -> None:
        if self.state is not None:
            self.state.close()
        self.state = BrokerState.attach(shm_name(self.cluster.root, BROKER, "state"), readonly=True)
        if self.has_slave:
            self._attach_slave()

    def _attach_slave(self) -> None:
        if self.slave_state is not None:
            self.slave_state.close()
        self.slave_state = BrokerState.attach(shm_name(self.cluster.root, SLAVE, "state"), readonly=True)

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        for w in self.producers + ([self.consumer] if self.consumer else []):
            w.quit()
        if self.admin is not None:
            self.admin.close()
            self.admin = None
        if self.state is not None:
            self.state.close()
            self.state = None
        if self.slave_state is not None:
            self.slave_state.close()
            self.slave_state = None
        self.cluster.stop()
        root = self.cluster.root
        for p in {shm_prefix(root, b) for b in (BROKER, SLAVE, "")}:
            for n in list_segments(p):
                self.leftovers.append(n)
                unlink_segment(n)
            for n in list_semaphores(p):
                self.leftovers.append(f"sem:{n}")
                unlink_semaphore(n)

    def __enter__(self) -> "ClusterUnderTest":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- one trial ------------------------------------------------------------------------------------------
    def trial(self, no: int, kind: FaultKind) -> TrialRow:
        t0 = time.monotonic()
        self.trials.append(no)
        self.ledger.open_trial(no)
        self._fault, self._first_ack_after = None, float("nan")
        for w in self.producers:
            w.go(no)
        fault = self._inject(kind)
        self._fault = fault
        restart_s = self._recover(fault, no)
        time.sleep(self.opts.after_s)
        for w in self.producers:
            w.command(f"stop {no}")
        stuck = []
        for w in self.producers:
            line = w.expect(f"done {no}", 30)
            if line is None or line.split()[-1] != "0":
                stuck.append(w.name)
        over = fault.failover
        if over:                        # the roles back as they were, for the checks
            over.give_back(self.ledger, TOPIC)
            self._attach()
        verdict = self._settle(no)
        crashes = self._crashes(fault) + (over.problems if over else [])
        _, split, split_words = self.watch.take() if self.watch else (0, 0, [])
        row = TrialRow(no, self.config, kind.name, kind.target, kind.action, kind.window,
                       ("yes" if fault.aim.hit else "no") if fault.aim else "", restart_s=restart_s,
                       recovery_s=self._first_ack_after - fault.wall,
                       crashes=sum(c.startswith("crash") for c in crashes), split_brain=split)
        _fill(row, verdict)
        breaches = fault.attack.breaches if fault.attack else []
        row.breaches = len(breaches)
        notes = crashes + split_words + [f"breach: {b}" for b in breaches] + \
            (fault.attack.notes if fault.attack else []) + (over.notes if over else []) + \
            [f"producer {n} did not finish its sends" for n in stuck]
        if fault.aim:
            notes.append(f"aim: {fault.aim.steps} steps, {fault.aim.seconds:.2f} s, {fault.aim.detail}")
        row.details = "; ".join(verdict.details + notes)
        row.seconds = time.monotonic() - t0
        return row

    def _inject(self, kind: FaultKind) -> Fault:
        rng = self.rng
        if kind.window:
            return self._aimed(kind)
        time.sleep(rng.uniform(*self.opts.load_s))
        if kind.target == "attack":
            fault = Fault(kind, [])
            fault.attack = run_attack(kind.action, self.cluster, BROKER, SLAVE, self._group_pids, TOPIC,
                                      CONSUMER_GROUP)
            fault.pids, fault.failover = fault.attack.killed, fault.attack.failover
            return fault
        pids, handle = self._target(kind.target)
        with self._targets(kind.target, pids) as targets:
            fault = Fault(kind, pids, handle)
            sig = signal.SIGSTOP if kind.action == "stop" else signal.SIGKILL
            group = {"broker": BROKER, "master": BROKER, "slave": SLAVE}.get(kind.target)
            if group:
                self.cluster.signal_group(group, sig)
            else:
                targets.signal(sig)
            if kind.action == "stop":
                time.sleep(rng.uniform(*self.opts.stop_s))
                if group:
                    self.cluster.signal_group(group, signal.SIGCONT)
                else:
                    targets.signal(signal.SIGCONT)
        return fault

    def _targets(self, target: str, pids: list[int]) -> Targets:
        """``pids`` held by pidfd; a broker child (read from the state words) only while it is still
        a process of this broker — by the time it is signalled its pid could name another process."""
        if target in CHILDREN or target in ("broker", "master"):
            broker = self.cluster.pid(BROKER)
            return Targets(pids, lambda pid: pid == broker or _pgid(pid) == broker)
        if target in ("slave", "replica"):
            slave = self.cluster.pid(SLAVE)
            return Targets(pids, lambda pid: pid == slave or _pgid(pid) == slave)
        return Targets(pids)

    def _target(self, target: str) -> tuple[list[int], WorkerHandle | None]:
        if target in CHILDREN:
            return [int(self.state.get(f"{target}_pid"))], None
        if target in ("broker", "master"):
            return self._group_pids(), None
        if target == "slave":
            return self._group_pids(SLAVE), None
        if target == "replica":
            return [int(self.slave_state.get("writer_pid"))], None
        if target == "namesrv":
            return [self.cluster.pid(NAMESRV)], None
        handle = self.rng.choice(self.producers) if target == "producer" else self.consumer
        return [handle.pid], handle

    def _group_pids(self, name: str = BROKER) -> list[int]:
        broker = self.cluster.pid(name)
        try:
            return [broker] + [p.pid for p in psutil.Process(broker).children(recursive=True)]
        except psutil.NoSuchProcess:
            return [broker]

    def _aimed(self, kind: FaultKind) -> Fault:
        time.sleep(self.rng.uniform(0.1, 0.3))          # let the load start
        pids = self._group_pids() if kind.target == "broker" else [int(self.state.get(f"{kind.target}_pid"))]
        with self._targets(kind.target, pids) as targets:
            res = step_into(kind.window, targets, self._look, self.opts.aim_timeout_s, self.rng.uniform)
            fault = Fault(kind, pids)
            fault.aim = res
            if kind.target == "broker":
                self.cluster.signal_group(BROKER, signal.SIGKILL)
            else:
                targets.signal(signal.SIGKILL)
        return fault

    def _look(self) -> Facts:
        words = self.state.snapshot()
        fb = self.state.commitlog_file_bytes
        newest, copied, unpatched = file_facts(os.path.join(self.store_dir, "commitlog"), words, fb)
        return Facts(words, fb, self.state.sync_flush, self.cluster.config.store.transient_store_pool_enable,
                     newest, copied, unpatched)

    # -- restart ----------------------------------------------------------------------------------------------
    def _recover(self, fault: Fault, no: int) -> float:
        """Restart what a supervisor would; the seconds it took (0 when nothing had to restart)."""
        kind = fault.kind
        if kind.action == "stop":
            return 0.0
        t0 = time.monotonic()
        target = kind.target
        if target in CHILDREN:
            old = fault.pids[0]
            wait_for(lambda: self.state.get(f"{target}_pid") not in (old, 0) and
                     psutil.pid_exists(int(self.state.get(f"{target}_pid"))), 60, f"a new {target}")
        elif target == "broker":
            wait_group_gone(self.cluster, BROKER, fault.pids, 30)
            self.cluster.start_broker(BROKER)
            self._attach()
        elif target == "master":
            fault.failover = Failover(self.cluster, BROKER, SLAVE)
            fault.failover.take_over(fault.pids)
        elif target == "slave":
            wait_group_gone(self.cluster, SLAVE, fault.pids, 30)
            self.cluster.start_broker(SLAVE)
            self._attach_slave()
        elif target == "replica":
            old = fault.pids[0]
            wait_for(lambda: self.slave_state.get("writer_pid") not in (old, 0) and
                     psutil.pid_exists(int(self.slave_state.get("writer_pid"))), 60, "a new replica")
        elif target == "attack":            # it brought back what it ended
            self._attach()
        elif target == "namesrv":
            self.cluster.processes[NAMESRV].wait(30)
            self.cluster.start_namesrv(0)
            self._await_route()
        else:
            fault.handle.kill()
            fault.handle.start()
            if target == "producer":
                fault.handle.go(no)
        return time.monotonic() - t0

    def _await_route(self) -> None:
        with Admin(self.cluster.root, timeout_s=1.0) as a:
            def routed() -> bool:
                try:
                    return len(a.route(TOPIC)) == QUEUES
                except HostMQError:
                    return False
            wait_for(routed, 30, "the broker to register with the restarted NameServer", 0.05)

    # -- verification --------------------------------------------------------------------------------------------
    def _read_logs(self) -> None:
        fault = self._fault
        for w in self.producers + [self.consumer]:
            for path in w.log_paths():
                events, self._log_offsets[path] = read_events(path, self._log_offsets.get(path, 0))
                self.ledger.add_events(events)
                if fault is not None:
                    after = [ev["t1"] for ev in events if ev.get("e") == "ack" and ev.get("t0", 0) >= fault.wall]
                    if after and not min(after) >= self._first_ack_after:       # (also when still NaN)
                        self._first_ack_after = min(after)

    def _scan(self) -> None:
        end = self.state.stored_pos()
        if end < self.scan_pos:
            self.ledger.pending.add("corrupt", f"the commitlog ends at {end}, below {self.scan_pos} that was "
                                               f"stored and verified before")
            self.scan_pos = end
        recs, problems, self.scan_pos = scan_commitlog(os.path.join(self.store_dir, "commitlog"),
                                                       self.state.commitlog_file_bytes, self.scan_pos, end, TOPIC)
        self.ledger.add_stored(recs, problems)

    def _settle(self, no: int) -> TrialVerdict:
        deadline = time.monotonic() + self.opts.settle_timeout_s
        while True:
            self._read_logs()
            self._scan()
            if self.ledger.missing(no) == (0, 0) or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        recs = self.ledger.records(no)
        need = max((r.phys + r.size for r in recs), default=0)
        try:
            wait_for(lambda: self.state.readable_pos() >= need, max(1.0, deadline - time.monotonic()),
                     "the dispatcher")
        except FaultHarnessError as e:
            self.ledger.pending.add("unreachable", f"{e} (dispatched {self.state.readable_pos()}, need {need})")
        unreachable = check_reachable(self.store_dir, self.cluster.config.store, recs, TOPIC, self.state.stored_pos())
        unreachable += check_public(self.admin, self.rng.sample(recs, min(PUBLIC_SAMPLE, len(recs))), TOPIC)
        if self.has_slave:
            self._check_slave(deadline)
        return self.ledger.verdict(no, unreachable)

    def _check_slave(self, deadline: float) -> None:
        """The slave caught up with everything the master stored, and holds it byte for byte."""
        target = self.state.stored_pos()
        try:
            wait_for(lambda: self.slave_state.stored_pos() >= target, max(5.0, deadline - time.monotonic()),
                     "the slave to catch up")
        except FaultHarnessError:
            self.ledger.pending.add("unreachable", f"the slave holds the commitlog to {self.slave_state.stored_pos()}, "
                                                   f"the master to {target}")
        end = min(self.slave_state.stored_pos(), self.state.stored_pos())
        paths = RootPaths(self.cluster.root)
        where = first_difference(os.path.join(paths.store_dir(BROKER), "commitlog"),
                                 os.path.join(paths.store_dir(SLAVE), "commitlog"),
                                 self.state.commitlog_file_bytes, self.slave_checked, end)
        if where is not None:
            self.ledger.pending.add("corrupt", f"the slave's commitlog differs from the master's at {where}")
        else:
            self.slave_checked = max(self.slave_checked, end)

    def _crashes(self, fault: Fault) -> list[str]:
        """Server processes that died although the harness did not kill them (restarted here so the
        run goes on)."""
        out = []
        for name in (BROKER, NAMESRV) + ((SLAVE,) if self.has_slave else ()):
            path = os.path.join(self.cluster.root, "logs", f"{name}.log")
            with open(path, "rb") as f:
                f.seek(self._server_log_pos[name])
                text = f.read().decode("utf-8", "replace")
                self._server_log_pos[name] = f.tell()
            for child, pid, code in restarted_children(text):
                if pid not in fault.pids:
                    out.append(f"crash: {name} {child} (pid {pid}) exited with {code}")
            if "Traceback" in text:
                out.append(f"{text.count('Traceback')} traceback(s) in {name}.log")
            misses = [ln for ln in text.splitlines() if "the index did not find it" in ln]
            if misses:      # no duplicate (the scheduler's commitlog scan found the copy), but a bug
                out.append(f"index miss: {len(misses)} delivered copies the restarted scheduler's index query "
                           f"missed in {name}.log; the first: {misses[0][-600:]}")
            if self.cluster.processes[name].poll() is not None:
                out.append(f"crash: {name} exited with {self.cluster.processes[name].returncode}")
                if name == NAMESRV:
                    self.cluster.start_namesrv(0)
                else:
                    self.cluster.start_broker(name)
                    self._attach()
        for w in self.producers + [self.consumer]:
            if not w.alive():
                out.append(f"worker {w.name} died ({w.proc.returncode}): {w.err_tail(2)}")
                w.start()
        return [c for c in out if c.startswith("crash")] + [c for c in out if not c.startswith("crash")]

    # -- the end of a configuration ------------------------------------------------------------------------------
    def final(self) -> TrialRow:
        """Every acknowledged message of this configuration's trials, checked again where its trial
        found it, from a full scan of the commitlog: still there, stored once, its consume-queue
        entry pointing at it; a sample also by key and id (damage a later fault did shows here)."""
        t0 = time.monotonic()
        exp = np.concatenate(self.ledger.verified) if self.ledger.verified else np.zeros(0, EXPECTED)
        pick = np.random.default_rng(len(exp)).choice(len(exp), min(FINAL_SAMPLE, len(exp)), replace=False)
        keys, phys, sampled, problems = self._full_scan(set(exp["key"][pick].tolist()))
        v = recheck(exp, keys, phys, self.ledger.allowed_copies, self.ledger.name)
        for p in problems:
            v.add("corrupt", p)
        cfg = self.cluster.config.store
        bad, found = queue_mismatches(self.store_dir, cfg.consume_queue_file_entries, TOPIC, exp["queue_id"],
                                      exp["queue_offset"], exp["phys"], exp["size"])
        for i in np.flatnonzero(bad):
            e = exp[i]
            v.add("unreachable", f"{self.ledger.name(int(e['key']))}: consume-queue entry {int(e['queue_id'])}/"
                                 f"{int(e['queue_offset'])} points at {int(found[i][0])}, the record is at {int(e['phys'])}")
        for p in check_reachable(self.store_dir, cfg, sampled, TOPIC, self.state.stored_pos(), queues=False):
            v.add("unreachable", p)
        row = TrialRow(0, self.config, "final", "all", "verify")
        _fill(row, v)
        row.details = "; ".join(v.details)
        row.seconds = time.monotonic() - t0
        return row

    def _full_scan(self, sample: set) -> tuple[np.ndarray, np.ndarray, list, list[str]]:
        """Keys and positions of every real-topic record, the records of the ``sample`` keys, problems."""
        cl, fb = os.path.join(self.store_dir, "commitlog"), self.state.commitlog_file_bytes
        pos = min((int(n) for n in os.listdir(cl) if n.isdecimal()), default=0)
        end = self.state.stored_pos()
        keys, phys, sampled, problems = [], [], [], []
        while pos < end:
            recs, probs, nxt = scan_commitlog(cl, fb, pos, min(end, pos - pos % fb + SCAN_FILES * fb), TOPIC)
            problems += probs
            real = [r for r in recs if r.kind == REAL]
            ks = [self.ledger.key(r.producer, r.seq) for r in real]
            keys.append(np.array(ks, np.int64))
            phys.append(np.array([r.phys for r in real], np.int64))
            sampled += [r for r, k in zip(real, ks) if k in sample]
            if nxt <= pos:
                break
            pos = nxt
        cat = (lambda parts: np.concatenate(parts) if parts else np.zeros(0, np.int64))
        return cat(keys), cat(phys), sampled, problems


def restarted_children(log_text: str) -> list[tuple[str, int, str]]:
    """``(child, pid, exit code)`` of every child a broker's supervisor restarted, from its log
    (``process.Supervisor.check`` logs each one)."""
    return [(child, int(pid), code) for child, pid, code in _RESTARTED.findall(log_text)]


def _fill(row: TrialRow, v: TrialVerdict) -> None:
    row.acked = v.acked
    for c in TrialVerdict.COUNTS:
        setattr(row, c, getattr(v, c))


def _pgid(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return -1

