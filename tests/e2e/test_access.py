"""Access control (issue 17): a root belongs to its owner and one group. Clients run as real other
uids and gids (``setpriv``): a member of the group produces and consumes, anybody else can neither
read the store nor connect — whatever the umask the servers were started under."""
from __future__ import annotations

import os
import shutil
import stat
import tempfile

import pytest

import hostmq
from hostmq.faults.as_user import run_as
from hostmq.root import RootPaths, shm_name, shm_prefix
from hostmq.shm.segment import list_segments
from tests.e2e.conftest import TEST_CONFIG, leftovers, merge

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("unshare"),
                                 reason="needs root, setpriv and unshare to run clients as other users")]

GROUP, MEMBER, OUTSIDER = 54320, 54321, 54322        # ids nobody on the machine uses: no passwd entries

MEMBER_CODE = """
import sys, time, hostmq
root = sys.argv[1]
with hostmq.Producer(root) as p:
    print("SENT", p.send(hostmq.Message("shared", b"from a member")).status.name, flush=True)
pc = hostmq.PullConsumer(root, group="g-member", consume_from=hostmq.ConsumeFrom.FIRST_OFFSET)
try:
    pc.subscribe("shared", "*")
    got, deadline = [], time.monotonic() + 60
    while len(got) < 2 and time.monotonic() < deadline:
        got += [m.body for m in pc.poll(timeout=0.5)]
    print("GOT", sorted(got), flush=True)
finally:
    pc.close()
"""

OUTSIDER_CODE = """
import os, sys, hostmq
root, store_file, segment = sys.argv[1:4]
try:
    with hostmq.Producer(root) as p:
        p.send(hostmq.Message("shared", b"from outside"))
    print("PRODUCED", flush=True)
except hostmq.errors.HostMQError as e:
    print("REFUSED", type(e).__name__, e, flush=True)
for path in (store_file, segment):
    try:
        open(path, "rb").read(1)
        print("READ", path, flush=True)
    except PermissionError:
        print("DENIED", path, flush=True)
"""


@pytest.fixture
def shared_root():
    """A root others could reach if its own mode let them (pytest's tmp dirs are private to root)."""
    base = tempfile.mkdtemp(prefix="hostmq-access-", dir="/tmp")
    os.chmod(base, 0o755)
    scratch = os.path.join(base, "scratch")
    os.makedirs(scratch, mode=0o777)
    os.chmod(scratch, 0o777)
    yield os.path.join(base, "root"), scratch
    shutil.rmtree(base, ignore_errors=True)


def test_group_members_produce_and_consume_and_nobody_else_gets_in(shared_root):
    root, scratch = shared_root
    old = os.umask(0o077)                   # the servers must not depend on a friendly umask
    try:
        cluster = hostmq.LocalCluster(root, config=merge(TEST_CONFIG, {"access": {"group": str(GROUP)}}))
        cluster.start()
    finally:
        os.umask(old)
    try:
        with hostmq.Producer(root) as p:
            p.send(hostmq.Message("shared", b"from the owner"))
        st = os.stat(root)
        assert (st.st_gid, stat.S_IMODE(st.st_mode)) == (GROUP, 0o2750)
        paths = RootPaths(root)
        for sock in (paths.namesrv_socket(0), paths.broker_socket("broker-a")):
            s = os.stat(sock)
            assert (s.st_gid, stat.S_IMODE(s.st_mode)) == (GROUP, 0o660), sock
        commitlog = os.path.join(paths.store_dir("broker-a"), "commitlog")
        first = os.path.join(commitlog, sorted(os.listdir(commitlog))[0])
        f = os.stat(first)
        assert (f.st_gid, stat.S_IMODE(f.st_mode)) == (GROUP, 0o640)
        state = "/dev/shm/" + shm_name(root, "broker-a", "state").lstrip("/")
        seg = os.stat(state)
        assert (seg.st_gid, stat.S_IMODE(seg.st_mode)) == (GROUP, 0o640)

        member = run_as(MEMBER, MEMBER, [GROUP], MEMBER_CODE, root, scratch=scratch)
        assert "SENT SEND_OK" in member.stdout, member.stdout + member.stderr
        assert "GOT [b'from a member', b'from the owner']" in member.stdout, member.stdout + member.stderr

        outsider = run_as(OUTSIDER, OUTSIDER, [], OUTSIDER_CODE, root, first, state, scratch=scratch)
        out = outsider.stdout
        assert "REFUSED" in out and "PRODUCED" not in out, out + outsider.stderr
        assert f"DENIED {first}" in out and f"DENIED {state}" in out, out + outsider.stderr
    finally:
        cluster.stop()
    left = leftovers(root, ["broker-a"])
    assert not left, left
    assert not [s for s in list_segments(shm_prefix(root, "broker-a"))]
