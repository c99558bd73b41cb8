"""Pre-allocation of the next commitlog file ahead of need (RocketMQ AllocateMappedFileService)."""
from __future__ import annotations

import os

import pytest

from hostmq.config import StoreConfig
from hostmq.errors import ConfigError
from hostmq.message import Message
from hostmq.observe import process_stats, residency
from hostmq.store import MessageStore
from hostmq.store.readonly import StoreReader
from tests.conftest import wait_until

from .conftest import crash_copy

pytestmark = pytest.mark.timeout(60)
MiB = 1 << 20
CFG = {"commitlog_file_bytes": MiB, "consume_queue_file_entries": 10_000, "warm_mapped_file": True,
       "preallocate_next_file": True, "preallocate_at_ratio": 0.5}
BODY = b"p" * 400


def listing(path: str) -> list[str]:
    return sorted(os.listdir(os.path.join(path, "commitlog")))


def put_until(store, file_pos: int) -> int:
    n = 0
    store.put(Message("t", BODY), 0)
    n += 1
    while store.commitlog.mfq.last().wrote_pos < file_pos:
        store.put(Message("t", BODY), 0)
        n += 1
    return n


def test_the_next_file_is_made_and_warmed_before_the_roll_under_a_temporary_name(tmp_path):
    path = str(tmp_path / "store")
    with MessageStore(path, CFG) as s:
        n = put_until(s, int(0.6 * MiB))
        tmp = wait_until(lambda: [f for f in listing(path) if f.endswith(".prealloc")], 10, "the next file")
        assert tmp == [f"{MiB:020d}.prealloc"] and listing(path) == [f"{0:020d}", tmp[0]]
        wait_until(lambda: residency(os.path.join(path, "commitlog", tmp[0])) == 100.0, 10, "the warm-up")
        with StoreReader(path, StoreConfig(**CFG)) as r:          # readers see one file only
            assert [f.file_from_offset for f in r.commitlog.mfq.files] == [0]
        while s.commitlog.mfq.last().file_from_offset == 0:        # roll into the next file
            s.put(Message("t", BODY), 0)
            n += 1
        before = process_stats(os.getpid())["minor_faults"]
        n += put_until(s, int(0.4 * MiB))
        faults = process_stats(os.getpid())["minor_faults"] - before
        assert faults < 0.4 * MiB // 4096 // 4, f"{faults} faults writing into a warmed, pre-allocated file"
        assert listing(path)[:2] == [f"{0:020d}", f"{MiB:020d}"]
        s.dispatch()
    assert not [f for f in listing(path) if f.endswith(".prealloc")]
    with MessageStore(path, CFG) as s:                              # reopens with every message
        assert s.max_offset("t", 0) == n
        b = s.get("t", 0, n - 1, 1)
        assert b.messages[0].body == BODY


def test_a_crash_leaves_a_temporary_file_that_recovery_removes(tmp_path):
    path = str(tmp_path / "store")
    with MessageStore(path, CFG) as s:
        n = put_until(s, int(0.7 * MiB))
        wait_until(lambda: any(f.endswith(".prealloc") for f in listing(path)), 10, "the next file")
        copy = crash_copy(s, str(tmp_path / "crashed"))
    assert any(f.endswith(".prealloc") for f in listing(copy))
    with MessageStore(copy, CFG) as s:
        assert s.recovery.abnormal and s.max_offset("t", 0) == n
        assert not [f for f in listing(copy) if f.endswith(".prealloc")]
        s.put(Message("t", BODY), 0)


def test_preallocate_ratio_is_checked():
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ConfigError, match="preallocate_at_ratio"):
            StoreConfig(preallocate_at_ratio=bad)
