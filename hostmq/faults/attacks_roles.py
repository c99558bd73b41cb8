"""Attack 2 of issue 27: ``hostmq ha promote`` while a restarted old master is still recovering.

:func:`promote_during_recovery` starts the stopped old master of a broker name again, freezes its
whole process group (SIGSTOP) once it holds its ``broker.lock`` and before its state segment is
published — inside its recovery — runs the promote an operator would run against the slave, thaws
the old master (SIGCONT) and waits until the name has a running master again. Before issue 27 the
promote succeeded there and both served as masters (epochs 0 and 1) on one root; now the promote
either meets the starting master and is refused, or waits for the role lock and times out naming
its holder, or — when the freeze came before the old master read its role — runs wholly before it,
so the old master reads the demotion and starts as a slave. :class:`RoleAttack` says which.

The caller supplies the load and the checks (one master per name at every sampled instant, no
acknowledged message lost): ``tests/e2e/test_role_fencing.py``; the fault harness can run it as a
kind later. Ownership: this module signals only the old master's process group it started.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field

from ..admin import promotion
from ..live import group
from ..live.role_lock import lock_holders, lock_path, starting
from ..cluster import LocalCluster
from ..errors import FaultHarnessError, HostMQError
from ..root import RootPaths

WINDOW_TIMEOUT_S = 60.0             # the restarted master reaches the window (or runs) within this
PROMOTE_WAIT_S = 20.0               # how long the attack's promote waits for the new master to run
LOCK_WAIT_S = 3.0                   # … and for the role lock
POLL_S = 0.0005


@dataclass
class RoleAttack:
    """What happened. ``window``: where the old master was frozen — ``"starting"`` (it decided to be
    the master and was recovering, its ``starting.json`` published), ``"deciding"`` (holding the
    role lock), ``"before-decision"`` (holding broker.lock, role not read yet) or ``"missed"`` (its
    state was published first). ``outcome``: ``"refused"`` (PromotionRefusedError), ``"lock-timeout"``
    (RoleLockTimeoutError) or ``"promoted"``; ``error``: the typed error's text; ``promoted``: what
    promote returned; ``frozen_s``: how long the old master stayed frozen."""

    window: str
    outcome: str
    error: str = ""
    error_type: str = ""
    promoted: dict = field(default_factory=dict)
    frozen_s: float = 0.0


def _window(root: str, name: str, pid: int) -> str | None:
    """Where the starting broker ``pid`` (instance ``name``) is, None while it has not taken broker.lock."""
    paths = RootPaths(root)
    if pid not in lock_holders(paths.broker_lock(name)):
        return None
    st = group.live_state(root, name)
    if st is not None:
        st.close()
        return "missed"
    if starting(root, name) is not None:
        return "starting"
    name_of_group = name.split(".")[0]
    return "deciding" if pid in lock_holders(lock_path(root, name_of_group)) else "before-decision"


def _freeze_in_window(cluster: LocalCluster, old_master: str, timeout_s: float) -> str:
    """Start ``old_master`` and SIGSTOP its process group inside its start-up window; the window."""
    cluster.start_broker(old_master, wait=False)
    pid = cluster.pid(old_master)
    deadline = time.monotonic() + timeout_s
    while True:
        where = _window(cluster.root, old_master, pid)
        # The recovery window is the one the attack is about; stop on the others only if it is missed.
        if where in ("starting", "missed"):
            os.killpg(pid, signal.SIGSTOP)
            # Read again once frozen: it may have moved on between the look and the signal.
            return _window(cluster.root, old_master, pid) or "before-decision"
        if cluster.processes[old_master].poll() is not None:
            raise FaultHarnessError(f"{old_master} exited while starting:\n{cluster.log_tail(old_master)}")
        if time.monotonic() >= deadline:
            raise FaultHarnessError(f"{old_master} did not reach its start-up window within {timeout_s:.0f} s")
        time.sleep(POLL_S)


def promote_during_recovery(cluster: LocalCluster, name: str = "broker-a", slave_id: int = 1,
                            old_master: str | None = None, role: str = "ASYNC_MASTER",
                            window_timeout_s: float = WINDOW_TIMEOUT_S) -> RoleAttack:
    """Run the attack on ``cluster`` whose old master ``old_master`` (default ``name``) is stopped
    (killed) and whose slave ``NAME.SLAVE_ID`` runs. Returns once the old master is thawed and the
    name has a running master again (either of them)."""
    old_master = old_master or name
    window = _freeze_in_window(cluster, old_master, window_timeout_s)
    frozen_at = time.monotonic()
    attack = RoleAttack(window=window, outcome="")
    try:
        attack.promoted = promotion.promote(cluster.root, name, slave_id, role, timeout_s=PROMOTE_WAIT_S,
                                            lock_timeout_s=LOCK_WAIT_S)
        attack.outcome = "promoted"
    except HostMQError as e:
        attack.outcome = {"PromotionRefusedError": "refused", "RoleLockTimeoutError": "lock-timeout"}.get(
            type(e).__name__, "error")
        attack.error, attack.error_type = str(e), type(e).__name__
    finally:
        attack.frozen_s = time.monotonic() - frozen_at
        os.killpg(cluster.pid(old_master), signal.SIGCONT)
    cluster.await_broker(old_master)
    return attack
