"""``hostmq bench --latency --quick`` (also ``bench/latency.py``) end to end with tiny counts: it exits 0,
writes a CSV row for every system available (the Redis row may be missing only when the report says
why, the C floor rows only where no compiler is), the report and the plot, every hostmq latency is a
positive finite number — and it leaves no process, shared-memory segment or semaphore behind. No
timing is asserted."""
from __future__ import annotations

import csv
import importlib.util
import math
import os
import shutil
import subprocess
import sys
import tempfile
import uuid

import psutil
import pytest

from hostmq.root import root_hash

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT_DIR, "bench", "latency.py")
HOSTMQ = ["hostmq_poll", "hostmq_poll_sleep", "hostmq_poll_backoff", "hostmq_poll_spin", "hostmq_poll_4q",
          "hostmq_push", "hostmq_poll_batch"]         # the default idle strategy, one row per strategy, 4 queues
PEERS = ["shm_ring", "zmq_ipc", "mp_queue"]          # always available (redis only with redis-server)
ZENOH = importlib.util.find_spec("zenoh") is not None  # eclipse-zenoh (the dev and bench extras)
FLOOR = ["c_ring", "c_relay"]                        # hostmq/bench/relay_floor.c: with a C compiler
SPLIT = ["c_ring_split", "c_relay_split"]            # ... and two CPUs
CC = bool(shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc"))
QUANTILES = ["p50", "p90", "p99", "p99.9", "max"]
RUN_ENV = "HQLAT_TEST_RUN"                            # every child inherits it: how leftovers are found


def _bench_shm_entries() -> set[str]:
    """The /dev/shm entries of the bench's own ring and semaphore (bench/latency.py NAME_PREFIX), and
    those Zenoh's shared-memory transport makes (*.zenoh: the bench's peers turn it off)."""
    return {n for n in os.listdir("/dev/shm") if n.startswith(("hqlat.", "sem.hqlat.")) or n.endswith(".zenoh")}


def _processes_with(token: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(RUN_ENV) == token:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def _text(out) -> str:
    return out.decode(errors="replace") if isinstance(out, bytes) else (out or "")


@pytest.fixture
def short_dir():
    d = tempfile.mkdtemp(prefix="hqlt-")          # the cluster's socket paths must stay under 107 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.timeout(300)
def test_quick_latency_bench_writes_every_row_and_cleans_up(tmp_path, short_dir):
    before = _bench_shm_entries()
    token = uuid.uuid4().hex
    out = tmp_path / "out"
    try:
        try:
            p = subprocess.run([sys.executable, "-m", "hostmq.cli.main", "bench", "--latency", "--quick", "--messages",
                                "150", "--warmup", "30", "--out", str(out), "--root-dir", short_dir],
                               capture_output=True, text=True, timeout=280, cwd=ROOT_DIR,
                               env={**os.environ, RUN_ENV: token})
        except subprocess.TimeoutExpired as e:       # say which row it was stuck in: the rows print as they end
            pytest.fail(f"the quick bench ran past 280 s; its output so far:\n{_text(e.stdout)}\n"
                        f"{_text(e.stderr)[-3000:]}")
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
        with open(out / "latency.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        report = (out / "report.md").read_text()
        systems = {r["system"] for r in rows}
        assert set(HOSTMQ + PEERS) <= systems
        if "redis" not in systems:
            assert "not measured: redis" in report, report[:2000]
        if CC:
            assert set(FLOOR) <= systems and "C floor: hostmq/bench/relay_floor.c" in report
            if len(os.sched_getaffinity(0)) >= 2:
                assert set(SPLIT) <= systems and "| C floor on two CPUs |" in report
            else:
                assert not set(SPLIT) & systems and "not measured: c_ring_split — the split rows need two CPUs" in report
        else:
            assert not set(FLOOR) & systems and "not measured: c_relay — no C compiler" in report
        if ZENOH:
            assert "zenoh" in systems
        else:
            assert "zenoh" not in systems and "not measured: zenoh — eclipse-zenoh not installed" in report
        want = {(s, n) for s in systems for n in ("quiet", "busy loop")}
        assert {(r["system"], r["neighbour"]) for r in rows} == want       # one pacing with --quick
        for r in rows:
            assert int(r["measured"]) > 0, r
        for r in rows:
            if r["system"] in HOSTMQ:
                for q in QUANTILES:
                    v = float(r[q])
                    assert math.isfinite(v) and v > 0, (r["system"], q, v)
                for base in ["shm"] + [b for b in ("redis", "zenoh") if b in systems] + (["floor"] if CC else []):
                    assert float(r[f"p50_x_{base}"]) > 0, r
            if r["system"] in FLOOR + SPLIT:
                assert all(math.isfinite(float(r[q])) and float(r[q]) > 0 for q in QUANTILES), r
            if r["system"] == "hostmq_push":       # its breakdown: pull thread woken, then the listener
                assert float(r["to_woken_p50"]) > 0 and float(r["woken_to_poll_p50"]) > 0, r
            if r["system"] == "hostmq_poll":       # the writer's own stamps split the hand-off
                step_, wake = float(r["to_step_p50"]), float(r["to_wake_p50"])
                assert 0 < step_ <= wake <= float(r["to_woken_p50"]), r
                share = float(r["same_cpu_share"])      # woken on the writer's CPU, or on another
                assert 0 <= share <= 1, r
                assert (share == 0 or float(r["same_cpu_p50"]) > 0) and (share == 1 or float(r["other_cpu_p50"]) > 0), r
        for s in HOSTMQ + PEERS + (["zenoh"] if ZENOH else []):
            assert f"| {s} |" in report
        assert "×zenoh" in report and "×floor" in report and "idle strategies:" in report
        assert "sync send p50" in report and "PING" in report and "poll_batch" in report
        assert "send → writer's step" in report and "send → queues woken" in report
        assert "on the writer's CPU: share, p50" in report
        import matplotlib.image
        img = matplotlib.image.imread(out / "latency_hist.png")
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    finally:
        leftovers = _processes_with(token)
        for proc in leftovers:           # never leave them running, even when the assertions below fail
            proc.kill()
    assert not leftovers, f"the bench left processes behind: {[(x.pid, x.name()) for x in leftovers]}"
    assert _bench_shm_entries() <= before, f"left behind: {sorted(_bench_shm_entries() - before)}"
    roots = [os.path.join(short_dir, d, "root") for d in os.listdir(short_dir)]
    assert not roots, f"the bench left its temporary directory: {roots}"
    # the cluster's segments are named from its root's hash: none of this run's may remain
    root_line = next(line for line in report.splitlines() if "cluster root" in line)
    root = root_line.split(": ", 1)[1].split(";")[0]
    hashes = {root_hash(root, ""), root_hash(root, "broker-a")}
    left = [n for n in os.listdir("/dev/shm") if any(h in n for h in hashes)]
    assert not left, f"the cluster left shared memory behind: {left}"


@pytest.mark.timeout(60)
def test_the_bench_script_runs_the_same_bench():
    p = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True, timeout=50, cwd=ROOT_DIR)
    assert p.returncode == 0 and "--messages" in p.stdout and "--dispatcher-nice" in p.stdout, p.stderr


@pytest.mark.timeout(240)
def test_the_rows_script_repeats_the_named_rows_and_cleans_up(short_dir):
    """bench/latency_rows.py (A/B comparisons): each named row once per run, with its quantiles and,
    for hostmq rows, the breakdown; an unknown row is refused; nothing is left behind."""
    script = os.path.join(ROOT_DIR, "bench", "latency_rows.py")
    bad = subprocess.run([sys.executable, script, "--rows", "hostmq_poll,no_such_row"], capture_output=True,
                         text=True, timeout=50, cwd=ROOT_DIR)
    assert bad.returncode == 2 and "no_such_row" in bad.stderr
    bad = subprocess.run([sys.executable, script, "--rows", "hostmq_poll", "--idle", "spinning"], capture_output=True,
                         text=True, timeout=50, cwd=ROOT_DIR)
    assert bad.returncode == 2 and "--idle" in bad.stderr and "spinning" in bad.stderr, bad.stderr
    token = uuid.uuid4().hex
    before = _bench_shm_entries()
    try:
        p = subprocess.run([sys.executable, script, "--rows", "shm_ring,hostmq_poll,hostmq_poll_4q", "--messages", "150",
                            "--warmup", "20", "--repeat", "2", "--idle", "backoff:20"], capture_output=True,
                           text=True, timeout=220,
                           cwd=ROOT_DIR, env={**os.environ, RUN_ENV: token, "TMPDIR": short_dir})
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
        assert "idle strategy of every hostmq process: backoff:20" in p.stdout, p.stdout[-2000:]
        lines = [line.split() for line in p.stdout.splitlines() if line.startswith("run ")]
        assert [(x[1], x[2]) for x in lines] == [(str(r), s) for r in range(2)
                                                  for s in ("shm_ring", "hostmq_poll", "hostmq_poll_4q")]
        for x in lines:
            assert float(x[x.index("p50") + 1]) > 0 and float(x[x.index("p99") + 1]) > 0, x
            assert ("woken→returned" in x) == x[2].startswith("hostmq"), x
    finally:
        leftovers = _processes_with(token)
        for proc in leftovers:
            proc.kill()
    assert not leftovers, f"the script left processes behind: {[(x.pid, x.name()) for x in leftovers]}"
    assert _bench_shm_entries() <= before, f"left behind: {sorted(_bench_shm_entries() - before)}"
    assert not os.listdir(short_dir), f"the script left its temporary directory: {os.listdir(short_dir)}"


def test_sched_delays_summarizes_perf_timehist_per_task_and_cpu():
    """bench/sched_delays.py's table from ``perf sched timehist`` lines (times in ms there, µs here):
    per task and CPU, the slices, the scheduling delay's quantiles and the run per slice; idle skipped."""
    sys.path.insert(0, os.path.join(ROOT_DIR, "bench"))
    try:
        import sched_delays
    finally:
        sys.path.pop(0)
    text = "\n".join([
        "           time    cpu  task name                       wait time  sch delay   run time",
        "---------------  ------  ------------------------------  ---------  ---------  ---------",
        "   62159.880451 [0001]  hostmq-writer[28821]                0.408      0.004      0.028",
        "   62159.880491 [0000]  python[28874]                       0.460      0.026      0.032",
        "   62159.880941 [0001]  hostmq-writer[28821]                0.464      0.004      0.025",
        "   62159.880977 [0000]  python[28874]                       0.456      0.022      0.029",
        "   62159.881513 [0001]  python[28874]                       0.474      0.000      0.061",
        "   62159.881600 [0000]  <idle>                              0.000      0.000      0.420",
        "   62159.882983 [0000]  hostmq-writer[28821]                                awakened: python[28874]",
    ])
    table = sched_delays.summarize(text, top=8)
    assert table[2:] == [                   # the task scheduled most often first
        "| python[28874] | 0 | 2 | 26 | 26 | 26 | 32 |",
        "| python[28874] | 1 | 1 | 0 | 0 | 0 | 61 |",
        "| hostmq-writer[28821] | 1 | 2 | 4 | 4 | 4 | 28 |",
    ], table
    assert sched_delays.summarize(text, top=1)[2:] == table[2:4]
    p = subprocess.run([sys.executable, os.path.join(ROOT_DIR, "bench", "sched_delays.py"), "--help"],
                       capture_output=True, text=True, timeout=50, cwd=ROOT_DIR)
    assert p.returncode == 0 and "perf sched" in p.stdout, p.stderr
