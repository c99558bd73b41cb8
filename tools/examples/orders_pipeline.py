"""Example data pipeline on Spark over hostmq (docs/spark.md).

    tools/pipeline.sh [ROOT] [--orders N]

1. Makes sure a cluster serves ROOT (default: the embedded default root, $HOSTMQ_ROOT or ~/.hostmq);
   if none is running (``tools/run.sh`` was stopped), it starts one for the run and stops it after.
2. Sends N JSON orders to topic ``orders`` (event times spread over the last 10 minutes).
3. Streaming: reads ``orders`` with ``trigger(availableNow=True)``, parses the JSON, sums revenue per
   minute of event time with a 2-minute watermark, appends finished windows to Parquet under
   ROOT/pipelines/revenue-per-minute (checkpoint beside it: a second run continues, no duplicates).
   The consumer group ``orders-revenue`` gets the processed offsets (``hostmq status`` shows its lag).
4. Backfill: batch-reads the last day of ``orders`` into ROOT/pipelines/orders-backfill (Parquet).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import hostmq
from hostmq import Message
from hostmq.root import RootPaths, resolve_root

ORDER_SCHEMA = "order_id string, customer string, amount double, event_time timestamp"


def cluster_running(root: str) -> bool:
    if not RootPaths.of(root).namesrv_sockets():
        return False
    try:
        with hostmq.Admin(root, timeout_s=1.0) as a:
            return any(b["alive"] for b in a.brokers())
    except hostmq.HostMQError:
        return False


def send_orders(root: str, n: int) -> None:
    with hostmq.Admin(root) as a:
        try:
            a.route("orders")
        except hostmq.NoRouteError:
            a.create_topic("orders", queues=4)
    now = time.time()
    rnd = random.Random()
    t = time.perf_counter()
    with hostmq.Producer(root) as p:
        batch = []
        for i in range(n):
            order = {"order_id": f"o-{int(now)}-{i}", "customer": f"c{rnd.randrange(50)}",
                     "amount": round(rnd.uniform(1, 200), 2),
                     "event_time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now - rnd.uniform(0, 600))) + "Z"}
            batch.append(Message("orders", json.dumps(order).encode(), tags="order", keys=[order["order_id"]]))
            if len(batch) == 200:
                p.send_batch(batch)
                batch = []
        if batch:
            p.send_batch(batch)
    print(f"sent {n} orders to {root} in {time.perf_counter() - t:.1f} s")


def spark_session():
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[2]").appName("hostmq-orders")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    import hostmq.spark
    hostmq.spark.register(spark)
    return spark


def revenue_stream(spark, root: str, out_dir: str) -> None:
    from pyspark.sql import functions as F
    orders = (spark.readStream.format("hostmq").option("root", root).option("topic", "orders")
              .option("startingOffsets", "earliest").option("group", "orders-revenue").load()
              .select(F.from_json(F.col("body").cast("string"), ORDER_SCHEMA).alias("o")).select("o.*"))
    revenue = (orders.withWatermark("event_time", "2 minutes")
               .groupBy(F.window("event_time", "1 minute").alias("minute"))
               .agg(F.round(F.sum("amount"), 2).alias("revenue"), F.count("*").alias("orders"))
               .select(F.col("minute.start").alias("minute"), "revenue", "orders"))
    q = (revenue.writeStream.format("parquet").outputMode("append")
         .option("path", os.path.join(out_dir, "data")).option("checkpointLocation", os.path.join(out_dir, "checkpoint"))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    rows = spark.read.parquet(os.path.join(out_dir, "data")).orderBy("minute").collect() \
        if os.path.isdir(os.path.join(out_dir, "data")) else []
    print(f"revenue per minute ({len(rows)} finished windows in {out_dir}; the newest ones are written once "
          f"the watermark passes them, on a later run):")
    for r in rows[-5:]:
        print(f"  {r.minute}  {r.revenue:>12,.2f}  ({r.orders} orders)")


def backfill(spark, root: str, out_dir: str) -> None:
    from pyspark.sql import functions as F
    since_ms = int((time.time() - 86_400) * 1000)
    t = time.perf_counter()
    df = (spark.read.format("hostmq").option("root", root).option("topic", "orders")
          .option("startingTimestamp", str(since_ms)).load()
          .select("queue_id", "queue_offset", "store_timestamp",
                  F.from_json(F.col("body").cast("string"), ORDER_SCHEMA).alias("o")).select("*", "o.*").drop("o"))
    df.write.mode("overwrite").parquet(out_dir)
    back = spark.read.parquet(out_dir)
    n, total = back.agg(F.count("*"), F.round(F.sum("amount"), 2)).first()
    print(f"backfill: {n} orders of the last day ({total:,.2f} revenue) into {out_dir} in {time.perf_counter() - t:.1f} s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default=None)
    ap.add_argument("--orders", type=int, default=5000, help="orders to send first (0: none)")
    args = ap.parse_args(argv)
    root = resolve_root(args.root)
    os.makedirs(root, exist_ok=True)
    cluster = None
    if not cluster_running(root):
        print(f"no cluster is serving {root}; starting one for this run")
        cluster = hostmq.LocalCluster(root).start()
    try:
        if args.orders:
            send_orders(root, args.orders)
        spark = spark_session()
        try:
            base = os.path.join(root, "pipelines")
            revenue_stream(spark, root, os.path.join(base, "revenue-per-minute"))
            backfill(spark, root, os.path.join(base, "orders-backfill"))
        finally:
            spark.stop()
    finally:
        if cluster is not None:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
