"""The command line's surface (issue 30): --root and global options on either side of the command,
"did you mean", a forgotten argument named as such, ISO times, status without system topics, queues
per broker, --version and ``python -m hostmq`` — and LocalCluster refusing a root `hostmq up` serves."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import hostmq
from tests.conftest import wait_until
from tests.e2e.test_cli import SMALL, Up, assert_nothing_left, hostmq as cli

pytestmark = pytest.mark.timeout(240)


def module(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hostmq", *args], capture_output=True, text=True, timeout=60)


def test_version_and_did_you_mean_without_a_cluster():
    assert module("--version").stdout.strip() == f"hostmq {hostmq.__version__}"
    r = module("stauts")
    assert r.returncode == 2 and "did you mean 'status'?" in r.stderr, r.stderr
    r = module("topic", "craete", "/tmp/x", "t")
    assert r.returncode == 2 and "did you mean 'create'?" in r.stderr, r.stderr


def test_a_forgotten_argument_is_named_not_taken_for_the_root(tmp_path):
    r = module("send", str(tmp_path), "events")
    assert r.returncode == 2 and f"'{tmp_path}' is a path, not a topic" in r.stderr, r.stderr
    r = module("--log-level", "DEBUG", "send", str(tmp_path), "t", "body")
    assert r.returncode == 2 and "--log-level does not apply to 'hostmq send'" in r.stderr, r.stderr
    r = module("send", str(tmp_path), "t", "body")            # a root nothing serves: what to do next
    assert r.returncode == 1 and f"start the cluster: `hostmq up {tmp_path}`" in r.stderr, r.stderr


@pytest.fixture
def served(root):
    with open(f"{root}/hostmq.toml", "w") as f:
        f.write(SMALL)
    up = Up(root, "--brokers", "2")
    try:
        up.wait_for("Ctrl-C stops", 120)
        yield root
        assert up.interrupt() == 0, up.text()
    finally:
        up.kill()
    assert_nothing_left(root, ["broker-a", "broker-b"])


def test_root_on_either_side_iso_times_status_and_a_served_root_refused(served, monkeypatch):
    root = served
    r = cli("--root", root, "topic", "create", "surface", "--queues", "2")
    assert r.returncode == 0 and "queues per broker: broker-a 2, broker-b 2 (4 in all)" in r.stdout, r.stdout + r.stderr
    r = cli("send", "surface", "hello", "--keys", "k1", "--root", root)
    assert r.returncode == 0 and r.stdout.startswith("SEND_OK"), r.stderr
    r = subprocess.run([sys.executable, "-m", "hostmq", "status"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "HOSTMQ_ROOT": root})
    assert r.returncode == 0 and "surface" in r.stdout, r.stderr
    assert "SCHEDULE_TOPIC_XXXX" not in r.stdout
    r = cli("status", root, "--all")
    assert r.returncode == 0
    def query():      # the index is built just after the store: the key shows up within moments
        q = cli("query", "--root", root, "--topic", "surface", "--key", "k1", "--begin", "2000-01-01T00:00:00")
        return q if q.returncode == 0 else None
    r = wait_until(query, 30, "the key in the index")
    assert re.search(r"stored \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ", r.stdout), r.stdout
    r = cli("status", root, "--root", "/somewhere/else")
    assert r.returncode == 2 and "disagree" in r.stderr, r.stderr
    with pytest.raises(hostmq.ConfigError, match="already served by a running cluster"):
        hostmq.LocalCluster(root, brokers=1).start()


def test_global_options_reach_the_command_from_either_side():
    from hostmq.cli.main import apply_globals, build_parser
    parser = build_parser()
    for argv in (["--log-level", "DEBUG", "--root", "/r", "broker", "--name", "b"],
                 ["broker", "--name", "b", "--log-level", "DEBUG", "--root", "/r"],
                 ["broker", "/r", "--name", "b", "--log-level", "debug"]):
        args = parser.parse_args(argv)
        apply_globals(parser, args)
        assert (args.root, args.log_level, args.name) == ("/r", "DEBUG", "b"), argv
    args = parser.parse_args(["--config", "/c.toml", "up", "/r"])
    apply_globals(parser, args)
    assert (args.root, args.config) == ("/r", "/c.toml")
