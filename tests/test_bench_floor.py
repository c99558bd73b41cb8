"""The latency bench's C floor (hostmq/bench/floor.py, relay_floor.c): built with the system compiler,
every row delivers every message it sends and measures each once (the echo modes, each round trip); the
split rows place producer (and writer) and consumer on two CPUs, and say so where there is one; a bad
argument is a RuntimeError with the program's words; without a compiler the build says so. No timing
is asserted."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess

import numpy as np
import psutil
import pytest

from hostmq.bench import floor as F
from tests.conftest import wait_until

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


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("batch", [1, 100])
def test_echo_measures_every_round_trip_once(exe, tmp_path, batch, split):
    if split and F.split_why():
        pytest.skip(F.split_why())
    lat = F.measure_echo(exe, batch, 200, 20, 0, str(tmp_path), 60, split)
    assert len(lat) == 200 and np.all(np.isfinite(lat)) and np.all(lat > 0)
    assert os.listdir(tmp_path) == []


@contextlib.contextmanager
def one_cpu():
    """This (test) process and what it starts limited to one CPU, for the block's length."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def test_the_split_rows_say_they_need_two_cpus_where_there_is_one(exe, tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("this machine gives the tests one CPU: nothing to narrow")
    assert F.split_why() == ""
    with one_cpu():
        assert "need two CPUs" in F.split_why()
        for row in F.SPLIT_ROWS:
            with pytest.raises(RuntimeError, match="exited 3: .*needs two CPUs"):
                F.measure(exe, row, 10, 0, 200e-6, 0, str(tmp_path), 60)
        with pytest.raises(RuntimeError, match="exited 3: echo_split needs two CPUs"):
            F.measure_echo(exe, 1, 10, 0, 0, str(tmp_path), 60, True)
    assert os.listdir(tmp_path) == []


def test_the_split_rows_place_their_processes_on_two_cpus(exe, tmp_path):
    """The consumer of a split row runs on another CPU than the producer: seen from outside, the
    program's processes' allowed CPU sets while it runs (the parent pins itself and its children)."""
    if F.split_why():
        pytest.skip(F.split_why())
    p = subprocess.Popen([exe, "relay_split", "20000", "0", "500", "0"], stdout=subprocess.PIPE, text=True)
    seen: dict[int, int] = {}

    def placed() -> bool:
        try:
            for proc in [psutil.Process(p.pid), *psutil.Process(p.pid).children()]:
                cpus = proc.cpu_affinity()
                if len(cpus) == 1:
                    seen[proc.pid] = cpus[0]
        except psutil.Error:
            pass
        return len(seen) == 3
    try:
        wait_until(placed, 20, "the relay's three processes pinned")
        assert len(set(seen.values())) == 2, seen       # producer + writer on one CPU, the consumer on another
        parent = seen[p.pid]
        assert sorted(seen.values()).count(parent) == 2, seen
    finally:
        p.kill()
        p.wait(10)


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
