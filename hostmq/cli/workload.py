"""Workloads against a running cluster, shared by ``hostmq up --demo`` and ``bench/broker_bench.py``.

Every function takes a root, runs real clients against the servers there, and returns plain numbers
(rates in messages per second, latencies in microseconds). End-to-end latency is measured across
processes: a consumer process reads what a producer in this process sends one message at a time;
each body carries its send time (``time.time_ns``, one clock for the whole machine).
"""
from __future__ import annotations

import multiprocessing
import struct
import time

import numpy as np

from ..admin.admin import Admin
from ..client.producer import Producer
from ..client.pull_consumer import PullConsumer
from ..message import ConsumeFrom, Message

_SPAWN = multiprocessing.get_context("spawn")
_STAMP = struct.Struct("<q")


def percentiles_us(samples_ns) -> dict[str, float]:
    a = np.asarray(samples_ns, dtype=np.float64) / 1000.0
    if not len(a):
        return {"p50": float("nan"), "p99": float("nan"), "p99.9": float("nan"), "mean": float("nan")}
    p50, p99, p999 = np.percentile(a, [50, 99, 99.9])
    return {"p50": float(p50), "p99": float(p99), "p99.9": float(p999), "mean": float(a.mean())}


def ensure_topic(root: str, topic: str, queues: int = 4) -> None:
    with Admin(root) as a:
        a.create_topic(topic, queues=queues)


def sync_sends(p: Producer, topic: str, n: int, body_bytes: int = 100, pause_s: float = 0.0) -> tuple[float, dict]:
    """``n`` sync sends one at a time (``pause_s`` apart): (rate, latency percentiles in µs)."""
    body = b"x" * body_bytes
    lat = np.empty(n, np.int64)
    t0 = time.perf_counter()
    for i in range(n):
        s = time.perf_counter_ns()
        p.send(Message(topic, body))
        lat[i] = time.perf_counter_ns() - s
        if pause_s:
            time.sleep(pause_s)
    return n / (time.perf_counter() - t0), percentiles_us(lat)


def async_sends(p: Producer, topic: str, n: int, body_bytes: int = 100) -> float:
    body = b"x" * body_bytes
    t0 = time.perf_counter()
    futures = [p.send_async(Message(topic, body)) for _ in range(n)]
    for f in futures:
        f.result(30)
    return n / (time.perf_counter() - t0)


def batch_sends(p: Producer, topic: str, n: int, batch: int = 100, body_bytes: int = 100) -> float:
    body = b"x" * body_bytes
    queues = p.instance.publish_queues(topic)
    t0 = time.perf_counter()
    sent = 0
    i = 0
    while sent < n:
        k = min(batch, n - sent)
        p.send_batch([Message(topic, body) for _ in range(k)], queue=queues[i % len(queues)])
        sent += k
        i += 1
    return n / (time.perf_counter() - t0)


def consume_all(root: str, topic: str, expect: int, timeout_s: float = 60.0) -> float:
    """Read ``expect`` messages of ``topic`` from the first offset (a fresh group); the rate."""
    with Admin(root) as a:
        queues = a.route(topic)
    group = f"workload-{time.time_ns()}"
    with PullConsumer(root, group=group, consume_from=ConsumeFrom.FIRST_OFFSET, auto_commit=False,
                      max_poll_records=4096) as c:
        c.assign(queues)
        got = 0
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout_s
        while got < expect and time.monotonic() < deadline:
            got += len(c.poll(0.5))
        return got / (time.perf_counter() - t0)


def _e2e_consumer(root: str, topic: str, n: int, conn) -> None:
    with Admin(root) as a:
        queues = a.route(topic)
    with PullConsumer(root, group=f"e2e-{time.time_ns()}", auto_commit=False) as c:
        c.assign(queues)
        conn.send("ready")
        lat = []
        deadline = time.monotonic() + 60
        while len(lat) < n and time.monotonic() < deadline:
            for m in c.poll(1.0):
                lat.append(time.time_ns() - _STAMP.unpack_from(m.body)[0])
        conn.send(lat)


def end_to_end(p: Producer, root: str, topic: str, n: int, gap_s: float = 0.0005) -> dict:
    """Latency producer → consumer (another process), one message at a time; percentiles in µs."""
    parent, child = _SPAWN.Pipe()
    proc = _SPAWN.Process(target=_e2e_consumer, args=(root, topic, n, child), daemon=True)
    proc.start()
    try:
        if not parent.poll(60) or parent.recv() != "ready":
            raise RuntimeError("end-to-end consumer did not start")
        pad = b"x" * 92
        for _ in range(n):
            p.send(Message(topic, _STAMP.pack(time.time_ns()) + pad))
            if gap_s:
                time.sleep(gap_s)
        lat = parent.recv() if parent.poll(90) else []
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    return {**percentiles_us(lat), "received": len(lat)}
