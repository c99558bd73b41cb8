"""hostmq/locks.py: who holds a broker's lock, from the kernel, for errors a user can act on."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hostmq.errors import ConnectError
from hostmq.locks import lock_holders, whereabouts
from hostmq.root import RootPaths

pytestmark = pytest.mark.timeout(60)

HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o640)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


def test_a_broker_that_is_not_running_is_named_with_how_to_start_it(tmp_path):
    root = str(tmp_path)
    os.makedirs(os.path.join(root, "brokers", "broker-a.1"))
    words = whereabouts(root, "broker-a.1")
    assert words.startswith("it is not running")
    assert f"hostmq up {root}" in words and f"hostmq broker {root} --name broker-a --id 1" in words
    assert os.path.join(root, "logs", "broker-a.1.log") in words


def test_the_pid_holding_a_broker_lock_is_named(tmp_path):
    root = str(tmp_path)
    os.makedirs(os.path.join(root, "brokers", "broker-a"))
    lock = RootPaths(root).broker_lock("broker-a")
    p = subprocess.Popen([sys.executable, "-c", HOLD, lock], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        assert lock_holders(lock) == [p.pid]
        words = whereabouts(root, "broker-a")
        assert f"pid {p.pid}" in words and "holds its lock" in words
    finally:
        p.stdin.close()
        p.wait(10)
    assert lock_holders(lock) == []


def test_a_producer_names_the_broker_that_does_not_listen(tmp_path):
    """The session's ConnectError says where the broker is (here: nowhere) and what to do."""
    from hostmq.ingress.session import ProducerSession

    class Instance:
        root = str(tmp_path)
    paths = RootPaths(str(tmp_path))
    os.makedirs(paths.broker_dir("broker-a"))
    address = f"ipc://{paths.broker_socket('broker-a')}"      # what a NameServer would answer
    with pytest.raises(ConnectError, match=r"broker broker-a does not listen at .*it is not running: start the cluster"):
        ProducerSession(Instance(), "broker-a", address, data_bytes=1 << 16, completion_entries=64, spin_s=0.0)


def test_a_control_client_names_the_broker_or_namesrv_that_does_not_listen(tmp_path):
    """What ``RemotingClient`` raises for a broker's or a NameServer's socket that nothing serves."""
    from hostmq.remoting import _check_listening
    paths = RootPaths(str(tmp_path))
    os.makedirs(paths.broker_dir("broker-b"))
    with pytest.raises(ConnectError, match=r"nothing listening at .*broker\.sock; broker broker-b: it is not running"):
        _check_listening(f"ipc://{paths.broker_socket('broker-b')}")
    with pytest.raises(ConnectError, match=rf"no NameServer runs under {tmp_path}: start the cluster"):
        _check_listening(f"ipc://{paths.namesrv_socket(0)}")
    with pytest.raises(ConnectError, match=r"nothing listening at /nonexistent/x\.sock$"):
        _check_listening("ipc:///nonexistent/x.sock")
