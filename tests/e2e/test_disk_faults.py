"""A full or failing disk under a real broker (issue 15, item 6).

ENOSPC: the store lives on a small tmpfs, filled until the commitlog cannot roll. I/O errors: the
store lives on ext4 on a loop device whose backing file sits on a smaller tmpfs (a thin-provisioned
disk), so write-back fails and ``fdatasync`` returns an error. Both need root (mount, losetup) and
are skipped without it.
"""
from __future__ import annotations

import os
import subprocess
import time

import pytest

import hostmq
from hostmq import Message, SendStatus
from hostmq.errors import BrokerBusyError, StoreFullError
from hostmq.root import RootPaths
from tests.e2e.conftest import consume_bodies
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(240)
MiB = 1 << 20
# The ratio-based refusal and forced cleanup are another mechanism: keep them out of the way.
NO_RATIOS = {"disk_max_used_ratio": 0.9999, "disk_force_clean_ratio": 0.9999, "disk_refuse_ratio": 0.99999}
SMALL = {"commitlog_file_bytes": MiB, "consume_queue_file_entries": 4000, "index_slots": 1000,
         "index_entries": 8000, **NO_RATIOS}


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


@pytest.fixture
def store_tmpfs(root):
    """The broker's store directory on a 4 MiB tmpfs (set up before the cluster, torn down after)."""
    store = RootPaths(root).store_dir("broker-a")
    os.makedirs(store)
    if os.geteuid() != 0 or _run("mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", store).returncode:
        pytest.skip("mounting a tmpfs needs root")
    yield store
    _run("umount", "-l", store)


@pytest.fixture
def store_thin_disk(root, tmp_path):
    """The store on ext4 over a 64 MiB loop device backed by a 6 MiB tmpfs: writes are accepted and
    space is reserved, but write-back fails once 6 MiB are really written."""
    store = RootPaths(root).store_dir("broker-a")
    os.makedirs(store)
    back = tmp_path / "back"
    back.mkdir()
    if os.geteuid() != 0 or _run("mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(back)).returncode:
        pytest.skip("mounting needs root")
    img = back / "img"
    loop = None
    try:
        with open(img, "wb") as f:
            f.truncate(64 * MiB)
        if _run("mkfs.ext4", "-q", "-F", str(img)).returncode:
            pytest.skip("mkfs.ext4 is missing")
        out = _run("losetup", "-f", "--show", str(img))
        if out.returncode:
            pytest.skip(f"no loop device: {out.stderr.strip()}")
        loop = out.stdout.strip()
        if _run("mount", loop, store).returncode:
            pytest.skip("cannot mount the loop device")
        yield store
    finally:
        _run("umount", "-l", store)
        if loop:
            _run("losetup", "-d", loop)
        _run("umount", "-l", str(back))


def _fill(path: str, leave_bytes: int) -> str:
    """Take all free space of ``path``'s file system but ``leave_bytes``; the filler's path."""
    st = os.statvfs(path)
    filler = os.path.join(path, "filler")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, max(4096, st.f_bavail * st.f_frsize - leave_bytes))
    finally:
        os.close(fd)
    return filler


def _writer_pid(root: str) -> int:
    with hostmq.Admin(root) as a:
        return a.brokers()[0]["pids"]["writer"]


def test_a_full_disk_refuses_writes_with_a_typed_error_and_recovers_when_space_is_back(store_tmpfs, cluster):
    c = cluster(store=SMALL)
    root = c.root
    with hostmq.Admin(root) as a:
        a.create_topic("full", queues=1)
    body = b"x" * 1000
    acked, refused = [], []
    with hostmq.Producer(root, retries=0) as p:
        p.send(Message("full", b"first"))
        acked.append(b"first")
        writer = _writer_pid(root)
        with hostmq.Admin(root) as a:                           # consume queue and index files exist
            wait_until(lambda: (lambda s: s["dispatched_pos"] == s["write_pos"])(a.brokers()[0]["state"]),
                       10, "the first message to be dispatched")
        filler = _fill(store_tmpfs, 64 * 1024)                  # no room for another commitlog file
        i = 0
        with hostmq.Admin(root) as a:
            while a.brokers()[0]["state"]["write_pos"] < MiB - 40 * 1024:
                b = b"%06d" % i + body
                p.send(Message("full", b))
                acked.append(b)
                i += 1
        # A batch that must cross into the next file: refused as a whole, nothing of it stored.
        batch = [Message("full", b"batch%04d" % j + body) for j in range(100)]
        with pytest.raises(StoreFullError):
            p.send_batch(batch)
        refused += [m.body for m in batch]
        # Single sends fill what is left of the file, then are refused too (promptly: no timeout).
        with pytest.raises(StoreFullError):
            for j in range(200):
                b = b"tail%04d" % j + body
                try:
                    p.send(Message("full", b), timeout=10.0)
                except StoreFullError:
                    refused.append(b)
                    raise
                acked.append(b)
        assert _writer_pid(root) == writer                      # no crash loop
        # Reads are still served while writes are refused.
        got = consume_bodies(root, "full", len(acked), "g-during", linger_s=1.0)
        assert sorted(got) == sorted(acked)
        os.unlink(filler)                                        # space is back
        after = wait_until(lambda: _try_send(p, b"after" + body), 30, "writes to be accepted again")
        assert after.status == SendStatus.SEND_OK
        acked.append(b"after" + body)
        assert _writer_pid(root) == writer
    got = consume_bodies(root, "full", len(acked), "g-after", linger_s=1.0)
    assert sorted(got) == sorted(acked) and not set(got) & set(refused)


def _try_send(p: hostmq.Producer, body: bytes):
    try:
        return p.send(Message("full", body))
    except StoreFullError:
        return None


def test_a_failed_fdatasync_is_never_reported_as_durable(store_thin_disk, cluster):
    """SYNC_FLUSH on a disk whose write-back fails: once fdatasync has failed, no send is answered
    SEND_OK again (a second fsync would "succeed" without the lost pages: fsyncgate), new sends get
    a typed refusal, and the broker's processes do not crash-loop."""
    c = cluster(store={**SMALL, "flush_disk_type": "SYNC_FLUSH", "sync_flush_timeout_ms": 2000})
    root = c.root
    body = os.urandom(64 * 1024)                                # incompressible: really takes disk space
    statuses, refusals = [], 0
    with hostmq.Producer(root, retries=0, compress_over_bytes=1 << 30) as p, hostmq.Admin(root) as a:
        pids = a.brokers()[0]["pids"]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and refusals < 3:
            try:
                statuses.append(p.send(Message("thin", body), timeout=10.0).status)
            except BrokerBusyError:
                refusals += 1
        state = a.brokers()[0]["state"]
        assert state["flush_error"] != 0, "the thin disk never failed a sync"
        assert refusals >= 3
        first_bad = next(i for i, s in enumerate(statuses) if s != SendStatus.SEND_OK)
        assert all(s != SendStatus.SEND_OK for s in statuses[first_bad:])
        flushed = state["flushed_pos"]
        with pytest.raises(BrokerBusyError, match="disk failed"):
            p.send(Message("thin", b"one more"), timeout=10.0)
        assert a.brokers()[0]["state"]["flushed_pos"] == flushed  # never moves again in this run
        assert a.brokers()[0]["pids"] == pids
