"""Which role a broker process group plays now (README "Replication": promote and rejoin).

A broker's *instance* — its directory ``ROOT/brokers/NAME`` or ``NAME.ID``, its store, its IPC names —
is fixed by the id it was started with. Its *role* starts as that id says (0: the master, ≥ 1: a
slave) and changes only by a promotion (``hostmq ha promote``): the promoted slave becomes the
master of its group, and the old master, when it starts again, a slave. The change is kept in the
instance's ``config/role.json``, which overrides what the id and ``broker.role`` say::

    {"role": "ASYNC_MASTER" | "SYNC_MASTER" | "SLAVE", "epoch": E, "slave_id": K}

``epoch`` counts promotions of the group (the first master has 0); ``slave_id`` is the id a demoted
instance whose directory id is 0 registers under (the promoted slave's old id: the two swap ids
with the NameServers, never directories). The file has one writer at a time: the promote command
writes both records while it holds each instance's ``broker.lock`` or while the broker it promotes
asks for it (``service.promote``); a running broker never writes it otherwise.

Pure except :func:`load` and :func:`save`.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from ..config import ROLES
from ..errors import ConfigError
from ..jsonfile import read_json, write_json
from .runtime import BrokerRuntime

ROLE_FILE = "role.json"
MAX_EPOCH = 1 << 40


@dataclass(frozen=True)
class RoleRecord:
    role: str                   # one of config.ROLES
    epoch: int = 0
    slave_id: int = 0           # a demoted instance of directory id 0: the id it registers under

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ConfigError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        for key, top in (("epoch", MAX_EPOCH), ("slave_id", 1024)):
            v = getattr(self, key)
            if type(v) is not int or not 0 <= v <= top:
                raise ConfigError(f"{key} must be an int in 0..{top}, got {v!r}")

    @property
    def is_slave(self) -> bool:
        return self.role == "SLAVE"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d) -> "RoleRecord":
        if not isinstance(d, dict) or set(d) - {"role", "epoch", "slave_id"}:
            raise ConfigError(f"a role record is {{role, epoch, slave_id}}, got {d!r}")
        return cls(**d)


def path(rt: BrokerRuntime) -> str:
    return rt.config_file(ROLE_FILE)


def load(rt: BrokerRuntime) -> RoleRecord | None:
    """The instance's role record, None when it never changed role."""
    d = read_json(path(rt), default=None)
    if d is None:
        return None
    try:
        return RoleRecord.from_dict(d)
    except (ConfigError, TypeError) as e:
        raise ConfigError(f"{path(rt)}: {e}") from None


def save(rt: BrokerRuntime, record: RoleRecord) -> None:
    write_json(path(rt), record.to_dict())


def apply(rt: BrokerRuntime, record: RoleRecord | None) -> BrokerRuntime:
    """``rt`` playing the recorded role (``rt`` itself when there is no record)."""
    if record is None:
        return rt
    b = dataclasses.replace(rt.config.broker, role=record.role)
    return dataclasses.replace(rt, config=dataclasses.replace(rt.config, broker=b), epoch=record.epoch,
                               slave_id=record.slave_id if record.is_slave and rt.broker_id == 0 else 0)


def current(rt: BrokerRuntime) -> BrokerRuntime:
    """The runtime an instance starts with: its id's role, or the one its role record says."""
    return apply(rt, load(rt))


def promoted(slave: BrokerRuntime, role: str) -> RoleRecord:
    """The record of a slave becoming its group's master (one epoch after the newest it knows)."""
    if role == "SLAVE":
        raise ConfigError("a slave is promoted to ASYNC_MASTER or SYNC_MASTER")
    return RoleRecord(role, slave.epoch + 1)


def demoted(old_master_id: int, new_master_id: int, epoch: int) -> RoleRecord:
    """The record of the instance with directory id ``old_master_id`` joining the master of
    directory id ``new_master_id`` as a slave: under its own id, or — the directory of id 0 — under
    the id the new master had."""
    return RoleRecord("SLAVE", epoch, new_master_id if old_master_id == 0 else 0)


def _is_master(broker_id: int, rec: RoleRecord | None) -> bool:
    return rec is None and broker_id == 0 or rec is not None and not rec.is_slave


def effective(broker_id: int, records: dict[int, RoleRecord | None]) -> RoleRecord | None:
    """The record instance ``broker_id`` starts with, given the records of every instance of its name
    on the root (``records[broker_id]`` its own; None: no record). Pure.

    An instance that would start as a master at an epoch below the newest recorded for its name
    starts as a slave instead, whatever its own record says (issue 27): a promotion happened that
    it missed — its record was unreachable, restored from a backup, or the demotion raced it. It
    joins the newest master (for directory id 0: under that master's id, or else the lowest id no
    instance here uses)."""
    own = records.get(broker_id)
    newest = max([0] + [r.epoch for r in records.values() if r is not None])
    own_epoch = own.epoch if own is not None else 0
    if not _is_master(broker_id, own) or own_epoch >= newest:
        return own
    masters = sorted(i for i, r in records.items() if r is not None and not r.is_slave and r.epoch == newest)
    if masters:
        new_master_id = masters[0]
    else:
        new_master_id = min(set(range(1, len(records) + 2)) - set(records))
    return demoted(broker_id, new_master_id, newest)


def newer_master(own_epoch: int, seen: list[tuple[str, int, bool]]) -> tuple[str, int] | None:
    """Among ``seen`` — (instance, epoch, says it is a master) of the other instances of a running
    master's name — the newest master of an epoch above ``own_epoch``: the one this master must step
    down for (``broker/fencing.py``). None: it is the newest. Pure."""
    best = None
    for instance, epoch, is_master in seen:
        if is_master and epoch > own_epoch and (best is None or epoch > best[1]):
            best = (instance, epoch)
    return best


def slave_read_lag_bytes(rt: BrokerRuntime, ram_bytes: int) -> int:
    """How far behind the master's write position a consumer's next message may be before it
    reads from a slave (``broker.slave_read_enable``; RocketMQ ``accessMessageInMemoryMaxRatio``:
    beyond that share of RAM the bytes are likely not in the page cache, and reading them from the
    master's disk competes with its writes). 0: never — off, or not a master. The broker publishes
    it in its state; consumers decide per read (``PullConsumer``)."""
    b = rt.config.broker
    if rt.is_slave or not b.slave_read_enable:
        return 0
    return max(1, int(ram_bytes * b.access_message_in_memory_max_ratio / 100))


def instance_path(root_paths, instance: str) -> str:
    """``role.json`` of an instance of the group (the promote command writes another's)."""
    return os.path.join(root_paths.config_dir(instance), ROLE_FILE)
