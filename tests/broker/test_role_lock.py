"""One role decision at a time per broker name (issue 27, attack 2; ``live/role_lock.py``,
``broker/fencing.py``, ``role.effective``): the role lock against a real holder process (alive,
stopped, killed), the starting marker, and the rule that a master of an old epoch starts as a slave —
real files and locks, no broker spawned."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from hostmq.admin import promotion
from hostmq.broker import fencing
from hostmq.broker import promotion as broker_promotion
from hostmq.live import group, role, role_lock
from hostmq.live.runtime import BrokerRuntime
from hostmq.broker.supervisor import take_lock
from hostmq.config import Config
from hostmq.errors import PromotionRefusedError, RoleLockTimeoutError
from hostmq.fsutil import ensure_dir
from hostmq.root import RootPaths

pytestmark = pytest.mark.timeout(60)
SLAVE = Config().with_overrides({"broker": {"role": "SLAVE"}})
M, S = "ASYNC_MASTER", "SLAVE"

_HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def holder():
    """Starts a process that takes a flock on a path and keeps it until its stdin closes."""
    made = []

    def _start(path: str) -> subprocess.Popen:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        p = subprocess.Popen([sys.executable, "-c", _HOLDER, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        made.append(p)
        assert p.stdout.readline() == b"held\n"
        return p

    yield _start
    for p in made:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
        p.wait(10)
        p.stdin.close()
        p.stdout.close()


def test_a_role_decision_waits_for_the_holder_and_times_out_naming_its_pid(tmp_path, holder):
    root = str(tmp_path)
    path = role_lock.lock_path(root, "broker-a")
    p = holder(path)
    assert role_lock.lock_holders(path) == [p.pid]
    with pytest.raises(RoleLockTimeoutError) as e:
        role_lock.RoleLock(root, "broker-a").acquire(0.2)
    assert e.value.holder_pid == p.pid and f"pid {p.pid}" in str(e.value) and "broker-a" in str(e.value)
    p.send_signal(signal.SIGSTOP)           # a stopped holder is named as stopped
    with pytest.raises(RoleLockTimeoutError, match="stopped"):
        role_lock.RoleLock(root, "broker-a").acquire(0.2)
    p.send_signal(signal.SIGKILL)           # the kernel releases it on death
    p.wait(10)
    with role_lock.RoleLock(root, "broker-a").hold(10.0):
        assert role_lock.lock_holders(path) == [os.getpid()]
        with pytest.raises(RoleLockTimeoutError):   # one decision at a time, even in one process
            role_lock.RoleLock(root, "broker-a").acquire(0.05)
    assert role_lock.lock_holders(path) == []


def test_names_have_their_own_locks(tmp_path, holder):
    root = str(tmp_path)
    holder(role_lock.lock_path(root, "broker-a"))
    with role_lock.RoleLock(root, "broker-b").hold(1.0):
        pass


def test_a_starting_marker_counts_only_while_its_writer_holds_the_broker_lock(tmp_path, holder):
    root = str(tmp_path)
    paths = RootPaths(root)
    ensure_dir(paths.broker_dir("broker-a"))
    role_lock.publish_starting(root, "broker-a", M, 0)
    assert role_lock.starting(root, "broker-a") is None          # nobody holds broker.lock: stopped
    fd = take_lock(paths.broker_lock("broker-a"), "test")
    try:
        s = role_lock.starting(root, "broker-a")
        assert (s.pid, s.role, s.epoch, s.is_slave) == (os.getpid(), M, 0, False)
        assert group.starting_master(root, "broker-a") == ("broker-a", s)
    finally:
        os.close(fd)
    holder(paths.broker_lock("broker-a"))  # another process holds it: the marker is not its own
    assert role_lock.starting(root, "broker-a") is None
    role_lock.clear_starting(root, "broker-a")
    assert not os.path.exists(role_lock.starting_path(root, "broker-a"))


def test_a_master_of_an_epoch_below_the_newest_starts_as_a_slave():
    rec = role.RoleRecord
    # The old master (directory 0, never promoted) after its slave 1 was promoted to epoch 1.
    assert role.effective(0, {0: None, 1: rec(M, 1)}) == rec(S, 1, 1)
    # Its record was restored from a backup: still a master of epoch 1 while 2 is the newest.
    assert role.effective(0, {0: rec(M, 1), 1: rec(M, 2)}) == rec(S, 2, 1)
    # A promoted slave directory (id 2) that missed the next promotion joins under its own id.
    assert role.effective(2, {0: None, 1: rec(M, 3), 2: rec(M, 2)}) == rec(S, 3, 0)
    # The newest master is on another host (`ha demote` recorded only a slave): an unused id.
    assert role.effective(0, {0: None, 1: rec(S, 3)}) == rec(S, 3, 2)
    # The newest master, slaves and a never-promoted group keep their records.
    newest = rec(M, 2)
    assert role.effective(1, {0: rec(S, 2, 1), 1: newest}) is newest
    assert role.effective(1, {0: None, 1: None}) is None
    assert role.effective(0, {0: None, 1: None}) is None
    assert role.effective(0, {0: rec(S, 1, 1), 1: rec(M, 1)}) == rec(S, 1, 1)


def test_a_master_steps_down_only_for_a_newer_master():
    assert role.newer_master(1, [("broker-a", 2, True), ("broker-a.2", 3, True)]) == ("broker-a.2", 3)
    assert role.newer_master(1, [("broker-a", 1, True), ("broker-a.2", 5, False)]) is None
    assert role.newer_master(0, []) is None


def test_decide_demotes_a_stale_master_on_disk_and_publishes_that_it_starts(tmp_path):
    root = str(tmp_path)
    master = BrokerRuntime(root, "broker-a", 0)
    slave = BrokerRuntime(root, "broker-a", 1, SLAVE)
    for rt in (master, slave):
        ensure_dir(rt.config_dir)
    assert fencing.decide(slave).is_slave and fencing.newer_master_seen(master) is None
    role.save(slave, role.RoleRecord("SYNC_MASTER", 1))         # promoted while broker-a was away
    assert fencing.newer_master_seen(master) == ("broker-a.1", 1)
    rt = fencing.decide(master)
    assert (rt.is_slave, rt.epoch, rt.registered_id) == (True, 1, 1)
    assert role.load(master) == role.RoleRecord(S, 1, 1)         # recorded: the next start agrees
    with open(role_lock.starting_path(root, "broker-a"), "rb") as f:
        assert b'"SLAVE"' in f.read()
    promoted = fencing.decide(slave)
    assert (promoted.is_slave, promoted.epoch) == (False, 1)
    assert fencing.newer_master_seen(promoted) is None


def test_decide_and_promote_wait_for_the_lock_then_fail_typed(tmp_path, holder):
    root = str(tmp_path)
    slave = BrokerRuntime(root, "broker-a", 1, SLAVE)
    ensure_dir(slave.config_dir)
    p = holder(role_lock.lock_path(root, "broker-a"))
    p.send_signal(signal.SIGSTOP)
    with pytest.raises(RoleLockTimeoutError, match=f"pid {p.pid}"):
        fencing.decide(slave, timeout_s=0.2)
    with pytest.raises(RoleLockTimeoutError, match=f"pid {p.pid}"):
        # The lock is taken before the slave is asked: no client is needed to get this far.
        promotion.promote(root, "broker-a", 1, instance_client=object(), lock_timeout_s=0.2)


def test_a_starting_master_makes_the_slave_refuse():
    why = broker_promotion.refusal(is_slave=True, replica_connected=False, write_pos=10, master_end_pos=10,
                            master_running=None, force=True, master_starting="broker-a (pid 7)")
    assert "broker-a (pid 7) is starting" in why
    assert broker_promotion.refusal(is_slave=True, replica_connected=False, write_pos=10, master_end_pos=10,
                             master_running=None, force=False) is None
    assert issubclass(RoleLockTimeoutError, TimeoutError) and not issubclass(RoleLockTimeoutError,
                                                                              PromotionRefusedError)


def test_promote_demotes_an_instance_that_holds_its_broker_lock_but_has_not_read_its_role(tmp_path, holder):
    root = str(tmp_path)
    paths = RootPaths(root)
    ensure_dir(paths.broker_dir("broker-a"))
    assert promotion._past_role_decision(root, "broker-a")       # never ran: nothing to decide
    p = holder(paths.broker_lock("broker-a"))
    assert not promotion._past_role_decision(root, "broker-a")   # locked, no marker: reads what promote writes
    p.kill()
    p.wait(10)
    fd = take_lock(paths.broker_lock("broker-a"), "test")
    try:
        role_lock.publish_starting(root, "broker-a", M, 0)
        assert promotion._past_role_decision(root, "broker-a")   # starting: the slave refuses
    finally:
        os.close(fd)


def test_demote_holds_the_role_lock(tmp_path, holder):
    root = str(tmp_path)
    ensure_dir(RootPaths(root).broker_dir("broker-a"))
    p = holder(role_lock.lock_path(root, "broker-a"))
    with pytest.raises(RoleLockTimeoutError, match=f"pid {p.pid}"):
        promotion.demote(root, "broker-a", 0, 1, lock_timeout_s=0.2)
    p.kill()
    p.wait(10)
    assert promotion.demote(root, "broker-a", 0, 1)["role"] == "SLAVE"
    assert group.record(root, "broker-a") == role.RoleRecord("SLAVE", 1, 1)
