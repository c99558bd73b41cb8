"""``LocalCluster``: NameServers and brokers as real processes under one root (docs/api.md "Running a cluster").

Each server is started the way an operator (or systemd) would start it — ``python -m hostmq.cli.main
namesrv|broker ROOT --config FILE`` — with its output in ``ROOT/logs/``. The config given to
LocalCluster (a dict of overrides or a ``Config``), applied on top of ``ROOT/hostmq.toml`` if present,
is written to ``ROOT/run/cluster.toml`` and passed to every server. The servers are asked to die with
this process (``HOSTMQ_DIE_WITH_PARENT``: ``PR_SET_PDEATHSIG``), so a crashed test leaves nothing
behind; start the cluster from the main thread (the signal follows the starting thread).

``start()`` returns once every NameServer answers and every broker is registered and writable;
``stop()`` is graceful (brokers first: unregister, drain, flush, remove ``abort``, unlink shared memory).
"""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from typing import Any, Mapping

from . import records as R
from .client.instance import ClientInstance
from .remoting import RemotingClient
from .config import Config
from .errors import ConfigError, ConnectError, HostMQError
from .fsutil import ensure_dir, open_file
from .locks import lock_held, lock_if_stopped
from .protocol.route_data import cluster_info_from_dict
from .protocol.codes import RequestCode
from .process import describe_exit
from .sdnotify import environment_without_notify
from .shm.segment import reclaim_stale
from .root import RootPaths, broker_instance, ipc_address, resolve_root, shm_prefix

DIE_WITH_PARENT_ENV = "HOSTMQ_DIE_WITH_PARENT"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


def broker_names(n: int) -> list[str]:
    """``broker-a``, ``broker-b``, … (``broker-27`` … beyond 26)."""
    return [f"broker-{chr(ord('a') + i)}" if i < 26 else f"broker-{i + 1}" for i in range(n)]


def split_instance(instance: str) -> tuple[str, int]:
    """``broker-a`` → (broker-a, 0); ``broker-a.1`` → (broker-a, 1) (``root.broker_instance``)."""
    name, _, bid = instance.partition(".")
    return name, int(bid) if bid else 0


def broker_args(root: str, instance: str) -> list[str]:
    name, bid = split_instance(instance)
    return ["broker", root, "--name", name] + (["--id", str(bid)] if bid else [])


def dump_toml(config: Config) -> str:
    """``config`` as TOML (sections of scalars: all hostmq config is that shape)."""
    lines = []
    for section in (f.name for f in dataclasses.fields(config)):
        lines.append(f"[{section}]")
        for k, v in dataclasses.asdict(getattr(config, section)).items():
            if isinstance(v, bool):
                lines.append(f"{k} = {'true' if v else 'false'}")
            elif isinstance(v, (int, float)):
                lines.append(f"{k} = {v!r}")
            else:
                lines.append(f"{k} = \"{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}\"")
        lines.append("")
    return "\n".join(lines)


def merged_config(root: str, config: Config | Mapping[str, Any] | None) -> Config:
    paths = RootPaths(root)
    base = Config.load(paths.config_file) if os.path.exists(paths.config_file) else Config()
    if isinstance(config, Config):
        return config
    return base.with_overrides(config)


def clean_after_crash(root: str, broker: str) -> None:
    """What a broker instance killed with SIGKILL leaves (its socket files, state segment, pool
    segments) is reclaimed by its next start; one that stops for good is cleaned here — only while
    nobody runs it (its ``broker.lock`` is free)."""
    paths = RootPaths(root)
    fd = lock_if_stopped(paths.broker_lock(broker))     # nobody runs it: we may clean
    if fd is None:
        return
    try:
        prefix = shm_prefix(root, broker)
        reclaim_stale(prefix, grace_s=0.0, orphan_semaphores=True)
        for sock in (paths.broker_socket(broker), paths.broker_session_socket(broker)):
            if os.path.exists(sock):
                os.unlink(sock)
    finally:
        os.close(fd)


class LocalCluster:
    def __init__(self, root=None, brokers: int = 1, namesrvs: int = 1,
                 config: Config | Mapping[str, Any] | None = None, *, slaves: int = 0,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        if not isinstance(brokers, int) or not 1 <= brokers <= 64 or not isinstance(namesrvs, int) or \
                not 1 <= namesrvs <= 16 or not isinstance(slaves, int) or not 0 <= slaves <= 8:
            raise ConfigError("LocalCluster needs 1..64 brokers, 1..16 NameServers and 0..8 slaves per broker")
        self.root = resolve_root(root)
        ensure_dir(self.root)
        self.config = merged_config(self.root, config)
        if slaves and not self.config.broker.ha_listen:     # its masters have slaves: they listen (on loopback)
            self.config = self.config.with_overrides({"broker": {"ha_listen": "tcp://127.0.0.1:0"}})
        self.brokers = broker_names(brokers)
        # Slaves of each broker on this root: ``NAME.ID`` (their directories and process names).
        self.slaves = [broker_instance(b, i) for b in self.brokers for i in range(1, slaves + 1)]
        self.namesrvs = namesrvs
        self.start_timeout_s = start_timeout_s
        self.processes: dict[str, subprocess.Popen] = {}
        self.exit_codes: dict[str, int | None] = {}     # each server's exit code at the last stop()
        self._logs: dict[str, Any] = {}
        self.config_file = os.path.join(self.root, "run", "cluster.toml")

    # -- life -----------------------------------------------------------------------------------------
    def start(self) -> "LocalCluster":
        self._refuse_a_served_root()
        ensure_dir(os.path.dirname(self.config_file))
        ensure_dir(os.path.join(self.root, "logs"))
        with os.fdopen(open_file(self.config_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as f:
            f.write(dump_toml(self.config))
        try:
            for i in range(self.namesrvs):
                self._spawn(f"namesrv-{i}", ["namesrv", self.root, "--index", str(i)])
            self._await_namesrvs()
            for name in self.brokers:
                self._spawn(name, ["broker", self.root, "--name", name])
            self._await_brokers()
            for inst in self.slaves:
                self._spawn(inst, broker_args(self.root, inst))
            self._await_brokers(self.slaves)
        except BaseException:
            self.stop()
            raise
        return self

    def _refuse_a_served_root(self) -> None:
        """A root that another cluster (``hostmq up``, another LocalCluster) serves is refused before
        anything is written: our servers would fail on its locks, saying so only in their logs, and
        this object would then talk to the other cluster with a config that is not in effect."""
        paths = RootPaths(self.root)
        locks = [paths.namesrv_socket(i)[:-len(".sock")] + ".lock" for i in range(self.namesrvs)]
        locks += [paths.broker_lock(b) for b in self.brokers + self.slaves]
        for path in locks:
            if lock_held(path):
                raise ConfigError(f"root {self.root} is already served by a running cluster ({path} is locked): "
                                  f"stop that cluster first, or use it without starting one "
                                  f"(hostmq.Producer({self.root!r}), hostmq.Admin(…))")

    def _spawn(self, name: str, args: list[str]) -> None:
        log = os.fdopen(open_file(os.path.join(self.root, "logs", f"{name}.log"),
                                  os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab")
        self._logs[name] = log
        # Not the unit's main process: only whoever runs the cluster (hostmq up) speaks to systemd.
        env = {**environment_without_notify(), DIE_WITH_PARENT_ENV: "1"}
        self.processes[name] = subprocess.Popen(
            [sys.executable, "-m", "hostmq.cli.main", *args, "--config", self.config_file],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            process_group=0)   # Ctrl-C reaches only us; we stop the servers in order

    def _deadline_check(self, deadline: float, what: str) -> None:
        for name, p in self.processes.items():
            if p.poll() is not None:
                raise ConnectError(f"{name} (pid {p.pid}) {describe_exit(p.returncode)} while starting:\n"
                                   f"{self.log_tail(name)}")
        if time.monotonic() >= deadline:
            raise ConnectError(f"{what} not ready within {self.start_timeout_s:.0f} s")

    def _await_namesrvs(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        paths = RootPaths(self.root)
        for i in range(self.namesrvs):
            while True:
                try:
                    with RemotingClient(ipc_address(paths.namesrv_socket(i)), timeout_s=1.0) as c:
                        c.request(RequestCode.PING)
                    break
                except HostMQError:
                    self._deadline_check(deadline, f"NameServer {i}")
                    time.sleep(0.02)

    def _await_brokers(self, names: list[str] | None = None) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        inst = ClientInstance(self.root, timeout_s=1.0)
        try:
            pending = set(self.brokers if names is None else names)
            while pending:
                for name in sorted(pending):
                    if self._broker_ready(inst, name):
                        pending.discard(name)
                if pending:
                    self._deadline_check(deadline, f"broker(s) {', '.join(sorted(pending))}")
                    time.sleep(0.02)
        finally:
            inst.close()

    def _broker_ready(self, inst, instance: str) -> bool:
        """Registered with every NameServer (under the id its role gives it: a promoted slave is
        id 0) and RUNNING (its children attached)."""
        paths = RootPaths(self.root)
        name, _ = split_instance(instance)
        address = ipc_address(paths.broker_socket(instance))
        try:
            for i in range(self.namesrvs):
                with RemotingClient(ipc_address(paths.namesrv_socket(i)), timeout_s=1.0) as c:
                    info = cluster_info_from_dict(c.request(RequestCode.GET_BROKER_CLUSTER_INFO).fields)
                if name not in info["brokers"] or address not in info["brokers"][name].addrs.values():
                    return False
            f = inst.broker_request(ipc_address(paths.broker_socket(instance)), RequestCode.PING).fields
            return f["state"] == R.BROKER_RUNNING
        except HostMQError:
            return False

    def stop(self) -> None:
        """Stop brokers (in parallel), then NameServers; SIGKILL what ignores SIGTERM."""
        brokers = [n for n in self.processes if not n.startswith("namesrv-")]
        namesrvs = [n for n in self.processes if n.startswith("namesrv-")]
        for group in (brokers, namesrvs):
            for n in group:
                p = self.processes[n]
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            for n in group:
                p = self.processes[n]
                try:
                    p.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
        self.exit_codes = {n: p.returncode for n, p in self.processes.items()}
        for n in brokers:
            if self.processes[n].returncode not in (0, None):
                clean_after_crash(self.root, n)
        for log in self._logs.values():
            log.close()
        self._logs.clear()
        self.processes.clear()

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- helpers for tests and operators ----------------------------------------------------------------
    def pid(self, name: str) -> int:
        return self.processes[name].pid

    def log_tail(self, name: str, lines: int = 30) -> str:
        try:
            with open(os.path.join(self.root, "logs", f"{name}.log"), "rb") as f:
                return b"".join(f.readlines()[-lines:]).decode("utf-8", "replace")
        except OSError:
            return ""

    def signal_group(self, name: str, sig: int) -> None:
        """Send ``sig`` to a server and every process it started (its process group): SIGKILL here is a
        crash of the whole broker, SIGSTOP / SIGCONT freeze and thaw it."""
        os.killpg(self.processes[name].pid, sig)

    def stop_process(self, name: str) -> int:
        """Stop one server gracefully (SIGTERM); its exit code."""
        p = self.processes[name]
        p.send_signal(signal.SIGTERM)
        return p.wait(STOP_TIMEOUT_S)

    def start_namesrv(self, index: int = 0) -> None:
        """(Re)start NameServer ``index`` and wait until it answers."""
        name = f"namesrv-{index}"
        if name in self.processes and self.processes[name].poll() is None:
            raise ConfigError(f"{name} is running")
        old = self._logs.pop(name, None)
        if old is not None:
            old.close()
        self._spawn(name, ["namesrv", self.root, "--index", str(index)])
        self._await_namesrvs()

    def kill_broker(self, name: str, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to a broker process (tests); returns its exit code once it is gone."""
        p = self.processes[name]
        p.send_signal(sig)
        return p.wait(30)

    def start_broker(self, name: str, wait: bool = True, master: str | None = None) -> None:
        """(Re)start one broker under the same root and wait until it is ready (``wait=False``:
        return once it is spawned, then :meth:`await_broker`). ``master``: a slave's replication
        link for this run (``hostmq broker --master``) instead of the address its NameServers give."""
        if name in self.processes and self.processes[name].poll() is None:
            raise ConfigError(f"{name} is running")
        old = self._logs.pop(name, None)
        if old is not None:
            old.close()
        self._spawn(name, broker_args(self.root, name) + (["--master", master] if master else []))
        if wait:
            self.await_broker(name)

    def await_broker(self, name: str) -> None:
        """Wait until a broker this cluster started is registered and running."""
        if "." in name:
            self._await_brokers([name])
            return
        saved = self.brokers
        self.brokers = [name]
        try:
            self._await_brokers()
        finally:
            self.brokers = saved if name in saved else saved + [name]
