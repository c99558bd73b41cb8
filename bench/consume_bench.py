"""Consume-side benchmark: long-poll wake-up latency and drain rates of push and pull consumers.

    .venv/bin/python bench/consume_bench.py [--messages 3000] [--backlog 100000]

Against a LocalCluster (one broker, ASYNC_FLUSH, on disk), 100-byte bodies:

* latency producer → consumer in another process, one message at a time, for a PushConsumer
  (listener) and a PullConsumer (``poll`` loop), with 0.5 ms and with 50 ms between messages — with
  50 ms the consumer has gone to sleep on its wake-up semaphore every time, so this is the
  long-poll wake-up path (RocketMQ: a pull held at the broker, answered on arrival);
* drain rate of a backlog: a PushConsumer with ``batch_size`` 1 and 32, and ``PullConsumer.poll``.

Prints a table and writes ``bench/out/consume_bench.csv``.
"""
from __future__ import annotations

import argparse
import csv
import multiprocessing
import os
import platform
import shutil
import struct
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import hostmq  # noqa: E402
from hostmq import ConsumeFrom, ConsumeResult, Message  # noqa: E402
from hostmq.cli import workload  # noqa: E402

SPAWN = multiprocessing.get_context("spawn")
STAMP = struct.Struct("<q")
PAD = b"x" * 92
QUEUES = 4                      # workload.ensure_topic's default
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")


def _latency_consumer(root: str, topic: str, kind: str, n: int, conn) -> None:
    lat: list[int] = []
    done = threading.Event()

    def listener(msgs):
        now = time.time_ns()
        stamps = [STAMP.unpack_from(m.body)[0] for m in msgs]
        lat.extend(now - t for t in stamps if t)            # 0: a warm-up message
        if len(lat) >= n:
            done.set()
        return ConsumeResult.SUCCESS

    group = f"lat-{kind}-{time.time_ns()}"
    if kind == "push":
        c = hostmq.PushConsumer(root, group=group, consume_from=ConsumeFrom.LAST_OFFSET, threads=1)
        c.subscribe(topic)
        c.register(listener)
        c.start()
        deadline = time.monotonic() + 30
        while len(c.assignment()) < QUEUES and time.monotonic() < deadline:     # its first rebalance
            time.sleep(0.01)
        time.sleep(0.5)                 # its pull thread is asleep on the wake-up semaphore
        conn.send("ready")
        done.wait(120)
        c.shutdown()
    else:
        with hostmq.PullConsumer(root, group=group, consume_from=ConsumeFrom.LAST_OFFSET, auto_commit=False) as c:
            c.subscribe(topic)
            while len(c.assignment()) < QUEUES:
                c.poll(0.1)
            conn.send("ready")
            deadline = time.monotonic() + 120
            while len(lat) < n and time.monotonic() < deadline:
                listener(c.poll(1.0))
    conn.send(lat)


def latency(root: str, topic: str, kind: str, n: int, pause_s: float) -> dict:
    parent, child = SPAWN.Pipe()
    proc = SPAWN.Process(target=_latency_consumer, args=(root, topic, kind, n, child), daemon=True)
    proc.start()
    try:
        if not parent.poll(60):
            raise RuntimeError(f"{kind} consumer did not start")
        parent.recv()
        with hostmq.Producer(root) as p:
            for _ in range(50):         # warm up: routes, the producer's ring, first-touch pages
                p.send(Message(topic, STAMP.pack(0) + PAD))
                time.sleep(pause_s)
            for _ in range(n):
                p.send(Message(topic, STAMP.pack(time.time_ns()) + PAD))
                time.sleep(pause_s)
        lat = parent.recv() if parent.poll(120) else []
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    return {**workload.percentiles_us(lat), "received": len(lat)}


def drain_push(root: str, topic: str, total: int, batch_size: int) -> float:
    got = [0]
    lock = threading.Lock()
    done = threading.Event()

    def listener(msgs):
        with lock:
            got[0] += len(msgs)
            if got[0] >= total:
                done.set()
        return ConsumeResult.SUCCESS
    c = hostmq.PushConsumer(root, group=f"drain-{batch_size}-{time.time_ns()}", consume_from=ConsumeFrom.FIRST_OFFSET,
                            batch_size=batch_size, pull_batch_size=256)
    c.subscribe(topic)
    c.register(listener)
    t0 = time.perf_counter()
    c.start()
    done.wait(300)
    rate = got[0] / (time.perf_counter() - t0)
    c.shutdown()
    return rate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=3000, help="messages per latency run (default 3000)")
    ap.add_argument("--backlog", type=int, default=100_000, help="backlog drained (default 100 000)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="hqc-")
    root = os.path.join(tmp, "root")
    print(f"consume bench: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"root {root}", flush=True)
    rows: list[tuple[str, float, str]] = []
    try:
        with hostmq.LocalCluster(root, config={"store": {"commitlog_file_bytes": 256 << 20}}):
            workload.ensure_topic(root, "lat")
            for kind in ("push", "pull"):
                for pause_s, label in ((0.0005, "0.5 ms apart"), (0.05, "50 ms apart (wake from sleep)")):
                    n = args.messages if pause_s < 0.01 else max(200, args.messages // 10)
                    r = latency(root, "lat", kind, n, pause_s)
                    for k in ("p50", "p99", "p99.9"):
                        rows.append((f"{kind} latency {k} µs, {label}", r[k], f"{r['received']} received"))
                    print(f"  {kind} latency, {label}: done", flush=True)
            workload.ensure_topic(root, "drain")
            with hostmq.Producer(root) as p:
                workload.batch_sends(p, "drain", args.backlog)
            for bs in (1, 32):
                rows.append((f"push drain msgs/s, batch_size {bs}", drain_push(root, "drain", args.backlog, bs), ""))
            rows.append(("pull drain msgs/s (poll)", workload.consume_all(root, "drain", args.backlog), ""))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    width = max(len(r[0]) for r in rows) + 2
    for name, value, note in rows:
        print(f"{name:<{width}}{value:>14,.0f}  {note}")
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "consume_bench.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["measure", "value", "note", "machine"])
        for name, value, note in rows:
            w.writerow([name, value, note, f"{platform.machine()} {os.cpu_count()} CPUs"])
    print(f"\nCSV: {os.path.join(OUT, 'consume_bench.csv')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
