"""Running hostmq as a service (issue 17): systemd units that verify, a clean stop whichever processes
get the signal, exit codes that say what happened, and the notify protocol against a real socket."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

import hostmq
from hostmq import Message
from hostmq.cli.systemd import (BROKER_UNIT, EXPORTER_UNIT, NAMESRV_UNIT, hostmq_command, missing_prerequisites,
                                render_units)
from hostmq.root import RootPaths
from tests.e2e.conftest import consume_bodies
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(180)


def _broker_pids(root: str) -> dict[str, int]:
    with hostmq.Admin(root) as a:
        return dict(a.brokers()[0]["pids"])


def _store_dir(root: str, broker: str = "broker-a") -> str:
    return os.path.join(root, "brokers", broker, "store")


def _log(root: str, name: str) -> str:
    with open(os.path.join(root, "logs", f"{name}.log"), "rb") as f:
        return f.read().decode("utf-8", "replace")


# -- units --------------------------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_rendered_units_pass_systemd_analyze_verify(tmp_path):
    root = str(tmp_path / "root with space")
    out = tmp_path / "units"
    r = subprocess.run([*hostmq_command(), "systemd", root, "--out", str(out), "--user", "root", "--group", "root"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(out)) == sorted([NAMESRV_UNIT, BROKER_UNIT, EXPORTER_UNIT])
    # A template is verified through an instance of it.
    shutil.copy(out / BROKER_UNIT, out / "hostmq-broker@broker-a.service")
    v = subprocess.run(["systemd-analyze", "verify", "--man=no", str(out / NAMESRV_UNIT),
                        str(out / "hostmq-broker@broker-a.service"), str(out / EXPORTER_UNIT)],
                       capture_output=True, text=True, timeout=60)
    assert v.returncode == 0 and v.stderr.strip() == "", v.stderr
    broker = (out / BROKER_UNIT).read_text()
    for line in ("Type=notify", "Restart=on-failure", "LimitMEMLOCK=infinity", "UMask=0007", "RemoveIPC=no",
                 "ProtectSystem=strict", f'ReadWritePaths="{root}" /dev/shm', "After=hostmq-namesrv.service local-fs.target",
                 "User=root", "Group=root"):
        assert line in broker.splitlines(), line
    exe = [ln for ln in broker.splitlines() if ln.startswith("ExecStart=")][0][len("ExecStart="):]
    assert os.path.isabs(exe.split()[0]) and os.access(exe.split()[0], os.X_OK)
    assert exe.endswith(f'broker "{root}" --name %i')


def test_units_refuse_names_systemd_or_a_shell_would_misread():
    with pytest.raises(hostmq.errors.ConfigError):
        render_units("/srv/hostmq", ["/usr/bin/hostmq"], "bad user\nExecStartPre=/bin/sh", "g")
    with pytest.raises(hostmq.errors.ConfigError):
        render_units("relative/root", ["/usr/bin/hostmq"], "u", "g")
    units = render_units("/srv/100%", ["/opt/hostmq/bin/hostmq"], "mq", "mq")
    assert "ExecStart=/opt/hostmq/bin/hostmq namesrv /srv/100%%" in units[NAMESRV_UNIT]


def test_each_unit_gets_only_what_it_needs():
    units = {name: text.splitlines() for name, text in render_units("/srv/hostmq", ["/usr/bin/hostmq"], "mq", "mq").items()}
    ns, broker, exporter = units[NAMESRV_UNIT], units[BROKER_UNIT], units[EXPORTER_UNIT]
    assert "LimitMEMLOCK=infinity" in broker and "LimitMEMLOCK=infinity" not in ns + exporter
    assert "ReadWritePaths=/srv/hostmq /dev/shm" in broker
    assert "ReadWritePaths=/srv/hostmq" in ns and "ReadWritePaths=/srv/hostmq" in exporter
    assert "RestrictAddressFamilies=AF_UNIX" in ns and "IPAddressDeny=any" in ns
    for unit in units.values():
        assert "CapabilityBoundingSet=" in unit and "SystemCallArchitectures=native" in unit
        assert not any(line.startswith("Documentation=") for line in unit)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_security_rates_every_unit_ok(tmp_path):
    """`systemd-analyze security` (offline, on the files) rated all three 7.8–8.2 EXPOSED before the
    hardening; 5.0 or less is its "OK"/"MEDIUM" boundary."""
    units = render_units("/srv/hostmq", ["/usr/bin/hostmq"], "mq", "mq")
    units["hostmq-broker@broker-a.service"] = units.pop(BROKER_UNIT)
    for name, text in units.items():
        (tmp_path / name).write_text(text)
        r = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager", str(tmp_path / name)],
                           capture_output=True, text=True, timeout=60)
        m = re.search(r"exposure level for \S+: (\d+\.\d+)", r.stdout + r.stderr)
        if m is None and "offline" in r.stderr:
            pytest.skip(f"this systemd-analyze cannot rate unit files offline: {r.stderr.strip()[:200]}")
        assert m, r.stdout[-2000:] + r.stderr[-2000:]
        assert float(m.group(1)) <= 5.0, f"{name}: {m.group(0)}"


def test_systemd_names_what_the_host_lacks_for_the_units(tmp_path):
    lines = missing_prerequisites(str(tmp_path / "no-root"), "no-such-user-hmq", "no-such-group-hmq")
    assert [line.split()[0] for line in lines] == ["user", "group", "root"]
    assert "useradd" in lines[0] and "groupadd" in lines[1] and "install -d -m 2750" in lines[2]
    assert missing_prerequisites(str(tmp_path), "root", "root") == []


# -- a clean stop whatever gets the signal -----------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_every_process_of_a_broker_at_once_stops_it_cleanly(cluster, sig):
    """systemd's default stop (KillMode=control-group) signals every process of the unit at the same
    moment; Ctrl-C signals a whole process group. The children pass it to their supervisor, which
    stops them in order: exit 0, no abort, and the next start is a normal recovery."""
    c = cluster(broker={"ha_listen": "tcp://127.0.0.1:0"})     # every child a master may run, its ha process too
    root = c.root
    with hostmq.Producer(root) as p:
        for i in range(300):
            p.send(Message("fanout", b"m%d" % i))
    pids = _broker_pids(root)
    assert set(pids) == {"broker", "writer", "dispatcher", "flusher", "scheduler", "ha"}
    for pid in pids.values():
        os.kill(pid, sig)
    proc = c.processes["broker-a"]
    assert proc.wait(60) == 0, c.log_tail("broker-a")
    assert not os.path.exists(os.path.join(_store_dir(root), "abort"))
    assert "stopped (clean)" in _log(root, "broker-a")
    c.start_broker("broker-a")
    assert "normal recovery" in c.log_tail("broker-a", 200)
    assert sorted(consume_bodies(root, "fanout", 300, "g-fanout")) == sorted(b"m%d" % i for i in range(300))


def test_a_signal_to_one_child_stops_the_whole_broker_in_order(cluster):
    c = cluster()
    with hostmq.Producer(c.root) as p:
        p.send(Message("one", b"x"))
    os.kill(_broker_pids(c.root)["dispatcher"], signal.SIGTERM)
    assert c.processes["broker-a"].wait(60) == 0, c.log_tail("broker-a")
    assert not os.path.exists(os.path.join(_store_dir(c.root), "abort"))


# -- exit codes ---------------------------------------------------------------------------------------
def test_a_broker_that_stopped_uncleanly_exits_non_zero_and_says_which_child(cluster):
    """A flusher that cannot stop in time is killed: the store needs recovery, so the broker's exit
    code is 1 (systemd restarts it) and its log names the child and how it ended."""
    c = cluster(broker={"child_stop_timeout_s": 1.0})
    with hostmq.Producer(c.root) as p:
        p.send(Message("unclean", b"x"))
    flusher = _broker_pids(c.root)["flusher"]
    os.kill(flusher, signal.SIGSTOP)
    c.processes["broker-a"].send_signal(signal.SIGTERM)
    assert c.processes["broker-a"].wait(60) == 1
    text = _log(c.root, "broker-a")
    assert "flusher killed by SIGKILL" in text and "stopped (store needs recovery)" in text
    assert os.path.exists(os.path.join(_store_dir(c.root), "abort"))
    c.start_broker("broker-a")
    assert "abnormal recovery" in c.log_tail("broker-a", 200)


def _up(root: str, env=None) -> subprocess.Popen:
    cfg = os.path.join(root, "hostmq.toml")
    with open(cfg, "w") as f:
        f.write('[namesrv]\nscan_interval_s = 0.2\nbroker_expiry_s = 1.5\n[broker]\nregister_interval_s = 0.5\n'
                '[store]\ncommitlog_file_bytes = 4194304\nconsume_queue_file_entries = 4000\n'
                'index_slots = 1000\nindex_entries = 8000\n')
    return subprocess.Popen([sys.executable, "-m", "hostmq.cli.main", "up", root], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)


@contextlib.contextmanager
def _running_up(root: str, env=None):
    """``hostmq up`` for the body of the block; killed (its whole session) if still running after."""
    up = _up(root, env)
    try:
        yield up
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()


def _ready(root: str) -> bool:
    try:
        with hostmq.Admin(root) as a:
            rows = a.brokers()
        return bool(rows) and all(r["alive"] for r in rows)
    except hostmq.errors.HostMQError:
        return False


def _wait_exit(proc: subprocess.Popen, timeout_s: float = 60) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"hostmq up did not exit:\n{out}")
    return proc.returncode, out


def test_hostmq_up_exits_non_zero_when_a_server_it_started_dies(root):
    with _running_up(root) as up:
        wait_until(lambda: _ready(root), 60, "the cluster")
        broker = _broker_pids(root)["broker"]
        os.kill(broker, signal.SIGKILL)
        code, out = _wait_exit(up)
    assert code == 1, out
    assert f"broker-a (pid {broker}) killed by SIGKILL" in out


def test_hostmq_up_exits_zero_after_a_clean_stop(root):
    with _running_up(root) as up:
        wait_until(lambda: _ready(root), 60, "the cluster")
        up.send_signal(signal.SIGTERM)
        code, out = _wait_exit(up)
    assert code == 0, out
    assert not os.path.exists(os.path.join(_store_dir(root), "abort"))


# -- the notify protocol -----------------------------------------------------------------------------
class NotifySocket:
    """A real unix datagram socket standing where systemd's would be."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.seen: list[str] = []

    def read(self, timeout_s: float) -> list[str]:
        """Every line received within ``timeout_s``."""
        got = []
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.sock.settimeout(left)
            try:
                got += self.sock.recv(4096).decode().splitlines()
            except socket.timeout:
                break
        self.seen += got
        return got

    def wait_for(self, pred, timeout_s: float, what: str) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                lines = self.sock.recv(4096).decode().splitlines()
            except socket.timeout:
                continue
            self.seen += lines
            for line in lines:
                if pred(line):
                    return line
        raise AssertionError(f"no {what} within {timeout_s} s; got {self.seen[-20:]}")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify(tmp_path):
    n = NotifySocket(str(tmp_path / "notify.sock"))
    yield n
    n.close()


def test_a_broker_under_a_notify_socket_reports_ready_status_watchdog_and_stopping(cluster, notify):
    """READY only once writable and registered; WATCHDOG=1 while every child beats; a SIGSTOPped
    writer stops the pings (systemd would restart the unit), SIGCONT resumes them; STOPPING at stop."""
    c = cluster(broker={"heartbeat_stale_s": 1.0})
    root = c.root
    env = {**os.environ, "NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "1000000"}
    env.pop("WATCHDOG_PID", None)
    proc = subprocess.Popen([sys.executable, "-m", "hostmq.cli.main", "broker", root, "--name", "broker-n",
                             "--config", c.config_file], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        notify.wait_for(lambda ln: ln == "READY=1", 60, "READY=1")
        assert any(ln.startswith("STATUS=recovering") for ln in notify.seen)
        # Ready means usable: registered (the NameServer routes to it) and writable.
        with hostmq.Admin(root) as a:
            a.create_topic("notified", queues=1, brokers=["broker-n"])
            row = [r for r in a.brokers() if r["name"] == "broker-n"][0]
        with hostmq.Producer(root) as p:
            r = p.send(Message("notified", b"x"))
            assert r.status == hostmq.SendStatus.SEND_OK and r.queue.broker == "broker-n"
        notify.wait_for(lambda ln: ln == "WATCHDOG=1", 10, "a watchdog ping")
        notify.wait_for(lambda ln: ln.startswith("STATUS=serving:"), 15, "a serving status")
        writer = row["pids"]["writer"]
        os.kill(writer, signal.SIGSTOP)
        try:
            line = notify.wait_for(lambda ln: ln.startswith("STATUS=unhealthy"), 15, "the unhealthy status")
            assert "writer heartbeat" in line
            assert "WATCHDOG=1" not in notify.read(2.0)      # four halves of the period: no ping
        finally:
            os.kill(writer, signal.SIGCONT)
        notify.wait_for(lambda ln: ln == "WATCHDOG=1", 15, "the pings to resume")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        notify.read(0.2)
        assert "STOPPING=1" in notify.seen
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_hostmq_up_reports_ready_once_every_server_is_ready(root, notify):
    env = {**os.environ, "NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "2000000"}
    with _running_up(root, env) as up:
        notify.wait_for(lambda ln: ln == "READY=1", 60, "READY=1")
        assert _ready(root)                     # no polling: ready when it says so
        notify.wait_for(lambda ln: ln == "WATCHDOG=1", 10, "a watchdog ping")
        up.send_signal(signal.SIGTERM)
        code, out = _wait_exit(up)
    assert code == 0, out
    notify.read(0.2)
    assert "STOPPING=1" in notify.seen
    # The servers it started do not speak for the unit: one READY only.
    assert notify.seen.count("READY=1") == 1


# -- logs ---------------------------------------------------------------------------------------------
def _run_broker(c, name: str, args=(), env=None, stderr=subprocess.DEVNULL, config=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hostmq.cli.main", "broker", c.root, "--name", name,
                             "--config", config or c.config_file, *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=stderr)


def _alive(root: str, name: str) -> bool:
    """Registered, answering, and every child up — the scheduler, the last to log that it is ready,
    holds its session and beats (its "ready" line is written before its first beat)."""
    try:
        with hostmq.Admin(root) as a:
            return any(r["name"] == name and r["alive"] and r["state"].get("scheduler_heartbeat_ms", 0) > 0
                       for r in a.brokers())
    except hostmq.errors.HostMQError:
        return False


def _start_then_stop(c, name: str, **kw) -> None:
    """A broker started by hand, once it is registered and alive stopped with SIGTERM: exit 0."""
    proc = _run_broker(c, name, **kw)
    try:
        wait_until(lambda: _alive(c.root, name), 60, name)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_under_the_journal_every_process_logs_priorities_without_timestamps(cluster, tmp_path):
    c = cluster()
    path = tmp_path / "journal"
    with open(path, "wb") as err:
        st = os.fstat(err.fileno())
        env = {**os.environ, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        env.pop("HOSTMQ_LOG_LEVEL", None)
        _start_then_stop(c, "broker-j", env=env, stderr=err)
    lines = path.read_text().splitlines()
    assert lines and all(ln[:3] in ("<7>", "<6>", "<4>", "<3>", "<2>") for ln in lines), lines[:5]
    assert any(ln.startswith("<6>broker-j hostmq.broker.supervisor INFO broker broker-j running") for ln in lines)
    for child in ("writer", "dispatcher", "flusher", "scheduler"):
        assert any(ln.startswith(f"<6>broker-j.{child} hostmq.broker.{child} INFO ") for ln in lines), child


def test_a_log_file_per_process_and_the_command_lines_level_reaches_the_children(cluster):
    c = cluster()
    with open(c.config_file) as f:
        text = f.read()
    assert 'file = ""' in text
    cfg = os.path.join(c.root, "run", "logging.toml")
    with open(cfg, "w") as f:
        f.write(text.replace('file = ""', 'file = "hostmq.log"'))
    _start_then_stop(c, "broker-f", args=("--log-level", "warning"), config=cfg)
    logs = os.path.join(c.root, "logs")
    names = {"hostmq.broker-f.log"} | {f"hostmq.broker-f.{ch}.log" for ch in
                                       ("writer", "dispatcher", "flusher", "scheduler")}
    assert names <= set(os.listdir(logs))
    # At INFO each of them logs its start ("writer ready", "broker … running"); at WARNING none does.
    for n in names:
        with open(os.path.join(logs, n)) as f:
            assert " INFO " not in f.read(), n
