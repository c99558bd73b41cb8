"""Delivery latency, producer process → consumer process, of hostmq and of what it is measured against
(issue 16), all in one run.

    hostmq bench --latency [--quick] [--messages N] [--out DIR]
    .venv/bin/python bench/latency.py [--quick] [--messages N] [--out DIR]    (default DIR: bench/results/latency)

Latency rows: one producer process and one consumer process (spawned, never a thread of the
producer) per row; 100-byte bodies, one message every 500 µs and (not with ``--quick``) every 5 ms —
with 5 ms every consumer has gone to sleep and is woken. The send time (``perf_counter_ns``, which is
CLOCK_MONOTONIC on Linux, one clock for every process: checked at start) travels in the body; the
consumer takes the receive time. The first ``--warmup`` messages of a row are not counted. Systems:

  shm_ring           pure-Python shared-memory ring + POSIX semaphore: the floor for Python code
  zmq_ipc            pyzmq PUSH → PULL over ipc (no store, no acknowledgement)
  zenoh              Zenoh (eclipse-zenoh): peer mode, unixsock-stream locator, express publisher with congestion
                     control BLOCK (lossless, as every other row; Zenoh's default drops), a Python callback
                     subscriber (no store, no acknowledgement; skipped with a note when not installed)
  redis              Redis Streams, XADD → XREAD BLOCK (redis-py, a private redis-server)
  mp_queue           multiprocessing.Queue
  c_ring             the floor in C (hostmq/bench/relay_floor.c, built with the system compiler; skipped
                     with a note without one): producer → consumer through shared memory, futex wake-ups
                     as hostmq.shm makes them
  c_relay            ... producer → writer → consumer: two hops, the middle process copying and CRC-ing
                     each message — hostmq's shape with nothing of hostmq's work (hostmq/bench/floor.py)
  c_ring_split       ... c_ring with the producer pinned to one CPU and the consumer to another: one wake-up
                     of the other CPU, alone (skipped with fewer than two CPUs)
  c_relay_split      ... c_relay with producer and writer on one CPU and the consumer on another: the floor
                     of the placement the kernel gives hostmq's consumer on most runs of a 2-vCPU VM
  hostmq_poll        hostmq Producer.send → PullConsumer.poll (both with their default idle strategy, auto)
  hostmq_poll_sleep  ... both with idle="sleep" (a futex wake-up per message)
  hostmq_poll_backoff ... both with idle="backoff:50" (10 µs busy, then yields, then the futex)
  hostmq_poll_spin   ... both with idle="spin:50": for machines with spare cores (on 2 vCPUs the spinners
                     take the CPU the writer and the dispatcher need)
  hostmq_poll_4q     ... into a topic of 4 queues (Admin.create_topic's default), the producer's
                     round-robin spreading the messages, the consumer assigned all four
  hostmq_push        hostmq Producer.send → PushConsumer listener
  hostmq_poll_batch  hostmq Producer.send → PullConsumer.poll_batch

Every row runs twice: quiet, and beside a CPU-bound neighbour (a Python busy loop at the bench's
niceness, started before the row and killed after it). Then, one process each: hostmq and Redis sync
send (p50, sends/s), batches of 100, hostmq send_async; a control round trip (hostmq PING of the broker
and of the NameServer against a raw pyzmq REQ/REP over ipc, and a raw DEALER ↔ ROUTER echo in hostmq's socket
shape, the floor of a Python server of that shape); hostmq consume rates (poll_batch, poll)
over the topic those sends filled.

The broker's own waits (writer, dispatcher) use its default strategy unless ``--broker-idle`` names one.

Prints the tables (hostmq figures with their ratio to the shm ring, Zenoh, Redis and the C relay) and writes
``latency.csv``, ``report.md`` and ``latency_hist.png`` to DIR. Every process, temporary directory,
redis-server, shared-memory segment and semaphore the run makes is removed on every way out.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import importlib.util
import multiprocessing
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

import hostmq
from hostmq.bench import floor as F
from hostmq.bench import latency_workers as W
from hostmq.bench.runner import RedisServer
from hostmq.config import Config

SPAWN = multiprocessing.get_context("spawn")
# The checkout this module runs from (an editable install), else the working directory: where the
# results go by default and whose commit the report names.
_HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPO = _HERE if os.path.isdir(os.path.join(_HERE, "bench", "results")) else os.getcwd()
OUT = os.path.join(REPO, "bench", "results", "latency") if REPO == _HERE else os.path.join(REPO, "hostmq-latency")
SYSTEMS = ["shm_ring", "zmq_ipc", "zenoh", "redis", "mp_queue", *F.ROWS, "hostmq_poll", *W.IDLE_ROWS,
           "hostmq_poll_4q", "hostmq_push", "hostmq_poll_batch"]
QUEUES = {"hostmq_poll_4q": 4}          # queues of a row's topic (1 unless named here)
CLUSTER_CONFIG = {"store": {"commitlog_file_bytes": 256 << 20}}     # the bench's cluster (latency_rows.py too)
BASES = {"shm_ring": "shm", "zenoh": "zenoh", "redis": "redis", "c_relay": "floor"}   # hostmq rows over these
HOSTMQ = [s for s in SYSTEMS if s.startswith("hostmq")]
QUANTILES = [("p50", 50), ("p90", 90), ("p99", 99), ("p99.9", 99.9), ("max", 100)]
WAIT_COUNTERS = ["blocked", "wakeups", "slice_timeouts", "rescued"]
NAME_PREFIX = "hqlat"                 # /dev/shm/hqlat.* and /dev/shm/sem.hqlat.* (the shm_ring row)
READY_TIMEOUT_S = 60.0
SEND_TOPIC = "latsend"


def check_clock() -> None:
    info = time.get_clock_info("perf_counter")
    if sys.platform.startswith("linux") and "CLOCK_MONOTONIC" not in info.implementation:
        raise SystemExit(f"perf_counter is {info.implementation}, not CLOCK_MONOTONIC: "
                         "send and receive times of two processes would not compare")


def plan(args) -> dict:
    n = args.messages or (2000 if args.quick else 20_000)
    pacings = [("every 500 µs", 500e-6, n)]
    if not args.quick:
        pacings.append(("every 5 ms", 5e-3, max(200, n // 5)))     # 5 ms × n/5 = twice the 500 µs row's time
    small = args.quick or args.messages
    return {"pacings": pacings, "warmup": args.warmup, "sync": 2000 if small else 20_000,
            # a burst of 20,000 async sends either way (~50 ms): one of 2,000 measures mostly its start
            # (the first frame alone, the last one's round trip, fresh memory for the results)
            "batches": 200 if small else 2000, "async": 20_000,
            "pings": 1000 if small else 5000}


# -- processes ---------------------------------------------------------------------------------------------
class Procs:
    """Every child the bench spawns; ``kill_all`` (in the finally of main) ends the ones still alive."""

    def __init__(self) -> None:
        self.procs: list = []

    def spawn(self, target, *args):
        p = SPAWN.Process(target=target, args=args, daemon=True)
        p.start()
        self.procs.append(p)
        return p

    def worker(self, target, cfg: dict):
        parent, child = SPAWN.Pipe()
        p = self.spawn(target, child, cfg)
        child.close()
        return p, parent

    def stop(self, p, timeout_s: float = 10.0) -> None:
        p.join(timeout_s)
        if p.is_alive():
            p.kill()
            p.join(5)
        if p in self.procs:
            self.procs.remove(p)

    def kill_all(self) -> None:
        for p in list(self.procs):
            if p.is_alive():
                p.kill()
            p.join(5)
        self.procs.clear()


def recv(conn, timeout_s: float, what: str):
    if not conn.poll(timeout_s):
        raise RuntimeError(f"{what}: nothing within {timeout_s:.0f} s")
    return conn.recv()


@contextlib.contextmanager
def neighbour(procs: Procs, on: bool):
    """A CPU-bound busy loop for the duration of the block (none when ``on`` is False)."""
    if not on:
        yield
        return
    started = SPAWN.Event()
    p = procs.spawn(W.busy_loop, started)
    try:
        if not started.wait(READY_TIMEOUT_S):
            raise RuntimeError("the neighbour did not start")
        yield
    finally:
        p.kill()
        procs.stop(p, 0)


# -- one latency row -----------------------------------------------------------------------------------------
def system_setup(system: str, row_id: int, env: dict, stack: contextlib.ExitStack) -> dict:
    """What producer and consumer of ``system`` share for one row; its cleanup is pushed on ``stack``."""
    if system == "shm_ring":
        import posix_ipc
        shm_name, sem_name = f"/{NAME_PREFIX}.{os.getpid()}.{row_id}", f"/{NAME_PREFIX}.{os.getpid()}.{row_id}.sem"
        posix_ipc.SharedMemory(shm_name, posix_ipc.O_CREX, size=W.RING_BYTES).close_fd()
        stack.callback(posix_ipc.unlink_shared_memory, shm_name)
        posix_ipc.Semaphore(sem_name, posix_ipc.O_CREX, initial_value=0).close()
        stack.callback(posix_ipc.unlink_semaphore, sem_name)
        return {"shm_name": shm_name, "sem_name": sem_name}
    if system == "zmq_ipc":
        return {"address": f"ipc://{env['tmp']}/zmq-{row_id}.sock"}
    if system == "zenoh":
        return {"path": f"{env['tmp']}/zenoh-{row_id}.sock"}
    if system == "redis":
        import redis
        key = f"lat{row_id}"
        stack.callback(lambda: redis.Redis(port=env["redis"].port).delete(key))
        return {"port": env["redis"].port, "key": key}
    if system == "mp_queue":
        q = SPAWN.Queue()
        stack.callback(q.cancel_join_thread)
        stack.callback(q.close)
        return {"queue": q}
    topic = f"lat{row_id}"                  # a fresh topic per row: a new group from FIRST_OFFSET reads only it
    prime_topic(env, topic, QUEUES.get(system, 1))
    return {"root": env["root"], "topic": topic, "group": f"lat{row_id}", "idle": W.IDLE_ROWS.get(system)}


def prime_topic(env: dict, topic: str, queues: int = 1) -> None:
    """Create ``topic`` and store one message (sequence number −1: consumers skip it), read back
    before the row starts, so the queue's first-record costs (its consume-queue file; the broker's
    first, the index file) fall outside the row. Added after 0.1–0.2 s stalls in the first hostmq
    row; one such stall was seen again afterwards on a heavily loaded host, so they are not (only) this."""
    queues = env["admin"].create_topic(topic, queues=queues)
    if "producer" not in env:
        env["producer"] = env["stack"].enter_context(hostmq.Producer(env["root"], group="latprime"))
    env["producer"].send(hostmq.Message(topic, W.STAMP.pack(0, -1) + W.PAD))
    with hostmq.PullConsumer(env["root"], group=f"prime-{topic}", consume_from=hostmq.ConsumeFrom.FIRST_OFFSET,
                             auto_commit=False) as c:
        c.assign(queues)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not c.poll(1.0):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the priming message of {topic} was not delivered")


def latency_row(system: str, pacing: tuple, with_neighbour: bool, row_id: int, env: dict, pl: dict) -> dict:
    label, period_s, n = pacing
    total = n + pl["warmup"]
    procs: Procs = env["procs"]
    with contextlib.ExitStack() as stack:
        cfg = {**system_setup(system, row_id, env, stack), "total": total, "warmup": pl["warmup"],
               "period_s": period_s, "budget_s": total * period_s + 30}
        consumer, c_conn = procs.worker(W.CONSUMERS[system], cfg)
        stack.callback(procs.stop, consumer, 0)          # after the results: anything left is killed
        recv(c_conn, READY_TIMEOUT_S, f"{system} consumer ready")
        producer, p_conn = procs.worker(W.PRODUCERS[system], cfg)
        stack.callback(procs.stop, producer, 0)
        recv(p_conn, READY_TIMEOUT_S, f"{system} producer ready")
        with neighbour(procs, with_neighbour):
            c_conn.send("go")
            p_conn.send("go")
            made = recv(p_conn, cfg["budget_s"] + 30, f"{system} producer result")
            got = recv(c_conn, cfg["budget_s"] + 30, f"{system} consumer result")
        producer.join(10)
        consumer.join(10)
    lat_us = got["lat_ns"] / 1000.0
    row = _row(system, label, with_neighbour, made["sent"], made["late"], got["received"], lat_us, got["waits"])
    if system in HOSTMQ:    # where the time goes, p50s in µs (latency_workers._publish_stamps, _WakeStamps)
        row["to_published_p50"] = round(made.get("to_published_us", float("nan")), 1)
        row["to_woken_p50"] = round(got.get("to_woken_us", float("nan")), 1)
        row["woken_to_poll_p50"] = round(got.get("round_us", float("nan")), 1)
        row["to_step_p50"] = round(got.get("to_step_us", float("nan")), 1)      # the writer's stamps
        row["to_wake_p50"] = round(got.get("to_wake_us", float("nan")), 1)
        # the placement: woken on the writer's CPU (a share of the stamped wake-ups) or on another
        row["same_cpu_share"] = round(got.get("same_cpu_share", float("nan")), 2)
        row["same_cpu_p50"] = round(got.get("same_cpu_us", float("nan")), 1)
        row["other_cpu_p50"] = round(got.get("other_cpu_us", float("nan")), 1)
    return {"row": row, "lat_us": lat_us}


def _row(system: str, label: str, with_neighbour: bool, sent: int, late, received: int, lat_us: np.ndarray,
         waits: dict) -> dict:
    """One CSV row: what was sent and measured, the load, the quantiles and the consumer's waits."""
    row = {"system": system, "pacing": label, "neighbour": "busy loop" if with_neighbour else "quiet",
           "sent": sent, "late_sends": late, "received": received, "measured": len(lat_us),
           "loadavg_1m": round(os.getloadavg()[0], 2)}      # the host is shared: how busy it was
    for name, q in QUANTILES:
        row[name] = round(float(np.percentile(lat_us, q)), 1) if len(lat_us) else float("nan")
    row.update({k: waits.get(k, "") for k in WAIT_COUNTERS})
    return row


def floor_row(system: str, pacing: tuple, with_neighbour: bool, env: dict, pl: dict) -> dict:
    """A C floor row (``floor.measure``), shaped like :func:`latency_row`'s."""
    label, period_s, n = pacing
    with neighbour(env["procs"], with_neighbour):
        lat_us = F.measure(env["floor_exe"], system, n, pl["warmup"], period_s, pl["floor_spin_us"], env["tmp"],
                           (n + pl["warmup"]) * period_s + 60)
    row = _row(system, label, with_neighbour, n + pl["warmup"], "", n + pl["warmup"], lat_us, {})
    return {"row": row, "lat_us": lat_us}


# -- the send / control / consume table ------------------------------------------------------------------
def send_table(env: dict, pl: dict) -> dict:
    procs: Procs = env["procs"]
    counts = {k: pl[k] for k in ("sync", "batches", "async", "pings")}
    env["admin"].create_topic(SEND_TOPIC, queues=1)
    p, conn = procs.worker(W.hostmq_send_worker, {"root": env["root"], "topic": SEND_TOPIC, **counts})
    out = {"hostmq": recv(conn, 600, "hostmq send worker"), "counts": counts}
    procs.stop(p)
    if env["redis"].proc is not None:
        p, conn = procs.worker(W.redis_send_worker, {"port": env["redis"].port, "key": "latsend", **counts})
        out["redis"] = recv(conn, 600, "redis send worker")
        procs.stop(p)
    for key, serve, ask, what in (("reqrep", W.rep_server, W.reqrep_worker, "REQ/REP"),
                                  ("dealer_router", W.router_server, W.dealer_worker, "DEALER/ROUTER")):
        address = f"ipc://{env['tmp']}/{key}.sock"
        ready = SPAWN.Event()
        server = procs.spawn(serve, address, ready)
        try:
            if not ready.wait(READY_TIMEOUT_S):
                raise RuntimeError(f"{what} server did not start")
            p, conn = procs.worker(ask, {"address": address, "pings": pl["pings"]})
            out[key] = recv(conn, 300, f"{what} worker")
            procs.stop(p)
        finally:
            server.kill()
            procs.stop(server, 0)
    if env.get("floor_exe"):                # the same sends in C: what the hand-offs alone cost
        one = F.measure_echo(env["floor_exe"], 1, pl["sync"], 100, pl["floor_spin_us"], env["tmp"], 120)
        many = F.measure_echo(env["floor_exe"], W.SEND_BATCH, pl["batches"], 20, pl["floor_spin_us"], env["tmp"], 120)
        out["floor"] = {"sync_p50_us": float(np.median(one)), "sync_per_s": len(one) / (one.sum() / 1e6),
                        "batch_msgs_per_s": W.SEND_BATCH * len(many) / (many.sum() / 1e6)}
        if not env["split_why"]:            # the same with producer and writer on two CPUs
            one = F.measure_echo(env["floor_exe"], 1, pl["sync"], 100, pl["floor_spin_us"], env["tmp"], 120, True)
            many = F.measure_echo(env["floor_exe"], W.SEND_BATCH, pl["batches"], 20, pl["floor_spin_us"], env["tmp"],
                                  120, True)
            out["floor_split"] = {"sync_p50_us": float(np.median(one)), "sync_per_s": len(one) / (one.sum() / 1e6),
                                  "batch_msgs_per_s": W.SEND_BATCH * len(many) / (many.sum() / 1e6)}
    p, conn = procs.worker(W.hostmq_drain_worker, {"root": env["root"], "topic": SEND_TOPIC,
                                                   "expect": out["hostmq"]["sent"]})
    out["drain"] = recv(conn, 600, "hostmq drain worker")
    procs.stop(p)
    return out


# -- output --------------------------------------------------------------------------------------------------
def fmt(v, digits: int = 0) -> str:
    if v == "" or v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "–"
    return f"{v:,.{digits}f}"


def ratio(v, ref) -> str:
    return f"{v / ref:.1f}×" if isinstance(ref, (int, float)) and isinstance(v, (int, float)) and ref \
        and np.isfinite(ref) and np.isfinite(v) else "–"


def add_ratios(rows: list[dict]) -> None:
    """``<q>_x_shm`` / ``<q>_x_zenoh`` / ``<q>_x_redis`` on every hostmq row: its quantile over the same
    pacing and neighbour's shm_ring / zenoh / redis quantile ("" where that peer was not measured)."""
    ref = {(r["system"], r["pacing"], r["neighbour"]): r for r in rows}
    for r in rows:
        if r["system"] not in HOSTMQ:
            continue
        for base, short in BASES.items():
            b = ref.get((base, r["pacing"], r["neighbour"]))
            for name, _ in QUANTILES:
                r[f"{name}_x_{short}"] = round(r[name] / b[name], 3) if b and b[name] else ""


def latency_tables(rows: list[dict]) -> list[str]:
    out = []
    xs = " | ".join(f"×{short}" for short in BASES.values())
    head = "| system | measured | load | " + " | ".join(f"{n} µs | {xs}" for n, _ in QUANTILES) + " |"
    for pacing in dict.fromkeys(r["pacing"] for r in rows):
        for nb in ("quiet", "busy loop"):
            sel = [r for r in rows if r["pacing"] == pacing and r["neighbour"] == nb]
            out += [f"### One message {pacing}, {'quiet' if nb == 'quiet' else 'beside a CPU-bound busy loop'}",
                    "", head, "|" + "---|" * (3 + (1 + len(BASES)) * len(QUANTILES))]
            for r in sel:
                cells = [r["system"], fmt(r["measured"]), fmt(r["loadavg_1m"], 1)]
                for name, _ in QUANTILES:
                    cells += [fmt(r[name])] + [fmt_x(r.get(f"{name}_x_{short}")) for short in BASES.values()]
                out.append("| " + " | ".join(cells) + " |")
            out.append("")
    hm = [r for r in rows if r["system"] in HOSTMQ]
    out += ["### hostmq rows: where the time goes (p50s, µs) and the consumer's futex waits", "",
            "From stamps in the producer and consumer processes around the native calls "
            "(hostmq/bench/latency_workers.py `_publish_stamps`, `_WakeStamps`), each against the send stamp "
            "in the body: send → ring write (the producer's own work until it writes its frame), send → "
            "consumer woken (its futex wait ends), woken → returned (the consumer's poll round; push rows: "
            "woken → the listener called, on the pull thread); ring write → "
            "woken (the frame write, the doorbell, the writer and two hand-offs) is the difference of the "
            "two p50s. Send → writer's step and send → queues woken are the writer's own stamps (CLOCK_MONOTONIC "
            "words of the broker state, `step_started_ns` and `step_woke_ns`, written by the native step just "
            "before it wakes the consumers), each the p50 over the messages whose step they stamped. "
            "Counted over the messages a poll returned (a listener got) right after a wake-up. "
            "Placement: whether the consumer was woken on the CPU the writer woke it from (`step_cpu`, the "
            "native step's stamp, against the consumer's own `sched_getcpu()`): the share of those wake-ups, "
            "and the p50 from send to returned of each kind — a wake-up of another, idle CPU costs what "
            "c_ring_split measures. Waits: the consumer's "
            "`PullConsumer.wait_stats` during the row.", "",
            "| system | pacing | neighbour | e2e p50 | send → ring write | send → writer's step | "
            "send → queues woken | ≈ ring write → woken | send → woken "
            "| woken → returned | on the writer's CPU: share, p50 | on another CPU: p50 "
            "| blocked | wakeups | slice timeouts | rescued |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def middle(r) -> float:
        return round(r["to_woken_p50"] - r["to_published_p50"], 1)

    def placement(r) -> str:
        share = r.get("same_cpu_share")
        if not isinstance(share, float) or share != share:
            return ""
        return f"{share:.0%}, {fmt(r.get('same_cpu_p50'))}"
    out += [f"| {r['system']} | {r['pacing']} | {r['neighbour']} | {fmt(r['p50'])} | {fmt(r['to_published_p50'])} | "
            f"{fmt(r.get('to_step_p50'))} | {fmt(r.get('to_wake_p50'))} | "
            f"{fmt(middle(r))} | {fmt(r['to_woken_p50'])} | {fmt(r['woken_to_poll_p50'])} | "
            f"{placement(r)} | {fmt(r.get('other_cpu_p50'))} | "
            + " | ".join(fmt(r[k]) for k in WAIT_COUNTERS) + " |" for r in hm]
    return out + [""]


def fmt_x(v) -> str:
    if not isinstance(v, (int, float)):
        return ""
    return f"{v:.0f}×" if v >= 100 else f"{v:.1f}×" if v >= 1 else f"{v:.2f}×"


def send_tables(s: dict) -> list[str]:
    h, r, c, c2 = s["hostmq"], s.get("redis", {}), s.get("floor", {}), s.get("floor_split", {})
    pl_async = s.get("counts", {}).get("async", 0)

    def line(what, key, digits=0):
        hv, rv, cv, c2v = h.get(key), r.get(key), c.get(key), c2.get(key)
        return (f"| {what} | {fmt(hv, digits)} | {fmt(rv, digits)} | {ratio(hv, rv)} | {fmt(cv, digits)} | "
                f"{ratio(hv, cv)} | {fmt(c2v, digits)} |")
    out = ["### Send (one producer process, unpaced, acknowledged)", "",
           "C floor: the same acknowledged sends in C (hostmq/bench/relay_floor.c echo: the producer writes "
           "the frame, the writer copies, CRCs and appends each message and answers; the same idle strategy "
           "as the floor rows), placed by the kernel; on two CPUs: the same with the producer pinned to one "
           "CPU and the writer to another (echo_split), so each hand-off wakes the other CPU.", "",
           "| measure | hostmq | redis | hostmq / redis | C floor | hostmq / floor | C floor on two CPUs |",
           "|---|---|---|---|---|---|---|",
           line("sync send p50, µs", "sync_p50_us", 1),
           line("sync sends/s", "sync_per_s"),
           line(f"batch of {W.SEND_BATCH} (send_batch / pipelined XADD), msgs/s", "batch_msgs_per_s"),
           line(f"send_async, one call per message (a burst of {pl_async:,}, then every result), msgs/s",
                "async_msgs_per_s"),
           line("send_async with auto_batch=True (RocketMQ 5 auto-batching), msgs/s", "auto_batch_msgs_per_s"), "",
           "### Control round trip (p50, µs)", "", "| measure | µs | × raw REQ/REP |", "|---|---|---|"]
    rr = s["reqrep"]["p50_us"]
    out += [f"| hostmq PING → broker (RemotingClient DEALER ↔ ROUTER) | {fmt(h['ping_broker_p50_us'], 1)} | "
            f"{ratio(h['ping_broker_p50_us'], rr)} |",
            f"| hostmq PING → NameServer | {fmt(h['ping_namesrv_p50_us'], 1)} | {ratio(h['ping_namesrv_p50_us'], rr)} |",
            f"| raw pyzmq REQ/REP over ipc (echo process) | {fmt(rr, 1)} | 1.0× |"]
    if "dealer_router" in s:
        dr = s["dealer_router"]["p50_us"]
        out.append(f"| raw pyzmq DEALER ↔ ROUTER over ipc, hostmq's socket shape (poll loop + eventfd, "
                   f"no hostmq code) | {fmt(dr, 1)} | {ratio(dr, rr)} |")
    if r:
        out.append(f"| redis PING (TCP loopback) | {fmt(r['ping_p50_us'], 1)} | {ratio(r['ping_p50_us'], rr)} |")
    d = s["drain"]
    out += ["", f"### Consume a pre-filled queue ({fmt(h['sent'])} messages of 100 bytes, one queue)", "",
            "| measure | msgs/s |", "|---|---|",
            f"| PullConsumer.poll_batch, bodies taken columnar (`bodies_joined()`) | "
            f"{fmt(d.get('poll_batch_joined_msgs_per_s'))} |",
            f"| PullConsumer.poll_batch, a memoryview per body | {fmt(d['poll_batch_msgs_per_s'])} |",
            f"| PullConsumer.poll (one MessageExt per message) | {fmt(d['poll_msgs_per_s'])} |", ""]
    return out


def machine(env: dict) -> list[str]:
    try:
        commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
        # The run's own outputs (bench/results/latency/ by default) are tracked: they do not count.
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)bench/results"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        commit, dirty = "unknown", ""
    return [f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
            f"- CPUs: {os.cpu_count()} ({platform.machine()}), load average at start {os.getloadavg()[0]:.2f}",
            f"- kernel: {platform.release()}", f"- Python: {platform.python_version()}",
            f"- git commit: {commit}{' (with uncommitted changes)' if dirty else ''}",
            f"- hostmq cluster root (removed at the end): {env['root']}; config overrides {env['config']}",
            f"- redis: {env['redis_desc']}", f"- zenoh: {env['zenoh_desc']}", f"- C floor: {env['floor_desc']}",
            f"- idle strategies: {env['idle_desc']}"]


def plot(results: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = list(dict.fromkeys((r["row"]["pacing"], r["row"]["neighbour"]) for r in results))
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 3.6 * len(panels)), squeeze=False)
    for ax, (pacing, nb) in zip(axes[:, 0], panels):
        for r in results:
            lat = np.sort(r["lat_us"])
            if r["row"]["pacing"] == pacing and r["row"]["neighbour"] == nb and len(lat):
                ax.plot(np.maximum(lat, 0.1), np.arange(1, len(lat) + 1) / len(lat), label=r["row"]["system"],
                        lw=2 if r["row"]["system"] in HOSTMQ else 1.2)
        ax.set_xscale("log")
        ax.set_xlabel("producer → consumer latency, µs (log)")
        ax.set_ylabel("fraction of messages")
        ax.set_title(f"one 100-byte message {pacing}, {nb}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_outputs(out_dir: str, results: list[dict], sends: dict, env: dict, pl: dict, elapsed_s: float) -> str:
    os.makedirs(out_dir, exist_ok=True)
    rows = [r["row"] for r in results]
    add_ratios(rows)
    cols = list(dict.fromkeys(k for r in rows for k in r))
    with open(os.path.join(out_dir, "latency.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, cols)
        w.writeheader()
        w.writerows(rows)
    tables = latency_tables(rows) + send_tables(sends)
    missing = [s for s in SYSTEMS if s not in {r["system"] for r in rows}]
    notes = [f"- not measured: {s} — {env['notes'][s]}" for s in missing if s in env["notes"]]
    text = ["# Delivery latency, producer process → consumer process (bench/latency.py)", "",
            f"100-byte messages; warm-up of {pl['warmup']} messages dropped per row; latencies in µs from the "
            "send timestamp in the body (CLOCK_MONOTONIC) to the consumer's receive; ×shm / ×zenoh / ×redis / ×floor: "
            "the hostmq figure over the shm ring's / Zenoh's / Redis's / the C relay's (c_relay: producer → writer → "
            "consumer in C, the floor of hostmq's shape) at the same pacing and neighbour; load: the 1-minute load "
            "average when the row ended (the host is shared with other work). "
            f"Run took {elapsed_s:.0f} s.", "", *machine(env), *notes, "", *tables]
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("\n".join(text))
    plot(results, os.path.join(out_dir, "latency_hist.png"))
    return "\n".join(tables)


def _redis_version() -> str:
    try:
        out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, timeout=10).stdout
        return next((w[2:] for w in out.split() if w.startswith("v=")), "")
    except OSError:
        return ""


def _zenoh_version() -> str | None:
    """eclipse-zenoh's version, "" if it has none to tell; None when it is not installed."""
    if importlib.util.find_spec("zenoh") is None:
        return None
    from importlib import metadata
    try:
        return metadata.version("eclipse-zenoh")
    except metadata.PackageNotFoundError:
        return ""


def _idle_desc(config) -> str:
    from hostmq.waiting import IdleStrategy, available_cores
    auto = IdleStrategy.parse("auto")
    return (f"{available_cores()} cores available to the bench, so auto = {auto} for clients; broker writer "
            f"{config.broker.idle_strategy('writer')}, dispatcher {config.broker.idle_strategy('dispatcher')}; "
            f"rows {', '.join(f'{k} = {v}' for k, v in W.IDLE_ROWS.items())} (producer and consumer); "
            "spin is for machines with spare cores")


# -- main ----------------------------------------------------------------------------------------------------
def _terminate(signum, frame):
    raise SystemExit(128 + signum)          # so every finally below runs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2,000 messages per row, the 500 µs pacing only")
    ap.add_argument("--messages", type=int, default=0, help="messages measured per 500 µs row (5 ms rows: a fifth)")
    ap.add_argument("--warmup", type=int, default=200, help="messages sent first and not counted, per row")
    ap.add_argument("--out", default=OUT, help=f"output directory (default {OUT})")
    ap.add_argument("--dispatcher-nice", type=int, default=None,
                    help="broker.dispatcher_nice for the cluster (default: the broker's default, 10)")
    ap.add_argument("--broker-idle", default=None,
                    help="broker.writer_idle and dispatcher_idle for the cluster, e.g. spin:50 (default: auto)")
    ap.add_argument("--root-dir", default=None, help="where the temporary directory goes (default: $TMPDIR)")
    ap.add_argument("--floor-spin", type=int, default=0,
                    help="µs the C floor rows' readers spin before the futex (default 0: sleep at once)")
    args = ap.parse_args(argv)
    if args.messages < 0 or args.warmup < 0 or not 0 <= args.floor_spin <= 100_000:
        ap.error("--messages and --warmup must be ≥ 0, --floor-spin within 0..100000")
    check_clock()
    signal.signal(signal.SIGTERM, _terminate)
    pl = plan(args)
    pl["floor_spin_us"] = args.floor_spin
    t0 = time.monotonic()
    procs = Procs()
    results: list[dict] = []
    with contextlib.ExitStack() as stack:
        stack.callback(procs.kill_all)                        # if the set-up below fails
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="hql-", dir=args.root_dir))
        redis_server = RedisServer()
        stack.callback(redis_server.stop)
        # described now: the report is written after the server stopped
        redis_desc = (f"redis-server {_redis_version()} on 127.0.0.1:{redis_server.port}, no persistence"
                      if redis_server.proc is not None else "")
        env = {"procs": procs, "stack": stack, "tmp": tmp, "root": os.path.join(os.path.realpath(tmp), "root"), "redis": redis_server,
               "redis_note": ("redis-server not installed" if "not found" in redis_server.why_not
                              else redis_server.why_not)}
        env["redis_desc"] = redis_desc or env["redis_note"]
        config = {k: dict(v) for k, v in CLUSTER_CONFIG.items()}
        if args.dispatcher_nice is not None:
            config.setdefault("broker", {})["dispatcher_nice"] = args.dispatcher_nice
        if args.broker_idle is not None:
            config.setdefault("broker", {}).update(writer_idle=args.broker_idle, dispatcher_idle=args.broker_idle)
        env["config"] = config
        env["notes"] = {"redis": env["redis_note"]}
        zenoh_version = _zenoh_version()
        if zenoh_version is None:
            env["notes"]["zenoh"] = "eclipse-zenoh not installed (pip install 'hostmq[bench]')"
        env["zenoh_desc"] = (f"eclipse-zenoh {zenoh_version}, peer mode, unixsock-stream, express BLOCK publisher, "
                             "callback subscriber" if zenoh_version is not None else env["notes"]["zenoh"])
        env["idle_desc"] = _idle_desc(Config.load(config))
        env["floor_exe"], why = F.build(tmp)
        split_why = env["split_why"] = F.split_why()
        for s in F.ROWS:
            if env["floor_exe"] is None:
                env["notes"][s] = why
            elif s in F.SPLIT_ROWS and split_why:
                env["notes"][s] = split_why
        env["floor_desc"] = (f"hostmq/bench/relay_floor.c, cc -O2; readers "
                             f"{f'spin {args.floor_spin} µs, then ' if args.floor_spin else ''}sleep on the futex"
                             if env["floor_exe"] else why)
        stack.enter_context(hostmq.LocalCluster(env["root"], config=config))
        env["admin"] = stack.enter_context(hostmq.Admin(env["root"]))
        stack.callback(procs.kill_all)                        # children go before the cluster stops
        systems = [s for s in SYSTEMS if (s != "redis" or redis_server.proc is not None)
                   and (s != "zenoh" or zenoh_version is not None) and (s not in F.ROWS or env["floor_exe"])
                   and (s not in F.SPLIT_ROWS or not split_why)]
        for s in SYSTEMS:
            if s not in systems:
                print(f"{s} row skipped: {env['notes'][s]}", flush=True)
        row_id = 0
        for pacing in pl["pacings"]:
            for with_nb in (False, True):
                for system in systems:
                    row_id += 1
                    r = (floor_row(system, pacing, with_nb, env, pl) if system in F.ROWS else
                         latency_row(system, pacing, with_nb, row_id, env, pl))
                    results.append(r)
                    x = r["row"]
                    print(f"[{time.monotonic() - t0:5.0f} s] {system:20} {x['pacing']:13} {x['neighbour']:9} "
                          f"p50 {x['p50']:8.1f}  p99 {x['p99']:8.1f}  max {x['max']:9.1f} µs  "
                          f"({x['measured']} measured)", flush=True)
        sends = send_table(env, pl)
        print(f"[{time.monotonic() - t0:5.0f} s] send / control / consume table done", flush=True)
    print()
    print(write_outputs(args.out, results, sends, env, pl, time.monotonic() - t0))
    print(f"wrote {args.out}/latency.csv, report.md, latency_hist.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
