"""IndexFile / IndexService: real files in tmp_path."""
from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hostmq.config import StoreConfig
from hostmq.errors import ConfigError, ValidationError
from hostmq.records import (INDEX_HEADER, SYSFLAG_TX_COMMIT, SYSFLAG_TX_PREPARED, SYSFLAG_TX_ROLLBACK,
                            IndexHeader, index_file_bytes, java_string_hash)
from hostmq.store.dispatch import DispatchRequest
from hostmq.store.index import (INDEX_DIR, SCALAR_BELOW_REQUESTS, IndexFile, collect_keys, index_file_name,
                                index_key, index_key_hash, index_key_hashes, next_index_file_name)
from hostmq.store.index_service import IndexService

pytestmark = pytest.mark.timeout(60)

T0_MS = 1_700_000_000_000
CLOCK_MS = 1_700_000_123_456


def req(phys_offset: int, uniq_key: str = "", keys: str = "", topic: str = "T", ts_ms: int | None = None,
        sys_flag: int = 0) -> DispatchRequest:
    ts_ms = T0_MS + phys_offset * 10 if ts_ms is None else ts_ms
    return DispatchRequest(topic, 0, phys_offset, 100, 0, ts_ms, 0, keys, uniq_key, sys_flag)


@pytest.fixture
def make_service(tmp_path):
    """Factory of IndexServices over tmp_path (or a given dir); closes every one it made."""
    made = []

    def make(store_dir=tmp_path, slots=101, entries=1000, **kw) -> IndexService:
        cfg = StoreConfig(index_slots=slots, index_entries=entries, **kw)
        svc = IndexService(str(store_dir), cfg, clock_ms=lambda: CLOCK_MS)
        made.append(svc)
        return svc

    yield make
    for svc in made:
        svc.close()


def file_bytes(svc: IndexService) -> list[tuple[str, bytes]]:
    svc.flush()
    return [(os.path.basename(p), Path(p).read_bytes()) for p in svc.files()]


def header_of(path: str) -> IndexHeader:
    return IndexHeader._make(INDEX_HEADER.unpack_from(Path(path).read_bytes(), 0))


def key_with_java_hash(prefix: str, target: int, length: int = 5) -> str:
    """A key k with ``java_string_hash(prefix + k) == target`` (Java's hash is a base-31 polynomial)."""
    want = (target - java_string_hash(prefix) * 31 ** length) % (1 << 32)
    chars = []
    for power in range(length - 1, -1, -1):
        digit, want = divmod(want, 31 ** power)
        chars.append(chr(digit))
    return "".join(chars)


# -- put and query ----------------------------------------------------------------------------------
def test_query_by_key_and_by_uniq_key(make_service):
    svc = make_service()
    svc.build_index([req(0, "U0", "order-1 order-2"), req(100, "U1", "order-2"), req(200, "U2")])
    assert svc.query("T", "U1") == [100]
    assert svc.query("T", "order-1") == [0]
    assert svc.query("T", "order-2") == [100, 0]              # newest first
    assert svc.query("T", "missing") == []
    assert svc.query("other-topic", "U1") == []
    assert svc.max_indexed_phys_offset() == 200


def test_keys_with_extra_spaces_and_no_uniq_key(make_service):
    svc = make_service()
    assert svc.build_index([req(0, "", "  a  b ")]) == 2
    assert svc.query("T", "a") == [0] and svc.query("T", "b") == [0] and svc.query("T", "") == []


def test_header_after_puts(make_service):
    svc = make_service(slots=7)
    svc.build_index([req(0, "a", ts_ms=T0_MS), req(100, "b", ts_ms=T0_MS + 5_500)])
    h = header_of(svc.files()[0])
    assert (h.begin_ts_ms, h.end_ts_ms) == (T0_MS, T0_MS + 5_500)
    assert (h.begin_phys_offset, h.end_phys_offset) == (0, 100)
    assert h.index_count == 3
    used = len({index_key_hash("T#a") % 7, index_key_hash("T#b") % 7})
    assert h.hash_slot_count == used
    assert os.path.getsize(svc.files()[0]) == index_file_bytes(7, 1000)


@pytest.mark.parametrize("begin_ms,end_ms,expected", [
    (0, None, [200, 100, 0]),
    (T0_MS + 1_000, T0_MS + 1_999, [100]),        # inside: only the middle one
    (T0_MS + 1_000, T0_MS + 2_000, [200, 100]),   # both ends inclusive
    (T0_MS + 1_000, None, [200, 100]),             # begin filter
    (0, T0_MS + 1_999, [100, 0]),                  # end filter
    (T0_MS + 3_000, None, []),                     # after every entry
    (0, T0_MS - 1, []),                            # before every entry
])
def test_time_range(make_service, begin_ms, end_ms, expected):
    svc = make_service()
    svc.build_index([req(0, "k", ts_ms=T0_MS), req(100, "k", ts_ms=T0_MS + 1_000),
                     req(200, "k", ts_ms=T0_MS + 2_000)])
    assert svc.query("T", "k", begin_ms=begin_ms, end_ms=end_ms) == expected


def test_times_are_known_to_the_second_so_the_range_errs_wide(make_service):
    svc = make_service()
    svc.build_index([req(0, "k", ts_ms=T0_MS), req(100, "k", ts_ms=T0_MS + 1_500),    # kept as +1 s
                     req(200, "k", ts_ms=T0_MS + 1_900)])                               # kept as +1 s
    assert svc.query("T", "k", begin_ms=T0_MS + 1_500, end_ms=T0_MS + 1_500) == [200, 100]
    assert svc.query("T", "k", begin_ms=T0_MS + 1_600) == [200, 100]   # 100 may be stored then too
    assert svc.query("T", "k", begin_ms=T0_MS + 1_901) == []           # after the file's last time
    assert svc.query("T", "k", end_ms=T0_MS + 999) == [0]
    assert svc.query("T", "k", begin_ms=T0_MS + 1, end_ms=T0_MS + 999) == [0]


def test_is_time_matched(make_service):
    svc = make_service()
    svc.build_index([req(0, "k", ts_ms=T0_MS), req(100, "k", ts_ms=T0_MS + 9_000)])
    f = IndexFile.open(Path(svc.files()[0]), 101, 1000)
    assert f.select_phys_offsets(index_key_hash("T#k"), 10) == [100, 0]
    assert f.select_phys_offsets(index_key_hash("T#k"), 10, T0_MS + 1_000, T0_MS + 9_000) == [100]
    assert f.is_time_matched(T0_MS - 5, T0_MS + 10_000)       # covers
    assert f.is_time_matched(T0_MS + 1, T0_MS + 2)             # inside
    assert f.is_time_matched(T0_MS + 9_000, T0_MS + 20_000)    # touches the end
    assert not f.is_time_matched(T0_MS + 9_001, T0_MS + 20_000)
    assert not f.is_time_matched(0, T0_MS - 1)
    f.close()


# -- hash collisions --------------------------------------------------------------------------------
def test_many_keys_in_few_slots(make_service):
    svc = make_service(slots=7)
    reqs = [req(i * 100, keys=f"key-{i % 13}") for i in range(200)]
    svc.build_index(reqs)
    for k in range(13):
        expected = [r.phys_offset for r in reversed(reqs) if r.keys == f"key-{k}"]
        assert svc.query("T", f"key-{k}", max_num=1000) == expected
        assert svc.query("T", f"key-{k}", max_num=5) == expected[:5]


def test_equal_java_hashes_are_returned_together():
    # "Aa" and "BB" have the same String.hashCode: the index answers by hash, callers check keys.
    assert java_string_hash("T#Aa") == java_string_hash("T#BB")


def test_equal_hash_keys_share_results(make_service):
    svc = make_service(slots=7)
    svc.build_index([req(0, keys="Aa"), req(100, keys="BB"), req(200, keys="Ab")])
    assert svc.query("T", "Aa") == [100, 0] == svc.query("T", "BB")


def test_hash_code_min_value_maps_to_zero(make_service):
    key = key_with_java_hash("T#", -(1 << 31))
    assert java_string_hash(index_key("T", key)) == -(1 << 31)
    assert index_key_hash(index_key("T", key)) == 0
    assert index_key_hashes(["T"], [key])[0] == 0
    svc = make_service(slots=7)
    svc.build_index([req(0, keys=key)])
    assert svc.query("T", key) == [0]
    f = IndexFile.open(Path(svc.files()[0]), 7, 1000)
    assert f.select_phys_offsets(0, 10) == [0]
    f.close()


# -- files: capacity, names, reopen -----------------------------------------------------------------
def test_full_file_rolls_and_queries_span_files(make_service):
    svc = make_service(slots=7, entries=10)          # 9 entries per file: entry 0 is never used
    svc.build_index([req(i * 100, f"U{i}", "shared") for i in range(10)])
    assert len(svc.files()) == 3                      # 20 entries: 9 + 9 + 2
    assert [header_of(p).index_count for p in svc.files()] == [10, 10, 3]
    assert svc.query("T", "U0") == [0] and svc.query("T", "U9") == [900]
    assert svc.query("T", "shared", max_num=100) == [i * 100 for i in range(9, -1, -1)]
    assert svc.query("T", "shared", max_num=4) == [900, 800, 700, 600]


def test_file_names_are_creation_times_and_unique(make_service):
    svc = make_service(slots=3, entries=2)             # one entry per file
    svc.build_index([req(i * 100, f"U{i}") for i in range(3)])
    names = [os.path.basename(p) for p in svc.files()]
    assert names[0] == index_file_name(CLOCK_MS) and len(set(names)) == 3 and names == sorted(names)
    assert all(len(n) == 17 and n.isdigit() for n in names)
    assert next_index_file_name(CLOCK_MS, "20991231235959999") == "21000101000000000"


def test_reopen_loads_files(make_service, tmp_path):
    svc = make_service(slots=7, entries=10)
    svc.build_index([req(i * 100, f"U{i}", "shared") for i in range(10)])
    before = file_bytes(svc)
    svc.close()
    again = make_service(slots=7, entries=10)
    assert file_bytes(again) == before
    assert again.query("T", "U3") == [300]
    assert again.query("T", "shared", max_num=3) == [900, 800, 700]
    assert again.max_indexed_phys_offset() == 900
    again.build_index([req(1000, "U10")])
    assert again.query("T", "U10") == [1000] and len(again.files()) == 3


def test_missing_directory_gives_an_empty_service(make_service, tmp_path):
    svc = make_service(store_dir=tmp_path / "nowhere")
    assert svc.files() == [] and svc.max_indexed_phys_offset() == 0 and svc.query("T", "k") == []
    svc.flush()
    assert svc.truncate(0) == 0 and svc.delete_expired(10**9) == 0
    assert not (tmp_path / "nowhere").exists()
    svc.build_index([req(0, "U0")])
    assert svc.query("T", "U0") == [0]


def test_torn_and_foreign_files_at_start_up(make_service, tmp_path):
    index_dir = tmp_path / INDEX_DIR
    index_dir.mkdir()
    (index_dir / "20240101000000000").write_bytes(b"")                       # torn creation
    (index_dir / "20240101000000001").write_bytes(bytes(index_file_bytes(7, 10)))   # header never written
    (index_dir / "notes.txt").write_text("not an index file")
    svc = make_service(slots=7, entries=10)
    assert svc.files() == []
    assert sorted(os.listdir(index_dir)) == ["notes.txt"]
    (index_dir / "20240101000000002").write_bytes(bytes(100))
    with pytest.raises(ConfigError, match="index_slots"):
        make_service(slots=7, entries=10)


def test_entries_below_two_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError):
        IndexService(str(tmp_path), StoreConfig(index_entries=1))


def test_disabled_index_builds_nothing(make_service):
    svc = make_service(message_index_enable=False)
    assert svc.build_index([req(0, "U0")]) == 0 and svc.files() == []


# -- recovery and retention -------------------------------------------------------------------------
def test_reindexing_indexed_offsets_adds_nothing(make_service):
    svc = make_service(slots=7, entries=10)
    reqs = [req(i * 100, f"U{i}", "k") for i in range(12)]
    svc.build_index(reqs[:8])
    before = file_bytes(svc)
    assert svc.build_index(reqs[:8]) == 0 and svc.build_index(reqs[7:8]) == 0
    assert file_bytes(svc) == before
    assert svc.build_index(reqs[5:]) == 8                   # only 800 .. 1100 are new
    assert svc.query("T", "k", max_num=100) == [i * 100 for i in range(11, -1, -1)]


def test_first_message_at_offset_zero_is_indexed_once(make_service):
    svc = make_service()
    assert svc.build_index([req(0, "U0")]) == 1
    assert svc.build_index([req(0, "U0")]) == 0
    assert svc.query("T", "U0") == [0]


def test_truncate_deletes_files_beyond_the_commitlog(make_service):
    svc = make_service(slots=7, entries=4)              # 3 entries per file
    svc.build_index([req(i * 100, f"U{i}") for i in range(9)])    # files end at 200, 500, 800
    assert len(svc.files()) == 3
    assert svc.truncate(900) == 0
    assert svc.truncate(800) == 1                        # an entry at 800 is beyond an end of 800
    assert svc.max_indexed_phys_offset() == 500 and len(svc.files()) == 2
    assert svc.truncate(450) == 1 and svc.max_indexed_phys_offset() == 200
    assert svc.query("T", "U5") == [] and svc.query("T", "U1") == [100]
    # re-dispatch from the index end rebuilds what was lost
    svc.build_index([req(i * 100, f"U{i}") for i in range(2, 9)])
    assert all(svc.query("T", f"U{i}") == [i * 100] for i in range(9))


def test_truncate_everything(make_service):
    svc = make_service()
    svc.build_index([req(0, "U0")])
    assert svc.truncate(0) == 1 and svc.files() == [] and svc.max_indexed_phys_offset() == 0
    svc.build_index([req(0, "U0")])
    assert svc.query("T", "U0") == [0]


def test_delete_expired_keeps_the_newest(make_service):
    svc = make_service(slots=7, entries=4)
    svc.build_index([req(i * 100, f"U{i}") for i in range(9)])    # files end at 200, 500, 800
    paths = svc.files()
    assert svc.delete_expired(200) == 0
    assert svc.delete_expired(201) == 1 and svc.files() == paths[1:]
    assert not os.path.exists(paths[0])
    assert svc.delete_expired(10**9) == 1 and svc.files() == paths[2:]
    assert svc.query("T", "U8") == [800] and svc.query("T", "U1") == []


# -- transactions -----------------------------------------------------------------------------------
def test_prepared_and_rolled_back_messages_are_not_indexed(make_service):
    svc = make_service()
    svc.build_index([req(0, "P", sys_flag=SYSFLAG_TX_PREPARED), req(100, "R", sys_flag=SYSFLAG_TX_ROLLBACK),
                     req(200, "C", sys_flag=SYSFLAG_TX_COMMIT), req(300, "N")])
    assert svc.query("T", "P") == [] and svc.query("T", "R") == []
    assert svc.query("T", "C") == [200] and svc.query("T", "N") == [300]


def test_batch_of_only_skipped_requests_creates_no_file(make_service):
    svc = make_service()
    reqs = [req(i * 100, f"U{i}", sys_flag=SYSFLAG_TX_ROLLBACK) for i in range(20)] + [req(5000)]
    assert svc.build_index(reqs) == 0 and svc.files() == []


# -- vectorised batches equal one request at a time -------------------------------------------------
def random_requests(rng: random.Random, n: int, start_phys: int = 0) -> list[DispatchRequest]:
    out, phys, ts = [], start_phys, T0_MS
    for _ in range(n):
        phys += rng.randrange(1, 300)
        ts += rng.randrange(-1500, 3000)                 # store times need not increase
        uniq = rng.choice(["", f"U{rng.randrange(40)}", f"ü{rng.randrange(5)}", "\U0001F600x"])
        keys = rng.choice(["", "", f"k{rng.randrange(9)}", f" k{rng.randrange(9)}  k{rng.randrange(9)} "])
        flag = rng.choice([0, 0, 0, SYSFLAG_TX_PREPARED, SYSFLAG_TX_ROLLBACK, SYSFLAG_TX_COMMIT])
        out.append(DispatchRequest(rng.choice(["T", "Topic-B", "%RETRY%g"]), 0, phys, 100, 0, ts, 0,
                                   keys, uniq, flag))
    return out


def build_one_by_one(svc: IndexService, reqs) -> None:
    for r in reqs:
        svc.build_index([r])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("slots,entries", [(1, 50), (7, 13), (101, 2000)])
def test_batch_equals_one_at_a_time(make_service, tmp_path, seed, slots, entries):
    rng = random.Random(seed)
    reqs = random_requests(rng, 300)
    one = make_service(tmp_path / "one", slots=slots, entries=entries)
    build_one_by_one(one, reqs)
    batched = make_service(tmp_path / "batched", slots=slots, entries=entries)
    cuts = sorted(rng.sample(range(SCALAR_BELOW_REQUESTS, len(reqs), SCALAR_BELOW_REQUESTS), 4))
    for a, b in zip([0] + cuts, cuts + [len(reqs)]):
        batched.build_index(reqs[a:b])
    assert file_bytes(batched) == file_bytes(one)
    assert len(one.files()) >= (2 if entries < 100 else 1)


def test_batch_with_many_same_slot_entries_equals_one_at_a_time(make_service, tmp_path):
    reqs = [req(i * 10, f"U{i % 3}", "a b a", ts_ms=T0_MS + i * 700) for i in range(500)]
    one = make_service(tmp_path / "one", slots=2, entries=300)
    build_one_by_one(one, reqs)
    batched = make_service(tmp_path / "batched", slots=2, entries=300)
    batched.build_index(reqs)
    assert file_bytes(batched) == file_bytes(one)
    assert batched.query("T", "a", max_num=3) == [4990, 4990, 4980]


def test_redispatch_straddling_the_index_end_equals_one_at_a_time(make_service, tmp_path):
    reqs = random_requests(random.Random(7), 200)
    one = make_service(tmp_path / "one", slots=7, entries=40)
    build_one_by_one(one, reqs)
    batched = make_service(tmp_path / "batched", slots=7, entries=40)
    batched.build_index(reqs[:120])
    batched.build_index(reqs[60:])
    assert file_bytes(batched) == file_bytes(one)


def test_unordered_batch_is_indexed_as_one_at_a_time(make_service, tmp_path):
    reqs = [req(p, f"U{p}") for p in (500, 100, 600, 600, 700, 300, 800, 900, 1000, 1100, 1200, 1300, 1400)]
    assert len(reqs) >= SCALAR_BELOW_REQUESTS            # a batch, not the key-by-key path
    one = make_service(tmp_path / "one", slots=7)
    build_one_by_one(one, reqs)
    batched = make_service(tmp_path / "batched", slots=7)
    batched.build_index(reqs)
    assert file_bytes(batched) == file_bytes(one)
    assert batched.query("T", "U100") == []              # below the index end when it came


def hashed_entries(reqs):
    keys, phys, ts = collect_keys(reqs, 0, False)
    hashes = np.array([index_key_hash(k) for k in keys], np.int32)
    return hashes, np.array(phys, np.int64), np.array(ts, np.int64)


def test_build_index_hashes_equals_build_index(make_service, tmp_path):
    reqs = random_requests(random.Random(11), 250)
    one = make_service(tmp_path / "one", slots=7, entries=40)
    build_one_by_one(one, reqs)
    hashed = make_service(tmp_path / "hashed", slots=7, entries=40)
    assert hashed.build_index_hashes(*hashed_entries(reqs[:150])) > 0
    hashes, phys, ts = hashed_entries(reqs[100:])         # re-dispatch overlapping the index end
    hashed.build_index_hashes(hashes, phys, ts)
    assert hashed.build_index_hashes(hashes, phys, ts) == 0
    assert file_bytes(hashed) == file_bytes(one)
    with pytest.raises(ValidationError):
        hashed.build_index_hashes(hashes[::-1], phys[::-1], ts[::-1])


def test_put_key_hashes_equals_put_key(tmp_path):
    rng = random.Random(3)
    keys = [f"T#{rng.randrange(50)}" for _ in range(400)]
    phys = np.arange(400, dtype=np.int64) * 50
    ts = T0_MS + np.cumsum([rng.randrange(0, 2500) for _ in range(400)]).astype(np.int64)
    a = IndexFile.create(tmp_path / "a", 5, 300)
    b = IndexFile.create(tmp_path / "b", 5, 300)
    try:
        assert [a.put_key(k, int(p), int(t)) for k, p, t in zip(keys, phys, ts)].count(True) == 299
        hashes = np.array([index_key_hash(k) for k in keys], dtype=np.int32)
        assert b.put_key_hashes(hashes[:150], phys[:150], ts[:150]) == 150
        assert b.put_key_hashes(hashes[150:], phys[150:], ts[150:]) == 149
        assert b.is_write_full() and not b.put_key("T#x", 0, 0)
        a.flush(), b.flush()
        assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()
    finally:
        a.close(), b.close()


# -- hashing -----------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["T", "Topic-B", "%DLQ%g", "é"]), st.text(max_size=40)),
                min_size=1, max_size=30))
def test_index_key_hashes_match_the_scalar_hash(pairs):
    topics, keys = [t for t, _ in pairs], [k for _, k in pairs]
    expected = [index_key_hash(index_key(t, k)) for t, k in pairs]
    assert index_key_hashes(topics, keys).tolist() == expected
    owners = np.arange(len(keys))[::-1].copy()
    assert index_key_hashes(topics, keys[::-1], owners).tolist() == expected[::-1]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 20), st.integers(2, 40))
def test_batch_equals_one_at_a_time_property(seed, slots, entries):
    reqs = random_requests(random.Random(seed), 60)
    with tempfile.TemporaryDirectory() as d:
        cfg = StoreConfig(index_slots=slots, index_entries=entries)
        one = IndexService(f"{d}/one", cfg, clock_ms=lambda: CLOCK_MS)
        batched = IndexService(f"{d}/batched", cfg, clock_ms=lambda: CLOCK_MS)
        try:
            build_one_by_one(one, reqs)
            batched.build_index(reqs)
            assert file_bytes(batched) == file_bytes(one)
        finally:
            one.close(), batched.close()


@pytest.mark.parametrize("many", [False, True])
def test_a_message_indexed_only_in_part_gets_its_other_keys_on_redispatch(make_service, many):
    """A dispatcher killed between a message's entries left its unique id indexed but not its keys:
    re-dispatch must add exactly the missing entries (the whole-broker kill trials of the fault suite
    found keys that no query returned any more)."""
    svc = make_service()
    first = [req(100 + i, uniq_key=f"U{i}", keys=f"k{i} j{i}") for i in range(3)]
    svc.build_index(first[:2])
    partial = req(120, uniq_key="UP", keys="kp jp")
    # What a kill leaves: only the unique id's entry of the message at 120 went in.
    from hostmq.store.index_keys import batch_keys
    hashes, phys, ts = batch_keys([partial], 0, False)
    assert svc.build_index_hashes(hashes[:1], phys[:1], ts[:1]) == 1
    assert 120 in svc.query("T", "UP") and 120 not in svc.query("T", "kp")
    again = first[:2] + [partial] + [req(130 + i, uniq_key=f"V{i}", keys=f"m{i}") for i in range(2)]
    pad = [req(200 + i, uniq_key=f"W{i}") for i in range(SCALAR_BELOW_REQUESTS)] if many else []
    added = svc.build_index(again + pad)
    assert added == 2 + 4 + len(pad)                  # kp, jp, then two messages of two entries each
    # (a query answers a superset — equal hashes — which a reader confirms against the record)
    assert 120 in svc.query("T", "kp") and 120 in svc.query("T", "jp") and 120 in svc.query("T", "UP")
    assert 131 in svc.query("T", "m1")
    assert svc.build_index(again + pad) == 0          # nothing twice


def test_slots_a_killed_append_left_pointing_past_the_count_are_repaired_at_open(make_service, tmp_path):
    """An append writes entries, then slots, then the header: a kill before the header leaves slots
    naming uncounted entries, which hid every older key of their bucket from queries for good."""
    svc = make_service(slots=7)                          # few slots: buckets shared by many keys
    old = [req(100 + i, uniq_key=f"U{i}", keys=f"k{i}") for i in range(20)]
    svc.build_index(old)
    path = svc.files()[-1]
    svc.close()
    f = IndexFile.open(Path(path), 7, 1000)
    before = f.header
    from hostmq.store.index_keys import batch_keys
    hashes, phys, ts = batch_keys([req(500 + i, uniq_key=f"N{i}", keys=f"n{i}") for i in range(10)], 0, False)
    f.put_key_hashes(hashes, phys, ts)
    f._set_header(before)                                # the header never made it: the kill
    f.flush()
    f.close()
    svc = make_service(slots=7)                          # the dispatcher's restart reopens (repairs)
    for i in range(20):
        assert 100 + i in svc.query("T", f"U{i}") and 100 + i in svc.query("T", f"k{i}"), i
    svc.build_index(old + [req(500 + i, uniq_key=f"N{i}", keys=f"n{i}") for i in range(10)])
    assert all(500 + i in svc.query("T", f"n{i}") for i in range(10))
    assert all(100 + i in svc.query("T", f"U{i}") for i in range(20))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 6), max_size=300), st.integers(0, 8))
def test_trailing_entries_counts_the_newest_entries_of_one_message(runs, probe):
    """What re-dispatch skips of a partly indexed message: the newest entries at one phys offset,
    counted backwards — compared with the whole column, as it was counted before."""
    with tempfile.TemporaryDirectory() as d:
        f = IndexFile.create(os.path.join(d, "f"), 7, 1200)
        try:
            phys = [100 * (i + 1) for i, n in enumerate(runs) for _ in range(n)]
            for p in phys:
                assert f.put_key(f"t#{p}", p, T0_MS)
            last = phys[-1] if phys and probe else 100 * probe
            want = 0
            while want < len(phys) and phys[-1 - want] == last:
                want += 1
            assert f.trailing_entries(last) == (want, want == len(phys))
        finally:
            f.close()


def test_a_reader_finds_a_key_whose_slot_a_batch_in_flight_moved(make_service, tmp_path):
    """The writer appends entries, then slots, then the header. A reader whose header is older than
    a slot it reads (a batch in flight) once saw that slot as empty and lost its whole older chain:
    a restarted scheduler then missed a delivered delay message and sent it again. Here the reader's
    header is from before a batch whose keys share every slot with the one looked for."""
    from hostmq.store.index import IndexReader
    svc = make_service(slots=3, entries=1000)
    svc.build_index([req(100, "U-old", "k-old")])
    reader = IndexReader(str(tmp_path), 3, 1000)
    try:
        assert reader.query("T", "U-old") == [100]          # maps the file, reads its header
        (f,) = reader._files.values()
        stale = f.header
        svc.build_index([req(200 + i, f"U{i}") for i in range(12)])      # every slot moves
        f.header = stale                                    # the header as read before that batch
        assert f.select_phys_offsets(index_key_hash(index_key("T", "U-old")), 8) == [100]
        assert f.select_phys_offsets(index_key_hash(index_key("T", "k-old")), 8) == [100]
        assert 205 in f.select_phys_offsets(index_key_hash(index_key("T", "U5")), 8)   # in flight: a superset
        assert reader.query("T", "U-old") == [100] and reader.query("T", "U5") == [205]
    finally:
        reader.close()
