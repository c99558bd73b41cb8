"""Heartbeats naming N new consumer groups against one broker: how long the flood holds the control
loop, and what an honest client's PING waits meanwhile (issue 27, attack 4's 4,000 groups).

Each new group makes the broker create its retry topic; before batching every one rewrote
``topics.json`` whole with an fsync (and re-registered every topic), so N groups cost O(N²). The flood
is sent as the root's owner (owners are not capped) with up to ``--window`` heartbeats in flight.

    PYTHONPATH=. python bench/group_flood.py [--groups 4000] [--window 128] [--keep ROOT]

Prints one JSON line: groups, flood_s (first heartbeat sent → last answered), broker_cpu_s (CPU the
broker process — its control loop — spent meanwhile), broker_written_mb (bytes it wrote to files:
``topics.json`` rewrites), ping_max_ms and ping_p50_ms (an honest client
pinging the broker every 10 ms during the flood), topics_json_bytes.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

import orjson
import psutil

import hostmq
from hostmq.remoting import RemotingClient
from hostmq.protocol.codes import RequestCode
from hostmq.root import RootPaths, ipc_address


def _pinger(address: str, stop: threading.Event, out: list[float]) -> None:
    with RemotingClient(address, timeout_s=120.0) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            c.request(RequestCode.PING)
            out.append((time.perf_counter() - t0) * 1000)
            stop.wait(0.01)


def flood(root: str, groups: int, window: int) -> dict:
    address = ipc_address(RootPaths(root).broker_socket("broker-a"))
    with hostmq.Admin(root) as a:
        broker = psutil.Process(a.brokers()[0]["pids"]["broker"])
    cpu0, written0 = sum(broker.cpu_times()[:2]), broker.io_counters().write_chars
    pings: list[float] = []
    stop = threading.Event()
    pinger = threading.Thread(target=_pinger, args=(address, stop, pings))
    pinger.start()
    try:
        with RemotingClient(address, timeout_s=600.0) as c:
            t0 = time.perf_counter()
            for start in range(0, groups, window):
                futures = [c.request_async(RequestCode.HEART_BEAT, {
                    "client_id": f"flood-{i}", "producer_groups": [], "consumer_groups": [f"flood-{i}"],
                    "pid": os.getpid()}) for i in range(start, min(groups, start + window))]
                for f in futures:
                    f.result(timeout=600)
            flood_s = time.perf_counter() - t0
            cpu_s = sum(broker.cpu_times()[:2]) - cpu0
            written_mb = (broker.io_counters().write_chars - written0) / 1e6
    finally:
        stop.set()
        pinger.join()
    topics = os.path.join(RootPaths(root).config_dir("broker-a"), "topics.json")
    return {"groups": groups, "window": window, "flood_s": round(flood_s, 3), "broker_cpu_s": round(cpu_s, 2),
            "broker_written_mb": round(written_mb, 1),
            "ping_max_ms": round(max(pings), 1), "ping_p50_ms": round(statistics.median(pings), 2),
            "pings": len(pings), "topics_json_bytes": os.path.getsize(topics)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=int, default=4000)
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--keep", default="", help="use this root (kept) instead of a temporary one")
    args = p.parse_args()
    root = args.keep or tempfile.mkdtemp(prefix="hostmq-flood-")
    config = {"broker": {"max_clients": 1 << 20, "max_groups": 1 << 20}} \
        if "max_groups" in hostmq.BrokerConfig.__dataclass_fields__ else {}
    try:
        with hostmq.LocalCluster(root, config=config):
            result = flood(root, args.groups, args.window)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(orjson.dumps(result).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
