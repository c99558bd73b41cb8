"""Page-cache observability (mincore residency, /proc faults and RSS) on real files and processes."""
from __future__ import annotations

import os

import numpy as np
import pytest

from hostmq.observe import broker_tuning, dir_residency, process_stats, residency, resident_pages, flush_histogram_summary

pytestmark = pytest.mark.timeout(60)


def test_residency_follows_eviction_and_reading(tmp_path):
    p = tmp_path / "f"
    with open(p, "wb") as f:
        f.write(os.urandom(2 << 20))
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(p, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)      # clean pages: the kernel drops them
    finally:
        os.close(fd)
    evicted = residency(str(p))
    fd = os.open(p, os.O_RDONLY)
    try:
        # No read-ahead: pages it fetched asynchronously could land between two looks below.
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        os.pread(fd, 1 << 20, 0)                              # the first half back in the cache
    finally:
        os.close(fd)
    half = resident_pages(str(p))
    assert evicted < 50.0
    assert half[1] == (2 << 20) // os.sysconf("SC_PAGE_SIZE")
    assert half[0] >= half[1] // 2 > 0
    assert residency(str(p)) >= 50.0 > evicted
    assert residency(str(p)) == residency(str(p))              # asking reads nothing in


def test_empty_missing_and_directories(tmp_path):
    (tmp_path / "empty").write_bytes(b"")
    assert residency(str(tmp_path / "empty")) == 0.0
    with pytest.raises(FileNotFoundError):
        residency(str(tmp_path / "nope"))
    (tmp_path / "d" / "q").mkdir(parents=True)
    (tmp_path / "d" / "q" / "0").write_bytes(b"x" * 8192)
    r = dir_residency(str(tmp_path / "d"))
    assert set(r["files"]) == {os.path.join("q", "0")} and r["total_pct"] == 100.0 and r["resident_bytes"] == 8192
    assert dir_residency(str(tmp_path / "absent")) == {"files": {}, "total_pct": 0.0, "resident_bytes": 0,
                                                        "total_bytes": 0}


def test_process_stats_count_faults_and_rss():
    before = process_stats(os.getpid())
    a = np.ones(48 << 17)                                      # 48 MiB written: new pages
    after = process_stats(os.getpid())
    assert after["minor_faults"] > before["minor_faults"]
    assert after["rss_bytes"] - before["rss_bytes"] >= 40 << 20
    assert isinstance(after["major_faults"], int) and after["major_faults"] >= before["major_faults"]   # a counter
    del a
    assert process_stats(2 ** 22 + 12345) is None              # no such pid


def test_broker_tuning_without_a_running_broker(tmp_path):
    store = tmp_path / "store"
    (store / "commitlog").mkdir(parents=True)
    (store / "commitlog" / "00000000000000000000").write_bytes(b"\0" * 4096)
    t = broker_tuning(str(store), None)
    assert t["commitlog"]["files"] == {"00000000000000000000": 100.0}
    assert "dirty_bytes" not in t and t["consume_queues"]["total_pct"] == 0.0
    t = broker_tuning(str(store), {"write_pos": 500, "flushed_pos": 200, "flush_latency_us": 7, "flush_count": 3,
                                   "writer_pid": os.getpid(), "broker_pid": 0})
    assert t["dirty_bytes"] == 300 and set(t["processes"]) == {"writer"} and t["processes"]["writer"]["rss_bytes"] > 0


def test_flush_histogram_buckets_and_percentiles():
    from hostmq.shm_layouts import FLUSH_HISTOGRAM_BUCKETS, histogram_bucket, histogram_percentile_us
    assert [histogram_bucket(us) for us in (0, 1, 2, 3, 4, 1000, 1023, 1024)] == [0, 1, 2, 2, 3, 10, 10, 11]
    assert histogram_bucket(10 ** 12) == FLUSH_HISTOGRAM_BUCKETS - 1
    counts = [0] * FLUSH_HISTOGRAM_BUCKETS
    for us in [300] * 98 + [5000, 70000]:       # 98 flushes in [256, 512) µs, one ~5 ms, one ~70 ms
        counts[histogram_bucket(us)] += 1
    assert histogram_percentile_us(counts, 50) == 512.0
    assert histogram_percentile_us(counts, 99) == 8192.0
    assert histogram_percentile_us(counts, 100) == 131072.0
    assert str(histogram_percentile_us([0] * 4, 50)) == "nan"
    s = flush_histogram_summary(counts)
    assert s["count"] == 100 and s["buckets"] == {"<512": 98, "<8192": 1, "<131072": 1} and s["max"] == 131072.0


def test_slowest_phys_is_the_lowest_position_any_group_has_not_read():
    from hostmq.broker.consumed import slowest_phys
    pos = {("t", 0): {5: 500, 9: 900}, ("t", 1): {2: 200}}        # queue → offset → commitlog offset

    def position(topic, qid, offset):
        return pos[(topic, qid)].get(offset)                     # None: nothing at or after it
    assert slowest_phys({}, position, 1000) is None              # no group: nothing known consumed
    assert slowest_phys({"a": {("t", 0): 5}, "b": {("t", 0): 9}}, position, 1000) == 500
    assert slowest_phys({"a": {("t", 0): 9, ("t", 1): 2}}, position, 1000) == 200
    assert slowest_phys({"a": {("t", 0): 10}}, position, 1000) == 1000      # caught up: the log end
