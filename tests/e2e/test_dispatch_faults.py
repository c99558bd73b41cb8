"""The dispatcher process under faults (issue 15, items 2 and 6): a record it cannot parse, and a disk
with no room for its consume-queue files. In both it keeps running (same pid), stalls, serves what is
dispatched, and carries on once the fault is gone."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

import hostmq
from hostmq import ConsumeFrom, Message
from hostmq import records as R
from hostmq.root import RootPaths
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(180)
FAST_RETRY = {"dispatch_retry_interval_ms": 100}


def _state(root: str) -> tuple[dict, dict]:
    with hostmq.Admin(root) as a:
        row = a.brokers()[0]
    return row["state"], row["pids"]


def _bodies(root: str, topic: str, want: int) -> list[bytes]:
    """Bodies of the topic read from the first offset (stops after ``want`` or when nothing comes)."""
    with hostmq.Admin(root) as a:
        queues = a.route(topic)
    got: list[bytes] = []
    with hostmq.PullConsumer(root, group=f"chk-{time.time_ns()}", consume_from=ConsumeFrom.FIRST_OFFSET,
                             auto_commit=False, max_poll_records=1024) as c:
        c.assign(queues)
        while len(got) < want:
            msgs = c.poll(0.5)
            if not msgs:
                break
            got += [bytes(m.body) for m in msgs]
    return got


def _commitlog_file(root: str, phys: int, file_bytes: int) -> tuple[str, int]:
    start = phys - phys % file_bytes
    return os.path.join(root, "brokers", "broker-a", "store", "commitlog", f"{start:020d}"), phys - start


def test_a_broken_record_stalls_the_dispatcher_until_it_reads_back_whole(cluster):
    c = cluster(store=FAST_RETRY)
    with hostmq.Admin(c.root) as a:
        a.create_topic("d", queues=1)
    with hostmq.Producer(c.root) as p:
        for i in range(10):
            p.send(Message("d", b"m%02d" % i))
        wait_until(lambda: len(_bodies(c.root, "d", 10)) == 10, 30, "10 messages dispatched")
        st, pids = _state(c.root)
        assert st["dispatch_error_pos"] == -1
        dispatcher = pids["dispatcher"]
        os.kill(dispatcher, signal.SIGSTOP)            # records pile up behind it
        try:
            results = [p.send(Message("d", b"m%02d" % i)) for i in range(10, 20)]
            _, bad = R.decode_msg_id(results[3].msg_id)
            path, rel = _commitlog_file(c.root, bad, c.config.store.commitlog_file_bytes)
            fd = os.open(path, os.O_RDWR)
            try:
                at = rel + R.FIELD["body_length"]
                good = os.pread(fd, 4, at)
                os.pwrite(fd, (1 << 30).to_bytes(4, "big"), at)     # a BODYLENGTH that cannot be
            finally:
                os.kill(dispatcher, signal.SIGCONT)
            wait_until(lambda: _state(c.root)[0]["dispatch_error_pos"] == bad, 30, "the error published")
            st, pids = _state(c.root)
            assert st["dispatched_pos"] == bad and pids["dispatcher"] == dispatcher
            assert _bodies(c.root, "d", 20) == [b"m%02d" % i for i in range(13)]
            os.pwrite(fd, good, at)
        finally:
            os.close(fd)
        wait_until(lambda: _state(c.root)[0]["dispatch_error_pos"] == -1, 30, "dispatch to resume")
        assert _bodies(c.root, "d", 20) == [b"m%02d" % i for i in range(20)]
        assert _state(c.root)[1]["dispatcher"] == dispatcher


@pytest.fixture
def small_store_fs(root):
    """The broker's store directory on an 8 MiB tmpfs (unmounted after the cluster stopped)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    store = os.path.join(root, "brokers", "broker-a", "store")
    os.makedirs(store)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", store], check=True)
    yield store
    if subprocess.run(["umount", store]).returncode:
        subprocess.run(["umount", "-l", store], check=True)


def _fill(path: str) -> str:
    """Take every free block of the filesystem holding ``path``; returns the filler file."""
    filler = os.path.join(path, "filler")
    fd = os.open(filler, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        free = os.statvfs(path).f_bavail * os.statvfs(path).f_frsize
        while free > 0:
            try:
                os.posix_fallocate(fd, os.fstat(fd).st_size, free)
            except OSError:
                free //= 2
            else:
                free = os.statvfs(path).f_bavail * os.statvfs(path).f_frsize
    finally:
        os.close(fd)
    return filler


def test_a_full_disk_stalls_dispatch_and_it_resumes_when_space_is_back(small_store_fs, cluster):
    # Writes are never refused (the ratio checks are off): the writer appends into its commitlog file,
    # already allocated; the dispatcher needs new consume-queue files and finds no room.
    c = cluster(store={**FAST_RETRY, "disk_refuse_ratio": 1.0, "disk_force_clean_ratio": 1.0,
                       "disk_max_used_ratio": 1.0})
    with hostmq.Admin(c.root) as a:
        a.create_topic("early", queues=1)
        a.create_topic("late", queues=1)
    with hostmq.Producer(c.root) as p:
        for i in range(5):
            p.send(Message("early", b"e%d" % i))
        wait_until(lambda: len(_bodies(c.root, "early", 5)) == 5, 30, "the first messages dispatched")
        dispatcher = _state(c.root)[1]["dispatcher"]
        filler = _fill(small_store_fs)
        try:
            for i in range(5):
                p.send(Message("late", b"l%d" % i))      # acknowledged: the commitlog has room
            for i in range(5, 8):
                p.send(Message("early", b"e%d" % i))
            # Dispatch is stalled (no room for the late topic's queue file). Consumers do not wait for
            # it: they read what is stored past dispatched_pos from the commitlog (store/tail.py).
            for _ in range(3):                           # (retries happen meanwhile)
                assert _bodies(c.root, "late", 5) == [b"l%d" % i for i in range(5)]
                st = _state(c.root)[0]
                assert st["dispatched_pos"] < st["write_pos"]
            assert _bodies(c.root, "early", 8) == [b"e%d" % i for i in range(8)]
            assert _state(c.root)[1]["dispatcher"] == dispatcher
        finally:
            os.unlink(filler)
        wait_until(lambda: (lambda st: st["dispatched_pos"] == st["write_pos"])(_state(c.root)[0]), 30,
                   "dispatch to resume")
        assert _bodies(c.root, "late", 5) == [b"l%d" % i for i in range(5)]
        assert _bodies(c.root, "early", 8) == [b"e%d" % i for i in range(8)]
        assert _state(c.root)[1]["dispatcher"] == dispatcher


def test_index_files_deleted_as_damaged_at_a_dispatcher_restart_are_rebuilt(cluster):
    """Found by the fault suite (dispatcher@mid-dispatch): a restarted dispatcher that deletes a
    damaged index file (one a killed dispatcher was creating) must index again what that file held —
    it lies below dispatched_pos, and dispatch went on from there, so those keys were lost for good."""
    c = cluster()
    root = c.root
    with hostmq.Admin(root) as a:
        a.create_topic("keyed", queues=2)
    with hostmq.Producer(root) as p:
        for i in range(40):
            p.send(Message("keyed", b"body %d" % i, keys=[f"k{i}"]))
    with hostmq.Admin(root) as a:
        wait_until(lambda: len(a.query_by_key("keyed", "k39")) == 1, 20, "the last key to be indexed")
        index_dir = os.path.join(RootPaths(root).store_dir("broker-a"), "index")
        (newest,) = sorted(os.listdir(index_dir))[-1:]
        dispatcher = _state(root)[1]["dispatcher"]
        os.kill(dispatcher, signal.SIGSTOP)
        with open(os.path.join(index_dir, newest), "r+b") as f:      # as if killed while creating it
            f.write(bytes(R.INDEX_HEADER.size))
        os.kill(dispatcher, signal.SIGKILL)
        wait_until(lambda: _state(root)[1]["dispatcher"] not in (dispatcher, 0), 30, "a new dispatcher")
        for i in range(40):
            got = wait_until(lambda: a.query_by_key("keyed", f"k{i}"), 20, f"key k{i} to be indexed again")
            assert [bytes(m.body) for m in got] == [b"body %d" % i]
        with hostmq.Producer(root) as p:                            # and indexing goes on
            p.send(Message("keyed", b"after", keys=["k-after"]))
        wait_until(lambda: a.query_by_key("keyed", "k-after"), 20, "a new key")
