"""Promotion, the broker's side: PROMOTE_BROKER on a slave's control socket (:func:`handle`) — the
slave refuses (:func:`refusal`) while its replica is connected to a master (the master runs and is
reachable), or when it has not stored everything its master said it holds (``force`` accepts losing
that tail); otherwise it records its new role (``role.json``, one epoch past the newest it or the
command knows) and starts again in the same process as the master. The operator's side — the role
lock, the old masters demoted, waiting for the new one — is ``hostmq/admin/promotion.py``.
"""
from __future__ import annotations

import logging

from ..errors import PromotionRefusedError, ValidationError
from ..protocol.messages import PromoteRequest
from ..live import group, role
from ..live.runtime import BrokerRuntime
from ..live.state import pid_alive

log = logging.getLogger(__name__)

MASTER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER")


def refusal(*, is_slave: bool, replica_connected: bool, write_pos: int, master_end_pos: int,
            master_running: str | None, force: bool, master_starting: str | None = None) -> str | None:
    """Why a slave may not become the master now (None: it may). Pure."""
    if not is_slave:
        return "it is the master of its group already"
    if master_running is not None:
        return f"the master {master_running} runs on this root: stop it first"
    if master_starting is not None:
        return (f"the master {master_starting} is starting on this root (recovering its store) and will "
                f"serve as the master: stop it first, or let it run")
    if replica_connected:
        return "its replica is connected to the master, which runs and is reachable: stop the master first"
    if write_pos < master_end_pos and not force:
        return (f"it holds the commitlog up to {write_pos} but its master said it held {master_end_pos}: "
                f"{master_end_pos - write_pos} bytes would be lost (--force accepts that)")
    return None


def handle(rt: BrokerRuntime, state, req: PromoteRequest) -> role.RoleRecord:
    """PROMOTE_BROKER on the slave's control socket (its types checked by the supervisor's decode
    step): the role record it starts again with (already saved), or PromotionRefusedError.
    ``state``: the slave's BrokerState."""
    new_role, force, epoch = req.role, req.force, req.epoch
    if new_role not in MASTER_ROLES or not 0 <= epoch < role.MAX_EPOCH:
        raise ValidationError(f"PROMOTE_BROKER takes role in {MASTER_ROLES}, force: bool and epoch ≥ 0, got {req!r}")
    found = group.running_master(rt.root, rt.name)
    if found is not None:
        found[1].close()
    starting = group.starting_master(rt.root, rt.name)
    # A killed replica leaves the word set until its successor starts: only a live one counts.
    connected = bool(state.get("replica_connected")) and pid_alive(state.get("writer_pid"))
    why = refusal(is_slave=rt.is_slave, replica_connected=connected,
                  write_pos=state.get("write_pos"), master_end_pos=state.get("master_end_pos"),
                  master_running=found[0] if found is not None else None, force=force,
                  master_starting=f"{starting[0]} (pid {starting[1].pid})" if starting is not None else None)
    if why is not None:
        raise PromotionRefusedError(f"broker {rt.instance} is not promoted: {why}")
    record = role.RoleRecord(new_role, max(rt.epoch, epoch) + 1)
    role.save(rt, record)
    log.warning("broker %s: promoted to %s of %s (epoch %d) at commitlog offset %d%s", rt.instance, new_role,
                rt.name, record.epoch, state.get("write_pos"),
                "" if state.get("write_pos") >= state.get("master_end_pos") else
                f", {state.get('master_end_pos') - state.get('write_pos')} bytes behind what its master held")
    return record
