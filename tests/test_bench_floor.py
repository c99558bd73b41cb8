"""The latency bench's C floor (hostmq/bench/floor.py, relay_floor.c): built with the system compiler,
both rows deliver every message they send and measure each once (the echo mode, each round trip); a bad argument is a RuntimeError with
the program's words; without a compiler the build says so. No timing is asserted."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from hostmq.bench import floor as F

pytestmark = pytest.mark.timeout(120)
CC = shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    if CC is None:
        pytest.skip("no C compiler on this machine: the bench notes the floor rows as not measured")
    path, why = F.build(str(tmp_path_factory.mktemp("floor")))
    assert path is not None, why
    return path


@pytest.mark.parametrize("row", sorted(F.ROWS))
def test_every_message_is_measured_once(exe, tmp_path, row):
    lat = F.measure(exe, row, 300, 30, 200e-6, 0, str(tmp_path), 60)
    assert len(lat) == 300 and np.all(np.isfinite(lat)) and np.all(lat > 0)
    assert os.listdir(tmp_path) == []                  # the latencies file is read and removed


def test_a_spin_budget_still_measures_every_message(exe, tmp_path):
    assert len(F.measure(exe, "c_relay", 100, 10, 200e-6, 20, str(tmp_path), 60)) == 100


@pytest.mark.parametrize("batch", [1, 100])
def test_echo_measures_every_round_trip_once(exe, tmp_path, batch):
    lat = F.measure_echo(exe, batch, 200, 20, 0, str(tmp_path), 60)
    assert len(lat) == 200 and np.all(np.isfinite(lat)) and np.all(lat > 0)
    assert os.listdir(tmp_path) == []


def test_an_echo_batch_past_its_frame_is_a_runtime_error(exe, tmp_path):
    with pytest.raises(RuntimeError, match="exited 2: bad arguments"):
        F.measure_echo(exe, 1001, 10, 0, 0, str(tmp_path), 60)


def test_bad_arguments_are_a_runtime_error(exe, tmp_path):
    with pytest.raises(RuntimeError, match="exited 2: bad arguments"):
        F.measure(exe, "c_ring", 0, 0, 200e-6, 0, str(tmp_path), 60)


def test_without_a_compiler_the_build_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setenv("PATH", str(tmp_path))
    path, why = F.build(str(tmp_path))
    assert path is None and "no C compiler" in why
