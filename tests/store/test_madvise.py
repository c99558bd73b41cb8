"""madvise policy per file kind: visible in the kernel's VmFlags of each mapping (/proc/PID/smaps:
``sr`` = MADV_SEQUENTIAL, ``rr`` = MADV_RANDOM)."""
from __future__ import annotations

import os

import pytest

from hostmq.config import StoreConfig
from hostmq.errors import ConfigError
from hostmq.message import Message
from hostmq.store import MessageStore
from hostmq.store.readonly import StoreReader

pytestmark = pytest.mark.timeout(60)


def vm_flags(pid: int, directory: str) -> dict[str, set[str]]:
    """File name → VmFlags of its mapping(s) in process ``pid``, for files under ``directory``."""
    out: dict[str, set[str]] = {}
    current = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if len(head) >= 6 and "-" in head[0] and not line.startswith("VmFlags"):
                path = head[5] if len(head) >= 6 else ""
                current = os.path.relpath(path, directory) if path.startswith(directory + os.sep) else None
            elif line.startswith("VmFlags:") and current is not None:
                out.setdefault(current, set()).update(line.split()[1:])
    return out


def fill(path: str, cfg: dict, n: int = 600) -> None:
    with MessageStore(path, cfg) as s:
        for i in range(n):
            s.put(Message("t", b"x" * 200), 0)
        s.dispatch()


def test_head_cold_and_consume_queue_advice_reach_the_mappings(tmp_path):
    path = str(tmp_path / "store")
    cfg = {"commitlog_file_bytes": 32 << 10, "consume_queue_file_entries": 200,
           "madvise_commitlog_head": "SEQUENTIAL", "madvise_commitlog_cold": "RANDOM",
           "madvise_consume_queue": "RANDOM"}
    with MessageStore(path, cfg) as s:
        for i in range(600):                        # ~290 B records: 5+ commitlog files, 3 cq files
            s.put(Message("t", b"x" * 200), 0)
        s.dispatch()
        flags = vm_flags(os.getpid(), path)
        logs = sorted(k for k in flags if k.startswith("commitlog"))
        cqs = [k for k in flags if k.startswith("consumequeue")]
        assert len(logs) >= 4 and len(cqs) >= 3
        assert "sr" in flags[logs[-1]] and "rr" not in flags[logs[-1]]          # the file being written
        assert all("rr" in flags[k] and "sr" not in flags[k] for k in logs[:-1])  # older files
        assert all("rr" in flags[k] for k in cqs)
    # A reader in another role maps the same files with the same policy.
    with StoreReader(path, StoreConfig(**cfg)) as r:
        r.refresh()
        flags = vm_flags(os.getpid(), path)
        logs = sorted(k for k in flags if k.startswith("commitlog"))
        assert "sr" in flags[logs[-1]] and all("rr" in flags[k] for k in logs[:-1])


def test_default_advice_sets_no_flags(tmp_path):
    path = str(tmp_path / "store")
    with MessageStore(path, {"commitlog_file_bytes": 32 << 10}) as s:
        for i in range(300):
            s.put(Message("t", b"x" * 200), 0)
        flags = vm_flags(os.getpid(), path)
        assert flags and not any({"sr", "rr"} & f for f in flags.values())


@pytest.mark.parametrize("field, value", [("madvise_commitlog_head", "DONTNEED"), ("madvise_consume_queue", "FAST"),
                                          ("madvise_commitlog_cold", "normal")])
def test_unknown_advice_is_a_config_error(field, value):
    with pytest.raises(ConfigError, match=field):
        StoreConfig(**{field: value})
