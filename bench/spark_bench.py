"""Spark data source benchmark: batch-read rows/s (Arrow vs tuples) and streaming latency.

    .venv/bin/python bench/spark_bench.py [--messages 10000000] [--stream-seconds 20]

1. Builds a store of N messages of 100 B (4 queues, one broker directory, no broker running) with
   the embedded store's batch append, then reads the whole topic on ``local[2]`` into Spark's
   ``noop`` sink, once with Arrow record batches and once with tuples. Beside each: the raw limits
   measured in the same run — ``spark.range(N)`` into ``noop`` (Spark's own ceiling), a Python data
   source that yields one prebuilt record batch of hostmq's schema over and over in the same
   partitions (Spark's own Arrow ingestion of our rows, no hostmq in the loop), and our row building
   alone in this process (``scan.read_range`` on one queue, one core). Arrow batches are built by
   ``hostmq/store/_columns.c`` unless ``HOSTMQ_NATIVE_COLUMNS=0`` (the Python path; the table says which).
2. Streaming: a LocalCluster, a producer sending ``--rate`` messages/s, and a query with the default
   trigger (next micro-batch as soon as the previous one ends) whose ``foreachBatch`` sink notes,
   for every row, now − the message's born time; per micro-batch: rows, batch duration, and the
   end-to-end latency p50/p99.

Prints tables and writes ``bench/out/spark_bench.csv``.
"""
from __future__ import annotations

import argparse
import csv
import os
import platform
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import hostmq  # noqa: E402
from hostmq import Message  # noqa: E402
from hostmq.records import encode_batch  # noqa: E402
from hostmq.store import MessageStore  # noqa: E402
from hostmq.store.encode import encode_message  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
TOPIC, QUEUES = "bench", 4


def build_store(root: str, n: int, body_bytes: int) -> float:
    path = os.path.join(root, "brokers", "broker-a", "store")
    body = b"x" * body_bytes
    t = time.perf_counter()
    with MessageStore(path, {"commitlog_file_bytes": 1 << 30}) as store:
        host = store.commitlog.store_host
        proto = [encode_message(Message(TOPIC, body, tags="t", keys=["k"], properties={"p": "v"}), TOPIC.encode(), q,
                                max_body_bytes=1 << 22, max_props_bytes=32767, born_host=host) for q in range(QUEUES)]
        done = 0
        while done < n:
            k = min(1000, n - done)
            q = (done // 1000) % QUEUES
            blob, starts = encode_batch([proto[q]] * k)
            store.append_encoded(TOPIC, q, blob, starts)
            done += k
            if done % 1_000_000 < 1000:
                store.dispatch()
        store.dispatch()
    return time.perf_counter() - t


def session():
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    s = (SparkSession.builder.master("local[2]").appName("hostmq-bench")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "2g")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    import hostmq.spark
    hostmq.spark.register(s)
    return s


def timed_noop(df) -> float:
    t = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t


def spark_cpu_s() -> tuple[float, float]:
    """CPU seconds used so far by Spark's JVM and by its Python workers (exited ones included)."""
    import psutil
    jvm = py = 0.0
    for p in psutil.Process().children(recursive=True):
        try:
            t = p.cpu_times()
            if "java" in p.name():
                jvm += t.user + t.system
            else:
                py += t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            pass
    return jvm, py


def timed_noop_cpu(df, n: int) -> tuple[float, str]:
    """timed_noop, and where the CPU went per row: Spark's JVM, the Python workers."""
    jvm0, py0 = spark_cpu_s()
    dt = timed_noop(df)
    jvm1, py1 = spark_cpu_s()
    return dt, f"CPU per row: JVM {(jvm1 - jvm0) / n * 1e6:.2f} µs, Python workers {(py1 - py0) / n * 1e6:.2f} µs"


def raw_rows_per_s(root: str, arrow: bool, n: int) -> float:
    from hostmq.spark.scan import read_range
    t = time.perf_counter()
    rows = 0
    for b in read_range(root, (TOPIC, "broker-a", 0), 0, n, arrow=arrow):
        rows += b.num_rows if arrow else 1
    return rows / (time.perf_counter() - t)


def partition_rows(n: int) -> list[int]:
    """Rows per partition of a hostmq read of n messages: per queue, chunks of maxRecordsPerPartition."""
    per_queue = [n // QUEUES + (q < n % QUEUES) for q in range(QUEUES)]
    return [min(1_000_000, m - s) for m in per_queue for s in range(0, m, 1_000_000)]


def prebuilt_source(spark, root: str) -> str:
    """Register a Python data source with hostmq's schema whose ``read`` yields one record batch —
    read from the store here and saved under ``root`` — again and again, in the partitions a hostmq
    read of option ``rows`` messages has: what Spark alone costs to ingest our Arrow batches. Its name."""
    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
    from hostmq.spark.scan import SCHEMA_DDL, read_range
    batch = next(read_range(root, (TOPIC, "broker-a", 0), 0, 8192))
    path = os.path.join(root, "prebuilt.arrow")
    with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, batch.schema) as w:
        w.write_batch(batch)

    class Reader(DataSourceReader):       # defined here: pickled by value, no module for workers to import
        def __init__(self, rows: int) -> None:
            self.rows = rows

        def partitions(self):
            return [InputPartition(k) for k in partition_rows(self.rows)]

        def read(self, partition):
            with pa.memory_map(path) as f:
                b = pa.ipc.open_file(f).get_batch(0)
            left = partition.value
            while left > 0:
                part = b if left >= b.num_rows else b.slice(0, left)
                left -= part.num_rows
                yield part

    class Prebuilt(DataSource):
        @classmethod
        def name(cls) -> str:
            return "hostmq_prebuilt_limit"

        def schema(self):
            return SCHEMA_DDL

        def reader(self, schema):
            return Reader(int(self.options["rows"]))

    spark.dataSource.register(Prebuilt)
    return Prebuilt.name()


def batch_read(spark, root: str, n: int, rows: list) -> None:
    dt = timed_noop(spark.range(n))
    rows.append(("batch", "spark.range → noop (JVM only, limit)", n, n / dt, ""))
    prebuilt = prebuilt_source(spark, root)
    # Warm the JVM first: its Arrow-to-row code runs ~1.7x slower per row until the JIT has compiled
    # it (measured: 1.72 then 1.04 µs/row of JVM CPU), which would favour whichever read came last.
    timed_noop(spark.read.format(prebuilt).option("rows", str(min(n, 2_000_000))).load())
    df = spark.read.format(prebuilt).option("rows", str(n)).load()
    dt, cpu = timed_noop_cpu(df, n)
    ingest = n / dt
    rows.append(("batch", "prebuilt Arrow batches → noop (no hostmq, limit)", n, ingest, cpu))
    for arrow in ("true", "false"):
        per_core = raw_rows_per_s(root, arrow == "true", min(n // QUEUES, 500_000))
        rows.append(("batch", f"row building alone, 1 core ({'Arrow' if arrow == 'true' else 'tuples'}, limit)",
                     min(n // QUEUES, 500_000), per_core, ""))
        df = spark.read.format("hostmq").option("root", root).option("topic", TOPIC).option("arrow", arrow).load()
        timed_noop(df.limit(1000))                                   # warm the Python workers
        dt, cpu = timed_noop_cpu(df, n)
        rows.append(("batch", f"hostmq read → noop ({'Arrow batches' if arrow == 'true' else 'tuples'})", n, n / dt,
                     f"{n / dt / (2 * per_core):.0%} of 2 cores × row building, {n / dt / ingest:.0%} of prebuilt; "
                     + cpu))


def stream_latency(spark, seconds: float, rate: int, rows: list) -> None:
    root = tempfile.mkdtemp(prefix="hostmq-sbench-")
    cluster = hostmq.LocalCluster(root).start()
    lat_ms: list[float] = []
    per_batch = []
    stop = threading.Event()
    try:
        with hostmq.Admin(root) as a:
            a.create_topic(TOPIC, queues=QUEUES)

        def produce():
            with hostmq.Producer(root) as p:
                nxt = time.perf_counter()
                while not stop.is_set():
                    p.send(Message(TOPIC, b"x" * 100))
                    nxt += 1.0 / rate
                    time.sleep(max(0.0, nxt - time.perf_counter()))

        def sink(df, batch_id):
            got = [r.born_timestamp.timestamp() * 1000 for r in df.select("born_timestamp").collect()]
            now = time.time() * 1000
            if got:
                lat = [now - b for b in got]
                lat_ms.extend(lat)
                per_batch.append((len(got), float(np.median(lat))))
        df = spark.readStream.format("hostmq").option("root", root).option("topic", TOPIC).load()
        ckpt = tempfile.mkdtemp(prefix="hostmq-sbench-ckpt-")
        q = df.writeStream.option("checkpointLocation", ckpt).foreachBatch(sink).start()
        t = threading.Thread(target=produce, daemon=True)
        t.start()
        time.sleep(seconds)
        stop.set()
        t.join()
        time.sleep(3)
        progress = [p for p in q.recentProgress if p["numInputRows"]]
        q.stop()
        shutil.rmtree(ckpt, ignore_errors=True)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    dur = [p["durationMs"]["triggerExecution"] for p in progress]
    a = np.array(lat_ms)
    rows.append(("stream", f"end-to-end latency, {rate} msgs/s, default trigger", len(a), float(np.percentile(a, 50)),
                 f"p99 {np.percentile(a, 99):.0f} ms; {len(per_batch)} micro-batches, "
                 f"median {np.median([b[0] for b in per_batch]):.0f} rows, batch duration p50 {np.median(dur):.0f} ms"))


def main() -> int:
    ap = argparse.ArgumentParser(description="hostmq Spark data source benchmark")
    ap.add_argument("--messages", type=int, default=10_000_000)
    ap.add_argument("--body-bytes", type=int, default=100)
    ap.add_argument("--stream-seconds", type=float, default=20.0)
    ap.add_argument("--rate", type=int, default=500)
    args = ap.parse_args()
    rows: list = []
    root = tempfile.mkdtemp(prefix="hostmq-spark-bench-", dir=os.environ.get("BENCH_DIR"))
    try:
        dt = build_store(root, args.messages, args.body_bytes)
        print(f"store: {args.messages:,} messages of {args.body_bytes} B built in {dt:.1f} s under {root}")
        spark = session()
        try:
            batch_read(spark, root, args.messages, rows)
            stream_latency(spark, args.stream_seconds, args.rate, rows)
        finally:
            spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    from hostmq.spark import scan
    print(f"\nmachine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print("Arrow columns: " + ("native (hostmq/store/_columns.c)" if scan.NATIVE_COLUMNS is not None else
                               "Python (batch_columns; HOSTMQ_NATIVE_COLUMNS=0 or not built)"))
    print(f"{'kind':<7} {'what':<62} {'rows':>11} {'rows/s or ms':>14}  note")
    for kind, what, n, v, note in rows:
        print(f"{kind:<7} {what:<62} {n:>11,} {v:>14,.1f}  {note}")
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "spark_bench.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kind", "what", "rows", "rows_per_s_or_p50_ms", "note"])
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
