"""The attack fault kinds (issue "Trust the cluster"): a hostile local process acts during a trial's
load, and the trial is verified as every other (0 acknowledged lost, 0 forged delivered, one master
per name at every sampled instant — ``masters.py``), plus what the attack itself got: a *breach*.

Kinds (target ``attack``, ``ha`` configuration — a SYNC_MASTER and its slave on one root):

* ``attack:forged-master`` — the master's process group is SIGKILLed; a process without the root's
  ``ha.secret`` binds the master's replication address (``attacks_ha.ForgedMaster``) and answers the
  slave's HELLO with ``WELCOME truncate_to=0`` and forged records. Breach: the slave sent anything
  after that WELCOME (it acted on it), or its log moved. Then the master starts again as after
  ``broker:kill``.
* ``attack:squat`` — an outsider holds 16 connections to the master's replication port, each
  trickling a HELLO a byte at a time (``attacks_ha.SlotSquatter``), while the slave's replica is
  SIGKILLed and must connect again. Breach: it could not within :data:`RECONNECT_TIMEOUT_S`.
* ``attack:member-admin`` (every configuration) — a process of another uid in the root's group
  (``as_user``) runs ``attacks_control``: every administration code on every control socket (delete
  the load's topic, reset the consumer's offsets, promote, unregister, KV config …), re-registers the
  broker name at a socket of its own, and floods heartbeats naming new groups and first sends naming
  new topics. Breach: any administration not refused, or the topic's route changed. Needs root,
  ``setpriv`` and ``unshare``; elsewhere the trial notes that it was skipped (the load and checks
  run as usual).
* ``attack:promote-recovering`` — the master's process group is SIGKILLed and started again; once it
  holds ``broker.lock`` and is recovering, it is frozen (SIGSTOP) and the slave is promoted, as an
  operator (or systemd racing one) would, then it is thawed (``attacks_roles``). The promote is
  refused, waits for the role lock, or runs wholly before the old master reads its role (then the
  old master joins as a slave and the roles are given back after the load, as for
  ``master:promote``). Breach: any other outcome; two masters show in ``split_brain``.

* ``attack:relay`` — a man in the middle on the replication path: the slave's process group is
  SIGKILLed and started again with its master link (``--master``, as an operator configures a link
  between hosts) pointing at a relay (``attacks_ha.Relay``) that passes every byte to and from the real
  master and, once the stream runs, injects a REPORT of everything the master streamed — the forgery
  that made a SYNC_MASTER answer SEND_OK for bytes no slave held. Breach: the master welcomed a relayed
  slave, or counted one (``ha_slaves``) while only the relay could reach it. Then the slave starts
  again on its direct link and must catch up.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
from dataclasses import dataclass, field

import orjson
import psutil

from ..admin.admin import Admin
from ..cluster import LocalCluster
from ..errors import FaultHarnessError
from ..jsonfile import read_json
from ..live.group import live_state
from ..broker.replica import MASTER_FILE
from ..root import RootPaths
from . import as_user
from .attacks_ha import ForgedMaster, Relay, SlotSquatter
from .attacks_roles import promote_during_recovery
from .failover import Failover, caught_up, wait_for, wait_group_gone
from .plan import ATTACKS
FORGER_WAIT_S = 15.0            # the slave dials the forged master within this (it retries every second)
RECONNECT_TIMEOUT_S = 30.0      # the slave connects past the squatters within this
STOP_TIMEOUT_S = 30.0
MEMBER_GID, MEMBER_UID = 54340, 54341   # the hostile member (ids no passwd entry uses); the harness's roots'
#                                         group when it runs as root (harness.ClusterUnderTest)
MEMBER_GROUPS, MEMBER_TOPICS = 200, 20  # its flood: heartbeats naming new groups, first sends of new topics
MEMBER_CODE = """
import sys
from hostmq.faults.attacks_control import main
sys.exit(main(sys.argv[1:]))
"""


@dataclass
class AttackOutcome:
    """What an attack did: ``notes`` in words, ``breaches`` (what it got that it must not), the
    server pids it ended on purpose (not crashes), and a failover whose roles must be given back."""

    notes: list[str] = field(default_factory=list)
    breaches: list[str] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    failover: Failover | None = None


def master_ha_address(root: str, slave: str) -> str:
    """The master's replication address as the slave knows it (``master.json``)."""
    d = read_json(os.path.join(RootPaths(root).broker_dir(slave), MASTER_FILE), default=None)
    if not isinstance(d, dict) or not d.get("ha_address"):
        raise FaultHarnessError(f"{slave} knows no master address yet ({MASTER_FILE})")
    return d["ha_address"]


def _word(root: str, instance: str, name: str) -> int | None:
    st = live_state(root, instance)
    if st is None:
        return None
    try:
        return int(st.get(name))
    finally:
        st.close()


def run_attack(action: str, cluster: LocalCluster, master: str, slave: str, group_pids, topic: str = "",
               group: str = "") -> AttackOutcome:
    """Carry out ``attack:ACTION`` against ``cluster`` (its master instance ``master``, slave
    ``slave``) under the trial's load; ``group_pids()`` lists the master's process group now; ``topic``
    and ``group`` are the load's (a member's victims). On return the cluster serves again (a
    promotion's roles are given back by the harness later)."""
    if action == "forged-master":
        return _forged_master(cluster, master, slave, group_pids())
    if action == "squat":
        return _squat(cluster, master, slave)
    if action == "promote-recovering":
        return _promote_recovering(cluster, master, slave, group_pids())
    if action == "member-admin":
        return _member_admin(cluster, master, topic, group)
    if action == "relay":
        return _relay(cluster, master, slave, group_pids(slave))
    raise FaultHarnessError(f"unknown attack {action!r}; known: {', '.join(ATTACKS)}")


def _forged_master(cluster: LocalCluster, master: str, slave: str, pids: list[int]) -> AttackOutcome:
    out = AttackOutcome(killed=list(pids))
    address = master_ha_address(cluster.root, slave)
    cluster.signal_group(master, signal.SIGKILL)
    wait_group_gone(cluster, master, pids, STOP_TIMEOUT_S)
    held = _word(cluster.root, slave, "write_pos")
    forger = ForgedMaster(address).start()
    try:
        wait_for(lambda: forger.report.hellos >= 1, FORGER_WAIT_S, "the slave to dial the forged master")
    except FaultHarnessError as e:
        out.notes.append(f"forged master at {address}: {e}")
    finally:
        report = forger.stop()
    out.notes.append(f"forged master at {address}: {report.connections} connections, {report.hellos} HELLOs, "
                     f"{report.welcomes_sent} forged WELCOMEs")
    if report.reports_after_welcome:
        out.breaches.append(f"the slave sent {report.reports_after_welcome} bytes after a forged WELCOME")
    now = _word(cluster.root, slave, "write_pos")
    if held is not None and now is not None and now != held:
        out.breaches.append(f"the slave's log moved from {held} to {now} while only the forged master ran")
    cluster.start_broker(master)
    return out


def _squat(cluster: LocalCluster, master: str, slave: str) -> AttackOutcome:
    out = AttackOutcome()
    address = master_ha_address(cluster.root, slave)
    squatter = SlotSquatter(address, connections=16).start()
    try:
        wait_for(lambda: squatter.report.opened >= 16, 10, "the squatter's connections")
        replica = _word(cluster.root, slave, "writer_pid")
        if replica:
            os.kill(replica, signal.SIGKILL)
            out.killed.append(replica)
        try:
            wait_for(lambda: _word(cluster.root, slave, "writer_pid") not in (replica, 0, None)
                     and _word(cluster.root, slave, "replica_connected")
                     and _word(cluster.root, master, "ha_slaves"), RECONNECT_TIMEOUT_S,
                     "the slave to connect again past the squatters")
        except FaultHarnessError as e:
            out.breaches.append(str(e))
    finally:
        report = squatter.stop()
    out.notes.append(f"squatter: {report.opened} connections opened, {report.closed_by_master} closed by the "
                     f"master, longest held {report.longest_held_s:.1f} s")
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _relay(cluster: LocalCluster, master: str, slave: str, pids: list[int]) -> AttackOutcome:
    out = AttackOutcome(killed=list(pids))
    real = master_ha_address(cluster.root, slave)
    listen = f"tcp://127.0.0.1:{_free_port()}"
    cluster.signal_group(slave, signal.SIGKILL)
    wait_group_gone(cluster, slave, pids, STOP_TIMEOUT_S)
    wait_for(lambda: not _word(cluster.root, master, "ha_slaves"), STOP_TIMEOUT_S,
             f"{master} to see its slave's connection closed")
    relay = Relay(listen, real, inject="report").start()
    counted = 0
    try:
        cluster.start_broker(slave, master=listen)      # its link to the master runs through the relay
        try:
            def dialed_twice() -> bool:
                nonlocal counted
                counted = max(counted, _word(cluster.root, master, "ha_slaves") or 0)
                return relay.report.connections >= 2
            wait_for(dialed_twice, FORGER_WAIT_S, "the slave to dial through the relay twice")
        except FaultHarnessError as e:
            out.notes.append(f"relay at {listen}: {e}")
    finally:
        report = relay.stop()
    out.notes.append(f"relay {listen} → {real}: {report.connections} connections, {report.frames['to_master']} "
                     f"frames to the master, {report.frames['to_slave']} to the slave, {report.injected} injected, "
                     f"{report.welcomes_passed} WELCOMEs passed")
    if report.welcomes_passed:
        out.breaches.append(f"the master welcomed a slave through the relay {report.welcomes_passed} times")
    if counted:
        out.breaches.append(f"the master counted {counted} connected slaves while the only one dialed the relay")
    again = [cluster.pid(slave)]
    try:
        again += [p.pid for p in psutil.Process(again[0]).children(recursive=True)]
    except psutil.NoSuchProcess:
        pass
    out.killed += again
    cluster.signal_group(slave, signal.SIGKILL)
    wait_group_gone(cluster, slave, again, STOP_TIMEOUT_S)
    cluster.start_broker(slave)                         # the direct link again
    caught_up(cluster.root, slave, master, f"{slave} to catch up on its direct link", everything=False)
    return out


def _promote_recovering(cluster: LocalCluster, master: str, slave: str, pids: list[int]) -> AttackOutcome:
    out = AttackOutcome(killed=list(pids))
    over = Failover(cluster, master, slave)         # before anything is cut: its give-back reads new cuts
    cluster.signal_group(master, signal.SIGKILL)
    wait_group_gone(cluster, master, pids, STOP_TIMEOUT_S)
    name, _, sid = slave.partition(".")
    attack = promote_during_recovery(cluster, name, int(sid), old_master=master, role="SYNC_MASTER")
    out.notes.append(f"promote while {master} was frozen ({attack.window}, {attack.frozen_s:.2f} s): "
                     f"{attack.outcome}{' — ' + attack.error_type if attack.error_type else ''}")
    if attack.outcome == "promoted":
        if attack.window == "starting":
            out.breaches.append(f"{slave} was promoted while {master} recovered as the master")
        caught_up(cluster.root, master, slave, f"{master} to join the promoted {slave}", everything=False)
        out.failover = over
    elif attack.outcome not in ("refused", "lock-timeout"):
        out.breaches.append(f"promote ended with {attack.error_type}: {attack.error}")
    return out


def _member_admin(cluster: LocalCluster, master: str, topic: str, group: str) -> AttackOutcome:
    out = AttackOutcome()
    why = as_user.available()
    if why:
        out.notes.append(f"member-admin skipped: {why}")
        return out
    with Admin(cluster.root) as admin:
        before = admin.route(topic)
    scratch = tempfile.mkdtemp(prefix="hmq-member-", dir="/tmp")
    os.chmod(scratch, 0o777)
    try:
        run = as_user.run_as(MEMBER_UID, MEMBER_UID, [MEMBER_GID], MEMBER_CODE, cluster.root, "--victim-topic", topic,
                             "--victim-group", group, "--broker", master.split(".")[0], "--groups",
                             str(MEMBER_GROUPS), "--auto-topics", str(MEMBER_TOPICS), scratch=scratch,
                             reach=(cluster.root,))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    try:
        report = orjson.loads(run.stdout.strip().splitlines()[-1])
    except (IndexError, orjson.JSONDecodeError):
        raise FaultHarnessError(f"the member's attack printed no report (exit {run.returncode}):\n"
                                f"{run.stderr[-2000:]}") from None
    tried = {**report["admin"], **report["reregister"]}
    got = sorted(f"{what}: {how}" for what, how in tried.items() if how not in ("refused", "not supported"))
    out.breaches += [f"a group member's administration was not refused: {g}" for g in got]
    refused, unserved = (sum(h == how for h in tried.values()) for how in ("refused", "not supported"))
    out.notes.append(f"member uid {report['uid']}: {len(tried)} admin attempts, {refused} refused, {unserved} "
                     f"codes the socket does not serve; heartbeats {report['heartbeats_accepted']} accepted / "
                     f"{report['heartbeats_refused']} refused; auto topics {report['auto_topics_accepted']} / "
                     f"{report['auto_topics_refused']}" + (f"; errors: {report['other_errors'][:3]}"
                                                           if report["other_errors"] else ""))
    with Admin(cluster.root) as admin:
        after = admin.route(topic)
    if after != before:
        out.breaches.append(f"the route of {topic} changed under a member: {before} → {after}")
    return out
