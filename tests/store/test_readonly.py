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
