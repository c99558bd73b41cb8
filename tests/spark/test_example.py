"""The example pipeline of docs/spark.md runs end to end on a fresh root (it starts a cluster itself)."""
from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from tests.e2e.conftest import leftovers

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]
EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "examples", "orders_pipeline.py")


def test_orders_pipeline_runs_on_a_fresh_root(tmp_path):
    root = str(tmp_path / "root")
    p = subprocess.run([sys.executable, EXAMPLE, root, "--orders", "700"], capture_output=True, text=True, timeout=280)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    assert "sent 700 orders" in p.stdout
    assert "backfill: 700 orders of the last day" in p.stdout
    assert os.path.isdir(os.path.join(root, "pipelines", "revenue-per-minute", "checkpoint"))
    assert any(f.endswith(".parquet") for f in os.listdir(os.path.join(root, "pipelines", "orders-backfill")))
    left = []
    for proc in psutil.process_iter(["cmdline"]):
        if root in " ".join(proc.info["cmdline"] or ()):
            left.append(proc.pid)
    assert not left, f"processes of the example's cluster left running: {left}"
    assert not leftovers(root, ["broker-a"])
