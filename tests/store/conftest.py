"""Fixtures and helpers shared by the store tests.

Everything here works on real files under pytest's ``tmp_path``. Expected values in the tests come
from what the test sent (its own bookkeeping) or from parsing the files with ``hostmq.records``
(an independent decoder, tested in ``tests/test_records.py``), never from the store under test.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import pytest

from hostmq import records as R
from hostmq.errors import CorruptRecordError
from hostmq.message import Message
from hostmq.store.encode import encode_message
from hostmq.store.message_store import MessageStore

SMALL = {"commitlog_file_bytes": 64 * 1024, "consume_queue_file_entries": 64, "index_slots": 101,
         "index_entries": 400}
CL_FILE_BYTES = SMALL["commitlog_file_bytes"]
CQ_ENTRIES = SMALL["consume_queue_file_entries"]
CQ_FILE_BYTES = CQ_ENTRIES * R.CQ_ENTRY.itemsize
BASE_MS = 1_600_000_000_000          # a fixed past time for messages stored at controlled times


def small_config(**overrides) -> dict:
    return {**SMALL, **overrides}


# Every store configuration a broker can run: flush mode × transient store pool (the pool serves only
# ASYNC_FLUSH, as in RocketMQ: asked for under SYNC_FLUSH it is not used — that combination checks so).
STORE_MODES = {
    "async": {"flush_disk_type": "ASYNC_FLUSH"},
    "sync": {"flush_disk_type": "SYNC_FLUSH"},
    # commit_interval_ms 0: the pool's buffer is committed to the file at every append, so what a
    # test reads right after a put is readable, through the pool's own copy-then-commit path
    "async-pool": {"flush_disk_type": "ASYNC_FLUSH", "transient_store_pool_enable": True,
                   "transient_store_pool_size": 2, "commit_interval_ms": 0},
    "sync-pool": {"flush_disk_type": "SYNC_FLUSH", "transient_store_pool_enable": True,
                  "transient_store_pool_size": 2, "commit_interval_ms": 0},
}


# Tests that store at fixed past times (``put_at``) stay on ``open_store``: the pool commits by the
# store's clock, which those times would stop.
@pytest.fixture(params=list(STORE_MODES))
def store_mode(request) -> dict:
    """One of ``STORE_MODES`` per run of a test that takes it (``modal_store`` does)."""
    return STORE_MODES[request.param]


def _stores(tmp_path, mode: dict, check_pool: bool):
    """The store factory behind ``open_store`` and ``modal_store``: yields ``_open`` and closes every
    store it opened."""
    opened: list[MessageStore] = []

    def _open(path=None, **overrides) -> MessageStore:
        s = MessageStore(str(path or tmp_path / "store"), small_config(**{**mode, **overrides}))
        if check_pool:
            assert (s.pool is not None) == (mode.get("transient_store_pool_enable", False)
                                             and mode["flush_disk_type"] == "ASYNC_FLUSH")
        opened.append(s)
        return s

    yield _open
    for s in opened:
        if not s.closed:
            s.close()


@pytest.fixture
def modal_store(tmp_path, store_mode):
    """``open_store`` in each store configuration (``STORE_MODES``); overrides still apply."""
    yield from _stores(tmp_path, store_mode, check_pool=True)


@pytest.fixture
def open_store(tmp_path):
    """Factory: ``open_store(path=None, **config_overrides)`` → an open MessageStore, closed at teardown."""
    yield from _stores(tmp_path, {}, check_pool=False)


def crash_copy(store: MessageStore, dst, flush: bool = False) -> str:
    """A copy of ``store``'s directory as a process crash would leave it (``abort`` present).

    Writes through the mappings are in the page cache, so the copy sees exactly what a killed process
    leaves behind. The ``lock`` file is dropped from the copy (a dead process holds no lock).
    """
    store.dispatch()
    if flush:
        store.flush()
    shutil.copytree(store.path, dst)
    os.unlink(os.path.join(dst, "lock"))
    assert os.path.exists(os.path.join(dst, "abort"))
    return str(dst)


@dataclass(frozen=True)
class Rec:
    """One record found by parsing commitlog files (independently of the store)."""

    phys: int
    total: int
    kind: int            # R.RecordKind
    topic: str = ""
    body: bytes = b""
    queue_id: int = -1
    queue_offset: int = -1
    header_phys: int = -1
    store_ts_ms: int = 0
    props: dict | None = None


def commitlog_files(store_dir) -> list[str]:
    d = os.path.join(store_dir, "commitlog")
    return sorted(os.path.join(d, n) for n in os.listdir(d)) if os.path.isdir(d) else []


def parse_file(path: str) -> tuple[list[Rec], int]:
    """Records of one commitlog file from its start; returns them and where parsing stopped."""
    start = int(os.path.basename(path))
    with open(path, "rb") as f:
        buf = f.read()
    out, pos = [], 0
    while pos < len(buf):
        try:
            kind, total = R.check_record(buf, pos, len(buf))
        except CorruptRecordError:
            break
        if kind == R.RecordKind.BLANK:
            out.append(Rec(start + pos, total, kind))
        else:
            h, topic, body, props = R.decode_record(buf, pos)
            out.append(Rec(start + pos, total, kind, topic, body, h.queue_id, h.queue_offset,
                           h.phys_offset, h.store_ts_ms, props))
        pos += total
    return out, pos


def parse_log(store_dir) -> list[Rec]:
    """Every message record of the commitlog, in order (blank records left out)."""
    recs = []
    for path in commitlog_files(store_dir):
        file_recs, _ = parse_file(path)
        recs += [r for r in file_recs if r.kind == R.RecordKind.MESSAGE]
    return recs


def body_for(topic: str, queue_id: int, i: int, pad: int = 0) -> bytes:
    """A unique body naming its queue and index, padded to vary record sizes."""
    return f"{topic}|{queue_id}|{i:07d}|".encode() + b"x" * pad


def key_for(topic: str, queue_id: int, i: int) -> str:
    return f"K-{topic}-{queue_id}-{i}"


def make_msg(topic: str, queue_id: int, i: int, pad: int = 0, tags: str | None = None) -> Message:
    return Message(topic, body_for(topic, queue_id, i, pad), tags=tags or f"t{i % 3}",
                   keys=[key_for(topic, queue_id, i)])


def read_queue(store: MessageStore, topic: str, queue_id: int, start: int = 0, max_count: int = 500):
    """Every message of a queue from ``start`` through ``get`` (FOUND pages until the end)."""
    from hostmq.store.reader import GetStatus
    out, off = [], start
    while True:
        g = store.get(topic, queue_id, off, max_count=max_count)
        if g.status != GetStatus.FOUND:
            break
        assert g.next_offset > off
        out += g.messages
        off = g.next_offset
    return out


def read_queue_batches(store: MessageStore, topic: str, queue_id: int, start: int = 0,
                       max_count: int = 4096) -> list[bytes]:
    """Every body of a queue through ``get_batch``."""
    bodies, off = [], start
    while off < store.max_offset(topic, queue_id):
        b = store.get_batch(topic, queue_id, off, max_count=max_count)
        assert b.next_offset > off, (off, b.status)
        bodies += [bytes(x) for x in b.bodies]
        off = b.next_offset
    return bodies


def put_at(store: MessageStore, msg: Message, now_ms: int, queue_id: int = 0,
           uniq_key: str | None = None) -> int:
    """Store one message with store time ``now_ms`` through the facade; returns its phys offset."""
    cfg = store.config
    rec = encode_message(msg, msg.topic.encode(), queue_id, max_body_bytes=cfg.max_message_bytes,
                         max_props_bytes=cfg.max_properties_bytes, born_host=store.commitlog.store_host,
                         uniq_key=uniq_key, born_ts_ms=now_ms)
    blob, starts = R.encode_batch([rec])
    return int(store.append_encoded(msg.topic, queue_id, blob, starts, now_ms=now_ms).phys_offsets[0])
