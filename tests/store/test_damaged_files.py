"""Store files that lost their end or hold garbage (issue 15): recovery keeps every record before the
damage and rebuilds what is derived (the index) instead of refusing to open or deleting data."""
from __future__ import annotations

import os

import pytest

from hostmq.message import Message
from hostmq.store.recovery import restore_short_files

from .conftest import CL_FILE_BYTES, commitlog_files, crash_copy, key_for, parse_log, read_queue

pytestmark = pytest.mark.timeout(120)


def _fill(store, n: int = 400) -> None:
    for i in range(n):
        store.put(Message("D", b"%05d|" % i + b"y" * 300, keys=[key_for("D", 0, i)]), queue_id=0)


@pytest.mark.parametrize("which", [0, -1])
def test_a_commitlog_file_that_lost_its_end(open_store, tmp_path, which):
    store = open_store()
    _fill(store)
    crash = crash_copy(store, tmp_path / "crash", flush=True)
    store.close()
    files = commitlog_files(crash)
    assert len(files) >= 3
    recs = parse_log(crash)
    victim = files[which]
    cut = int(os.path.basename(victim)) + 5000
    os.truncate(victim, 5000)
    again = open_store(crash)
    kept = [r for r in recs if r.phys + r.total <= cut]
    got = read_queue(again, "D", 0)
    assert [m.body for m in got[:len(kept)]] == [r.body for r in kept]
    assert len(got) == len(kept)
    assert all(os.path.getsize(p) == CL_FILE_BYTES for p in commitlog_files(crash))
    if which == -1:     # (damage before the checkpoint's durable point is not rescanned, only unreachable)
        assert again.commitlog.max_offset() == kept[-1].phys + kept[-1].total


def test_restore_short_files_leaves_a_store_of_another_size_alone(tmp_path):
    d = tmp_path / "commitlog"
    d.mkdir()
    for i, size in enumerate([1000, 1000, 400]):
        (d / f"{i * 1000:020d}").write_bytes(b"\1" * size)
    assert restore_short_files(str(d), 4096) == []              # no file has 4096 bytes: not ours
    assert restore_short_files(str(d), 1000) == [f"{2000:020d}"]
    assert (d / f"{2000:020d}").read_bytes() == b"\1" * 400 + bytes(600)
    (d / f"{3000:020d}").write_bytes(b"")                       # a crash while creating the newest file
    assert restore_short_files(str(d), 1000) == [] and (d / f"{3000:020d}").stat().st_size == 0


@pytest.mark.parametrize("damage", ["truncate", "garbage_header"])
def test_a_damaged_index_file_is_rebuilt_with_the_newer_ones(open_store, tmp_path, damage):
    store = open_store()
    _fill(store)
    crash = crash_copy(store, tmp_path / "crash", flush=True)
    store.close()
    index = sorted(os.listdir(os.path.join(crash, "index")))
    assert len(index) >= 3
    victim = os.path.join(crash, "index", index[1])
    if damage == "truncate":
        os.truncate(victim, 1000)
    else:
        with open(victim, "r+b") as f:
            f.write(b"\xff" * 40)
    again = open_store(crash)
    for i in range(0, 400, 7):
        (m,) = again.query_by_key("D", key_for("D", 0, i))
        assert m.body.startswith(b"%05d|" % i)
