"""The ``hostmq`` data source for PySpark (``pip install hostmq[spark]``: pyspark ≥ 4.2, pyarrow).

    import hostmq.spark
    hostmq.spark.register(spark)
    df = spark.read.format("hostmq").option("root", root).option("topic", "orders").load()

Batch and streaming reads straight from the store files (``source``), batch and streaming writes
through producers (``writer``); options in ``options``. See README "Spark".
"""
from __future__ import annotations

from .options import OptionError


def register(spark) -> None:
    """Register the ``hostmq`` format with a SparkSession."""
    from .source import HostMQDataSource
    spark.dataSource.register(HostMQDataSource)


__all__ = ["register", "OptionError"]
