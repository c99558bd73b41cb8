"""The embedded store on a full disk: a typed error, nothing half-stored, appends resume with space."""
from __future__ import annotations

import os
import subprocess

import pytest

from hostmq import Message
from hostmq.errors import StoreFullError
from hostmq.store import MessageStore

pytestmark = pytest.mark.timeout(60)
SMALL = {"commitlog_file_bytes": 256 * 1024, "consume_queue_file_entries": 1000, "index_slots": 100,
         "index_entries": 2000, "disk_refuse_ratio": 0.99999, "disk_force_clean_ratio": 0.9999,
         "disk_max_used_ratio": 0.9999}


@pytest.fixture
def small_disk(tmp_path):
    d = tmp_path / "disk"
    d.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)]).returncode:
        pytest.skip("mounting a tmpfs needs root")
    yield str(d)
    subprocess.run(["umount", "-l", str(d)])


def test_a_batch_that_cannot_roll_is_undone_and_refused(small_disk):
    path = os.path.join(small_disk, "store")
    with MessageStore(path, SMALL) as s:
        s.put(Message("t", b"first"))
        s.dispatch()
        st = os.statvfs(small_disk)
        filler = os.path.join(small_disk, "filler")
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        os.posix_fallocate(fd, 0, st.f_bavail * st.f_frsize - 16 * 1024)    # no room for a second file
        os.close(fd)
        body = b"x" * 1000
        n = 1
        while s.commitlog.max_offset() < 256 * 1024 - 30 * 1024:
            s.put(Message("t", b"%05d" % n + body))
            n += 1
        end = s.commitlog.max_offset()
        with pytest.raises(StoreFullError, match="disk is full"):
            s.put_batch([Message("t", b"batch%03d" % i + body) for i in range(60)])      # crosses the file end
        assert s.commitlog.max_offset() == end and len(s.commitlog.mfq.files) == 1
        os.unlink(filler)
        s.put_batch([Message("t", b"again%03d" % i + body) for i in range(60)])
        s.dispatch()
        got, off = [], 0
        while off < s.max_offset("t", 0):               # one get answers at most max_transfer_bytes
            r = s.get("t", 0, off, max_count=4096)
            got += r.messages
            off = r.next_offset
        bodies = [m.body for m in got]
    assert len(bodies) == n + 60 and not any(b.startswith(b"batch") for b in bodies)
    assert [m.queue_offset for m in got] == list(range(n + 60))
