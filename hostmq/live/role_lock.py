"""One role decision at a time per broker name on a root (issue 27, attack 2: two masters on one root).

A *role decision* is reading or writing the role records of a broker name's instances
(``live/role.py``): an instance starting reads its own and decides what it plays; ``hostmq ha
promote`` and ``demote`` decide for others. Each holds the name's **role lock** for the whole
decision::

    ROOT/roles/NAME.lock        flock(LOCK_EX); empty — the kernel is the record of who holds it

A starting instance holds it only to read its role and publish that it is **starting** — its
``brokers/INSTANCE/starting.json`` (:class:`Starting`) — and lets it go before recovery, which
can take minutes on a large store. Promote, under the lock, reads every instance of the name as one
of: running (its state segment, ``group.live_state``), starting (its ``broker.lock`` is held and
``starting.json`` names the holder: the kernel's pid and the process's start time), about to read
its role (``broker.lock`` held, no such marker: it reads what promote writes), or stopped.

Why flock: the kernel releases it when the holder dies (a semaphore would wedge the name), and
``/proc/locks`` names the holder's pid, so a wait that times out says who holds it
(:class:`~hostmq.errors.RoleLockTimeoutError`). Every wait is bounded; the lock is never held
across a wait on a client, except the promote command's one PROMOTE_BROKER request (10 s).

Ownership: ``NAME.lock`` is created by whichever decision comes first and never written;
``starting.json`` is written by its instance's broker process under the role lock and removed when
that run stops (a killed broker leaves it: its ``broker.lock`` is free, so it is ignored).
"""
from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass

import orjson
import psutil

from ..errors import RoleLockTimeoutError
from ..fsutil import ensure_dir, open_file
from ..locks import describe_pid, lock_holders
from ..root import RootPaths

ROLE_LOCK_DIR = "roles"
STARTING_FILE = "starting.json"
START_LOCK_TIMEOUT_S = 30.0         # a starting broker waits this long for the name's role lock
PROMOTE_LOCK_TIMEOUT_S = 15.0       # promote / demote wait this long
_POLL_MIN_S, _POLL_MAX_S = 0.002, 0.05


def lock_path(root: str, name: str) -> str:
    return os.path.join(root, ROLE_LOCK_DIR, f"{name}.lock")


class RoleLock:
    """The role lock of broker ``name`` under ``root``: ``with RoleLock(root, name).hold(timeout_s):``."""

    def __init__(self, root: str, name: str) -> None:
        self.root, self.name = root, name
        self.path = lock_path(root, name)
        self._fd: int | None = None

    def acquire(self, timeout_s: float) -> None:
        """Take the lock, waiting up to ``timeout_s`` (RoleLockTimeoutError naming the holder)."""
        ensure_dir(os.path.dirname(self.path))
        fd = open_file(self.path, os.O_RDONLY | os.O_CREAT)
        deadline, pause = time.monotonic() + timeout_s, _POLL_MIN_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._fd = fd
                return
            except BlockingIOError:
                pass
            left = deadline - time.monotonic()
            if left <= 0:
                holders = lock_holders(self.path)
                os.close(fd)
                pid = holders[0] if holders else 0
                raise RoleLockTimeoutError(self.name, self.path, pid, describe_pid(pid) if pid else "",
                                           timeout_s)
            # Backing off from a short poll: a role decision usually takes milliseconds.
            time.sleep(min(pause, left))
            pause = min(pause * 2, _POLL_MAX_S)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def hold(self, timeout_s: float) -> "RoleLock":
        self.acquire(timeout_s)
        return self

    def __enter__(self) -> "RoleLock":
        if self._fd is None:
            raise RuntimeError("RoleLock: use `with lock.hold(timeout_s):`")
        return self

    def __exit__(self, *exc) -> None:
        self.release()


@dataclass(frozen=True)
class Starting:
    """What a starting instance published before its recovery: the role it decided (``role.py``
    names) at ``epoch``, and the process (pid and its start time, to tell a reused pid apart)."""

    pid: int
    create_time: float
    role: str
    epoch: int

    @property
    def is_slave(self) -> bool:
        return self.role == "SLAVE"


def starting_path(root: str, instance: str) -> str:
    return os.path.join(RootPaths(root).broker_dir(instance), STARTING_FILE)


def publish_starting(root: str, instance: str, role: str, epoch: int) -> None:
    """Called by the instance's broker process, under the role lock, before its recovery. Not
    fsynced: after a crash the marker is ignored anyway (its broker.lock is free)."""
    me = psutil.Process()
    path = starting_path(root, instance)
    tmp = path + ".tmp"
    fd = open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        os.write(fd, orjson.dumps({"pid": me.pid, "create_time": me.create_time(), "role": role, "epoch": epoch}))
    finally:
        os.close(fd)
    os.replace(tmp, path)


def clear_starting(root: str, instance: str) -> None:
    try:
        os.unlink(starting_path(root, instance))
    except FileNotFoundError:
        pass


def starting(root: str, instance: str) -> Starting | None:
    """The instance's starting marker if it is current: the process the kernel says holds the
    instance's ``broker.lock`` wrote it in this life. None: not starting (stopped, or running past
    it — its state segment then says its role), or it has not yet read its role."""
    holders = lock_holders(RootPaths(root).broker_lock(instance))
    if not holders:
        return None
    try:
        with open(starting_path(root, instance), "rb") as f:
            d = orjson.loads(f.read(4096))
        s = Starting(int(d["pid"]), float(d["create_time"]), str(d["role"]), int(d["epoch"]))
        alive = psutil.Process(s.pid).create_time() == s.create_time
    except (OSError, ValueError, KeyError, TypeError, orjson.JSONDecodeError, psutil.Error):
        return None
    return s if alive and s.pid in holders else None
