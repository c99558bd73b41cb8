"""Page-cache switches in a running broker: the writer and dispatcher map store files with the
configured madvise policy (seen in /proc/PID/smaps)."""
from __future__ import annotations

import os

import pytest

import hostmq
from hostmq import Message
from hostmq.root import RootPaths
from tests.conftest import wait_until
from tests.store.test_madvise import vm_flags

pytestmark = pytest.mark.timeout(120)


def test_writer_and_dispatcher_map_with_the_configured_advice(cluster, root):
    c = cluster(store={"commitlog_file_bytes": 32 << 10, "madvise_commitlog_head": "SEQUENTIAL",
                       "madvise_commitlog_cold": "RANDOM", "madvise_consume_queue": "RANDOM"})
    with hostmq.Producer(c.root) as p:
        for i in range(400):
            p.send(Message("adv", b"x" * 200))
    with hostmq.Admin(c.root) as a:
        pids = a.brokers()[0]["pids"]
    store = RootPaths(root).store_dir("broker-a")

    def writer_rolled():
        logs = sorted(k for k in vm_flags(pids["writer"], store) if k.startswith("commitlog"))
        return logs if len(logs) >= 3 else None
    logs = wait_until(writer_rolled, 30, "the writer to map several commitlog files")
    flags = vm_flags(pids["writer"], store)
    assert "sr" in flags[logs[-1]] and all("rr" in flags[k] for k in logs[:-1])
    d = wait_until(lambda: [f for k, f in vm_flags(pids["dispatcher"], store).items() if k.startswith("consumequeue")],
                   30, "the dispatcher to map consume queues")
    assert all("rr" in f for f in d)


def test_a_broker_with_preallocation_rolls_through_made_ahead_files(cluster, root):
    c = cluster(store={"commitlog_file_bytes": 256 << 10, "warm_mapped_file": True, "preallocate_next_file": True})
    with hostmq.Admin(c.root) as a:
        a.create_topic("pre", queues=2)
    with hostmq.Producer(c.root) as p:
        for i in range(0, 3000, 100):
            p.send_batch([Message("pre", f"{j}".encode() + b"." * 300) for j in range(i, i + 100)])
    commitlog = os.path.join(RootPaths(root).store_dir("broker-a"), "commitlog")
    names = sorted(os.listdir(commitlog))
    assert len([n for n in names if n.isdecimal()]) >= 4, names
    got = set()
    with hostmq.PullConsumer(c.root, group="pre-g", consume_from=hostmq.ConsumeFrom.FIRST_OFFSET) as pc:
        pc.subscribe("pre")
        wait_until(lambda: got.update(int(m.body.split(b".")[0]) for m in pc.poll(0.2)) or len(got) == 3000,
                   60, "every message back")
    c.stop()
    assert not [n for n in os.listdir(commitlog) if not n.isdecimal()]      # the made-ahead file went away


def test_the_writer_locks_the_head_file_when_asked(cluster, root):
    from tests.store.test_mlock import locked_kib
    c = cluster(store={"commitlog_file_bytes": 256 << 10, "mlock_commitlog_head": True})
    with hostmq.Producer(c.root) as p:
        p.send(Message("lk", b"x"))
    with hostmq.Admin(c.root) as a:
        writer = a.brokers()[0]["pids"]["writer"]
    store = RootPaths(root).store_dir("broker-a")
    got = wait_until(lambda: locked_kib(writer, os.path.join(store, "commitlog")), 20, "a locked commitlog file")
    assert list(got) == [f"{0:020d}"] and 0 < got[f"{0:020d}"] <= 256, got     # a VM_LOCKED mapping of the head


def test_status_json_shows_the_flush_latency_histogram(cluster, root):
    c = cluster(store={"flush_disk_type": "SYNC_FLUSH"})
    with hostmq.Producer(c.root) as p:
        for i in range(20):
            p.send(hostmq.Message("hist", b"x%d" % i))
    from hostmq.cli.status import gather
    with hostmq.Admin(c.root) as a:
        b = gather(a)["brokers"][0]
    h = b["tuning"]["flush_latency_us"]
    # every SYNC_FLUSH group commit is one flush in the histogram
    assert h["count"] == b["state"]["flush_count"] >= 1
    assert sum(h["buckets"].values()) == h["count"] and h["p50"] <= h["p99"] <= h["max"]


def test_commitlog_files_every_group_has_read_leave_the_page_cache(cluster, root):
    from hostmq.observe import dir_residency
    c = cluster(store={"commitlog_file_bytes": 1 << 20, "madvise_dontneed_consumed": True,
                       "consumed_check_interval_s": 0.2})
    with hostmq.Admin(c.root) as a:
        a.create_topic("cold", queues=2)
    body = os.urandom(8000)
    with hostmq.Producer(c.root) as p:
        for i in range(500):                          # ~4 MiB: four full 1 MiB files and a head
            p.send(Message("cold", body))
    commitlog = os.path.join(RootPaths(c.root).store_dir("broker-a"), "commitlog")
    files = sorted(os.listdir(commitlog))
    assert len(files) >= 4
    with hostmq.PullConsumer(c.root, group="reader", consume_from=hostmq.ConsumeFrom.FIRST_OFFSET) as pc:
        pc.subscribe("cold", "*")
        got = []
        wait_until(lambda: got.extend(pc.poll(0.3)) or len(got) >= 500, 30, "all 500 messages")
        pc.commit()
        older = files[:-1]

        def evicted():
            assert pc.poll(0.05) == []                # an idle consumer, still polling
            res = dir_residency(commitlog)["files"]
            return all(res.get(f, 0.0) < 5.0 for f in older) and res
        # the consumer is still open: its own map of the files had to let go too
        res = wait_until(evicted, 20, "the consumed files to leave the page cache")
        assert res[files[-1]] > 0                     # the newest file stays
    with hostmq.PullConsumer(c.root, group="again", consume_from=hostmq.ConsumeFrom.FIRST_OFFSET) as pc:
        pc.subscribe("cold", "*")
        again = []
        wait_until(lambda: again.extend(pc.poll(0.3)) or len(again) >= 500, 30, "a re-read of all 500")
        assert all(m.body == body for m in again)
