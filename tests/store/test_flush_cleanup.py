"""Flush policy (pure decisions and the store's use of them), the checkpoint, and retention cleanup."""
from __future__ import annotations

import os
import time

import pytest

from hostmq import records as R
from hostmq.errors import MessageNotFoundError
from hostmq.message import Message
from hostmq.store import cleanup
from hostmq.store.checkpoint import EMPTY, StoreCheckpoint
from hostmq.store.flush import AsyncFlushState, FlushRequest, GroupCommit, async_flush_pages
from hostmq.store.mapped_file import PAGE_BYTES
from hostmq.store.reader import GetStatus

from .conftest import body_for, commitlog_files, key_for, parse_log, put_at, read_queue

pytestmark = pytest.mark.timeout(120)


# -- async flush decisions ---------------------------------------------------------------------------
def test_async_flush_pages_over_time():
    state = AsyncFlushState(last_flush_ms=0, last_thorough_ms=0)
    # interval 500 ms, at least 4 pages, everything every 10 s
    table = [
        (100, None), (499, None),          # too early
        (500, 4), (600, None), (999, None),
        (1000, 4), (1499, None), (1500, 4),
        (9999, 4),                         # late wake-up: still a normal flush
        (10_000, None),                    # 1 ms after the last flush
        (10_499, 0),                       # 10 s since the last thorough flush (at 0): flush everything
        (12_000, 4), (12_100, None), (12_600, 4),
        (20_498, 4), (20_999, 0),          # next thorough one 10 s after 10_499 (first wake-up ≥ 20_499)
        (21_500, 4),
        (21_000, None), (21_999, None),    # the clock went back: wait for the interval again
        (22_000, 4), (30_999, 0),
    ]
    got = [(now, async_flush_pages(now, state, 500, 4, 10_000)) for now, _ in table]
    assert got == table
    assert (state.last_flush_ms, state.last_thorough_ms) == (30_999, 30_999)


def test_async_flush_with_every_wake_up_thorough():
    state = AsyncFlushState(0, 0)
    assert [async_flush_pages(t, state, 0, 4, 0) for t in (0, 1, 1, 5)] == [0, 0, 0, 0]


# -- group commit ----------------------------------------------------------------------------------------
def test_group_commit_answers_done_and_timed_out_requests():
    gc = GroupCommit()
    assert gc.needed_offset() == 0
    assert gc.complete(10 ** 9, 0) == ([], [])
    reqs = [FlushRequest(100, 5000, "a"), FlushRequest(300, 1000, "b"), FlushRequest(200, 2000, "c"),
            FlushRequest(400, 9000, "d"), FlushRequest(100, 500, "e")]
    for r in reqs:
        gc.add(r)
    assert gc.needed_offset() == 400
    done, late = gc.complete(flushed_offset=150, now_ms=600)
    assert [r.token for r in done] == ["a", "e"]
    assert late == []
    done, late = gc.complete(flushed_offset=150, now_ms=2000)
    assert done == [] and [r.token for r in late] == ["b", "c"]
    assert gc.needed_offset() == 400
    done, late = gc.complete(flushed_offset=400, now_ms=10 ** 6)      # done wins over late
    assert [r.token for r in done] == ["d"] and late == []
    assert gc.waiting == [] and gc.needed_offset() == 0


# -- cleanup decisions ---------------------------------------------------------------------------------
@pytest.mark.parametrize("hour, when, want", [
    (4, "04", True), (5, "04", False), (3, "04", False), (4, "4", True),
    (16, "04;16", True), (4, "04;16", True), (10, "04;16", False),
    (16, " 04 ; 16 ", True), (0, "", False), (0, "00", True), (4, "xx;04", True), (0, "24", False),
    (23, "23", True),
])
def test_is_delete_hour(hour, when, want):
    assert cleanup.is_delete_hour(hour, when) is want


@pytest.mark.parametrize("hour, ratio, manual, want", [
    # (delete_expired, force, refuse_writes) with delete_when "04", max 0.75, force 0.85, refuse 0.90
    (10, 0.10, False, (False, False, False)),
    (4, 0.10, False, (True, False, False)),          # the delete hour
    (10, 0.10, True, (True, False, False)),          # asked for
    (10, 0.75, False, (False, False, False)),        # at the limit is not over it
    (10, 0.76, False, (True, False, False)),         # fuller than max: any hour
    (10, 0.85, False, (True, False, False)),
    (10, 0.86, False, (True, True, False)),          # force the oldest files
    (10, 0.90, False, (True, True, False)),
    (10, 0.91, False, (True, True, True)),           # refuse writes
    (4, 1.00, True, (True, True, True)),
])
def test_cleanup_decide(hour, ratio, manual, want):
    d = cleanup.decide(hour, ratio, "04", 0.75, 0.85, 0.90, manual=manual)
    assert (d.delete_expired, d.force, d.refuse_writes) == want
    assert d.disk_ratio == ratio


def test_disk_used_ratio_is_a_ratio(tmp_path):
    r = cleanup.disk_used_ratio(str(tmp_path))
    assert 0.0 < r <= 1.0


# -- the store's flushing ------------------------------------------------------------------------------
def test_sync_flush_makes_every_put_durable_before_it_returns(open_store):
    store = open_store(message_index_enable=False, flush_disk_type="SYNC_FLUSH")
    cl = store.commitlog
    for i in range(300):
        if i % 10 == 0:
            store.put_batch([Message("SF", body_for("SF", 0, i, 900)) for _ in range(5)])
        else:
            store.put(Message("SF", body_for("SF", 0, i, 900)))
        assert cl.mfq.flushed_offset() == cl.max_offset() > 0, i
    assert len(commitlog_files(store.path)) > 2
    assert all(mf.flushed_pos == mf.wrote_pos for mf in cl.mfq.files)


def test_async_flush_waits_for_enough_dirty_pages(open_store):
    store = open_store(message_index_enable=False, flush_interval_ms=500, flush_least_pages=4,
                       flush_thorough_interval_ms=10 ** 9)
    cl = store.commitlog
    t0 = int(time.time() * 1000) + 3_600_000       # later than the store's own flush clock
    # A fresh store flushes nothing on its own within its interval.
    r = store.append_encoded("AF", 0, *_encoded_batch(store, 1, 100), now_ms=t0)
    assert cl.mfq.flushed_offset() == 0 < cl.max_offset()            # 1 dirty page < 4
    store.append_encoded("AF", 0, *_encoded_batch(store, 1, 100), now_ms=t0 + 100)
    assert cl.mfq.flushed_offset() == 0                               # within the interval
    store.append_encoded("AF", 0, *_encoded_batch(store, 5, PAGE_BYTES - 200), now_ms=t0 + 200)
    assert cl.mfq.flushed_offset() == 0                               # enough pages, too early
    store.append_encoded("AF", 0, *_encoded_batch(store, 1, 100), now_ms=t0 + 700)
    assert cl.mfq.flushed_offset() == cl.max_offset()                 # 5+ pages and 500 ms later
    assert r.phys_offsets.tolist() == [0]


def _encoded_batch(store, n: int, body_bytes: int):
    recs = [R.encode_record(b"AF", b"a" * body_bytes, b"", born_host=store.commitlog.store_host,
                            store_host=store.commitlog.store_host) for _ in range(n)]
    return R.encode_batch(recs)


def test_flush_and_close_write_the_checkpoint(open_store):
    store = open_store(flush_interval_ms=10 ** 9, flush_thorough_interval_ms=10 ** 9)
    cp_path = os.path.join(store.path, "checkpoint")
    assert not os.path.exists(cp_path)
    ts = 1_650_000_000_000
    for i in range(50):
        put_at(store, Message("CP", body_for("CP", 0, i, 500), keys=[key_for("CP", 0, i)]), ts + i)
    end = store.commitlog.max_offset()
    assert store.commitlog.mfq.flushed_offset() < end
    store.flush()                                   # nothing dispatched yet
    with open(cp_path, "rb") as f:
        cp = R.decode_checkpoint(f.read())
    assert cp.commitlog_flushed_offset == end and cp.cq_flushed_phys_offset == 0
    assert cp.physic_msg_ts_ms == ts + 49
    assert store.commitlog.mfq.flushed_offset() == end
    store.dispatch()
    store.flush()
    with open(cp_path, "rb") as f:
        cp = R.decode_checkpoint(f.read())
    assert cp.cq_flushed_phys_offset == cp.index_flushed_phys_offset == end
    assert all(cq.mfq.flushed_offset() == cq.mfq.max_offset() for cq in store.all_consume_queues())
    put_at(store, Message("CP", b"last"), ts + 100)
    end = store.commitlog.max_offset()
    store.close()
    assert not os.path.exists(os.path.join(store.path, "abort"))
    with open(cp_path, "rb") as f:
        cp = R.decode_checkpoint(f.read())
    assert cp.confirm_phys_offset == cp.commitlog_flushed_offset == cp.cq_flushed_phys_offset == end
    assert cp.physic_msg_ts_ms == ts + 100


def test_checkpoint_file_missing_or_corrupt_is_not_valid(tmp_path):
    cp = StoreCheckpoint(str(tmp_path / "checkpoint"))
    assert cp.load() == EMPTY and not cp.valid
    cp.update(confirm_phys_offset=123, physic_msg_ts_ms=456)
    cp.flush()
    assert os.path.getsize(tmp_path / "checkpoint") == R.CHECKPOINT_FILE_BYTES
    again = StoreCheckpoint(str(tmp_path / "checkpoint"))
    v = again.load()
    assert again.valid and (v.confirm_phys_offset, v.physic_msg_ts_ms) == (123, 456)
    with open(tmp_path / "checkpoint", "r+b") as f:
        f.seek(10)
        f.write(b"\x99")
    broken = StoreCheckpoint(str(tmp_path / "checkpoint"))
    assert broken.load() == EMPTY and not broken.valid


# -- retention -----------------------------------------------------------------------------------------
def _fill(store, n=600, ids=None):
    bodies = []
    for i in range(n):
        m = Message("CL", body_for("CL", 0, i, 700), keys=[key_for("CL", 0, i)])
        r = store.put(m)
        bodies.append(m.body)
        if ids is not None:
            ids.append(r.msg_id)
    return bodies


def test_clean_expired_deletes_old_files_by_age(open_store):
    store = open_store(file_reserved_hours=72)
    ids = []
    bodies = _fill(store, ids=ids)
    store.dispatch()
    files = commitlog_files(store.path)
    assert len(files) >= 6
    now_ms = time.time() * 1000
    for i, p in enumerate(files):
        age_h = 100 if i < 3 else 1
        t = (now_ms - age_h * 3_600_000) / 1000
        os.utime(p, (t, t))
    gone = store.clean_expired(now_ms=now_ms)
    assert sorted(gone) == files[:3]
    assert commitlog_files(store.path) == files[3:]
    assert store.clean_expired(now_ms=now_ms) == []                   # the rest are young
    left = {r.body for r in parse_log(store.path)}
    first = bodies.index(next(b for b in bodies if b in left))
    assert store.min_offset("CL", 0) == first > 0
    assert [m.body for m in read_queue(store, "CL", 0, first)] == bodies[first:]
    assert store.query_by_key("CL", key_for("CL", 0, first - 1)) == []
    (m,) = store.query_by_key("CL", key_for("CL", 0, first))
    assert m.body == bodies[first]
    assert store.view(ids[first]).body == bodies[first]
    with pytest.raises(MessageNotFoundError):
        store.view(ids[first - 1])


def test_clean_expired_never_deletes_undispatched_data_and_respects_the_batch_limit(open_store):
    store = open_store(delete_files_batch_max=2)
    bodies = _fill(store)
    n_files = len(commitlog_files(store.path))
    assert store.clean_expired(now_ms=10 ** 15, force=True) == []     # nothing dispatched yet
    assert len(commitlog_files(store.path)) == n_files
    store.dispatch()
    assert len(store.clean_expired(now_ms=10 ** 15, force=True)) == 2
    assert len(store.clean_expired(now_ms=10 ** 15, force=True)) == 2
    assert len(commitlog_files(store.path)) == n_files - 4
    left = {r.body for r in parse_log(store.path)}
    first = bodies.index(next(b for b in bodies if b in left))
    assert store.min_offset("CL", 0) == first
    assert store.get("CL", 0, first - 1).status == GetStatus.OFFSET_TOO_SMALL
    while store.clean_expired(now_ms=10 ** 15, force=True):
        pass
    assert len(commitlog_files(store.path)) == 1                       # the last file always stays


def test_index_files_of_deleted_data_go_too(open_store):
    store = open_store(index_entries=50)
    _fill(store)
    store.dispatch()
    index_dir = os.path.join(store.path, "index")
    before = sorted(os.listdir(index_dir))
    assert len(before) > 10
    while store.clean_expired(now_ms=10 ** 15, force=True):
        pass
    after = sorted(os.listdir(index_dir))
    assert 0 < len(after) < len(before)
    assert after == before[len(before) - len(after):]                  # the oldest went
