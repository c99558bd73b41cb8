"""Resolve a hostmq root ("connect by path") and every name derived from it (docs/internals.md: the root).

A root is a directory that *is* an installation: sockets, stores and config live under it, and the
names of its shared-memory segments and semaphores are derived from a hash of its real path (plus the
broker name), so two roots never collide and an operator can see what belongs to hostmq::

    ROOT/hostmq.toml  ROOT/namesrv.sock  ROOT/namesrv-1.sock …
    ROOT/brokers/NAME/broker.sock  ROOT/brokers/NAME/session.sock  ROOT/brokers/NAME/broker.lock
    ROOT/brokers/NAME/store/…
    ROOT/brokers/NAME/config/topics.json …
    /dev/shm/hostmq.<hash12>.<kind>.<n>          (POSIX shm and semaphores)
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from .errors import ConfigError, ConnectError

DEFAULT_ROOT = "~/.hostmq"
MAX_IPC_PATH_BYTES = 107          # sun_path is 108 bytes with the terminating NUL
SHM_PREFIX = "hostmq"


def resolve_root(root: str | os.PathLike | None = None) -> str:
    """``root``, else ``$HOSTMQ_ROOT``, else ``~/.hostmq`` — as an absolute real path."""
    chosen = root if root is not None else os.environ.get("HOSTMQ_ROOT") or DEFAULT_ROOT
    return os.path.realpath(os.path.expanduser(os.fspath(chosen)))


def broker_store_dir(root: str, broker: str) -> str:
    """``ROOT/brokers/NAME/store`` (docs/internals.md: the root)."""
    return os.path.join(root, "brokers", broker, "store")


def root_hash(root: str, broker: str = "") -> str:
    """12 hex digits naming (root, broker) in global IPC names."""
    return hashlib.sha1(f"{os.path.realpath(root)}\0{broker}".encode()).hexdigest()[:12]


def shm_name(root: str, broker: str, kind: str, n: int | str = 0) -> str:
    """``/hostmq.<hash12>.<kind>.<n>``: a POSIX shm / semaphore name (no inner ``/``, ≤ 251 bytes)."""
    if "/" in kind or "/" in str(n) or "." in kind:
        raise ConfigError(f"bad IPC name part {kind!r}/{n!r}")
    return f"/{SHM_PREFIX}.{root_hash(root, broker)}.{kind}.{n}"


def shm_prefix(root: str, broker: str) -> str:
    """``/hostmq.<hash12>.``: the prefix of every IPC name of ``broker`` on ``root`` (``""``: the root's
    own, e.g. consumers' wake-up words) — for reclaiming and leak checks."""
    return f"/{SHM_PREFIX}.{root_hash(root, broker)}."


def broker_instance(name: str, broker_id: int = 0) -> str:
    """The directory and IPC name of one broker process group: ``NAME`` for the master (id 0),
    ``NAME.ID`` for a slave on the same root ('.' is not allowed in a broker name: no clash)."""
    return name if broker_id == 0 else f"{name}.{broker_id}"


def ipc_address(path: str) -> str:
    """``ipc://PATH`` for a Unix socket path, refusing paths the kernel cannot bind."""
    if len(os.fsencode(path)) > MAX_IPC_PATH_BYTES:
        raise ConfigError(f"socket path {path} is {len(os.fsencode(path))} bytes; Unix sockets allow "
                          f"{MAX_IPC_PATH_BYTES} — use a shorter root (e.g. /run/hostmq/NAME)")
    return f"ipc://{path}"


@dataclass(frozen=True)
class RootPaths:
    """Every path under one root."""

    root: str

    @classmethod
    def of(cls, root: str | os.PathLike | None = None) -> "RootPaths":
        return cls(resolve_root(root))

    @property
    def config_file(self) -> str:
        return os.path.join(self.root, "hostmq.toml")

    def namesrv_socket(self, index: int = 0) -> str:
        return os.path.join(self.root, "namesrv.sock" if index == 0 else f"namesrv-{index}.sock")

    def namesrv_sockets(self) -> list[str]:
        """Sockets of the NameServers present under the root, in index order."""
        found = []
        for name in os.listdir(self.root) if os.path.isdir(self.root) else ():
            if name == "namesrv.sock":
                found.append((0, name))
            elif name.startswith("namesrv-") and name.endswith(".sock") and name[8:-5].isdigit():
                found.append((int(name[8:-5]), name))
        return [os.path.join(self.root, n) for _, n in sorted(found)]

    @property
    def ha_secret(self) -> str:
        """The replication secret both ends of a replication link prove they hold (``protocol/ha_auth.py``;
        owner-only)."""
        return os.path.join(self.root, "ha.secret")

    def broker_dir(self, broker: str) -> str:
        return os.path.join(self.root, "brokers", broker)

    def broker_socket(self, broker: str) -> str:
        return os.path.join(self.broker_dir(broker), "broker.sock")

    def broker_session_socket(self, broker: str) -> str:
        """Where producers hand their ingress rings to the broker (``broker.session_server``)."""
        return os.path.join(self.broker_dir(broker), "session.sock")

    def session_socket_of(self, name: str, address: str) -> str:
        """The session socket of the instance of broker name ``name`` whose control address is
        ``address`` (a NameServer's answer: after a promotion the master of ``name`` is ``NAME.ID``).
        The address only selects one of this root's own paths, never names one: ConnectError if no
        instance of ``name`` here has it."""
        prefix = name + "."
        for inst in self.instances():
            if (inst == name or inst.startswith(prefix)) and address == f"ipc://{self.broker_socket(inst)}":
                return self.broker_session_socket(inst)
        raise ConnectError(f"{address} is not the address of a broker named {name} under {self.root}")

    def broker_lock(self, broker: str) -> str:
        return os.path.join(self.broker_dir(broker), "broker.lock")

    def store_dir(self, broker: str) -> str:
        return broker_store_dir(self.root, broker)

    def config_dir(self, broker: str) -> str:
        return os.path.join(self.broker_dir(broker), "config")

    def brokers(self) -> list[str]:
        """The masters' directories (one per broker name): what readers of the whole root read."""
        return [n for n in self.instances() if "." not in n]

    def instances(self) -> list[str]:
        """Every broker process group's directory: masters (``NAME``) and slaves (``NAME.ID``)."""
        d = os.path.join(self.root, "brokers")
        return sorted(os.listdir(d)) if os.path.isdir(d) else []

    def require(self) -> "RootPaths":
        """ConnectError with a clear message if the root is missing or unreadable."""
        if not os.path.isdir(self.root):
            raise ConnectError(f"hostmq root {self.root} does not exist (start one with `hostmq up {self.root}`)")
        if not os.access(self.root, os.R_OK | os.X_OK):
            raise ConnectError(f"hostmq root {self.root} is not readable by this user")
        return self
