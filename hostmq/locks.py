"""Who holds a lock file, and where a broker is — from the kernel, for errors a user can act on.

``/proc/locks`` lists every flock and POSIX lock with the holder's pid and the file's device and
inode: a broker's ``broker.lock`` (held for its whole run) and a name's role lock name their holders
here without asking them. Those are pure reads; :func:`lock_if_stopped` and :func:`lock_held` ask the
kernel by trying the lock itself (the one probe promotion, demotion and ``LocalCluster`` share).
"""
from __future__ import annotations

import fcntl
import os

import psutil

from .root import RootPaths


def lock_holders(path: str) -> list[int]:
    """The pids the kernel says hold a flock or POSIX lock on ``path`` (``/proc/locks``, matched by
    device and inode); [] when none or unknown."""
    try:
        st = os.stat(path)
        with open("/proc/locks", "rb") as f:
            lines = f.read().decode("ascii", "replace").splitlines()
    except OSError:
        return []
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = []
    for line in lines:
        parts = line.split()
        if len(parts) >= 6 and parts[1] != "->" and parts[5] == want and parts[4].lstrip("-").isdigit():
            pids.append(int(parts[4]))
    return [p for p in pids if p > 0]


def describe_pid(pid: int) -> str:
    """A few words about a process for an error message (its command line, or why not)."""
    try:
        p = psutil.Process(pid)
        state = p.status()
        cmd = " ".join(p.cmdline()[:8]) or p.name()
    except psutil.Error:
        return "no longer running"
    return f"{cmd}, {state}" if state == psutil.STATUS_STOPPED else cmd


def whereabouts(root: str, instance: str) -> str:
    """What to tell a user about broker ``instance`` of ``root`` that did not answer: the pid that
    holds its ``broker.lock`` (starting, stopping or stuck) and its log, or that it is not running and
    how to start it."""
    paths = RootPaths(root)
    log = os.path.join(paths.root, "logs", f"{instance}.log")
    holders = lock_holders(paths.broker_lock(instance))
    if holders:
        pid = holders[0]
        return f"its process, pid {pid} ({describe_pid(pid)}), holds its lock: it is starting, stopping or stuck — see {log}"
    name, _, bid = instance.partition(".")
    start = f"hostmq broker {paths.root} --name {name}" + (f" --id {bid}" if bid else "")
    return f"it is not running: start the cluster (`hostmq up {paths.root}`) or this broker (`{start}`); its log: {log}"


def lock_if_stopped(path: str) -> int | None:
    """An exclusive ``flock`` on a server's lock file that no running process holds: the open
    descriptor, which keeps it (None: a process holds it, or the file is missing — it never ran).
    The kernel answers, not ``/proc/locks``, whose pids are 0 across pid namespaces."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def lock_held(path: str) -> bool:
    """Whether a running process holds the ``flock`` on ``path``; False when the file is missing."""
    if not os.path.exists(path):
        return False
    fd = lock_if_stopped(path)
    if fd is None:
        return os.path.exists(path)         # held (or removed between the two looks: not held)
    os.close(fd)
    return False
