"""The notify protocol's pure parts (hostmq/sdnotify.py) and recovery's progress line."""
from __future__ import annotations

import socket
import threading

import pytest

from hostmq import process
from hostmq.broker import supervisor
from hostmq.sdnotify import (Watchdog, environment_without_notify, sd_notify, stale_heartbeats,
                             watchdog_period_s)
from hostmq.store.recovery import RecoveryProgress

pytestmark = pytest.mark.timeout(30)


def test_the_watchdog_period_is_systemds_and_only_for_the_pid_it_names():
    assert watchdog_period_s({}) is None
    assert watchdog_period_s({"WATCHDOG_USEC": "30000000"}) == 30.0
    assert watchdog_period_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "7"}, pid=7) == 30.0
    assert watchdog_period_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "7"}, pid=8) is None
    assert watchdog_period_s({"WATCHDOG_USEC": "soon"}) is None
    assert watchdog_period_s({"WATCHDOG_USEC": "0"}) is None


def test_pings_come_every_half_period_stop_while_unhealthy_and_resume_at_once():
    w = Watchdog(period_s=10.0)
    assert w.due(0.0, []) == ["WATCHDOG=1"]
    assert w.due(4.9, []) == []
    assert w.due(5.0, []) == ["WATCHDOG=1"]
    assert w.due(6.0, ["writer heartbeat 12.0 s old"]) == [
        "STATUS=unhealthy: writer heartbeat 12.0 s old; watchdog pings withheld"]
    assert w.due(30.0, ["writer heartbeat 12.0 s old"]) == []           # said once; never pinged
    assert w.due(31.0, ["writer heartbeat 13.0 s old"])[0].startswith("STATUS=unhealthy")
    assert w.due(32.0, []) == ["STATUS=healthy again", "WATCHDOG=1"]
    assert Watchdog(period_s=None).due(0.0, []) == []


def test_stale_heartbeats_name_the_child_and_the_age():
    beats = {"writer": 10_000, "dispatcher": 19_500, "flusher": 0}
    assert stale_heartbeats(beats, now_ms=20_000, stale_ms=5_000) == ["flusher heartbeat missing",
                                                                      "writer heartbeat 10.0 s old"]
    assert stale_heartbeats({"writer": 19_000}, now_ms=20_000, stale_ms=5_000) == []


def test_servers_started_by_a_cluster_do_not_inherit_the_notify_socket():
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "1", "WATCHDOG_PID": "3", "PATH": "/bin"}
    assert environment_without_notify(env) == {"PATH": "/bin"}


def test_exit_statuses_read_as_an_operator_would():
    assert process.describe_exit(0) == "exit code 0"
    assert process.describe_exit(-9) == "killed by SIGKILL"
    assert process.describe_exit(None) == "still running"


def test_recovery_progress_says_phase_bytes_share_and_rate():
    p = RecoveryProgress()
    assert p.line() == "opening"
    p.enter("commitlog scan", 4 << 30)
    p.done_bytes = 1 << 30
    line = p.line()
    assert line.startswith("commitlog scan 1.0 GiB of 4.0 GiB (25 %, ") and line.endswith("/s)")


def test_a_long_recovery_extends_systemds_start_timeout_with_its_progress(tmp_path, monkeypatch):
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(path)
        s.settimeout(10)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        monkeypatch.setattr(supervisor, "RECOVERY_REPORT_S", 0.05)
        progress, done = RecoveryProgress(), threading.Event()
        progress.enter("redispatch", 1000)
        progress.done_bytes = 500
        t = threading.Thread(target=supervisor._report_recovery, args=("broker-a", progress, done))
        t.start()
        try:
            lines = s.recv(4096).decode().splitlines()
        finally:
            done.set()
            t.join()
    assert lines[0] == "EXTEND_TIMEOUT_USEC=100000"
    assert lines[1].startswith("STATUS=recovering: redispatch 500 B of 1000 B (50 %")
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert not sd_notify("READY=1")


def test_sd_notify_reaches_an_abstract_notify_socket(monkeypatch):
    """systemd may name its socket in the abstract namespace (``@…``)."""
    import os
    name = f"hostmq-notify-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("\0" + name)
        s.settimeout(10)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert sd_notify("READY=1\nSTATUS=serving")
        assert s.recv(100) == b"READY=1\nSTATUS=serving"
