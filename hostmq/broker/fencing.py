"""A broker's own role decisions (issue 27, attack 2): what it starts as, and stepping down when a
newer master of its name appears.

**Starting** (:func:`decide`, each run of ``supervisor.run``): under its name's role lock
(``role_lock.py``) the instance reads every role record of its name on the root, applies
``role.effective`` — a master whose epoch is below the newest recorded starts as a slave, and its
record says so from then on — and publishes that it is starting in that role (``starting.json``)
before it lets the lock go and recovers its store. ``hostmq ha promote`` therefore either sees it
(and refuses while it starts as a master) or has finished before it reads its role.

**Serving** (:func:`newer_master_seen`, every :data:`ROLE_CHECK_INTERVAL_S` on a master's control
loop): two masters of one name can still arise where no lock is shared — a master on another
host's root that was stopped (SIGSTOP, a partition) while its slave was promoted and `ha demote`
then written to its root, or a role record restored by hand. A master that sees a role record of
its name newer than its epoch — another instance's master record, or its own record demoted —
**steps down** (:func:`fence`): its writer refuses every send with ``NotMasterError`` (nothing is
stored), it logs one ERROR line that starts with :data:`ALERT` (docs/trust-roles.md), and it
starts again — as a slave, by :func:`decide`.
"""
from __future__ import annotations

import logging

from ..root import broker_instance
from ..live import group, role
from ..live.role_lock import START_LOCK_TIMEOUT_S, RoleLock, publish_starting
from ..live.runtime import BrokerRuntime

log = logging.getLogger(__name__)

ROLE_CHECK_INTERVAL_S = 1.0
ALERT = "two masters of"            # the fixed start of the step-down log line (operators alert on it)


def _records(rt: BrokerRuntime, own: role.RoleRecord | None) -> dict[int, role.RoleRecord | None]:
    records = {i: group.record(rt.root, broker_instance(rt.name, i)) for i in group.instance_ids(rt.root, rt.name)}
    records[rt.broker_id] = own             # its own, read strictly (a broken record is a ConfigError)
    return records


def decide(rt: BrokerRuntime, timeout_s: float = START_LOCK_TIMEOUT_S) -> BrokerRuntime:
    """The runtime this run of instance ``rt`` starts with (see the module docstring); it is
    published as starting. RoleLockTimeoutError when the lock stays held ``timeout_s``."""
    with RoleLock(rt.root, rt.name).hold(timeout_s):
        own = role.load(rt)
        rec = role.effective(rt.broker_id, _records(rt, own))
        if rec is not own:
            role.save(rt, rec)
            log.warning("broker %s: starts as a slave of epoch %d, not as the master its role record says "
                        "(epoch %d): a newer master of %s is recorded on this root", rt.instance, rec.epoch,
                        own.epoch if own is not None else 0, rt.name)
        out = role.apply(rt, rec)
        publish_starting(rt.root, rt.instance, out.config.broker.role, out.epoch)
    return out


def newer_master_seen(rt: BrokerRuntime) -> tuple[str, int] | None:
    """For a running master: the newer master it must step down for — (who, epoch) — or None."""
    seen = []
    for i in group.instance_ids(rt.root, rt.name):
        instance = broker_instance(rt.name, i)
        rec = group.record(rt.root, instance)
        if rec is None:
            continue                        # never promoted: epoch 0, never newer than a master's
        if i == rt.broker_id:
            # Its own record rewritten to a newer epoch (``ha demote`` while it was stopped) says
            # a newer master exists, wherever it runs.
            seen.append((f"the master its own role record names (epoch {rec.epoch})", rec.epoch, rec.is_slave))
        else:
            seen.append((instance, rec.epoch, not rec.is_slave))
    return role.newer_master(rt.epoch, seen)


def fence(rt: BrokerRuntime, state, newer: tuple[str, int]) -> None:
    """Stop accepting sends (the writer answers NotMasterError from now on) and say so, once."""
    state.set("fenced_epoch", newer[1])
    alert(rt, newer)


def alert(rt: BrokerRuntime, newer: tuple[str, int]) -> None:
    """The one line an operator alerts on (docs/trust-roles.md)."""
    who, epoch = newer
    log.error("%s %s: %s (epoch %d) steps down for %s (epoch %d); sends refused with NotMasterError, "
              "starting again as a slave", ALERT, rt.name, rt.instance, rt.epoch, who, epoch)
