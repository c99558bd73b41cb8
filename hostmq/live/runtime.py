"""What every process of one broker needs to know: its identity, its config, and the names derived
from the root (sockets, files, shared-memory segments, semaphores). Picklable: the broker hands it to
the writer, dispatcher and flusher it spawns.

Names (``root.shm_name``: ``/hostmq.<hash12 of root + broker name>.<kind>.<n>``)::

    state.0     broker state segment (records.BROKER_STATE)
    pool.<n>    transient store pool buffers (created by the broker, written by its writer)

Wake-ups are futex words (``hostmq.shm.futex``) in the state segment and in the broker's doorbell
memfd; producers' rings are sealed memfds handed over ``session.sock``: neither has a name in
``/dev/shm``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..config import Config
from ..errors import ConfigError
from ..root import RootPaths, broker_instance, ipc_address, resolve_root, shm_name, shm_prefix

MAX_BROKER_NAME_CHARS = 64
MAX_RING_DATA_BYTES = 256 << 20     # the broker refuses larger ingress rings (bounds a torn commitlog tail)


def check_broker_name(name: str) -> str:
    """Broker names become directory and IPC name parts: letters, digits, '-' and '_' only."""
    if not isinstance(name, str) or not name or len(name) > MAX_BROKER_NAME_CHARS or \
            not name.replace("-", "").replace("_", "").isalnum() or not name.isascii():
        raise ConfigError(f"broker name must be 1..{MAX_BROKER_NAME_CHARS} letters, digits, '-' or '_', "
                          f"got {name!r}")
    return name


@dataclass(frozen=True)
class BrokerRuntime:
    root: str
    name: str = "broker-a"
    broker_id: int = 0                  # the instance's id: its directory and IPC names (never changes)
    config: Config = field(default_factory=Config)
    epoch: int = 0                      # promotions of the group this instance knows of (live/role.py)
    slave_id: int = 0                   # a demoted instance of id 0: the id it registers under as a slave

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", resolve_root(self.root))
        check_broker_name(self.name)
        if not isinstance(self.broker_id, int) or not 0 <= self.broker_id <= 1024:
            raise ConfigError(f"broker id must be 0 (master) .. 1024, got {self.broker_id!r}")
        # Only a promotion (a role record, live/role.py) makes a slave's instance a master or the
        # master's instance a slave; the configuration alone cannot.
        if self.broker_id == 0 and self.is_slave and not 1 <= self.slave_id <= 1024:
            raise ConfigError(f"broker {self.name} id 0 is the master: a slave needs an id ≥ 1 (broker.role is "
                              f"{self.config.broker.role})")
        if self.broker_id != 0 and not self.is_slave and self.epoch < 1:
            raise ConfigError(f"broker {self.name} id {self.broker_id} is a slave (broker.role must be SLAVE, "
                              f"is {self.config.broker.role}); `hostmq ha promote` makes it a master")

    # -- identity -------------------------------------------------------------------------------------
    @property
    def instance(self) -> str:
        """``NAME`` (master) or ``NAME.ID`` (slave): its directory under the root and its IPC names."""
        return broker_instance(self.name, self.broker_id)

    @property
    def is_slave(self) -> bool:
        return self.config.broker.role == "SLAVE"

    @property
    def registered_id(self) -> int:
        """The id the NameServers know this broker by: 0 while it is the master of its group."""
        if not self.is_slave:
            return 0
        return self.broker_id or self.slave_id

    # -- files --------------------------------------------------------------------------------------
    @property
    def paths(self) -> RootPaths:
        return RootPaths(self.root)

    @property
    def broker_dir(self) -> str:
        return self.paths.broker_dir(self.instance)

    @property
    def store_dir(self) -> str:
        return self.paths.store_dir(self.instance)

    @property
    def config_dir(self) -> str:
        return self.paths.config_dir(self.instance)

    @property
    def socket_path(self) -> str:
        return self.paths.broker_socket(self.instance)

    @property
    def address(self) -> str:
        return ipc_address(self.socket_path)

    @property
    def session_socket_path(self) -> str:
        return self.paths.broker_session_socket(self.instance)

    @property
    def lock_path(self) -> str:
        return self.paths.broker_lock(self.instance)

    def config_file(self, name: str) -> str:
        return os.path.join(self.config_dir, name)

    # -- shared memory -------------------------------------------------------------------------------
    def shm(self, kind: str, n: int | str = 0) -> str:
        return shm_name(self.root, self.instance, kind, n)

    @property
    def state_name(self) -> str:
        return self.shm("state")

    def pool_names(self, count: int) -> list[str]:
        """Transient store pool buffers (created by the broker, written by its writer)."""
        return [self.shm("pool", i) for i in range(count)]

    @property
    def shm_prefix(self) -> str:
        """Prefix of every IPC name of this broker (for reclaiming and leak checks)."""
        return shm_prefix(self.root, self.instance)
