"""store.json: a store keeps the file sizes it was created with, whatever the configuration says."""
from __future__ import annotations

import json
import os

import pytest

from hostmq import Message
from hostmq.errors import ConfigError
from hostmq.store import MessageStore
from hostmq.store.meta import META_FILE, effective_config, infer_sizes, read_sizes

pytestmark = pytest.mark.timeout(60)
SMALL = {"commitlog_file_bytes": 64 * 1024, "consume_queue_file_entries": 50, "index_slots": 100,
         "index_entries": 400}


def _fill(path: str, n: int, config=SMALL) -> None:
    with MessageStore(path, config) as s:
        for i in range(n):
            s.put(Message("t", b"m%04d" % i + b"." * 200))
        s.dispatch()


def test_sizes_are_recorded_at_creation_and_win_over_the_configuration(tmp_path):
    path = str(tmp_path / "store")
    _fill(path, 600)                                     # several commitlog and consume-queue files
    assert read_sizes(path) == SMALL
    files = sorted(os.listdir(os.path.join(path, "commitlog")))
    assert len(files) > 1
    other = {"commitlog_file_bytes": 1 << 20, "consume_queue_file_entries": 4000, "index_slots": 1000,
             "index_entries": 8000}
    with MessageStore(path, other) as s:
        assert s.config.commitlog_file_bytes == SMALL["commitlog_file_bytes"]
        got = s.get("t", 0, 0, max_count=1000)
        assert [m.body[:5] for m in got.messages] == [b"m%04d" % i for i in range(600)]
    assert sorted(os.listdir(os.path.join(path, "commitlog"))) == files      # nothing deleted
    assert read_sizes(path) == SMALL


def test_a_store_from_before_store_json_has_its_sizes_inferred_once(tmp_path):
    path = str(tmp_path / "store")
    _fill(path, 300)
    os.unlink(os.path.join(path, META_FILE))
    inferred = infer_sizes(path)
    assert inferred == {"commitlog_file_bytes": SMALL["commitlog_file_bytes"],
                        "consume_queue_file_entries": SMALL["consume_queue_file_entries"]}
    with MessageStore(path, {**SMALL, "commitlog_file_bytes": 1 << 20, "consume_queue_file_entries": 9}) as s:
        assert s.max_offset("t", 0) == 300
    assert read_sizes(path)["commitlog_file_bytes"] == SMALL["commitlog_file_bytes"]


def test_a_foreign_or_damaged_store_json_is_refused_with_a_clear_error(tmp_path):
    path = str(tmp_path / "store")
    os.makedirs(path)
    for bad in ({"version": 9}, {"version": 1, "commitlog_file_bytes": -1}, [1, 2]):
        with open(os.path.join(path, META_FILE), "w") as f:
            json.dump(bad, f)
        with pytest.raises(ConfigError):
            read_sizes(path)


def test_a_wrong_size_commitlog_file_is_reported_not_deleted(tmp_path):
    path = str(tmp_path / "store")
    _fill(path, 600)
    last = os.path.join(path, "commitlog", sorted(os.listdir(os.path.join(path, "commitlog")))[-1])
    with open(last, "ab") as f:
        f.write(b"\0" * 100)                             # not the size of the store's files
    with pytest.raises(ConfigError, match="nothing was changed"):
        MessageStore(path, SMALL)                        # store.json says 64 KiB files
    os.unlink(os.path.join(path, META_FILE))
    with pytest.raises(ConfigError, match="different sizes"):
        MessageStore(path, SMALL)                        # and inference cannot pick a size
    assert os.path.getsize(last) == SMALL["commitlog_file_bytes"] + 100


def test_effective_config_keeps_other_settings(tmp_path):
    from hostmq.config import StoreConfig
    path = str(tmp_path / "s")
    os.makedirs(path)
    cfg = StoreConfig(**SMALL, flush_disk_type="SYNC_FLUSH")
    assert effective_config(path, cfg) == cfg
    bigger = StoreConfig(commitlog_file_bytes=1 << 20, flush_disk_type="SYNC_FLUSH")
    eff = effective_config(path, bigger)
    assert eff.commitlog_file_bytes == SMALL["commitlog_file_bytes"] and eff.flush_disk_type == "SYNC_FLUSH"
