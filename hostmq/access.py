"""Who may use a root: its owner and one group (README "Access").

A root belongs to the user that runs its servers and to one group — ``[access] group`` /
``hostmq up --group G``, else the group the root directory already has. Members of the group produce
and consume; nobody else can read a stored message or connect:

* the root directory is ``2750``: the group may enter and read, others may not even enter, so
  nothing beneath it — store files, sockets, logs — is reachable for them whatever its own mode; the
  setgid bit gives every file and directory created beneath it the root's group;
* servers run with umask ``027``: files ``0640``, directories ``0750`` (``fsutil``), whatever the umask
  they were started with;
* sockets are ``0660`` after ``bind`` (``connect`` needs write permission on a unix socket);
* shared-memory segments, which live in ``/dev/shm`` and not under the root, are created ``0640``
  and handed to the root's group (``shm.segment.set_segment_group``): members map a broker's state
  read-only, others cannot open it.

``secure_root`` applies this when a server starts; it walks the tree only when the group changed
(or the root predates this), fixing group and modes of what is already there.
"""
from __future__ import annotations

import grp
import logging
import os
import stat

from .errors import ConfigError

log = logging.getLogger(__name__)

ROOT_MODE = 0o2750
SERVER_UMASK = 0o027
SOCKET_MODE = 0o660


def resolve_gid(group: str) -> int:
    """A group name or number → gid (ConfigError if there is no such group)."""
    group = str(group).strip()
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ConfigError(f"access.group: no group named {group!r}") from None


def secure_root(root: str, group: str = "") -> int:
    """Make ``root`` (created if missing) belong to ``group`` (or keep its group) with the modes
    above, set this process's umask and segment group; returns the gid."""
    from .fsutil import ensure_dir
    from .shm.segment import set_segment_group
    os.umask(SERVER_UMASK)
    ensure_dir(root)
    st = os.stat(root)
    gid = resolve_gid(group) if group else st.st_gid
    if st.st_gid != gid or stat.S_IMODE(st.st_mode) != ROOT_MODE:
        try:
            _fix_tree(root, gid)
        except PermissionError as e:
            raise ConfigError(f"cannot give {root} to group {group or gid}: {e.strerror} (the owner must be a "
                              f"member of the group, or run this once as root)") from None
        log.info("root %s: group %d, mode %o (owner and group only)", root, gid, ROOT_MODE)
    set_segment_group(gid)
    return gid


def _fix_tree(root: str, gid: int) -> None:
    """Group ``gid`` and no access for others on everything of ours under ``root``; setgid dirs."""
    me = os.geteuid()
    for d, dirs, files in os.walk(root):
        for path, is_dir in [(d, True)] + [(os.path.join(d, f), False) for f in files]:
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(st.st_mode) or (st.st_uid != me and me != 0):
                continue
            if st.st_gid != gid:
                os.chown(path, -1, gid, follow_symlinks=False)
            mode = stat.S_IMODE(st.st_mode)
            if path == root:
                want = ROOT_MODE
            elif is_dir:
                want = (mode | 0o2000) & ~0o007
            elif stat.S_ISSOCK(st.st_mode):
                want = SOCKET_MODE
            else:
                want = mode & ~0o007
            if want != mode:
                os.chmod(path, want)


def secure_socket(path: str) -> None:
    """A unix socket just bound: owner and group may connect, others not (whatever the umask)."""
    os.chmod(path, SOCKET_MODE)


def owner_uids(root: str) -> frozenset[int]:
    """Who administers ``root`` on its control sockets: the uid owning the root directory, the uid
    this server runs as (whoever runs the servers owns what they serve) and uid 0."""
    return frozenset({os.stat(root).st_uid, os.geteuid(), 0})


def control_policy(root: str):
    """The :class:`~hostmq.protocol.permissions.ControlPolicy` of ``root``'s control sockets."""
    from .protocol.permissions import ControlPolicy
    return ControlPolicy(owner_uids(root), where=os.path.realpath(root))
