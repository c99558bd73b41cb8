"""docs/aio.md's programs and tools/examples/aio_service.py run as written against a real cluster
(the examples connect to ``$HOSTMQ_ROOT``, set here to the module's cluster)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(180)
CONFIG = {"broker": {"message_delay_level": "1s 1s 1s 1s 1s"}}      # the push example's retry: 1 s
REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "aio.md"
SERVICE = REPO / "tools" / "examples" / "aio_service.py"


def programs() -> list[str]:
    """The doc's ``python`` blocks (the API synopses are plain blocks: fragments, not programs)."""
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def env(root: str) -> dict[str, str]:
    return {**os.environ, "HOSTMQ_ROOT": root, "PYTHONPATH": str(REPO)}


def test_the_doc_has_programs():
    assert len(programs()) >= 5


def test_every_program_of_the_doc_runs_as_written(aio_cluster, tmp_path):
    for i, code in enumerate(programs()):
        path = tmp_path / f"example_{i}.py"
        path.write_text(code)
        r = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env(aio_cluster.root),
                           capture_output=True, text=True, timeout=90)
        assert r.returncode == 0, f"example {i} of docs/aio.md failed:\n{code}\n{r.stdout}\n{r.stderr[-3000:]}"


def test_the_service_demo_prices_and_reads_back_every_order(aio_cluster):
    r = subprocess.run([sys.executable, str(SERVICE), "--root", aio_cluster.root, "--demo", "300"],
                       env=env(aio_cluster.root), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "priced 300 orders" in r.stdout and "read back 300 priced orders" in r.stdout


def test_the_service_stops_cleanly_on_sigterm(aio_cluster):
    proc = subprocess.Popen([sys.executable, str(SERVICE)], env=env(aio_cluster.root), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        wait_until(lambda: any("Ctrl-C stops" in x for x in lines), 60, "the service to run")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, proc.stderr.read()[-3000:]
        reader.join(10)
        assert any(x.startswith("priced ") for x in lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
