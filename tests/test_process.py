"""Process launching and supervision with real spawned processes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from hostmq.process import Child, Supervisor, restart_delay_s

pytestmark = pytest.mark.timeout(60)


def _wait(cond, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return False


def _pids(path) -> list[int]:
    try:
        with open(path) as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


def test_restart_delay_doubles_for_quick_deaths_and_resets_after_uptime():
    assert [restart_delay_s(n, 0.5) for n in range(4)] == [0.1, 0.2, 0.4, 0.8]
    assert restart_delay_s(30, 0.5) == 5.0
    assert restart_delay_s(7, 60.0) == 0.1


def test_a_child_obeys_sigterm_and_exits_cleanly(tmp_path):
    pidfile = str(tmp_path / "pids")
    c = Child("sleeper", "tests.procs.targets:until_stopped", {"pidfile": pidfile})
    c.start()
    assert _wait(lambda: len(_pids(pidfile)) == 1)
    assert c.stop() == 0
    assert _pids(pidfile + ".stopped") == _pids(pidfile)


def test_the_supervisor_restarts_a_killed_child_and_stops_in_order(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    sup = Supervisor([Child("a", "tests.procs.targets:until_stopped", {"pidfile": a}),
                      Child("b", "tests.procs.targets:until_stopped", {"pidfile": b})])
    sup.start()
    try:
        assert _wait(lambda: len(_pids(a)) == 1 and len(_pids(b)) == 1)
        os.kill(_pids(a)[0], signal.SIGKILL)
        assert _wait(lambda: (sup.check(), len(_pids(a)) == 2)[1])
        assert sup.children[0].history == [-signal.SIGKILL]
        assert psutil.pid_exists(_pids(a)[1])
    finally:
        codes = sup.stop()
    assert codes == {"a": 0, "b": 0}
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in _pids(a) + _pids(b))


def test_children_die_with_their_parent(tmp_path):
    """A parent killed with SIGKILL takes its children along (PR_SET_PDEATHSIG)."""
    pidfile = str(tmp_path / "pids")
    code = ("import sys, time; sys.path.insert(0, %r)\n"
            "from hostmq.process import Child\n"
            "c = Child('x', 'tests.procs.targets:until_stopped', {'pidfile': %r}); c.start()\n"
            "time.sleep(60)\n") % (os.getcwd(), pidfile)
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        assert _wait(lambda: len(_pids(pidfile)) == 1, 30)
        child = _pids(pidfile)[0]
    finally:
        parent.kill()
        parent.wait()
    assert _wait(lambda: not psutil.pid_exists(child) or
                 psutil.Process(child).status() == psutil.STATUS_ZOMBIE, 10)
