"""Promotion, the operator's side: a slave becomes the master of its group, and the old master later
rejoins as a slave (README "Replication"; beyond RocketMQ 4, whose operators edit brokerId and brokerRole by hand).

``hostmq ha promote ROOT --name NAME --id ID`` (:func:`promote`), on the slave's host:

1. holds NAME's role lock (``role_lock.py``) for the whole decision — an instance starting reads
   its role under the same lock — and takes the ``broker.lock`` of every other stopped instance of
   NAME on this root; an instance that runs or is starting (recovering, its ``starting.json``
   published) as a master makes the slave refuse; one that holds its broker.lock but has not yet
   read its role is demoted like a stopped one (it reads the new record);
2. asks the slave (PROMOTE_BROKER, ``hostmq/broker/promotion.py``) — which refuses while its replica is connected
   to a master (the master runs and is reachable), or when it has not stored everything its master
   said it holds (``--force`` accepts losing that tail); otherwise it records its new role
   (``role.json``, one epoch past the newest it or the command knows) and starts again in the same
   process as the master: recovery, writer, scheduler, replication listener, id 0 with the
   NameServers (the route moves to its address at its first registration);
3. records, for each former master it locked, that it is now a slave (``role.demoted``): started
   again, it joins the new master, whose handshake finds where their logs part; the old master cuts
   what the new one never had (keeping the cut bytes in ``store/cut-FROM-TO.bin``) and catches up.

Across hosts the old master's root is out of reach: run ``hostmq ha demote`` there before starting it
(a master started without that keeps serving as a master of its own root).
"""
from __future__ import annotations

import logging
import os
import time

from .. import records as R
from ..broker.promotion import MASTER_ROLES
from ..client.instance import ClientInstance
from ..errors import ConfigError, ConnectError, PromotionRefusedError
from ..jsonfile import write_json
from ..live import group, role
from ..live.role_lock import PROMOTE_LOCK_TIMEOUT_S, RoleLock, starting
from ..locks import lock_if_stopped
from ..protocol.codes import RequestCode
from ..protocol.messages import PromoteRequest
from ..root import RootPaths, broker_instance, ipc_address

log = logging.getLogger(__name__)

PROMOTE_TIMEOUT_S = 120.0           # recovery of a large store is part of the restart
__all__ = ["MASTER_ROLES", "PROMOTE_LOCK_TIMEOUT_S", "PROMOTE_TIMEOUT_S", "demote", "promote"]


def promote(root: str, name: str, broker_id: int, new_role: str = "ASYNC_MASTER", force: bool = False,
            timeout_s: float = PROMOTE_TIMEOUT_S, instance_client=None,
            lock_timeout_s: float = PROMOTE_LOCK_TIMEOUT_S) -> dict:
    """Make the slave ``NAME.ID`` of this root the master of its group (see the module docstring).
    Returns ``{"instance", "epoch", "write_pos", "demoted": [instances]}`` once it runs as the master.
    The whole decision holds the name's role lock (RoleLockTimeoutError after ``lock_timeout_s``)."""
    paths = RootPaths.of(root).require()
    target = broker_instance(name, broker_id)
    if not os.path.isdir(paths.broker_dir(target)):
        raise ConfigError(f"no broker {target} under {paths.root}")
    client = instance_client or ClientInstance(paths.root)
    try:
        with RoleLock(paths.root, name).hold(lock_timeout_s):
            reply, demote = _decide_promotion(paths, client, name, broker_id, target, new_role, force)
    finally:
        if instance_client is None:
            client.close()
    _await_master(paths.root, name, target, timeout_s)
    return {"instance": target, "epoch": reply["epoch"], "write_pos": reply.get("write_pos", 0),
            "demoted": demote}


def _decide_promotion(paths: RootPaths, client, name: str, broker_id: int, target: str, new_role: str,
                      force: bool) -> tuple[dict, list[str]]:
    """Under the role lock: ask the slave, then record every other instance that would start as a
    master — stopped, or holding its broker.lock but not yet past its role decision — as a slave."""
    held: dict[str, int] = {}
    demote: list[tuple[int, str]] = []
    try:
        for i in group.instance_ids(paths.root, name):
            instance = broker_instance(name, i)
            if instance == target:
                continue
            fd = lock_if_stopped(paths.broker_lock(instance))
            if fd is not None:
                held[instance] = fd
            elif _past_role_decision(paths.root, instance):
                continue                    # running or starting: the slave refuses while it is a master
            rec = group.record(paths.root, instance)
            if (rec is None and i == 0) or (rec is not None and not rec.is_slave):
                demote.append((i, instance))
        epoch = group.newest_epoch(paths.root, name)
        reply = client.broker_request(ipc_address(paths.broker_socket(target)), RequestCode.PROMOTE_BROKER,
                                      PromoteRequest.of(role=new_role, force=force, epoch=epoch).to_fields(),
                                      timeout_s=10.0).fields
        for i, instance in demote:
            write_json(role.instance_path(paths, instance), role.demoted(i, broker_id, reply["epoch"]).to_dict())
            log.warning("%s will join %s as a slave when it starts", instance, target)
    finally:
        for fd in held.values():
            os.close(fd)
    return reply, [inst for _, inst in demote]


def _past_role_decision(root: str, instance: str) -> bool:
    """Whether an instance whose broker.lock is held has decided its role: it runs (a live state
    segment) or publishes that it is starting. One that has not reads its role after the lock is
    released (``fencing.decide``), so its record may still be changed. One that never ran has no
    broker.lock file: True, nothing to decide for it."""
    if not os.path.exists(RootPaths(root).broker_lock(instance)):
        return True
    st = group.live_state(root, instance)
    if st is not None:
        st.close()
        return True
    return starting(root, instance) is not None


def _await_master(root: str, name: str, target: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = group.running_master(root, name)
        if found is not None:
            instance, st = found
            running = st.get("broker_state") == R.BROKER_RUNNING
            st.close()
            if instance == target and running:
                return
        time.sleep(0.05)
    raise ConnectError(f"{target} did not run as the master of {name} within {timeout_s:.0f} s (see its log)")


def demote(root: str, name: str, broker_id: int, epoch: int, slave_id: int = 1,
           lock_timeout_s: float = PROMOTE_LOCK_TIMEOUT_S) -> dict:
    """Record that the stopped instance ``NAME[.ID]`` of this root is a slave of epoch ``epoch``
    (its group's master was promoted on another host): started again — with ``--master`` pointing at
    the new master — it joins as a slave and cuts what the new master never had."""
    paths = RootPaths.of(root).require()
    instance = broker_instance(name, broker_id)
    if not os.path.isdir(paths.broker_dir(instance)):
        raise ConfigError(f"no broker {instance} under {paths.root}")
    with RoleLock(paths.root, name).hold(lock_timeout_s):
        fd = lock_if_stopped(paths.broker_lock(instance))
        if fd is None and os.path.exists(paths.broker_lock(instance)):
            raise PromotionRefusedError(f"broker {instance} runs: stop it before demoting it")
        try:
            record = role.RoleRecord("SLAVE", epoch, slave_id if broker_id == 0 else 0)
            if broker_id == 0 and record.slave_id < 1:
                raise ConfigError("a demoted instance 0 needs a --slave-id ≥ 1 to register under")
            write_json(role.instance_path(paths, instance), record.to_dict())
        finally:
            if fd is not None:
                os.close(fd)
    log.warning("%s will start as a slave (epoch %d)", instance, epoch)
    return {"instance": instance, **record.to_dict()}
