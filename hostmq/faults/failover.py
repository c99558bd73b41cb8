"""The failover fault ``master:promote`` (``ha`` configuration; ``harness`` runs its trials).

A trial of it, around the harness's usual steps:

1. under load, the harness SIGKILLs the master's whole process group (as for ``broker:kill``);
2. :meth:`Failover.take_over`: once the group is gone, the slave is promoted (``Admin.promote``,
   ``broker/promotion.py``) as a SYNC_MASTER — tried again while it is refused because its replica
   has not yet seen the master go; forced only when the one thing left in the way is the tail its
   old master had sent and it never stored (under SYNC_MASTER that tail was never acknowledged
   SEND_OK: no slave had it) — then the old master is started again with its usual start: its role
   record now says slave, so it joins the promoted master, cuts what that one lacks (kept in
   ``store/cut-FROM-TO.bin``) and catches up. Producers and the consumer go on against the
   promoted master: they follow the routes; sends that fail meanwhile are logged as failures, not
   acknowledgements;
3. :meth:`Failover.give_back`, once the trial's producers have stopped: the promoted master is stopped
   gracefully, the old one promoted back and the slave started again — connected and caught up —
   so the next trial starts from the usual layout and the harness verifies as after every ``ha``
   trial (the master ``broker-a``, its slave ``broker-a.1`` byte for byte). The records the old
   master cut are read from its cut files (``verify.Ledger.add_cut``): an acknowledged message
   found only there is lost, unless its send was answered other than SEND_OK (SLAVE_NOT_AVAILABLE,
   FLUSH_SLAVE_TIMEOUT: the SYNC_MASTER stored it without a slave's copy).

Why the way back is a graceful stop, not a SIGKILL: it is the planned switch an operator makes, not
the fault under test — a second crash there would be a second failover inside one trial. A
SYNC_MASTER stops its writer before its replication process, so every record written up to the stop
(the last sends, the scheduler's deliveries, check-back commits) reached the slave or was answered
FLUSH_SLAVE_TIMEOUT; with the load stopped and the slave caught up first, the promotion back is not
refused for lag and nothing is cut on the way back. A refusal there is a finding, so it is raised.

Ownership: the harness process is the only one that kills, stops, promotes and starts servers here;
what it ends is recorded (``Fault.pids``; the promoted master stops by the harness's SIGTERM and
must exit 0) so that the crash check does not report it. Reads of the instances' state segments go
through ``group.live_state`` each time, since a promotion or a cut starts a broker's next run — a
new segment — in the same process.
"""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import time

import psutil

from ..live.group import live_state
from ..admin.admin import Admin
from ..cluster import LocalCluster, split_instance
from ..waiting import poll_until
from ..errors import FaultHarnessError, PromotionRefusedError
from ..process import describe_exit
from ..root import RootPaths
from .verify import Ledger, scan_cut_file

ROLE = "SYNC_MASTER"                # the ha configuration's master role, kept across the swaps
PROMOTE_TIMEOUT_S = 60.0            # a refused promotion is tried again this long
CATCH_UP_TIMEOUT_S = 60.0           # a rejoined old master catches up within this
STOP_TIMEOUT_S = 30.0
COMPARE_BYTES = 1 << 20             # a slave's commitlog is compared with its master's in reads of this size


def wait_for(cond, timeout_s: float, what: str, step_s: float = 0.02):
    """``cond()`` once it is truthy; FaultHarnessError after ``timeout_s``."""
    return poll_until(cond, timeout_s, what, step_s=step_s, error=FaultHarnessError)


class Failover:
    """One ``master:promote`` trial's failover of the group ``master`` (instance id 0, the master at
    the start) and ``slave`` (its slave): :meth:`take_over`, then :meth:`give_back`. ``notes`` says
    what happened; ``problems`` (``crash: …``) what must fail the trial."""

    def __init__(self, cluster: LocalCluster, master: str, slave: str) -> None:
        self.cluster, self.master, self.slave = cluster, master, slave
        self.notes: list[str] = []
        self.problems: list[str] = []
        self._cuts_before = self._cut_files()

    def take_over(self, killed: list[int]) -> None:
        """After the master's group (``killed``) was SIGKILLed: the slave promoted, the old master
        started again as its slave and caught up with what the new one had stored by then."""
        c = self.cluster
        wait_group_gone(c, self.master, killed, STOP_TIMEOUT_S)
        self.notes += promote(c.root, self.slave, force_lag=True)
        c.start_broker(self.master)             # its role record says slave now
        caught_up(c.root, self.master, self.slave, f"the old master {self.master} to catch up as a slave",
                  everything=False)

    def give_back(self, ledger: Ledger, topic: str) -> None:
        """Once the load stopped: the promoted master stops, the old one — its slave now, holding all
        it stored — is promoted back, and the slave starts again, connects and catches up. What the
        old master cut when it rejoined goes to ``ledger`` (``Ledger.add_cut``)."""
        c, master, slave = self.cluster, self.master, self.slave
        caught_up(c.root, master, slave, f"{master} to hold everything the promoted {slave} stored", everything=True)
        try:
            code = describe_exit(c.stop_process(slave))
        except subprocess.TimeoutExpired:
            c.signal_group(slave, signal.SIGKILL)
            c.processes[slave].wait(STOP_TIMEOUT_S)
            code = f"no exit within {STOP_TIMEOUT_S:.0f} s (then killed)"
        if code != describe_exit(0):
            self.problems.append(f"crash: the promoted master {slave} stopped on SIGTERM with {code}")
        promote(c.root, master, force_lag=False)
        c.start_broker(slave)                   # demoted by that promotion: it joins as a slave
        caught_up(c.root, slave, master, f"{slave} to connect to {master} again and catch up", everything=True)
        for path in sorted(self._cut_files() - self._cuts_before):
            ledger.add_cut(*scan_cut_file(path, topic), os.path.basename(path))

    def _cut_files(self) -> set[str]:
        paths = RootPaths(self.cluster.root)
        return {p for i in (self.master, self.slave) for p in glob.glob(os.path.join(paths.store_dir(i), "cut-*.bin"))}


def promote(root: str, instance: str, force_lag: bool) -> list[str]:
    """Promote ``instance`` to SYNC_MASTER, again while it is refused, within PROMOTE_TIMEOUT_S. Once
    its replica is disconnected, a lag (it lacks part of what its master said it held) can only
    be forced away: with ``force_lag`` it is (a note says how many bytes that gave up), without it
    that is raised at once."""
    name, bid = split_instance(instance)
    deadline = time.monotonic() + PROMOTE_TIMEOUT_S
    with Admin(root) as admin:
        while True:
            lag = _lag(root, instance)
            if lag and not force_lag:
                raise FaultHarnessError(f"{instance} lacks {lag} bytes of what its master said it held after a "
                                        f"graceful stop of that master: it cannot be promoted without losing them")
            try:
                admin.promote(name, bid, ROLE, force=bool(lag))
                return [f"promoted {instance} with --force: it lacked {lag} bytes its master had sent "
                        f"(never acknowledged SEND_OK: no slave had them)"] if lag else []
            except PromotionRefusedError as e:
                if time.monotonic() >= deadline:
                    raise FaultHarnessError(f"{instance} was not promoted within {PROMOTE_TIMEOUT_S:.0f} s: {e}") \
                        from None
                time.sleep(0.05)


def _lag(root: str, instance: str) -> int | None:
    """Bytes ``instance`` lacks of what its master said it held, once that is all that can refuse its
    promotion (its replica no longer connected); None before that."""
    st = live_state(root, instance)
    if st is None:
        return None
    try:
        if st.get("replica_connected") and psutil.pid_exists(int(st.get("writer_pid"))):
            return None
        return max(0, int(st.get("master_end_pos")) - int(st.get("write_pos")))
    finally:
        st.close()


def caught_up(root: str, follower: str, leader: str, what: str, everything: bool) -> None:
    """Wait until ``follower`` runs as a slave, streams from ``leader`` (running as the master) and
    holds what it had stored when the wait began (under load), or with ``everything`` all of it at
    one look. (A slave that starts with the whole log holds it before it even connected: a
    SYNC_MASTER answers SLAVE_NOT_AVAILABLE until it does.)"""
    def positions() -> tuple[int, int] | None:
        s, m = live_state(root, follower), live_state(root, leader)
        try:
            if s is None or m is None or not s.is_slave or m.is_slave or not s.get("replica_connected") \
                    or not m.get("ha_slaves"):
                return None
            return s.stored_pos(), m.stored_pos()
        finally:
            for st in (s, m):
                if st is not None:
                    st.close()
    target = wait_for(lambda: (p := positions()) and p[1], CATCH_UP_TIMEOUT_S, what)
    wait_for(lambda: (p := positions()) and p[0] >= (p[1] if everything else target), CATCH_UP_TIMEOUT_S, what)


def wait_group_gone(cluster: LocalCluster, instance: str, pids: list[int], timeout_s: float) -> None:
    """Wait until a broker's SIGKILLed process group (``pids``: its broker and children) is gone."""
    cluster.processes[instance].wait(timeout_s)
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=timeout_s)


def first_difference(master_dir: str, slave_dir: str, file_bytes: int, start: int, end: int) -> int | None:
    """The first commitlog offset in [start, end) where the slave's bytes differ from the master's
    (a missing file counts as different), None if they agree."""
    pos = start
    while pos < end:
        name = f"{pos - pos % file_bytes:020d}"
        n = min(end - pos, file_bytes - pos % file_bytes, COMPARE_BYTES)
        chunks = []
        for d in (master_dir, slave_dir):
            try:
                fd = os.open(os.path.join(d, name), os.O_RDONLY)
            except FileNotFoundError:
                return pos
            try:
                chunks.append(os.pread(fd, n, pos % file_bytes))
            finally:
                os.close(fd)
        if chunks[0] != chunks[1]:
            at = next((i for i, (a, b) in enumerate(zip(*chunks)) if a != b), min(map(len, chunks)))
            return pos + at
        pos += n
    return None
