"""The wheel a user gets: built from this checkout, installed into a fresh virtual environment, run
from another directory — `hostmq --version`, `python -m hostmq`, and README's quickstart against a
cluster that the installed `hostmq up` serves. The wheel carries LICENSE, py.typed and an SPDX
license; the version comes from ``hostmq.__version__`` alone.

With the dev extra's `build` the test runs `python -m build` (an sdist, and the wheel built from it);
without it, `pip wheel`. The new environment gets hostmq's dependencies (numpy, pyzmq, …) from this interpreter's
site-packages through a ``.pth`` line instead of downloading them, so the test needs no network
beyond what pip's isolated build of the wheel needs (setuptools, as every install of hostmq does).
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

import pytest

import hostmq
from tests.docs.examples import SHARED_ROOT, TOP, all_blocks, interrupt
from tests.e2e.conftest import leftovers
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(300)


def _setuptools_ok() -> bool:
    """Whether this interpreter can build the wheel without pip's isolated build (faster, offline)."""
    try:
        import setuptools
        import wheel  # noqa: F401
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= 77


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("dist")
    # What an sdist holds, copied: pip builds in the source tree, which must stay clean (build/, egg-info).
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(os.path.join(TOP, name), src / name)
    shutil.copytree(os.path.join(TOP, "hostmq"), src / "hostmq", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    if importlib.util.find_spec("build") is not None:
        # The dev extra's `build`: an sdist, then the wheel built from that sdist (so the sdist is whole).
        argv = [sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(src)]
    else:
        argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(src)]
        if _setuptools_ok():
            argv.insert(4, "--no-build-isolation")
    p = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=str(out))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    wheels = [f for f in os.listdir(out) if f.endswith(".whl")]
    assert len(wheels) == 1, wheels
    for sdist in (f for f in os.listdir(out) if f.endswith(".tar.gz")):
        with tarfile.open(out / sdist) as tar:
            names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        assert {"LICENSE", "pyproject.toml", "README.md", "hostmq/_codec.c", "hostmq/include/record_layout.h",
                "hostmq/ingress/_step.c", "hostmq/include/step_layout.h", "hostmq/include/record_check.h",
                "hostmq/store/_read.c", "hostmq/store/_columns.c", "hostmq/store/_encode.c", "hostmq/py.typed",
                "hostmq/shm/_futex.c", "hostmq/include/idle_wait.h"} <= names, names
    return str(out / wheels[0])


def test_the_wheel_carries_license_types_and_one_version(wheel):
    assert os.path.basename(wheel).startswith(f"hostmq-{hostmq.__version__}-")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "hostmq/py.typed" in names
    # The C codec is optional to the install but not to the wheel built here: a build that lost its
    # generated layout header (hostmq/include/record_layout.h) would otherwise pass as a pure-Python wheel.
    assert any(re.fullmatch(r"hostmq/_codec\..+\.so", n) for n in names), names
    assert any(re.fullmatch(r"hostmq/ingress/_step\..+\.so", n) for n in names), names     # the writer's step
    assert any(re.fullmatch(r"hostmq/shm/_futex\..+\.so", n) for n in names), names       # a consumer's wait
    assert any(re.fullmatch(r"hostmq/store/_read\..+\.so", n) for n in names), names     # the read round
    assert any(re.fullmatch(r"hostmq/store/_columns\..+\.so", n) for n in names), names  # Spark's Arrow columns
    assert any(re.fullmatch(r"hostmq/store/_encode\..+\.so", n) for n in names), names   # a producer's records
    assert any(re.search(r"\.dist-info/licenses/LICENSE$", n) for n in names), names
    assert re.search(r"^License-Expression: Apache-2.0$", meta, re.M), meta[:2000]
    assert f"Version: {hostmq.__version__}" in meta
    assert "Classifier: Operating System :: POSIX :: Linux" in meta


def test_the_wheel_installs_and_runs_the_quickstart(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HOSTMQ_ROOT")}
    p = subprocess.run([py, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", wheel],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    # Only now: pip must not see this interpreter's own hostmq (an editable install) as satisfying the wheel.
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    with open(os.path.join(site, "outer-deps.pth"), "w") as f:
        f.write("\n".join(sorted(deps)) + "\n")
    away = str(tmp_path / "elsewhere")          # not the checkout: only the installed package is importable
    os.makedirs(away)

    def run(*argv):
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=120, cwd=away, env=env)

    where = run(py, "-c", "import hostmq; print(hostmq.__file__)")
    assert where.returncode == 0 and where.stdout.startswith(site), where.stdout + where.stderr
    assert run(str(venv / "bin" / "hostmq"), "--version").stdout.strip() == f"hostmq {hostmq.__version__}"
    assert run(py, "-m", "hostmq", "--version").stdout.strip() == f"hostmq {hostmq.__version__}"

    root = str(tmp_path / "mq")
    up = subprocess.Popen([str(venv / "bin" / "hostmq"), "up", root], cwd=away, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, process_group=0)
    try:
        wait_until(lambda: up.poll() is not None or run(py, "-m", "hostmq", "status", root, "--check").returncode == 0,
                   90, "the installed hostmq up")
        assert up.poll() is None, up.stdout.read()
        quickstart = next(b for b in all_blocks() if b.path == "README.md" and b.lang == "python" and not b.mark)
        with open(os.path.join(away, "quickstart.py"), "w") as f:
            f.write(quickstart.code.replace(SHARED_ROOT, root))
        q = run(py, "quickstart.py")
        assert q.returncode == 0 and "100 messages" in q.stdout, q.stdout + q.stderr[-3000:]
    finally:
        interrupt(up)
    assert up.returncode == 0, up.stdout.read()[-3000:]
    assert not leftovers(root, ["broker-a"])


def test_another_platform_is_told_at_import_that_hostmq_needs_linux():
    code = "import sys; sys.platform = 'darwin'\ntry:\n    import hostmq\nexcept ImportError as e:\n    print(e)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=TOP)
    assert "hostmq runs on Linux only" in p.stdout and "darwin" in p.stdout, p.stdout + p.stderr
