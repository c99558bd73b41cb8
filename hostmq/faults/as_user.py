"""Run Python as another local user — a member of a root's group, or an outsider — for the attacks that
need a real other uid (``attack_kinds``: a hostile group member; ``tests/e2e/test_access.py``).

Needs root, ``setpriv`` and ``unshare`` (util-linux). The interpreter (a virtual environment under
``/root``, say) or the root may sit beneath a directory the other uid cannot enter: then, in a private
mount namespace of that one run only, the directory is covered with an empty enterable tmpfs and the
entries needed beneath it are bound back — nothing outside the run sees a change.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys


def available() -> str:
    """"" when :func:`run_as` can work here, else why not."""
    if os.geteuid() != 0:
        return "needs root (to change uid)"
    missing = [t for t in ("setpriv", "unshare") if not shutil.which(t)]
    return f"needs {' and '.join(missing)} (util-linux)" if missing else ""


def blocked_ancestors(paths: list[str]) -> dict[str, set[str]]:
    """Directories others cannot enter on the way to ``paths`` → the entries beneath them we need."""
    out: dict[str, set[str]] = {}
    for p in paths:
        parts = os.path.realpath(p).split(os.sep)
        for i in range(1, len(parts) - 1):
            d = os.sep.join(parts[:i]) or os.sep
            if not os.stat(d).st_mode & stat.S_IXOTH:
                out.setdefault(d, set()).add(parts[i])
                break
    return out


def run_as(uid: int, gid: int, groups: list[int], code: str, *args: str, scratch: str,
           reach: tuple[str, ...] = (), timeout_s: float = 180) -> subprocess.CompletedProcess:
    """Run ``code`` with this Python as ``uid:gid`` (supplementary ``groups``; none: cleared), with
    ``args`` as its argv, ``scratch`` (a directory it may write: its HOME) and ``reach`` (paths it
    must be able to walk to, besides the interpreter and hostmq). Output captured as text."""
    import hostmq as pkg
    needed = [sys.executable, os.path.realpath(sys.executable), sys.prefix, os.path.dirname(pkg.__file__),
              scratch, *reach]
    script = []
    for n, (d, entries) in enumerate(sorted(blocked_ancestors(needed).items())):
        for e in sorted(entries):
            keep = os.path.join(scratch, f"keep{n}-{e}")
            os.makedirs(keep, exist_ok=True)
            script.append(f"mount --bind '{os.path.join(d, e)}' '{keep}'")
        script.append(f"mount -t tmpfs -o mode=0755 tmpfs '{d}'")
        for e in sorted(entries):
            keep = os.path.join(scratch, f"keep{n}-{e}")
            script.append(f"mkdir -p '{os.path.join(d, e)}' && mount --bind '{keep}' '{os.path.join(d, e)}'")
    ids = [f"--reuid={uid}", f"--regid={gid}"] + ([f"--groups={','.join(map(str, groups))}"] if groups
                                                    else ["--clear-groups"])
    script.append('exec setpriv ' + " ".join(ids) + ' "$@"')
    env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "PYTHONDONTWRITEBYTECODE": "1"}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", " && ".join(script), "sh",
                           sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout_s,
                          env=env)
