"""Files and directories a root creates: modes that never let other users read, and durable names.

Everything under a root — store files, config JSON, locks, logs — is created with :data:`FILE_MODE`
and every directory with :data:`DIR_MODE`, whatever the process umask, so another user of the
machine never reads a message body (README "Access"). The umask may only take more away.

A new, renamed or deleted file name is durable only once its *directory* is fsynced
(:func:`fsync_dir`): without it a crash can bring back a deleted commitlog file or lose a new
consume-queue file whose data were fsynced.
"""
from __future__ import annotations

import os

FILE_MODE = 0o640
DIR_MODE = 0o750


def ensure_dir(path: str) -> None:
    """Create ``path`` and any missing parents with :data:`DIR_MODE` (``os.makedirs`` would give the
    parents the umask's default)."""
    path = os.path.abspath(path)
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for p in reversed(missing):
        try:
            os.mkdir(p, DIR_MODE)
        except FileExistsError:
            if not os.path.isdir(p):
                raise


def open_file(path: str, flags: int = os.O_RDWR | os.O_CREAT) -> int:
    """``os.open`` with :data:`FILE_MODE` for a file it creates (and close-on-exec)."""
    return os.open(path, flags | os.O_CLOEXEC, FILE_MODE)


def fsync_dir(path: str) -> None:
    """Make the names in directory ``path`` durable (after creating, renaming or deleting a file)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
