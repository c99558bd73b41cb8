"""The read side skips records it cannot decode (issue 15, item 9): ``get`` (with and without a tag
filter) and ``get_batch`` pass over them — the offset still advances, they are logged once and
counted — and the batch check agrees with the per-message check on any damage.

Bad records are put into a real store the way an old store or a damaged disk would hold them:
hand-encoded with ``records.encode_record`` and appended through ``append_encoded`` (the writer's
path, which copies bytes), or good records whose bytes are changed in the mapped file afterwards.
"""
from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hostmq import records as R
from hostmq.message import Message
from hostmq.store import read_check
from hostmq.store.read_check import SkippedRecords, check_one, check_rows
from hostmq.store.reader import GetStatus
from hostmq.store.message_store import MessageStore
from tests.store.conftest import put_at, small_config

pytestmark = pytest.mark.timeout(120)
T = "RC"
NOW_MS = 1_700_000_000_000


def append_raw(store: MessageStore, queue_id: int, props: bytes, body: bytes = b"bad", tag: str = "A") -> int:
    """A hand-encoded record with these PROPERTIES bytes, appended as the writer would; its phys offset."""
    rec = R.encode_record(T.encode(), body, props, queue_id=queue_id)
    blob, starts = R.encode_batch([rec])
    return int(store.append_encoded(T, queue_id, blob, starts, now_ms=NOW_MS).phys_offsets[0])


def put_good(store: MessageStore, i: int, queue_id: int = 0, tag: str = "A") -> int:
    return put_at(store, Message(T, f"good-{i}".encode(), tags=tag, properties={"n": str(i)}), NOW_MS, queue_id)


BAD_PROPS = [b"TAGS\x01A\x02n\x01\xff\xfe\x02",      # not UTF-8 (the review's stalled-consumer record)
             b"TAGS\x01A\x02novalue\x02",            # a pair without \x01
             b"TAGS\x01A\x02\x01x\x02"]              # an empty name


@pytest.fixture
def store(tmp_path):
    s = MessageStore(str(tmp_path / "store"), small_config())
    yield s
    s.close()


def fill(store: MessageStore, queue_id: int = 0) -> list[int]:
    """good-0, bad, good-1, bad, good-2, bad, good-3 in one queue; the bad queue offsets."""
    bad = []
    for i in range(4):
        put_good(store, i, queue_id)
        if i < 3:
            append_raw(store, queue_id, BAD_PROPS[i])
            bad.append(2 * i + 1)
    store.dispatch()
    return bad


def bodies_via_get(store: MessageStore, expression: str, max_count: int) -> tuple[list[bytes], int]:
    out, off, skipped = [], 0, 0
    while off < store.max_offset(T, 0):
        g = store.get(T, 0, off, max_count=max_count, expression=expression)
        assert g.next_offset > off, g.status
        out += [m.body for m in g.messages]
        skipped += g.skipped
        off = g.next_offset
    return out, skipped


@pytest.mark.parametrize("expression", ["*", "A", "A || B"])
@pytest.mark.parametrize("max_count", [1, 2, 32])
def test_get_skips_undecodable_records_and_moves_on(store, expression, max_count):
    fill(store)
    bodies, skipped = bodies_via_get(store, expression, max_count)
    assert bodies == [f"good-{i}".encode() for i in range(4)] and skipped == 3


@pytest.mark.parametrize("max_count", [1, 3, 4096])
def test_get_batch_skips_undecodable_records_and_moves_on(store, max_count):
    fill(store)
    off, bodies, offsets, skipped = 0, [], [], 0
    while off < store.max_offset(T, 0):
        b = store.get_batch(T, 0, off, max_count)
        assert b.next_offset > off and b.status in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE)
        bodies += [bytes(x) for x in b.bodies]
        offsets += b.queue_offsets.tolist()
        assert [m.properties["n"] for m in b] == [bytes(x).decode()[5:] for x in b.bodies]
        _, props = b.bodies_and_properties(b.headers(), len(T))
        assert all(R.decode_properties(bytes(p)) for p in props)
        skipped += b.skipped
        off = b.next_offset
    assert bodies == [f"good-{i}".encode() for i in range(4)] and offsets == [0, 2, 4, 6] and skipped == 3


def test_each_skipped_record_is_logged_once_with_its_place(store, caplog, monkeypatch):
    monkeypatch.setattr(read_check, "SKIPPED", SkippedRecords())
    bad = fill(store)
    with caplog.at_level(logging.ERROR, logger="hostmq.store.read_check"):
        for _ in range(3):                                   # read three times, through both paths
            bodies_via_get(store, "*", 32)
            store.get_batch(T, 0, 0, 4096)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and read_check.SKIPPED.count == 3
    for off, line in zip(bad, lines):
        assert f"{T}@-#0 queue offset {off}," in line
    assert "not UTF-8" in lines[0] and "malformed" in lines[1] and "malformed" in lines[2]


def test_skip_log_memory_is_bounded():
    log = SkippedRecords(remembered=10)
    for i in range(100):
        log.note("b", T, 0, i, i, "why")
    log.note("b", T, 0, 99, 99, "why")                       # remembered: not counted again
    assert log.count == 100 and len(log._logged) == 10


def test_a_batch_across_commitlog_files_skips_bad_records_in_each(store):
    want = []
    for i in range(60):                                      # 2 KiB bodies: 64 KiB files roll every ~30
        if i % 20 == 7:
            append_raw(store, 0, BAD_PROPS[0], body=b"y" * 2048)
        else:
            put_at(store, Message(T, f"{i:04d}".encode() + b"x" * 2044, tags="A"), NOW_MS)
            want.append(i)
    store.dispatch()
    assert len(store.commitlog.mfq.files) >= 2
    b = store.get_batch(T, 0, 0, 4096)
    assert [int(bytes(x)[:4]) for x in b.bodies] == want and b.skipped == 3 and b.next_offset == 60
    assert [m.queue_offset for m in b] == b.queue_offsets.tolist() == want


def test_entries_that_point_at_the_wrong_place_are_skipped(store):
    for i in range(6):
        put_good(store, i, queue_id=i % 2)
    store.dispatch()
    cq = store.queues[(T, 0)]
    ents = cq.entries(0, 3)           # writable view of queue 0's entries: good-0, good-2, good-4
    other = store.queues[(T, 1)].entries(0, 1)
    ents["phys_offset"][0] = other["phys_offset"][0]          # a record of another queue
    ents["size"][1] = ents["size"][1] + 1                     # a size the record does not have
    bodies, skipped = bodies_via_get(store, "*", 32)
    assert bodies == [b"good-4"] and skipped == 2
    b = store.get_batch(T, 0, 0, 10)
    assert [bytes(x) for x in b.bodies] == [b"good-4"] and b.queue_offsets.tolist() == [2] and b.skipped == 2


@pytest.mark.parametrize("phys,size", [(-5, 100), (10 ** 12, 100), (0, -1), (0, 10 ** 9), (0, 3)])
def test_impossible_entries_are_skipped_not_raised(store, phys, size):
    put_good(store, 0)
    put_good(store, 1)
    store.dispatch()
    ents = store.queues[(T, 0)].entries(0, 1)
    ents["phys_offset"][0], ents["size"][0] = phys, size
    # skipped as undecodable, or passed over as data no file holds (as retention-deleted data is)
    assert bodies_via_get(store, "*", 32)[0] == [b"good-1"]
    b = store.get_batch(T, 0, 0, 10)
    assert [bytes(x) for x in b.bodies] == [b"good-1"]


def test_a_corrupt_compressed_body_is_skipped(store):
    rec = R.encode_record(T.encode(), b"not zlib", b"TAGS\x01A\x02", sys_flag=R.SYSFLAG_COMPRESSED)
    blob, starts = R.encode_batch([rec])
    store.append_encoded(T, 0, blob, starts, now_ms=NOW_MS)
    put_good(store, 1)
    store.dispatch()
    assert bodies_via_get(store, "*", 32) == ([b"good-1"], 1)
    assert [bytes(x) for x in store.get_batch(T, 0, 0, 10).bodies] == [b"good-1"]


# -- the batch check agrees with the per-message check on any damage ----------------------------------
@pytest.fixture(scope="module")
def damage_store(tmp_path_factory):
    """Records of varied shapes in one commitlog file, dispatched; damaged and restored by the test."""
    s = MessageStore(str(tmp_path_factory.mktemp("dmg") / "store"), small_config(commitlog_file_bytes=1 << 20))
    for i in range(40):
        props = {"n": str(i), "v": "x" * (i % 7)} if i % 5 else {}
        put_at(s, Message(T, b"b" * (1 + i % 9), tags="A" if i % 3 else None, properties=props), NOW_MS, i % 2)
    append_raw(s, 0, b"a\x01b\x01c\x02\x02")                  # valid but not the simple form
    s.dispatch()
    yield s
    s.close()


def rows_of(store: MessageStore, queue_id: int):
    ents = store.queues[(T, queue_id)].entries(0, 1000)
    phys = ents["phys_offset"].astype(np.int64)
    mf = store.commitlog.mfq.find(int(phys[0]))
    return mf, phys - mf.file_from_offset, ents["size"].astype(np.int64), np.arange(len(ents), dtype=np.int64)


@pytest.mark.parametrize("vector_min_rows", [0, 10 ** 6], ids=["vectorised", "one-by-one"])
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_batch_check_agrees_with_the_message_check(damage_store, vector_min_rows, data):
    queue_id = data.draw(st.integers(0, 1))
    mf, rel, sizes, offsets = rows_of(damage_store, queue_id)
    lo, hi = int(rel.min()), int((rel + sizes).max())
    saved = bytes(mf.mm[lo:hi])
    try:
        for _ in range(data.draw(st.integers(1, 6))):
            if data.draw(st.booleans()):                       # anywhere
                at = data.draw(st.integers(lo, hi - 1))
            else:                                              # a record's tail: topic and properties
                k = data.draw(st.integers(0, len(rel) - 1))
                at = int(rel[k] + sizes[k]) - data.draw(st.integers(1, 40))
            mf.wu8[at] = data.draw(st.sampled_from([0, 1, 2, 0x80, 0xC3, 0xFF, 0x7F]))
        if data.draw(st.booleans()):                           # an entry with the wrong size or place
            k = data.draw(st.integers(0, len(rel) - 1))
            sizes = sizes.copy()
            sizes[k] += data.draw(st.sampled_from([-1, 1, -200, 10 ** 7]))
        saved_min, read_check.VECTOR_MIN_ROWS = read_check.VECTOR_MIN_ROWS, vector_min_rows
        try:
            ok = check_rows(mf, rel, sizes, offsets, T.encode(), queue_id)
        finally:
            read_check.VECTOR_MIN_ROWS = saved_min
        want = [not isinstance(check_one(mf.mm, int(p), int(n), T.encode(), queue_id, int(o), ""), str)
                for p, n, o in zip(rel, sizes, offsets)]
        assert ok.tolist() == want
    finally:
        mf.wmm[lo:hi] = saved
