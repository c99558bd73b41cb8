"""What a store promises across restarts, configurations, users and clocks (issue 15, items 5, 7,
10, 11): file sizes are the store's own, nothing is world-readable, a whole-broker kill with the
transient store pool loses no acknowledged message, and a wall-clock step kills no session."""
from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import time

import pytest

import hostmq
from hostmq import Message, SendStatus
from hostmq.root import RootPaths, shm_prefix
from hostmq.shm import list_segments
from tests.e2e.conftest import consume_bodies
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(240)


def test_changing_file_sizes_in_the_config_never_deletes_or_hides_data(root):
    """Item 7: another commitlog_file_bytes silently deleted the only commitlog file; another
    consume_queue_file_entries left 299 of 300 messages unreachable. The store's sizes are recorded
    in store.json at creation and used from then on; a differing configuration is logged."""
    small = {"store": {"commitlog_file_bytes": 1 << 20, "consume_queue_file_entries": 100}}
    with hostmq.LocalCluster(root, config=small), hostmq.Producer(root) as p:
        for i in range(300):
            assert p.send(Message("sizes", b"m%03d" % i)).status == SendStatus.SEND_OK
    store = RootPaths(root).store_dir("broker-a")
    files = sorted(os.listdir(os.path.join(store, "commitlog")))
    other = {"store": {"commitlog_file_bytes": 4 << 20, "consume_queue_file_entries": 300_000}}
    with hostmq.LocalCluster(root, config=other) as c:
        got = consume_bodies(root, "sizes", 300, "g-sizes")
        log = c.log_tail("broker-a", 200)
    assert sorted(got) == sorted(b"m%03d" % i for i in range(300))
    assert sorted(os.listdir(os.path.join(store, "commitlog"))) == files
    assert "were ignored" in log or "are ignored" in log
    with open(os.path.join(store, "store.json")) as f:
        assert '"commitlog_file_bytes": 1048576' in f.read()


def test_nothing_a_root_creates_is_readable_by_other_users(root):
    """Item 10: under umask 022 another user read message bodies through the commitlog. Every file,
    directory and shared-memory segment of a root is for its owner (and group) only."""
    old = os.umask(0o022)
    try:
        with hostmq.LocalCluster(root), hostmq.Producer(root) as p:
            p.send(Message("secret", b"the body nobody else may read"))
            wait_until(lambda: consume_bodies(root, "secret", 1, "g-secret"), 20, "the message")
            prefixes = [shm_prefix(root, "broker-a"),
                        shm_prefix(root, "")]
            segs = [s for pre in prefixes for s in list_segments(pre)]
            assert segs, "the broker's state segment should exist"
            for s in segs:
                mode = os.stat("/dev/shm/" + s.lstrip("/")).st_mode
                assert mode & 0o007 == 0, f"{s} is {stat.filemode(mode)}"
            open_to_others = []
            for d, dirs, files in os.walk(root):
                for name in dirs + files:
                    path = os.path.join(d, name)
                    mode = os.lstat(path).st_mode
                    if not stat.S_ISSOCK(mode) and mode & 0o007:
                        open_to_others.append(f"{stat.filemode(mode)} {path}")
            assert not open_to_others, open_to_others
            commitlog = os.path.join(RootPaths(root).store_dir("broker-a"), "commitlog")
            first = os.path.join(commitlog, sorted(os.listdir(commitlog))[0])
            if os.geteuid() == 0:           # a real other user: nobody may not read it
                out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                      "cat", first], capture_output=True, timeout=30)
                assert out.returncode != 0 and b"the body" not in out.stdout
    finally:
        os.umask(old)


def test_a_whole_broker_kill_loses_nothing_acknowledged_from_the_transient_store_pool(root):
    """Item 11: with the pool on, a whole-broker kill lost acknowledged messages that were appended
    to the pool but not yet committed to the file. The pool's shared memory and the broker state
    outlive the processes; the next start commits what was acknowledged before recovering."""
    cfg = {"store": {"commitlog_file_bytes": 4 << 20, "transient_store_pool_enable": True,
                     "commit_interval_ms": 600_000, "commit_least_pages": 1_000_000}}
    c = hostmq.LocalCluster(root, config=cfg).start()
    try:
        with hostmq.Producer(root) as p:
            acked = []
            for i in range(300):
                b = b"pool%04d" % i
                if p.send(Message("pool", b)).status == SendStatus.SEND_OK:
                    acked.append(b)
            with hostmq.Admin(root) as a:
                st = a.brokers()[0]["state"]
                assert st["committed_pos"] < st["write_pos"], "everything was committed: nothing to salvage"
        c.signal_group("broker-a", signal.SIGKILL)         # broker, writer and all die at once
        c.processes["broker-a"].wait(30)
        c.start_broker("broker-a")
        got = consume_bodies(root, "pool", len(acked), "g-pool")
        assert sorted(got) == sorted(acked)
        assert "transient store pool" in c.log_tail("broker-a", 100)
    finally:
        c.stop()


@contextlib.contextmanager
def clock_stepped(seconds: float):
    """Step the machine's wall clock forward by ``seconds`` for the block, and back after it (every
    process on the machine sees it: never run a fault run beside these tests)."""
    try:
        time.clock_settime(time.CLOCK_REALTIME, time.clock_gettime(time.CLOCK_REALTIME) + seconds)
    except PermissionError:
        pytest.skip("stepping the clock needs CAP_SYS_TIME")
    try:
        yield
    finally:
        time.clock_settime(time.CLOCK_REALTIME, time.clock_gettime(time.CLOCK_REALTIME) - seconds)


def test_a_wall_clock_step_breaks_no_session_and_no_view(root):
    """Item 5: a wall-clock step made every live process look dead (psutil create_time moves with
    the clock). Liveness uses boot-relative start ticks: sessions and consumer views survive."""
    with hostmq.LocalCluster(root), hostmq.Producer(root) as p:
        assert p.send(Message("clock", b"before")).status == SendStatus.SEND_OK
        pc = hostmq.PullConsumer(root, group="g-clock", consume_from=hostmq.ConsumeFrom.FIRST_OFFSET)
        try:
            pc.subscribe("clock", "*")
            wait_until(lambda: pc.poll(timeout=0.2), 20, "the first message")
            with clock_stepped(3600.0):
                views_stale = [v.stale() for v in pc.views.values()]
                sessions = list(p._sessions.values())
                usable = [s.usable() for s in sessions]
                sent = p.send(Message("clock", b"during")).status
            assert views_stale == [False] * len(views_stale) and usable == [True] * len(usable)
            assert sent == SendStatus.SEND_OK and list(p._sessions.values()) == sessions
            got = wait_until(lambda: pc.poll(timeout=0.2), 20, "the message sent during the step")
            assert [m.body for m in got] == [b"during"]
        finally:
            pc.close()


def test_a_delay_message_stored_while_the_clock_was_ahead_is_delivered_after_it_steps_back(root):
    """A one-hour forward step and back left store times an hour ahead (they never go back), and the
    scheduler held every delay message stored meanwhile for that hour. An entry due later than its
    level allows from now is due now (RocketMQ correctDeliverTimestamp)."""
    with hostmq.LocalCluster(root), hostmq.Producer(root) as p, \
            hostmq.PullConsumer(root, group="g-clock-delay", consume_from=hostmq.ConsumeFrom.FIRST_OFFSET) as pc:
        pc.subscribe("clock-delay", "*")
        with clock_stepped(3600.0):
            ahead = p.send(Message("clock-delay", b"ahead"))
        assert ahead.status == SendStatus.SEND_OK
        r = p.send(Message("clock-delay", b"delayed", delay_level=1))      # 1 s
        assert r.status == SendStatus.SEND_OK
        got = []
        wait_until(lambda: got.extend(m.body for m in pc.poll(0.2)) or len(got) >= 2, 30,
                   "the delay message, not an hour later")
        assert sorted(got) == [b"ahead", b"delayed"]
