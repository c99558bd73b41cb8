"""StoreReader: a read-only view that sees exactly what the writer (or recovery) would keep."""
from __future__ import annotations

import hashlib
import os
import shutil

import pytest

from hostmq.message import Message
from hostmq.store import MessageStore
from hostmq.store.readonly import StoreReader

from .conftest import crash_copy, small_config

pytestmark = pytest.mark.timeout(120)


def _digest(path: str) -> dict[str, str]:
    out = {}
    for d, _, files in os.walk(path):
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, path)] = hashlib.sha1(fh.read()).hexdigest()
    return out


def _read_all(reader, topic: str, qid: int) -> list[bytes]:
    out, off = [], reader.min_offset(topic, qid)
    while True:
        g = reader.get(topic, qid, off, 16)
        if not g.messages:
            return out
        out += [m.body for m in g.messages]
        off = g.next_offset


def _fill(store, n: int, start: int = 0) -> dict[tuple[str, int], list[bytes]]:
    sent: dict[tuple[str, int], list[bytes]] = {}
    for i in range(start, start + n):
        key = (f"T{i % 2}", i % 3)
        body = b"m%06d" % i + b"." * (i % 50)
        store.put(Message(key[0], body, tags="t"), queue_id=key[1])
        sent.setdefault(key, []).append(body)
    return sent


def test_a_closed_store_reads_back_everything_and_is_not_modified(tmp_path):
    path = str(tmp_path / "s")
    with MessageStore(path, small_config()) as store:
        sent = _fill(store, 1500)
    before = _digest(path)
    with StoreReader(path, small_config()) as reader:
        assert reader.topics() == ["T0", "T1"]
        for key, bodies in sent.items():
            assert _read_all(reader, *key) == bodies
            assert reader.max_offset(*key) == len(bodies)
        bodies, off = [], 0
        while True:          # a batch stops at a consume-queue file boundary
            batch = reader.get_batch("T0", 0, off, 10_000)
            if not len(batch):
                break
            bodies += [bytes(b) for b in batch.bodies]
            off = batch.next_offset
        assert bodies == sent[("T0", 0)]
    assert _digest(path) == before
    assert not os.path.exists(os.path.join(path, "abort"))


def test_a_live_store_is_followed_up_to_the_published_limit(tmp_path):
    path = str(tmp_path / "s")
    store = MessageStore(path, small_config())
    try:
        sent = _fill(store, 300)
        store.dispatch()
        reader = StoreReader(path, small_config(), limit_phys=lambda: store.dispatched_phys)
        assert _read_all(reader, "T0", 0) == sent[("T0", 0)]
        more = _fill(store, 3000, start=300)            # rolls into new commitlog and CQ files
        # Appended but not dispatched: the reader must not see it even after a refresh.
        reader.refresh()
        assert _read_all(reader, "T0", 0) == sent[("T0", 0)]
        store.dispatch()
        reader.refresh()
        assert len(store.commitlog.mfq.files) > 2
        for key in sent:
            assert _read_all(reader, *key) == sent[key] + more[key]
        reader.close()
    finally:
        store.close()


def test_a_crashed_store_shows_what_recovery_keeps(tmp_path):
    path = str(tmp_path / "s")
    store = MessageStore(path, small_config())
    _fill(store, 800)
    store.flush()
    _fill(store, 400, start=800)
    crash = crash_copy(store, str(tmp_path / "crash"))
    store.close()
    # Tear the commitlog's last record: cut into it and zero the rest of the file.
    last = sorted(os.listdir(os.path.join(crash, "commitlog")))[-1]
    clpath = os.path.join(crash, "commitlog", last)
    with StoreReader(crash, small_config()) as r0:
        cut = r0.readable_end - r0.commitlog.mfq.last().file_from_offset - 30
    with open(clpath, "r+b") as f:
        f.seek(cut)
        f.write(b"\0" * (small_config()["commitlog_file_bytes"] - cut))
    shutil.copytree(crash, str(tmp_path / "crash2"))
    with StoreReader(crash, small_config()) as reader:
        seen = {k: _read_all(reader, *k) for k in reader.queues}
    with MessageStore(str(tmp_path / "crash2"), small_config()) as recovered:
        assert recovered.recovery.abnormal
        kept = {k: _read_all(recovered, *k) for k in recovered.queues}
    assert seen == kept
    assert sum(map(len, seen.values())) == 1199       # exactly the torn last record is gone


def test_a_reader_does_not_lock_the_store(tmp_path):
    path = str(tmp_path / "s")
    with MessageStore(path, small_config()) as store:
        _fill(store, 10)
    with StoreReader(path, small_config()):
        with MessageStore(path, small_config()) as again:     # the writer can still open it
            assert again.max_offset("T0", 0) > 0


@pytest.mark.parametrize("bursts", [[1, 1, 3, 15, 16, 17, 33, 1, 120, 2, 64, 1, 300]])
def test_refresh_queue_follows_a_live_queue_entry_by_entry(tmp_path, bursts):
    """A consumer's incremental refresh (a scalar look at the next entries, numpy past that) sees
    exactly the dispatched entries, across consume-queue file boundaries, and never more."""
    path = str(tmp_path / "s")
    cfg = small_config()
    store = MessageStore(path, cfg)
    try:
        store.put(Message("T", b"first"), queue_id=0)
        store.dispatch()
        reader = StoreReader(path, cfg, scan_queues=False, limit_phys=lambda: store.dispatched_phys)
        assert reader.refresh_queue("T", 0) == 1
        expected = 1
        for n in bursts:
            for i in range(n):
                store.put(Message("T", b"b%d-%d" % (expected, i)), queue_id=0)
            assert reader.refresh_queue("T", 0) == expected          # appended, not dispatched
            store.dispatch()
            expected += n
            assert reader.refresh_queue("T", 0) == expected
        assert expected > 2 * cfg["consume_queue_file_entries"]
        assert [m.body for m in reader.get("T", 0, 0, expected).messages] == \
            [b"first"] + [b"b%d-%d" % (sum([1] + bursts[:k]), i) for k, n in enumerate(bursts) for i in range(n)]
        reader.close()
    finally:
        store.close()


def test_a_stopped_store_is_read_with_the_file_sizes_it_was_written_with(tmp_path):
    from hostmq import Message
    from hostmq.config import StoreConfig
    from hostmq.store import MessageStore
    from hostmq.store.readonly import infer_store_config
    path = str(tmp_path / "store")
    with MessageStore(path, {"commitlog_file_bytes": 8192, "consume_queue_file_entries": 50}) as s:
        for i in range(200):
            s.put(Message("t", b"x" * 100), 0)
        s.dispatch()
    cfg = infer_store_config(path, StoreConfig())
    assert (cfg.commitlog_file_bytes, cfg.consume_queue_file_entries) == (8192, 50)
    with StoreReader(path, cfg) as r:
        assert r.max_offset("t", 0) == 200 and len(_read_all(r, "t", 0)) == 200
    empty = tmp_path / "empty"
    empty.mkdir()
    assert infer_store_config(str(empty), StoreConfig()) == StoreConfig()
