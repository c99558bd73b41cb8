"""The process groups of one broker name on one root, and which of them is the master now.

A broker name's instances are ``ROOT/brokers/NAME`` (started with id 0) and ``NAME.ID`` (ids ≥ 1).
Which one is the master is not its directory but its role (``live/role.py``): a running instance
says it in its state segment (``role``, ``role_epoch``), a stopped one in its ``config/role.json``
(no record: id 0 is the master). Readers of the root — consumers' views, the promote command —
find the master here; when two running instances both say master (an old master that has not yet
learnt of a promotion), the one with the newer epoch is.
"""
from __future__ import annotations

import os

from ..errors import ConfigError, SegmentError
from ..jsonfile import read_json
from ..root import RootPaths, broker_instance, shm_name
from .role import ROLE_FILE, RoleRecord
from .role_lock import Starting, starting
from .state import BrokerState


def instance_ids(root: str, name: str) -> list[int]:
    """The ids of ``name``'s instance directories on this root, sorted (0 first)."""
    prefix = name + "."
    ids = []
    for n in RootPaths(root).instances():
        if n == name:
            ids.append(0)
        elif n.startswith(prefix) and n[len(prefix):].isdecimal() and n[len(prefix)] != "0":
            ids.append(int(n[len(prefix):]))
    return sorted(ids)


def live_state(root: str, instance: str) -> BrokerState | None:
    """A running instance's state segment, or None. A killed broker leaves its segment behind until
    it starts again: following that one would show a store frozen at the kill while recovery
    rewrites it, so it counts as not running."""
    try:
        st = BrokerState.attach(shm_name(root, instance, "state"), readonly=True)
    except SegmentError:
        return None
    if not st.gone():
        return st
    st.close()
    return None


def running(root: str, name: str) -> list[tuple[str, BrokerState]]:
    """Every running instance of ``name``: masters first (the newest epoch first), then slaves by id.
    The caller closes the states."""
    found = []
    for i in instance_ids(root, name):
        st = live_state(root, broker_instance(name, i))
        if st is not None:
            found.append((st.is_slave, -st.role_epoch, i, broker_instance(name, i), st))
    found.sort(key=lambda f: f[:3])
    return [(f[3], f[4]) for f in found]


def _first(root: str, name: str, slave: bool) -> tuple[str, BrokerState] | None:
    out = None
    for instance, st in running(root, name):
        if out is None and st.is_slave == slave:
            out = (instance, st)
        else:
            st.close()
    return out


def running_master(root: str, name: str) -> tuple[str, BrokerState] | None:
    """The running master of ``name`` on this root — (its instance, its state) — or None. The
    usual case (instance ``NAME``, never promoted) costs one attach."""
    st = live_state(root, name)
    if st is not None and not st.is_slave:
        return name, st
    if st is not None:
        st.close()
    return _first(root, name, slave=False)


def running_slave(root: str, name: str) -> tuple[str, BrokerState] | None:
    """A running slave of ``name`` on this root, the lowest id first, or None."""
    return _first(root, name, slave=True)


def starting_master(root: str, name: str) -> tuple[str, Starting] | None:
    """An instance of ``name`` that is starting as a master on this root — it decided its role and
    is recovering, its state not yet published (``role_lock.py``) — or None."""
    for i in instance_ids(root, name):
        s = starting(root, broker_instance(name, i))
        if s is not None and not s.is_slave:
            return broker_instance(name, i), s
    return None


def record(root: str, instance: str) -> RoleRecord | None:
    """An instance's role record (None: none, or unreadable — then its id says its role)."""
    try:
        d = read_json(os.path.join(RootPaths(root).config_dir(instance), ROLE_FILE), default=None)
        return RoleRecord.from_dict(d) if d is not None else None
    except (ConfigError, TypeError):
        return None


def recorded_master(root: str, name: str) -> str:
    """The instance that was the master when the group last stopped: the newest epoch whose record
    says master (``NAME`` when nothing was ever promoted) — what a reader of a stopped group reads."""
    best, best_epoch = name, -1
    for i in instance_ids(root, name):
        instance = broker_instance(name, i)
        rec = record(root, instance)
        if rec is None:
            if i == 0 and best_epoch < 0:
                best_epoch = 0
            continue
        if not rec.is_slave and rec.epoch > best_epoch:
            best, best_epoch = instance, rec.epoch
    return best


def newest_epoch(root: str, name: str) -> int:
    """The newest epoch any instance of ``name`` on this root recorded (0: never promoted)."""
    return max([0] + [r.epoch for i in instance_ids(root, name)
                      if (r := record(root, broker_instance(name, i))) is not None])
