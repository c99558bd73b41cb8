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
from tests.conftest import TEST_CONFIG, child_pids, merge, stop_and_check

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
def cluster(root, spark):
    made: list[LocalCluster] = []
    older = child_pids()        # e.g. multiprocessing's resource tracker

    def _make(brokers: int = 1, **overrides) -> LocalCluster:
        c = LocalCluster(root, brokers=brokers, config=merge(TEST_CONFIG, overrides))
        made.append(c)
        return c.start()

    yield _make
    stop_and_check(made, root, older, ignore=_spark_tree)
