"""The short fault run (part of tools/test.sh): a few trials of every fault kind against real clusters.

Every trial kills or stops one process (a broker child, the whole broker, the NameServer, a producer,
the consumer) at a random moment or aimed inside a window, restarts it, and verifies every
acknowledged message; the run must find nothing lost, duplicated, unreachable, unseen or out of
order, no server that crashed on its own, nothing left in /dev/shm and no file outside the roots.
"""
from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import tempfile

import psutil
import pytest

from hostmq.faults.runner import run
from hostmq.faults.plan import RunOptions, parse_kinds
from hostmq.faults.report import COUNTS, failures_text, kinds_table

pytestmark = pytest.mark.timeout(900)

# Every target killed at a random moment, the stops that matter most, and the aimed windows.
ASYNC_KINDS = ("writer:kill,dispatcher:kill,flusher:kill,scheduler:kill,broker:kill,namesrv:kill,producer:kill,"
               "consumer:kill,"
               "writer:stop,broker:stop,producer:stop,consumer:stop,"
               "broker@mid-patch,broker@mid-journal,broker@mid-roll,writer@mid-append,writer@mid-journal,"
               "flusher@mid-flush,dispatcher@mid-dispatch,"
               "attack:member-admin")          # a hostile member of the root's group (issue 27)
OTHER_KINDS = "broker:kill,broker@mid-commit"          # pool: both; SYNC_FLUSH: the whole-broker kill


@pytest.fixture
def short_tmp():
    """A short directory: the roots' socket paths must stay under the 107-byte Unix limit."""
    d = tempfile.mkdtemp(prefix="hf-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def no_children_left(before=frozenset()):
    """Children of this test process still running (``before``: pids that predate the test, such as
    multiprocessing's resource tracker an earlier test started)."""
    me = psutil.Process()
    gone, alive = psutil.wait_procs([p for p in me.children(recursive=True) if p.pid not in before], timeout=20)
    return alive


@pytest.fixture
def older_children():
    return frozenset(p.pid for p in psutil.Process().children(recursive=True))


def check(summary) -> None:
    table = kinds_table(summary.rows + summary.finals)
    broken = {c: sum(getattr(r, c) for r in summary.rows + summary.finals) for c in COUNTS}
    assert summary.rows, "no trial ran"
    assert not any(broken.values()) and not summary.leftovers and not summary.outside, \
        f"broken promises {broken}\n{table}\n{failures_text(summary)}"


def every_kind_once(spec: str, config: str, short_tmp: str, older_children) -> None:
    """One trial of each kind in ``spec`` against ``config``'s cluster: all of them ran, nothing broke."""
    kinds = parse_kinds(spec)
    summary = run(RunOptions(trials=len(kinds), kinds=tuple(kinds), configs=(config,), seed=15,
                             work_dir=os.path.join(short_tmp, "w")), progress=print)
    assert sorted(r.kind for r in summary.rows) == sorted(k.name for k in kinds)
    assert not no_children_left(older_children)
    check(summary)


def test_short_run_with_the_default_store(short_tmp, older_children):
    every_kind_once(ASYNC_KINDS, "async", short_tmp, older_children)


def test_short_run_with_the_pool_and_sync_flush(short_tmp, older_children):
    summary = run(RunOptions(trials=3, kinds=tuple(parse_kinds(OTHER_KINDS)), configs=("pool", "sync"), seed=15,
                             work_dir=os.path.join(short_tmp, "w"), fuzz_cases=200), progress=print)
    assert sorted((r.config, r.kind) for r in summary.rows) == [
        ("pool", "broker:kill"), ("pool", "broker@mid-commit"), ("sync", "broker:kill")]
    assert not no_children_left(older_children)
    assert not [f for f in summary.fuzz if f.failures], failures_text(summary)
    check(summary)


def test_the_command_line_writes_its_results(short_tmp, tmp_path):
    out = tmp_path / "out"
    work = os.path.join(short_tmp, "w")
    p = subprocess.run([sys.executable, "-m", "hostmq.cli.main", "faults", work, "--trials", "1",
                        "--kinds", "consumer:stop", "--configs", "async", "--out", str(out), "--seed", "3"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode in (0, 3), p.stderr
    with open(out / "trials.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["kind"] for r in rows] == ["consumer:stop", "final"]
    assert all(int(r["acked"]) > 0 for r in rows)
    report = (out / "report.md").read_text()
    assert "## Trials per fault kind" in report and "| async | consumer:stop | 1 |" in report
    assert p.returncode == 0, report
    assert os.listdir(work) == ["async"]          # a given root is kept, with nothing stray


def test_the_command_line_refuses_a_used_root_and_bad_kinds(tmp_path):
    (tmp_path / "x").write_text("")
    for args, want in ((["faults", str(tmp_path), "--trials", "1"], "not empty"),
                       (["faults", "--kinds", "kernel"], "unknown fault kind"),
                       (["faults", "--configs", "fast"], "unknown configuration"),
                       (["faults", str(tmp_path / ("long" * 30))], "Unix sockets allow")):
        p = subprocess.run([sys.executable, "-m", "hostmq.cli.main", *args], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 1 and want in p.stderr and "Traceback" not in p.stderr
        assert len(p.stderr.strip().splitlines()) == 1


HA_KINDS = ("slave:kill,replica:kill,ha:kill,slave:stop,broker:kill,master:promote,"
            "attack:forged-master,attack:squat,attack:promote-recovering,attack:relay")


def test_short_run_with_a_slave(short_tmp, older_children):
    """A SYNC_MASTER and its slave: kill the slave, either end of the replication connection, stop the
    slave, kill the master — and kill the master, promote the slave, let the old master rejoin as its
    slave under load, then give the roles back; a forged master, replication-slot squatters, a
    promote racing a recovering master and a relay on the slave's link (issue 27) — every acknowledged message is on the master, one
    master at every sampled instant, no attack got through, and after every trial the slave caught
    up and holds the master's commitlog byte for byte."""
    every_kind_once(HA_KINDS, "ha", short_tmp, older_children)
