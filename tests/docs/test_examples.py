"""Every Python and shell example of README.md and docs/ runs as written, on a fresh root.

One cluster serves the whole module: the quickstart's own ``hostmq up /tmp/mq`` block (marked
``<!-- run: cluster -->``), started in the background on a fresh root; every other block then runs in
a process of its own, in page order, with ``/tmp/mq`` meaning that root (``tests/docs/examples.py``
says how blocks are found and marked). The programs of ``tools/examples/`` run against it too.
"""
from __future__ import annotations

import os
import re
import stat
import subprocess
import sys

import psutil
import pytest

from tests.docs.examples import SHARED_ROOT, TOP, Block, all_blocks, interrupt, localise
from tests.e2e.conftest import leftovers
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(180)

BLOCKS = all_blocks()
RUNNABLE = [b for b in BLOCKS if not b.mark]
MAX_NOT_RUN = 20        # "keep those few": a page that needs more is telling us its examples are not real


def test_every_marker_is_known_and_says_why():
    for b in BLOCKS:
        if b.mark == "not-run":
            assert len(b.mark_arg) >= 10, f"{b.id}: a not-run block must say why, got {b.mark_arg!r}"
        elif b.mark == "run":
            assert b.mark_arg == "cluster", f"{b.id}: unknown run marker {b.mark_arg!r}"
    clusters = [b for b in BLOCKS if b.mark == "run"]
    assert [b.path for b in clusters] == ["README.md"], f"one cluster block, the quickstart's: {clusters}"
    assert re.fullmatch(rf"hostmq up {SHARED_ROOT}\s*", clusters[0].code), clusters[0].code
    not_run = [b.id for b in BLOCKS if b.mark == "not-run"]
    assert len(not_run) <= MAX_NOT_RUN, f"{len(not_run)} examples are marked not-run: {not_run}"
    assert len(RUNNABLE) >= 10, "the pages lost their examples"


def _shims(bin_dir: str) -> None:
    """``hostmq`` and ``python`` as a user's venv has them, both on this interpreter and this checkout."""
    os.makedirs(bin_dir, exist_ok=True)
    for name, line in (("hostmq", f'exec "{sys.executable}" -m hostmq "$@"'),
                       ("python", f'exec "{sys.executable}" "$@"')):
        path = os.path.join(bin_dir, name)
        with open(path, "w") as f:
            f.write(f"#!/bin/sh\n{line}\n")
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


def _serving(root: str) -> bool:
    p = subprocess.run([sys.executable, "-m", "hostmq", "status", root, "--check"], capture_output=True,
                       text=True, timeout=60)
    return p.returncode == 0


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(root, scratch, env): the quickstart's cluster running on a fresh root."""
    base = tmp_path_factory.mktemp("ex")
    root, scratch = str(base / "mq"), str(base / "scratch")
    os.makedirs(scratch)
    bin_dir = str(base / "bin")
    _shims(bin_dir)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ.get('PATH', '')}", HOSTMQ_ROOT=root,
               PYTHONPATH=os.pathsep.join(p for p in (TOP, os.environ.get("PYTHONPATH")) if p))
    start = next(b for b in BLOCKS if b.mark == "run")
    up = subprocess.Popen(["bash", "-c", "exec " + localise(start.code, root, scratch).strip()], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, process_group=0)
    try:
        wait_until(lambda: up.poll() is not None or _serving(root), 90, "the quickstart's cluster")
        assert up.poll() is None, f"hostmq up exited: {up.stdout.read()}"
        yield root, scratch, env
    finally:
        interrupt(up)
    assert up.returncode == 0, f"hostmq up did not stop cleanly ({up.returncode}): {up.stdout.read()[-3000:]}"
    assert not leftovers(root, ["broker-a"])


def _run(block: Block, served, workdir: str) -> subprocess.CompletedProcess:
    root, scratch, env = served
    code = localise(block.code, root, scratch)
    if block.lang == "python":
        path = os.path.join(workdir, "example.py")
        with open(path, "w") as f:
            f.write(code)
        argv, cwd = [sys.executable, path], workdir
    else:
        argv, cwd = ["bash", "-euo", "pipefail", "-c", code], TOP     # shell examples name tools/… paths
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=150)


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.id for b in RUNNABLE])
def test_example_runs_as_written(block, served, tmp_path):
    p = _run(block, served, str(tmp_path))
    assert p.returncode == 0, f"{block.id} exited {p.returncode}\n--- code\n{block.code}\n--- stdout\n" \
                              f"{p.stdout[-3000:]}\n--- stderr\n{p.stderr[-5000:]}"
    # A block that started a cluster of its own (LocalCluster on /tmp/NAME) left nothing running or mapped.
    scratch = served[1]
    for name in set(re.findall(r"/tmp/(?!mq(?![\w.-]))([\w.-]+)", block.code)):
        root = os.path.join(scratch, name)
        assert not leftovers(root, ["broker-a", "broker-b", "broker-a.1"]), f"{block.id} left shared memory"
        assert not [q.pid for q in psutil.process_iter(["cmdline"]) if root in " ".join(q.info["cmdline"] or ())], \
            f"{block.id} left processes of {root} running"


def test_example_services_share_a_group(served):
    """tools/examples: two workers of one group handle every job of a producer between them (at least
    once: a queue that moves to the second worker before the first committed it is read again)."""
    root, _, env = served
    ex = os.path.join(TOP, "tools", "examples")
    p = subprocess.run([sys.executable, os.path.join(ex, "producer.py"), root, "--topic", "shared-jobs",
                        "--count", "60"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "60 stored" in p.stdout, p.stdout + p.stderr
    workers = [subprocess.Popen([sys.executable, os.path.join(ex, "worker.py"), root, "--topic", "shared-jobs",
                                 "--group", "shared", "--idle-exit", "4"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [w.communicate(timeout=120) for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outs
    handled = [int(re.search(r"worker handled (\d+)", out).group(1)) for out, _ in outs]
    jobs = sorted(int(m) for out, _ in outs for m in re.findall(r"^job (\d+) ", out, re.M))
    assert sorted(set(jobs)) == list(range(60)) and sum(handled) == len(jobs), (handled, outs)


def test_the_quickstart_root_is_a_development_root_of_tens_of_mb(served):
    """`hostmq up` on a new root uses the dev store profile (README "Footprint")."""
    import json
    root = served[0]
    with open(os.path.join(root, "brokers", "broker-a", "store", "store.json")) as f:
        sizes = json.load(f)
    assert sizes["commitlog_file_bytes"] == 32 << 20, sizes
    used = sum(os.stat(os.path.join(d, n)).st_blocks * 512 for d, _, names in os.walk(root) for n in names
               if os.path.isfile(os.path.join(d, n)))
    assert used < 100 << 20, f"the root takes {used >> 20} MiB of disk"
