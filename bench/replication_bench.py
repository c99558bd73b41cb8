"""Master → slave replication: throughput, the slave's lag under load, and what SYNC_MASTER costs a send.

    .venv/bin/python bench/replication_bench.py [--messages 200000] [--sends 3000] [--out DIR]

Each row runs a fresh LocalCluster (one master, and a slave on the same root: ``broker-a.1``, its
own store and processes; 2 vCPUs shared by all of them), 100-byte bodies:

* **replication throughput** — ``send_batch`` of 100 as fast as one producer can, ASYNC_MASTER; the
  master's append rate and the slave's, and how long after the last send the slave held everything
  (catch-up); the slave's lag (master's commitlog end − the slave's) sampled every 10 ms while
  sending: p50 / p99 / max bytes;
* **send latency** — one acknowledged sync send at a time: ASYNC_MASTER without a slave (the
  baseline), ASYNC_MASTER with a slave (does replication slow the send path?), SYNC_MASTER (the send
  waits for the slave's ack), and SYNC_MASTER + SYNC_FLUSH (on the master's disk and on the slave);
  p50 / p99 µs and sends/s, with the ratio to the baseline in the same run.

Prints a table and writes ``replication.csv`` and ``report.md`` to ``--out`` (default
``bench/results/replication``).
"""
from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import hostmq  # noqa: E402
from hostmq import Message  # noqa: E402

BODY = b"r" * 100
FILES = {"store": {"commitlog_file_bytes": 64 << 20}}


def _positions(root: str) -> dict[int, int]:
    with hostmq.Admin(root) as a:
        return {r["id"]: r["state"].get("write_pos", 0) for r in a.brokers() if r["alive"]}


def _wait_connected(root: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with hostmq.Admin(root) as a:
            rows = {r["id"]: r for r in a.brokers()}
        if 0 in rows and rows[0]["state"].get("ha_slaves") == 1:
            return
        time.sleep(0.05)
    raise RuntimeError("the slave did not connect")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))] if xs else float("nan")


def throughput(messages: int) -> dict:
    root = tempfile.mkdtemp(prefix="hqrep-")
    try:
        with hostmq.LocalCluster(root, slaves=1, config=FILES):
            _wait_connected(root)
            with hostmq.Admin(root) as a:
                a.create_topic("rep", queues=4)
            lags, stop = [], threading.Event()

            def sample():
                while not stop.is_set():
                    p = _positions(root)
                    if 0 in p and 1 in p:
                        lags.append(max(0, p[0] - p[1]))
                    stop.wait(0.01)
            t = threading.Thread(target=sample)
            t.start()
            t0 = time.perf_counter()
            with hostmq.Producer(root) as p:
                for i in range(0, messages, 100):
                    p.send_batch([Message("rep", BODY) for _ in range(100)])
            sent_s = time.perf_counter() - t0
            master_end = _positions(root)[0]
            while _positions(root).get(1, 0) < master_end:
                time.sleep(0.002)
            caught_s = time.perf_counter() - t0
            stop.set()
            t.join()
        return {"messages": messages, "bytes": master_end, "send_s": sent_s, "caught_up_s": caught_s,
                "master_msgs_s": messages / sent_s, "slave_msgs_s": messages / caught_s,
                "slave_mib_s": master_end / caught_s / (1 << 20), "lag_p50": _pct(lags, 50),
                "lag_p99": _pct(lags, 99), "lag_max": max(lags) if lags else 0, "samples": len(lags)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def send_latency(label: str, sends: int, slaves: int, broker: dict, store: dict) -> dict:
    root = tempfile.mkdtemp(prefix="hqrep-")
    try:
        with hostmq.LocalCluster(root, slaves=slaves, config={"broker": broker, "store": {**FILES["store"], **store}}):
            if slaves:
                _wait_connected(root)
            with hostmq.Admin(root) as a:
                a.create_topic("lat", queues=4)
            lat, statuses = [], {}
            with hostmq.Producer(root) as p:
                for _ in range(200):
                    p.send(Message("lat", BODY))
                t0 = time.perf_counter()
                for _ in range(sends):
                    t = time.perf_counter()
                    r = p.send(Message("lat", BODY))
                    lat.append((time.perf_counter() - t) * 1e6)
                    statuses[r.status.name] = statuses.get(r.status.name, 0) + 1
                total = time.perf_counter() - t0
        return {"row": label, "p50_us": _pct(lat, 50), "p99_us": _pct(lat, 99), "sends_s": sends / total,
                "statuses": " ".join(f"{k} {v}" for k, v in sorted(statuses.items()))}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--sends", type=int, default=3000)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "replication"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    load0 = os.getloadavg()[0]
    tp = throughput(args.messages)
    rows = [send_latency("ASYNC_MASTER, no slave (baseline)", args.sends, 0, {}, {}),
            send_latency("ASYNC_MASTER + slave", args.sends, 1, {}, {}),
            send_latency("SYNC_MASTER + slave", args.sends, 1, {"role": "SYNC_MASTER"}, {}),
            send_latency("SYNC_MASTER + slave, SYNC_FLUSH", args.sends, 1, {"role": "SYNC_MASTER"},
                         {"flush_disk_type": "SYNC_FLUSH"})]
    base = rows[0]
    for r in rows:
        r["x_p50"] = r["p50_us"] / base["p50_us"]
        r["x_rate"] = r["sends_s"] / base["sends_s"]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        commit = "?"
    lines = [
        "# Replication (bench/replication_bench.py)", "",
        f"- commit {commit}; {os.cpu_count()} CPUs; load average {load0:.1f} at start, "
        f"{os.getloadavg()[0]:.1f} at the end; master and slave on one host (one root)", "",
        "## Throughput and the slave's lag (send_batch of 100, ASYNC_MASTER)", "",
        "| messages | MiB | master msgs/s | slave caught up after s | slave msgs/s | slave MiB/s | "
        "lag p50 bytes | lag p99 | lag max |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {tp['messages']:,} | {tp['bytes'] / (1 << 20):.1f} | {tp['master_msgs_s']:,.0f} | "
        f"{tp['caught_up_s']:.2f} (sending took {tp['send_s']:.2f}) | {tp['slave_msgs_s']:,.0f} | "
        f"{tp['slave_mib_s']:.1f} | {tp['lag_p50']:,.0f} | {tp['lag_p99']:,.0f} | {tp['lag_max']:,} |", "",
        f"## One acknowledged sync send at a time ({args.sends:,} sends per row)", "",
        "| configuration | p50 µs | × baseline | p99 µs | sends/s | × baseline | statuses |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(f"| {r['row']} | {r['p50_us']:.0f} | {r['x_p50']:.2f}× | {r['p99_us']:.0f} | "
                     f"{r['sends_s']:,.0f} | {r['x_rate']:.2f}× | {r['statuses']} |")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "replication.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kind", "row", "p50_us", "p99_us", "sends_s", "x_p50", "x_rate", "statuses"])
        for r in rows:
            w.writerow(["send", r["row"], f"{r['p50_us']:.1f}", f"{r['p99_us']:.1f}", f"{r['sends_s']:.0f}",
                        f"{r['x_p50']:.3f}", f"{r['x_rate']:.3f}", r["statuses"]])
        w.writerow(["throughput", "send_batch", "", "", f"{tp['master_msgs_s']:.0f}", "", "",
                    f"slave {tp['slave_msgs_s']:.0f} msgs/s, lag p99 {tp['lag_p99']:.0f} B"])


if __name__ == "__main__":
    main()
