"""A session-scoped ``local[2]`` SparkSession and clusters under fresh roots for the Spark tests.

Spark's JVM and its Python workers are children of the test process for the whole session, so the
leak check here looks at everything else: the cluster's processes, socket files and shared memory.
"""
from __future__ import annotations

import os
import shutil
import sys

import psutil
import pytest

from hostmq import LocalCluster
from tests.e2e.conftest import TEST_CONFIG, leftovers, merge
from tests.conftest import wait_until

pyspark = pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install -e .[spark])")
if shutil.which("java") is None:
    pytest.skip("java is not on PATH: Spark needs a JVM (Java 17 or 21)", allow_module_level=True)

pytestmark = pytest.mark.spark


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable     # workers need this venv (pyarrow, hostmq)
    from pyspark.sql import SparkSession
    import hostmq.spark
    session = (SparkSession.builder.master("local[2]").appName("hostmq-tests")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2").config("spark.default.parallelism", "2")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.memory", "1g")
               .config("spark.local.dir", str(tmp_path_factory.mktemp("spark-local")))
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    hostmq.spark.register(session)
    yield session
    session.stop()


def _spark_tree() -> set[int]:
    """The Spark JVM and everything under it (workers)."""
    me = psutil.Process()
    out = set()
    for p in me.children():
        try:
            if "java" in p.name() or any("spark" in a for a in p.cmdline()[:3]):
                out |= {p.pid} | {c.pid for c in p.children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    r.mkdir()
    return str(r)


@pytest.fixture
def cluster(root, spark):
    made: list[LocalCluster] = []
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}     # e.g. multiprocessing's resource tracker

    def _make(brokers: int = 1, **overrides) -> LocalCluster:
        c = LocalCluster(root, brokers=brokers, config=merge(TEST_CONFIG, overrides))
        made.append(c)
        return c.start()

    yield _make
    names = set()
    for c in made:
        names |= set(c.brokers)
        c.stop()

    def ours():
        spark_pids = _spark_tree()
        return [p for p in me.children(recursive=True) if p.pid not in spark_pids and p.pid not in before]
    wait_until(lambda: not ours(), 20, "cluster processes to exit")
    socks = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".sock")]
    assert not socks, f"socket files left behind: {socks}"
    assert not leftovers(root, names or {"broker-a"}), "shared memory left behind"
