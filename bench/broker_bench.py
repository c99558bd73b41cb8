"""Broker benchmark: one producer process against a real cluster, beside Redis Streams and pyzmq ipc.

    .venv/bin/python bench/broker_bench.py [--messages 20000] [--root DIR] [--quick]

Every workload uses 100-byte bodies and runs in this invocation against:

* hostmq — a LocalCluster (NameServer + broker with writer, dispatcher, flusher), ASYNC_FLUSH, first with
  the default bounded spin-then-block, then with every wait configured to block only;
* Redis Streams — Debian's redis-server on 127.0.0.1 (started here on a free port, no persistence) via
  redis-py: XADD one at a time, pipelined XADD in batches of 100, XREAD BLOCK in another process;
  skipped with a note if redis-server or redis-py is missing;
* pyzmq over ipc — REQ/REP round trips (an acknowledged send), PUSH one frame per message, PUSH of
  100 messages per frame, PUSH → PULL in another process.

Raw limits measured in the same run: a blocking POSIX-semaphore round trip between two processes,
back to back and with 0.5 ms pauses, and how much slower the same pure-Python work runs right after
a 0.5 ms sleep (the cost of a cold vCPU, which every paused workload pays).

End-to-end latency is always producer (this process) → consumer (another process), one message at a
time, each body carrying its send time. Prints a table with hostmq/peer ratios and writes
``bench/out/broker_bench.csv``.
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
import time

import numpy as np
import zmq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import hostmq  # noqa: E402
from hostmq.bench.runner import RedisServer  # noqa: E402
from hostmq.cli import workload  # noqa: E402

SPAWN = multiprocessing.get_context("spawn")
STAMP = struct.Struct("<q")
BODY = b"x" * 100
PAUSE_S = 0.0005        # the pause of the paused workloads (as end-to-end: one message at a time)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")


def timed_calls(call, n: int, pause_s: float = 0.0) -> tuple[float, dict]:
    """``call()`` ``n`` times one after another (``pause_s`` apart): (calls/s, latency percentiles in µs)."""
    lat = np.empty(n, np.int64)
    t0 = time.perf_counter()
    for i in range(n):
        s = time.perf_counter_ns()
        call()
        lat[i] = time.perf_counter_ns() - s
        if pause_s:
            time.sleep(pause_s)
    return n / (time.perf_counter() - t0), workload.percentiles_us(lat)


def sync_rows(call, n: int) -> dict:
    """The sync-send rows of a peer: back to back, then with pauses."""
    rate, lat = timed_calls(call, n)
    res = {"sync send msgs/s": rate, **{f"sync send {k} µs": v for k, v in lat.items() if k != "mean"}}
    res["sync send p50 µs, 0.5 ms pauses"] = timed_calls(call, min(n, 2000), PAUSE_S)[1]["p50"]
    return res


# ---------------------------------------------------------------------------------------------------
# hostmq
# ---------------------------------------------------------------------------------------------------
def run_hostmq(root: str, n: int, block_only: bool) -> dict:
    cfg = {"store": {"commitlog_file_bytes": 256 << 20}}
    if block_only:
        cfg["broker"] = {"writer_spin_s": 0.0, "writer_busy_spin_s": 0.0, "dispatcher_spin_s": 0.0}
    res = {}
    shutil.rmtree(root, ignore_errors=True)
    with hostmq.LocalCluster(root, config=cfg):
        workload.ensure_topic(root, "bench")
        with hostmq.Producer(root, spin_s=0.0 if block_only else 200e-6) as p:
            workload.sync_sends(p, "bench", 500)                                    # warm-up
            rate, lat = workload.sync_sends(p, "bench", n)
            res["sync send msgs/s"] = rate
            res.update({f"sync send {k} µs": v for k, v in lat.items() if k != "mean"})
            _, lat = workload.sync_sends(p, "bench", min(n, 2000), pause_s=PAUSE_S)
            res["sync send p50 µs, 0.5 ms pauses"] = lat["p50"]
            if block_only:
                return res
            res["send_async msgs/s"] = workload.async_sends(p, "bench", n)
            res["send_batch(100) msgs/s"] = workload.batch_sends(p, "bench", n * 10)
            e2e = workload.end_to_end(p, root, "bench", min(n, 5000))
            res.update({f"end-to-end {k} µs": v for k, v in e2e.items() if k in ("p50", "p99", "p99.9")})
        res["consume (pull) msgs/s"] = workload.consume_all(root, "bench", n * 12 + 500 + min(n, 5000))
    return res


# ---------------------------------------------------------------------------------------------------
# Redis Streams
# ---------------------------------------------------------------------------------------------------
def _redis_reader(port: int, n: int, conn) -> None:
    import redis
    r = redis.Redis(port=port)
    conn.send("ready")
    last, lat = "$", []
    while len(lat) < n:
        got = r.xread({"e2e": last}, block=5000, count=100)
        if not got:
            break
        for mid, fields in got[0][1]:
            lat.append(time.time_ns() - STAMP.unpack_from(fields[b"b"])[0])
            last = mid
    conn.send(lat)


def run_redis(n: int) -> dict | str:
    server = RedisServer()          # a throw-away redis-server (hostmq.bench.runner), no persistence
    if server.proc is None:
        return server.why_not
    import redis
    port = server.port
    r = redis.Redis(port=port)
    try:
        res = {}
        res.update(sync_rows(lambda: r.xadd("s", {"b": BODY}), n))
        t0 = time.perf_counter()
        for _ in range(n * 10 // 100):
            pipe = r.pipeline(transaction=False)
            for _ in range(100):
                pipe.xadd("s", {"b": BODY})
            pipe.execute()
        res["send_batch(100) msgs/s"] = n * 10 / (time.perf_counter() - t0)
        parent, child = SPAWN.Pipe()
        reader = SPAWN.Process(target=_redis_reader, args=(port, min(n, 5000), child), daemon=True)
        reader.start()
        parent.recv()
        time.sleep(0.2)         # the reader is blocked in XREAD before the first message
        for _ in range(min(n, 5000)):
            r.xadd("e2e", {"b": STAMP.pack(time.time_ns()) + BODY[8:]})
            time.sleep(PAUSE_S)
        e2e = workload.percentiles_us(parent.recv())
        reader.join(10)
        res.update({f"end-to-end {k} µs": v for k, v in e2e.items() if k in ("p50", "p99", "p99.9")})
        return res
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------------
# pyzmq over ipc
# ---------------------------------------------------------------------------------------------------
def _zmq_rep(addr: str, n: int) -> None:
    ctx = zmq.Context()
    s = ctx.socket(zmq.REP)
    s.bind(addr)
    for _ in range(n):
        s.send(s.recv()[:8])
    s.close(0)
    ctx.term()


def _zmq_pull(addr: str, expect: int, latency: bool, conn) -> None:
    ctx = zmq.Context()
    s = ctx.socket(zmq.PULL)
    s.bind(addr)
    conn.send("ready")
    lat, got = [], 0
    while got < expect:
        m = s.recv()
        if latency:
            lat.append(time.time_ns() - STAMP.unpack_from(m)[0])
            got += 1
        else:
            got += max(1, len(m) // len(BODY))
    conn.send(lat)
    s.close(0)
    ctx.term()


def _pull_pair(ctx, addr: str, count: int, latency: bool):
    """A PULL process bound at ``addr`` (ready) and a PUSH socket connected to it."""
    parent, child = SPAWN.Pipe()
    pull = SPAWN.Process(target=_zmq_pull, args=(addr, count, latency, child), daemon=True)
    pull.start()
    parent.recv()
    push = ctx.socket(zmq.PUSH)
    push.connect(addr)
    return pull, parent, push


def run_zmq(tmp: str, n: int) -> dict:
    res = {}
    ctx = zmq.Context()
    addr = f"ipc://{tmp}/rep.sock"
    rep = SPAWN.Process(target=_zmq_rep, args=(addr, n + min(n, 2000)), daemon=True)
    rep.start()
    req = ctx.socket(zmq.REQ)
    req.connect(addr)

    def round_trip():
        req.send(BODY)
        req.recv()

    res.update(sync_rows(round_trip, n))
    req.close(0)
    rep.join(10)
    for name, per_frame, count in (("send_async msgs/s", 1, n), ("send_batch(100) msgs/s", 100, n * 10)):
        pull, parent, push = _pull_pair(ctx, f"ipc://{tmp}/pull-{per_frame}.sock", count, False)
        frame = BODY * per_frame
        t0 = time.perf_counter()
        for _ in range(count // per_frame):
            push.send(frame)
        parent.recv()
        res[name] = count / (time.perf_counter() - t0)
        push.close(0)
        pull.join(10)
    m = min(n, 5000)
    pull, parent, push = _pull_pair(ctx, f"ipc://{tmp}/e2e.sock", m, True)
    time.sleep(0.2)
    for _ in range(m):
        push.send(STAMP.pack(time.time_ns()) + BODY[8:])
        time.sleep(PAUSE_S)
    e2e = workload.percentiles_us(parent.recv())
    res.update({f"end-to-end {k} µs": v for k, v in e2e.items() if k in ("p50", "p99", "p99.9")})
    push.close(0)
    pull.join(10)
    ctx.term()
    return res


# ---------------------------------------------------------------------------------------------------
# Raw limits of this machine, measured in the same run
# ---------------------------------------------------------------------------------------------------
def _sem_echo(a_name: str, b_name: str) -> None:
    import posix_ipc
    a, b = posix_ipc.Semaphore(a_name), posix_ipc.Semaphore(b_name)
    while True:
        a.acquire()
        b.release()


def _python_work() -> int:
    s = 0
    for i in range(200):
        s += i * i
    return s


def run_raw(n: int) -> dict:
    """Blocking semaphore round trips between two processes, back to back and with 0.5 ms pauses
    (the end-to-end workloads pause 0.5 ms between messages), and how much slower the same
    pure-Python work runs right after a 0.5 ms sleep than back to back (a cold vCPU)."""
    import posix_ipc
    res = {}
    names = [f"/hqb-{os.getpid()}-a", f"/hqb-{os.getpid()}-b"]
    a, b = (posix_ipc.Semaphore(x, posix_ipc.O_CREX) for x in names)
    echo = SPAWN.Process(target=_sem_echo, args=tuple(names), daemon=True)
    echo.start()
    try:
        m = min(n, 3000)

        def round_trip():
            a.release()
            b.acquire()

        res["semaphore round trip p50 µs, back to back"] = timed_calls(round_trip, m)[1]["p50"]
        res["semaphore round trip p50 µs, 0.5 ms pauses"] = timed_calls(round_trip, m, PAUSE_S)[1]["p50"]
        work = {"back to back": timed_calls(_python_work, m)[1]["p50"],
                "after 0.5 ms sleep": timed_calls(_python_work, m, PAUSE_S)[1]["p50"]}
        res["same Python work after 0.5 ms sleep (× slower)"] = work["after 0.5 ms sleep"] / work["back to back"]
    finally:
        echo.kill()
        echo.join(5)
        for x in (a, b):
            x.unlink()
            x.close()
    return res


# ---------------------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=20_000, help="messages per phase (default 20 000)")
    ap.add_argument("--root", default=None, help="cluster root (default: a temporary directory on disk)")
    ap.add_argument("--quick", action="store_true", help="2 000 messages per phase")
    args = ap.parse_args()
    n = 2000 if args.quick else args.messages
    tmp = tempfile.mkdtemp(prefix="hqb-")
    root = args.root or os.path.join(tmp, "root")
    print(f"broker bench: {n:,} messages per phase, 100-byte bodies; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}; root {root}", flush=True)
    results = {"hostmq": run_hostmq(root, n, False)}
    print("  hostmq (spin-then-block) done", flush=True)
    results["hostmq block-only"] = run_hostmq(root + "-block", n, True)
    print("  hostmq (block only) done", flush=True)
    redis_res = run_redis(n)
    if isinstance(redis_res, str):
        print(f"  Redis Streams skipped: {redis_res}", flush=True)
        redis_res = {}
    else:
        print("  Redis Streams done", flush=True)
    results["redis"] = redis_res
    results["zmq ipc"] = run_zmq(tmp, n)
    print("  pyzmq ipc done\n", flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    rows = sorted({k for r in results.values() for k in r}, key=_order)
    cols = ["hostmq", "hostmq block-only", "redis", "zmq ipc"]
    header = f"{'workload':<26}" + "".join(f"{c:>18}" for c in cols) + f"{'hostmq/redis':>14}{'hostmq/zmq':>12}"
    print(header)
    print("-" * len(header))
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "broker_bench.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["workload"] + cols + ["hostmq/redis", "hostmq/zmq", "messages", "machine", "raw"])
        for k in rows:
            vals = [results[c].get(k) for c in cols]
            ratios = [_ratio(vals[0], vals[2]), _ratio(vals[0], vals[3])]
            print(f"{k:<26}" + "".join(f"{_fmt(v):>18}" for v in vals) + f"{_fmt(ratios[0], 2):>14}"
                  f"{_fmt(ratios[1], 2):>12}")
            w.writerow([k] + vals + ratios + [n, f"{platform.machine()} {os.cpu_count()} CPUs"])
        raw = run_raw(n)
        print("\nraw limits of this machine (same run)")
        for k, v in raw.items():
            print(f"  {k:<52}{v:>10,.1f}")
            w.writerow([f"raw: {k}"] + [None] * len(cols) + [None, None, n, f"{platform.machine()} {os.cpu_count()} CPUs",
                                                              v])
    print(f"\nCSV: {os.path.join(OUT, 'broker_bench.csv')} (ratios: rates hostmq/peer, latencies hostmq/peer)")
    return 0


def _order(k: str) -> tuple:
    order = ["sync send msgs/s", "sync send p50", "sync send p99 ", "sync send p99.9", "send_async", "send_batch",
             "consume", "end-to-end p50", "end-to-end p99 ", "end-to-end p99.9"]
    for i, o in enumerate(order):
        if k.startswith(o.strip()) and (o.endswith(" ") is False or k.startswith(o)):
            return (i, k)
    return (99, k)


def _ratio(a, b):
    return a / b if a and b else None


def _fmt(v, digits: int = 0) -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}" if digits else f"{v:,.0f}"


if __name__ == "__main__":
    sys.exit(main())
