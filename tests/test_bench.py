"""``hostmq bench``: the sweep it plans, the report's pairing of runs, and ``--quick`` end to end
(a real sweep on a tiny config: files exist and parse; no timing is asserted)."""
from __future__ import annotations

import csv
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from hostmq.bench import report, scenarios
from hostmq.errors import SegmentError
from hostmq.shm import list_segments, list_semaphores, read_info
from hostmq.shm.segment import info_owner_alive

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_full_sweep_covers_every_combination_of_the_switches():
    s = scenarios.full_sweep()
    runs = s.runs()
    seen = {(c.flush, c.pool, c.warm, c.madvise, size, n) for c, size, n in runs}
    want = {(f, p, w, m, size, n) for f, p, w, m, size, n in itertools.product(
        scenarios.FLUSH_MODES, (False, True), (False, True), scenarios.MADVISE_POLICIES,
        scenarios.SIZES_BYTES, scenarios.PRODUCERS) if not (f == "SYNC_FLUSH" and p)}   # pool: ASYNC only
    assert seen == want and len(runs) == len(want)
    assert len({c.label for c in s.configs}) == len(s.configs)
    assert {p for p, _, _ in s.peer_runs()} == {"redis", "zmq_ipc", "mp_queue"}
    cfg = scenarios.TuningConfig(pool=True, warm=True, madvise="RANDOM").store_config(1 << 20)
    assert cfg["transient_store_pool_enable"] and cfg["warm_mapped_file"] and cfg["preallocate_next_file"]
    assert {cfg[k] for k in ("madvise_commitlog_head", "madvise_commitlog_cold", "madvise_consume_queue")} == {"RANDOM"}


def _row(**kw) -> dict:
    base = {"system": "hostmq", "config": "x", "flush": "ASYNC_FLUSH", "pool": "False", "warm": "False",
            "madvise": "NORMAL", "size_bytes": "100", "producers": "1", "phase": "caught_up", "sent": "10",
            "msgs_per_s": "100"}
    return {**base, **{k: str(v) for k, v in kw.items()}}


def test_switch_effects_pair_runs_that_differ_only_in_that_switch():
    rows = [_row(msgs_per_s=100), _row(pool=True, msgs_per_s=150),
            _row(size_bytes=1024, msgs_per_s=50), _row(size_bytes=1024, pool=True, msgs_per_s=100),
            _row(pool=True, warm=True, msgs_per_s=999)]          # no partner without the pool: not paired
    effects = {r[0]: r[1] for r in report.switch_effects(rows)}
    assert effects["transient store pool"] == "1.75× (2)"          # median of 1.5 and 2.0
    assert effects["warm-up + pre-allocation"] == "6.66× (1)"     # 999 / 150
    assert effects["SYNC_FLUSH (vs ASYNC_FLUSH)"] == "–"


@pytest.fixture
def short_dir():
    d = tempfile.mkdtemp(prefix="hbt-")          # the runs' socket paths must stay under 107 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.timeout(420)
def test_quick_bench_writes_csv_report_and_plots(tmp_path, short_dir):
    before = set(list_segments("/hostmq.")) | set(list_semaphores("/hostmq."))
    out = tmp_path / "out"
    roots = os.path.join(short_dir, "roots")
    p = subprocess.run([sys.executable, "-m", "hostmq.cli.main", "bench", "--quick", "--out", str(out),
                        "--duration", "0.5", "--root-dir", roots],
                       capture_output=True, text=True, timeout=400, cwd=ROOT_DIR)
    assert p.returncode == 0, p.stderr[-3000:]
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    sweep = scenarios.quick_sweep()
    failed = [(r["system"], r["config"], r["size_bytes"], r["note"]) for r in rows if r["sent"] == ""]
    assert not failed, f"runs failed: {failed}"
    hostmq_rows = [r for r in rows if r["system"] == "hostmq"]
    assert len(hostmq_rows) == 2 * len(sweep.runs())
    assert {(r["config"], int(r["size_bytes"]), r["phase"]) for r in hostmq_rows} == {
        (c.label, size, phase) for c, size, _ in sweep.runs() for phase in scenarios.PHASES}
    for r in hostmq_rows:
        assert int(r["sent"]) > 0 and int(r["errors"]) == 0, r
        assert float(r["msgs_per_s"]) > 0 and float(r["send_p50_us"]) > 0
    for r in hostmq_rows:
        if r["phase"] == "caught_up":          # the consumer got every message sent
            assert int(r["consumed"]) == int(r["sent"]), r
            assert float(r["e2e_p50_us"]) > 0
        else:                                  # the lagging consumer read the caught-up phase's backlog too
            backlog = next(int(x["sent"]) for x in hostmq_rows if x["phase"] == "caught_up"
                           and x["config"] == r["config"] and x["size_bytes"] == r["size_bytes"])
            assert int(r["consumed"]) == int(r["sent"]) + backlog, r
            assert float(r["resident_before_pct"]) < 50.0, r      # the backlog was dropped from the page cache
    peers = {r["system"] for r in rows if r["system"] != "hostmq"}
    assert {"zmq_ipc", "mp_queue"} <= peers
    for r in rows:
        if r["system"] in ("zmq_ipc", "mp_queue"):
            assert int(r["consumed"]) == int(r["sent"]) > 0, r
    meta = json.loads((out / "meta.json").read_text())
    assert meta["quick"] and meta["limits"]["mmap append MB/s (warm)"] > 0 and meta["machine"]["cores"] >= 1
    text = (out / "report.md").read_text()
    for c in sweep.configs:
        assert f"| {c.label} |" in text
    import matplotlib.image
    for name in report.PLOTS:
        img = matplotlib.image.imread(out / name)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100, name
    cdfs = np.load(out / "latency.npz")
    assert any(k.endswith("|send") for k in cdfs.files) and any(k.endswith("|e2e") for k in cdfs.files)
    # Names that appeared meanwhile and whose owner still runs belong to another cluster on this
    # machine (a fault run beside the suite); every process of the bench has exited by now.
    new_segs = set(list_segments("/hostmq.")) - before
    left = {n for n in new_segs if not _owner_alive(n)}
    left |= {n for n in set(list_semaphores("/hostmq.")) - before if n not in new_segs - left}
    assert not left, f"the bench left shared memory behind: {sorted(left)}"
    assert not os.listdir(roots)                      # every run's root removed


def test_bench_refuses_a_bad_duration_and_a_root_dir_too_long_for_sockets(tmp_path):
    p = subprocess.run([sys.executable, "-m", "hostmq.cli.main", "bench", "--quick", "--duration", "0",
                        "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "--duration" in p.stderr and not (tmp_path / "o").exists()
    p = subprocess.run([sys.executable, "-m", "hostmq.cli.main", "bench", "--quick", "--out", str(tmp_path / "o"),
                        "--root-dir", str(tmp_path / ("x" * 60))], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "too long" in p.stderr and not (tmp_path / "o").exists()


def _owner_alive(name: str) -> bool:
    try:
        return info_owner_alive(read_info(name))
    except SegmentError:                # gone meanwhile, or no header yet: not one of ours to blame
        return True
