"""mlock of the commitlog head: locked when allowed, a warning and no harm when refused."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from hostmq.message import Message
from hostmq.store import MessageStore

pytestmark = pytest.mark.timeout(60)
CFG = {"commitlog_file_bytes": 1 << 20, "mlock_commitlog_head": True}


def locked_kib(pid: int, path_part: str) -> dict[str, int]:
    """Mapping file name → 'Locked:' kB in /proc/PID/smaps, for files whose path contains ``path_part``."""
    out, current = {}, None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and not line.startswith(("Locked", "VmFlags")) and len(head) >= 5 and ":" in head[3]:
                current = head[5] if len(head) >= 6 and path_part in head[5] else None
            elif line.startswith("Locked:") and current:
                out[os.path.basename(current)] = out.get(os.path.basename(current), 0) + int(head[1])
    return out


def test_the_head_file_is_locked_and_unlocked_when_it_turns_cold(tmp_path):
    path = str(tmp_path / "store")
    with MessageStore(path, CFG) as s:
        s.put(Message("t", b"x"), 0)
        first = locked_kib(os.getpid(), path)
        assert first == {f"{0:020d}": 1024}, first                  # the whole 1 MiB head file
        while s.commitlog.mfq.last().file_from_offset == 0:
            s.put(Message("t", b"x" * 2000), 0)
        after = locked_kib(os.getpid(), path)
        assert after[f"{1 << 20:020d}"] == 1024 and after.get(f"{0:020d}", 0) == 0, after


REFUSED = r"""
import logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
from hostmq.message import Message
from hostmq.store import MessageStore
with MessageStore(sys.argv[1], {"commitlog_file_bytes": 1 << 20, "mlock_commitlog_head": True}) as s:
    for i in range(3000):
        s.put(Message("t", b"y" * 500), 0)
    s.dispatch()
    print(s.max_offset("t", 0), s.get("t", 0, 2999, 1).messages[0].body == b"y" * 500)
"""


def run_without_mlock(script: str, *args: str) -> subprocess.CompletedProcess:
    """``python -c script args`` with RLIMIT_MEMLOCK 64 KiB and no CAP_IPC_LOCK (dropped from the
    bounding set when run as root), so every mlock is refused."""
    cmd = ["prlimit", "--memlock=65536", sys.executable, "-c", script, *args]
    if os.geteuid() == 0:
        assert shutil.which("setpriv"), "setpriv is needed to drop CAP_IPC_LOCK as root"
        cmd = ["setpriv", "--bounding-set", "-ipc_lock"] + cmd
    return subprocess.run(cmd, capture_output=True, text=True, timeout=50,
                          env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(__file__)))})


def test_a_refused_mlock_warns_once_and_changes_nothing_else(tmp_path):
    p = run_without_mlock(REFUSED, str(tmp_path / "store"))
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["3000", "True"]
    assert p.stderr.count("mlock of") == 1 and "RLIMIT_MEMLOCK is 65536 bytes" in p.stderr, p.stderr
