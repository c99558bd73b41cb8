"""The `hostmq` command line as a user runs it: real subprocesses against a root on disk."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from tests.e2e.conftest import leftovers
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(240)

SMALL = """[store]
commitlog_file_bytes = 16777216
consume_queue_file_entries = 4000
index_slots = 1000
index_entries = 8000
[namesrv]
scan_interval_s = 0.2
broker_expiry_s = 1.5
[broker]
register_interval_s = 0.5
"""


def hostmq(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hostmq.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout_s)


class Up:
    """``hostmq up ROOT …`` in its own process group, its output collected by a reader thread."""

    def __init__(self, root: str, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "hostmq.cli.main", "up", root, *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     process_group=0)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, needle: str, timeout_s: float) -> None:
        wait_until(lambda: needle in self.text() or self.proc.poll() is not None, timeout_s, f"{needle!r} from hostmq up")
        assert needle in self.text(), f"hostmq up exited ({self.proc.returncode}) before {needle!r}:\n{self.text()}"

    def interrupt(self, timeout_s: float = 30.0) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout_s)

    def tree(self) -> list[psutil.Process]:
        """``hostmq up`` and every process under it (NameServers, brokers, their children)."""
        try:
            me = psutil.Process(self.proc.pid)
            return [me] + me.children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def kill(self) -> None:
        """Teardown, also after a failure: SIGKILL ``up``'s process group and every process under it
        (the servers run in process groups of their own)."""
        if self.proc.poll() is None:
            for p in self.tree():
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        self.reader.join(5)


def assert_gone(procs: list[psutil.Process]) -> None:
    """None of ``procs`` runs any more (a pid reused by an unrelated process does not count)."""
    def gone(p: psutil.Process) -> bool:
        try:
            return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True
    wait_until(lambda: all(gone(p) for p in procs), 20, "every process of the cluster to exit")


def assert_nothing_left(root: str, brokers) -> None:
    me = psutil.Process()
    wait_until(lambda: not me.children(recursive=True), 20, "every process to exit")
    socks = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".sock")]
    assert not socks, f"socket files left behind: {socks}"
    assert not leftovers(root, brokers), f"shared memory left behind: {leftovers(root, brokers)}"


@pytest.fixture
def small_root(root):
    with open(os.path.join(root, "hostmq.toml"), "w") as f:
        f.write(SMALL)
    return root


def test_up_with_the_demo_then_ctrl_c_stops_everything(small_root):
    up = Up(small_root, "--demo", "--demo-messages", "500")
    try:
        up.wait_for("demo done; still serving", 180)
        out = up.text()
        for phase in ("send (sync, one at a time)", "send_async", "send_batch", "consume (pull, mmap reads)",
                      "end to end"):
            assert phase in out, f"the demo did not report {phase!r}:\n{out}"
        assert "(2000 received)" in out, out
        # The cluster keeps serving after the demo: a client in another process still gets through.
        r = hostmq("send", small_root, "DemoTopic", "after the demo")
        assert r.returncode == 0 and r.stdout.startswith("SEND_OK"), r.stderr
        procs = up.tree()
        cmdlines = [" ".join(p.cmdline()) for p in procs]
        assert sum(" namesrv " in c for c in cmdlines) == 1 and sum(" broker " in c for c in cmdlines) == 1, cmdlines
        assert len(procs) >= 6, f"expected up, a NameServer, a broker and its writer/dispatcher/flusher: {cmdlines}"
        assert up.interrupt() == 0, up.text()
        assert up.text().rstrip().endswith("stopped"), up.text()
        assert "Traceback" not in up.text(), up.text()
    finally:
        up.kill()
    assert_gone(procs)
    assert_nothing_left(small_root, ["broker-a"])


def test_topic_send_consume_status_and_errors(small_root):
    up = Up(small_root, "--brokers", "2")
    try:
        up.wait_for("Ctrl-C stops", 60)
        r = hostmq("topic", "create", small_root, "cli-t", "--queues", "2")
        assert r.returncode == 0, r.stderr
        listed = wait_until(lambda: "cli-t" in (o := hostmq("topic", "list", small_root)).stdout.split() and o, 15,
                            "the topic in the list")
        assert listed.returncode == 0
        route = hostmq("topic", "route", small_root, "cli-t").stdout
        rows = [line.split() for line in route.splitlines()[1:] if line.strip()]
        assert sorted((b, int(q)) for _, b, q in rows) == [(b, q) for b in ("broker-a", "broker-b") for q in (0, 1)]

        sent = []
        for i in range(6):
            r = hostmq("send", small_root, "cli-t", f"body-{i}", "--tags", "even" if i % 2 == 0 else "odd",
                       "--keys", f"k{i}")
            assert r.returncode == 0 and r.stdout.startswith("SEND_OK"), r.stderr
            sent.append(f"body-{i}")
        r = hostmq("consume", small_root, "cli-t", "--group", "cli-g", "--from", "first", "--count", "6",
                   "--idle-exit", "20")
        assert r.returncode == 0, r.stderr
        got = [line.rsplit(": ", 1)[1] for line in r.stdout.splitlines() if ": body-" in line]
        assert sorted(got) == sent
        r = hostmq("consume", small_root, "cli-t", "--group", "cli-even", "--from", "first", "--expr", "even",
                   "--count", "3", "--idle-exit", "20")
        assert sorted(line.rsplit(": ", 1)[1] for line in r.stdout.splitlines() if ": body-" in line) == \
            ["body-0", "body-2", "body-4"]

        status = hostmq("status", small_root)
        assert status.returncode == 0, status.stderr
        assert "broker-a" in status.stdout and "broker-b" in status.stdout
        offsets = [line.split() for line in status.stdout.splitlines() if line.startswith("cli-t ")]
        assert len(offsets) == 4 and sum(int(row[4]) for row in offsets) == 6    # max offsets add up
        assert sorted((row[1], int(row[2])) for row in offsets) == \
            [(b, q) for b in ("broker-a", "broker-b") for q in (0, 1)]
        group = status.stdout.split("group cli-g\n", 1)
        assert len(group) == 2, f"no progress of group cli-g in the status:\n{status.stdout}"
        lags = [line.split() for line in group[1].split("\n\n")[0].splitlines()[1:] if line.strip()]
        assert len(lags) == 4 and all(row[-1] == "0" for row in lags), group[1]    # consumed it all
        js = hostmq("status", small_root, "--json")
        assert js.returncode == 0, js.stderr
        brokers = json.loads(js.stdout)["brokers"]
        assert any(b["state"]["write_pos"] > 0 for b in brokers)
        for b in brokers:                                   # the page-cache picture of each broker
            t = b["tuning"]
            if b["state"]["write_pos"] > 0:                 # just written: in the page cache
                assert t["commitlog"]["total_pct"] > 0 and t["commitlog"]["files"], t
            st = b["state"]                                 # the tuning view reads the same state words
            assert t["flush_count"] == st["flush_count"]
            assert t["dirty_bytes"] == max(0, min(st["write_pos"], st["committed_pos"]) - st["flushed_pos"])
            assert set(t["processes"]) >= {"broker", "writer", "dispatcher", "flusher"}
            assert all(p["rss_bytes"] > 0 and p["minor_faults"] > 0 for p in t["processes"].values()), t

        r = hostmq("topic", "delete", small_root, "cli-t")
        assert r.returncode == 0, r.stderr
        wait_until(lambda: "cli-t" not in hostmq("topic", "list", small_root).stdout.split(), 15, "the topic to go")
        r = hostmq("topic", "route", small_root, "cli-t")
        assert r.returncode == 1 and r.stderr.startswith("hostmq: error:"), (r.returncode, r.stdout, r.stderr)

        # Bad input: one line on stderr, exit 1, no traceback; the servers keep serving.
        missing = small_root + "-missing"
        for args, words in ((("send", missing, "cli-t", "x"), "does not exist"),
                            (("status", missing), "does not exist"),
                            (("topic", "list", missing), "does not exist"),
                            (("send", small_root, "bad topic!", "x"), "characters outside"),
                            (("topic", "create", small_root, "x" * 200), "topic"),
                            (("consume", small_root, "cli-t", "--group", "g", "--expr", "a ||| b",
                              "--count", "1", "--idle-exit", "1"), "")):
            r = hostmq(*args)
            assert r.returncode == 1, (args, r.returncode, r.stdout, r.stderr)
            assert r.stderr.startswith("hostmq: error:") and words in r.stderr, r.stderr
            assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
        assert not os.path.exists(missing), "a command created the root it was pointed at"
        r = hostmq("send", small_root, "cli-t2", "still serving")
        assert r.returncode == 0 and r.stdout.startswith("SEND_OK"), r.stderr
        procs = up.tree()
        assert up.interrupt() == 0, up.text()
    finally:
        up.kill()
    assert_gone(procs)
    assert_nothing_left(small_root, ["broker-a", "broker-b"])


def test_misuse_of_the_command_exits_2(tmp_path):
    r = hostmq("send")
    assert r.returncode == 2 and "usage" in r.stderr.lower()
    r = hostmq("no-such-verb")
    assert r.returncode == 2


def test_a_root_with_nothing_running_is_a_one_line_error(root):
    for args in (("status", root), ("send", root, "t", "x"), ("topic", "list", root)):
        r = hostmq(*args)
        assert r.returncode == 1, (args, r.returncode, r.stdout, r.stderr)
        assert r.stderr.startswith("hostmq: error:") and "no NameServer is running" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert_nothing_left(root, ["broker-a"])


@pytest.mark.parametrize("prop,words", [("TAGS=x", "'TAGS' are used by the system"),
                                        ("TRACE_ON=true", "'TRACE_ON' are used by the system"),
                                        ("k=", "may not be blank"), ("k=  ", "may not be blank"),
                                        ("=v", "wants KEY=VALUE")])
def test_send_refuses_bad_properties_before_it_connects(root, prop, words):
    # The root has nothing running: the property is refused first, as RocketMQ's putUserProperty would.
    r = hostmq("send", root, "t", "x", "--property", prop)
    assert r.returncode == 1 and r.stderr.startswith("hostmq: error:") and words in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
