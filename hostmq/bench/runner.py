"""One bench run of hostmq or a peer, and the sweep that writes ``results.csv`` (see ``scenarios``).

Each run starts its own processes (spawned): producers that send one message at a time for the
run's duration, and one consumer in another process. hostmq runs get a fresh root and a
``LocalCluster`` with the run's store config; between the two phases the cluster stops, the store
files are flushed and dropped from the page cache (``POSIX_FADV_DONTNEED``, which works once no
process maps them), and the cluster starts again.
"""
from __future__ import annotations

import csv
import logging
import multiprocessing
import os
import shutil
import socket
import subprocess
import tempfile
import time

import numpy as np
import psutil

from .. import observe
from .. import records as R
from . import workers
from .scenarios import Sweep, TuningConfig

log = logging.getLogger(__name__)
SPAWN = multiprocessing.get_context("spawn")
TOPIC = "bench"
READY_TIMEOUT_S = 60.0
# base dir "hb-XXXXXXXX/" + run root "r-XXXXXXXX/" + "brokers/broker-a/broker.sock" under the root dir
RUN_PATH_EXTRA_BYTES = 12 + 11 + 28
CAUGHT_UP_DRAIN_S = 10.0
LAGGING_DRAIN_S = 60.0
CDF_POINTS = np.linspace(0, 100, 401)
COLUMNS = ["system", "config", "flush", "pool", "warm", "madvise", "size_bytes", "producers", "phase",
           "duration_s", "sent", "errors", "msgs_per_s", "mb_per_s", "send_p50_us", "send_p99_us", "send_p999_us",
           "e2e_p50_us", "e2e_p99_us", "e2e_p999_us", "consumed", "consume_msgs_per_s", "consume_mb_per_s",
           "flushes", "flush_p50_us", "flush_p99_us",
           "writer_minflt", "writer_majflt", "consumer_minflt", "consumer_majflt", "commitlog_resident_pct",
           "resident_before_pct", "server_cpu_pct", "clients_cpu_pct", "note"]


def pct(lat_us: np.ndarray, q: float) -> float:
    return round(float(np.percentile(lat_us, q)), 1) if len(lat_us) else float("nan")


def run_phase(producer, producer_args: tuple, n_producers: int, consumer, consumer_args: tuple,
              duration_s: float, expect_extra: int = 0) -> tuple[list[dict], dict]:
    """Start the consumer and the producers, let them all work until one deadline; their results."""
    procs, conns = [], []
    try:
        for target, args in [(consumer, consumer_args)] + [(producer, producer_args)] * n_producers:
            parent, child = SPAWN.Pipe()
            p = SPAWN.Process(target=target, args=(child, *args), daemon=True)
            p.start()
            child.close()
            procs.append(p)
            conns.append(parent)
        for c, p in zip(conns, procs):
            if not c.poll(READY_TIMEOUT_S):
                raise RuntimeError(f"bench worker {p.name} not ready after {READY_TIMEOUT_S} s")
            c.recv()
        deadline = time.monotonic() + duration_s
        for c in conns:
            c.send(deadline)
        made = [_recv(c, duration_s + 60) for c in conns[1:]]
        conns[0].send(("expect", sum(r["count"] for r in made) + expect_extra))
        got = _recv(conns[0], duration_s + LAGGING_DRAIN_S + 60)
        for p in procs:
            p.join(10)
        return made, got
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        for c in conns:
            c.close()


def _recv(conn, timeout_s: float) -> dict:
    if not conn.poll(timeout_s):
        raise RuntimeError(f"bench worker sent no result within {timeout_s:.0f} s")
    return conn.recv()


def summarize(made: list[dict], got: dict, duration_s: float, size_bytes: int) -> tuple[dict, np.ndarray, np.ndarray]:
    send_lat = np.concatenate([r["lat_us"] for r in made]) if made else np.empty(0, np.float32)
    sent = sum(r["count"] for r in made)
    e2e = got["lat_us"]
    span = max(got["last_s"] - got["first_s"], 1e-9)
    row = {"duration_s": duration_s, "sent": sent, "errors": sum(r.get("errors", 0) for r in made),
           "msgs_per_s": round(sent / duration_s, 1), "mb_per_s": round(sent * size_bytes / duration_s / 1e6, 3),
           "send_p50_us": pct(send_lat, 50), "send_p99_us": pct(send_lat, 99), "send_p999_us": pct(send_lat, 99.9),
           "e2e_p50_us": pct(e2e, 50), "e2e_p99_us": pct(e2e, 99), "e2e_p999_us": pct(e2e, 99.9),
           "consumed": got["count"], "consume_msgs_per_s": round(got["count"] / span, 1),
           "consume_mb_per_s": round(got["bytes"] / span / 1e6, 3),
           "consumer_minflt": got["minflt"], "consumer_majflt": got["majflt"],
           "clients_cpu_pct": round(100 * (sum(r["cpu_s"] for r in made) + got["cpu_s"]) / duration_s, 1)}
    return row, send_lat, e2e


# -- hostmq ---------------------------------------------------------------------------------------------
def _tree_cpu_s(pid: int) -> float:
    try:
        p = psutil.Process(pid)
        total = 0.0
        for q in [p] + p.children(recursive=True):
            t = q.cpu_times()
            total += t.user + t.system
        return total
    except psutil.Error:
        return float("nan")


def _writer_faults(root: str) -> tuple[int, int]:
    from ..admin.admin import Admin
    with Admin(root) as a:
        pid = a.brokers()[0]["pids"].get("writer", 0)
    s = observe.process_stats(pid) if pid else None
    return (s["minor_faults"], s["major_faults"]) if s else (0, 0)


def _flush_histogram(root: str) -> np.ndarray:
    from ..live.state import BrokerState
    from ..root import shm_name
    st = BrokerState.attach(shm_name(root, "broker-a", "state"), readonly=True)
    try:
        return np.array(st.flush_histogram, dtype=np.int64)
    finally:
        st.close()


def drop_page_cache(directory: str) -> None:
    """Flush every file under ``directory`` and drop its pages from the page cache (pages some
    process has mapped in are skipped by the kernel: the broker's writer keeps its file's tail)."""
    for d, _, names in os.walk(directory):
        for n in names:
            fd = os.open(os.path.join(d, n), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def run_hostmq(cfg: TuningConfig, size_bytes: int, producers: int, sweep: Sweep, base_dir: str
               ) -> list[tuple[dict, np.ndarray, np.ndarray]]:
    """Both phases of one hostmq run: ``[(row, send latencies µs, e2e latencies µs), ...]``."""
    from ..admin.admin import Admin
    from ..cluster import LocalCluster
    root = tempfile.mkdtemp(prefix="r-", dir=base_dir)
    config = {"store": cfg.store_config(sweep.commitlog_file_bytes)}
    store = os.path.join(root, "brokers", "broker-a", "store")
    base = {"system": "hostmq", "config": cfg.label, "flush": cfg.flush, "pool": cfg.pool, "warm": cfg.warm,
            "madvise": cfg.madvise, "size_bytes": size_bytes, "producers": producers}
    out = []
    backlog = 0
    try:
        for phase in ("caught_up", "lagging"):
            with LocalCluster(root, config=config) as c:
                if phase == "caught_up":
                    with Admin(root) as a:
                        a.create_topic(TOPIC, queues=4)
                else:       # the broker's start-up recovery read the last file back in: drop it again
                    drop_page_cache(os.path.join(store, "commitlog"))
                resident_before = observe.dir_residency(os.path.join(store, "commitlog"))["total_pct"]
                broker_pid = c.processes["broker-a"].pid
                cpu0, (mn0, mj0), t0 = _tree_cpu_s(broker_pid), _writer_faults(root), time.monotonic()
                hist0 = _flush_histogram(root)
                made, got = run_phase(workers.hostmq_producer, (root, TOPIC, size_bytes), producers,
                                      workers.hostmq_consumer,
                                      (root, TOPIC, f"bench-{phase}", True,
                                       CAUGHT_UP_DRAIN_S if phase == "caught_up" else LAGGING_DRAIN_S),
                                      sweep.duration_s, expect_extra=backlog)
                elapsed = time.monotonic() - t0
                cpu1, (mn1, mj1) = _tree_cpu_s(broker_pid), _writer_faults(root)
                flushes = _flush_histogram(root) - hist0
                resident = observe.dir_residency(os.path.join(store, "commitlog"))["total_pct"]
            row, send_lat, e2e = summarize(made, got, sweep.duration_s, size_bytes)
            row.update(base, phase=phase, writer_minflt=mn1 - mn0, writer_majflt=mj1 - mj0,
                       flushes=int(flushes.sum()), flush_p50_us=R.histogram_percentile_us(flushes, 50),
                       flush_p99_us=R.histogram_percentile_us(flushes, 99),
                       commitlog_resident_pct=resident, resident_before_pct=resident_before,
                       server_cpu_pct=round(100 * (cpu1 - cpu0) / elapsed, 1))
            if phase == "lagging":
                row["note"] = f"backlog {backlog} msgs read cold"
                e2e = np.empty(0, np.float32)           # backlog age, not a latency
                row.update(e2e_p50_us=float("nan"), e2e_p99_us=float("nan"), e2e_p999_us=float("nan"))
            out.append((row, send_lat, e2e))
            backlog += row["sent"]
            if phase == "caught_up":
                drop_page_cache(store)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


# -- peers ------------------------------------------------------------------------------------------------
class RedisServer:
    """A throw-away redis-server on a free local port, no persistence."""

    def __init__(self) -> None:
        self.proc = None
        self.port = 0
        self.why_not = ""
        exe = shutil.which("redis-server")
        try:
            import redis  # noqa: F401
        except ImportError:
            self.why_not = "redis-py not installed (pip install hostmq[bench])"
            return
        if exe is None:
            self.why_not = "redis-server not found"
            return
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen([exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis
        r = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                r.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    self.stop()
                    self.why_not = "redis-server did not start"
                    return
                time.sleep(0.05)

    def reset(self) -> None:
        import redis
        redis.Redis(port=self.port).delete("bench")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


def run_peer(peer: str, size_bytes: int, producers: int, duration_s: float, tmp: str,
             redis_server: RedisServer | None) -> tuple[dict, np.ndarray, np.ndarray]:
    base = {"system": peer, "config": peer, "size_bytes": size_bytes, "producers": producers, "phase": "caught_up"}
    cpu0 = server_pid = None
    if peer == "redis":
        if redis_server is None or redis_server.proc is None:
            return {**base, "note": redis_server.why_not if redis_server else "redis disabled"}, \
                np.empty(0, np.float32), np.empty(0, np.float32)
        redis_server.reset()
        server_pid = redis_server.proc.pid
        p_target, p_args = workers.redis_producer, (redis_server.port, size_bytes)
        c_target, c_args = workers.redis_consumer, (redis_server.port, CAUGHT_UP_DRAIN_S)
    elif peer == "zmq_ipc":
        address = f"ipc://{tmp}/bench-{time.monotonic_ns()}.sock"
        p_target, p_args = workers.zmq_producer, (address, size_bytes)
        c_target, c_args = workers.zmq_consumer, (address, CAUGHT_UP_DRAIN_S)
    elif peer == "mp_queue":
        q = SPAWN.Queue(maxsize=10_000)
        p_target, p_args = workers.mpq_producer, (q, size_bytes)
        c_target, c_args = workers.mpq_consumer, (q, CAUGHT_UP_DRAIN_S)
    else:
        raise ValueError(f"unknown peer {peer!r}")
    if server_pid:
        cpu0 = _tree_cpu_s(server_pid)
    t0 = time.monotonic()
    made, got = run_phase(p_target, p_args, producers, c_target, c_args, duration_s)
    row, send_lat, e2e = summarize(made, got, duration_s, size_bytes)
    row.update(base)
    row["server_cpu_pct"] = round(100 * (_tree_cpu_s(server_pid) - cpu0) / (time.monotonic() - t0), 1) \
        if server_pid else 0.0
    row["note"] = {"redis": "XADD per message (acknowledged), XREAD BLOCK, no persistence",
                   "zmq_ipc": "PUSH → PULL, not acknowledged, not stored",
                   "mp_queue": "put → get (pickled through a pipe), not acknowledged, not stored"}[peer]
    return row, send_lat, e2e


# -- the sweep --------------------------------------------------------------------------------------------
def run_sweep(sweep: Sweep, out_dir: str, root_dir: str | None = None, progress=print) -> list[dict]:
    """Every run of ``sweep``: rows appended to ``out_dir/results.csv`` as they finish, latency
    distributions (quantiles) in ``out_dir/latency.npz``. A failed run is a row with its error."""
    os.makedirs(out_dir, exist_ok=True)
    base_dir = tempfile.mkdtemp(prefix="hb-", dir=root_dir)
    csv_path = os.path.join(out_dir, "results.csv")
    rows: list[dict] = []
    cdfs: dict[str, np.ndarray] = {}
    redis_server = RedisServer() if "redis" in sweep.peers else None
    todo = [("hostmq", r) for r in sweep.runs()] + [("peer", r) for r in sweep.peer_runs()]
    t_start = time.monotonic()
    try:
        with open(csv_path, "w", newline="") as f:
            w = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
            w.writeheader()
            for i, (kind, spec) in enumerate(todo, 1):
                label = f"{spec[0].label if kind == 'hostmq' else spec[0]} {spec[1]} B × {spec[2]} producers"
                try:
                    if kind == "hostmq":
                        results = run_hostmq(*spec, sweep, base_dir)
                    else:
                        results = [run_peer(*spec, sweep.duration_s, base_dir, redis_server)]
                except Exception as e:      # noqa: BLE001 — one failed run is a row, the sweep goes on
                    log.exception("bench run %s failed", label)
                    results = [({"system": "hostmq" if kind == "hostmq" else spec[0],
                                 "config": spec[0].label if kind == "hostmq" else spec[0],
                                 "size_bytes": spec[1], "producers": spec[2], "note": f"failed: {e}"},
                                np.empty(0), np.empty(0))]
                for row, send_lat, e2e in results:
                    rows.append(row)
                    w.writerow(row)
                    key = f"{row['config']}|{row['size_bytes']}|{row['producers']}|{row.get('phase', '')}"
                    if len(send_lat):
                        cdfs[key + "|send"] = np.percentile(send_lat, CDF_POINTS).astype(np.float32)
                    if len(e2e):
                        cdfs[key + "|e2e"] = np.percentile(e2e, CDF_POINTS).astype(np.float32)
                f.flush()
                progress(f"[{i}/{len(todo)}, {time.monotonic() - t_start:.0f} s] {label}: "
                         + "; ".join(f"{r.get('phase', '')} {r.get('msgs_per_s', '-')} msgs/s" for r, _, _ in results))
    finally:
        if redis_server is not None:
            redis_server.stop()
        shutil.rmtree(base_dir, ignore_errors=True)
    np.savez_compressed(os.path.join(out_dir, "latency.npz"), **cdfs)
    return rows
