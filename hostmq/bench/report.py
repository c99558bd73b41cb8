"""``report.md`` and PNG plots from a sweep's ``results.csv``, ``latency.npz`` and ``meta.json``.

Every hostmq figure is shown beside a ratio: to the peers' figure for the same workload, to the
switch turned off, or to the raw limit of the machine measured in the same run.
"""
from __future__ import annotations

import csv
import json
import math
import os
import statistics

import numpy as np

PLOTS = ("throughput_vs_size.png", "latency_cdf.png", "page_faults.png", "lagging_read.png")
BASE = {"flush": "ASYNC_FLUSH", "pool": "False", "warm": "False", "madvise": "NORMAL"}
SWITCHES = [  # (name, field, value on, value off)
    ("transient store pool", "pool", "True", "False"),
    ("warm-up + pre-allocation", "warm", "True", "False"),
    ("SYNC_FLUSH (vs ASYNC_FLUSH)", "flush", "SYNC_FLUSH", "ASYNC_FLUSH"),
    ("madvise SEQUENTIAL (vs NORMAL)", "madvise", "SEQUENTIAL", "NORMAL"),
    ("madvise RANDOM (vs NORMAL)", "madvise", "RANDOM", "NORMAL"),
]
METRICS = [("msgs/s", "msgs_per_s", "caught_up"), ("send p99", "send_p99_us", "caught_up"),
           ("e2e p50", "e2e_p50_us", "caught_up"), ("flush p99", "flush_p99_us", "caught_up"),
           ("writer minor faults", "writer_minflt", "caught_up"),
           ("lagging read MB/s", "consume_mb_per_s", "lagging"), ("lagging reader major faults", "consumer_majflt", "lagging")]


def load(out_dir: str) -> tuple[list[dict], dict, dict]:
    with open(os.path.join(out_dir, "results.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    meta_path = os.path.join(out_dir, "meta.json")
    meta = json.load(open(meta_path)) if os.path.exists(meta_path) else {}
    npz_path = os.path.join(out_dir, "latency.npz")
    cdfs = dict(np.load(npz_path)) if os.path.exists(npz_path) else {}
    return rows, meta, cdfs


def num(row: dict, key: str) -> float:
    try:
        return float(row.get(key) or "nan")
    except ValueError:
        return float("nan")


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b and not math.isnan(a) and not math.isnan(b) else "–"


def share_pct(a: float, b: float) -> str:
    """``a`` as a percentage of ``b`` with two significant digits (0.0036 %, not 0.00×)."""
    return f"{100 * a / b:.2g} %" if b and not math.isnan(a) and not math.isnan(b) else "–"


def fmt(v: float, digits: int = 0) -> str:
    if math.isnan(v):
        return "–"
    return f"{v:,.{digits}f}"


def _ok(rows):
    return [r for r in rows if r.get("sent") not in (None, "")]


def hostmq_rows(rows, **match) -> list[dict]:
    return [r for r in _ok(rows) if r["system"] == "hostmq" and all(r.get(k) == str(v) for k, v in match.items())]


def peer_row(rows, peer: str, size: str, producers: str) -> dict | None:
    return next((r for r in _ok(rows) if r["system"] == peer and r["size_bytes"] == size
                 and r["producers"] == producers), None)


def switch_effects(rows) -> list[list[str]]:
    """Median over matching pairs (all else equal) of on/off for each switch and metric."""
    key_fields = ("flush", "pool", "warm", "madvise", "size_bytes", "producers", "phase")
    index = {tuple(r[k] for k in key_fields): r for r in hostmq_rows(rows)}
    out = []
    for name, field, on, off in SWITCHES:
        cells = [name]
        for _, metric, phase in METRICS:
            ratios = []
            for key, r in index.items():
                d = dict(zip(key_fields, key))
                if d[field] != on or d["phase"] != phase:
                    continue
                other = index.get(tuple(off if k == field else d[k] for k in key_fields))
                if other is None:
                    continue
                a, b = num(r, metric), num(other, metric)
                if not (math.isnan(a) or math.isnan(b)) and b > 0:
                    ratios.append(a / b)
            cells.append(f"{statistics.median(ratios):.2f}× ({len(ratios)})" if ratios else "–")
        out.append(cells)
    return out


def table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def write_report(out_dir: str) -> str:
    rows, meta, cdfs = load(out_dir)
    plots = make_plots(out_dir, rows, cdfs)
    limits = meta.get("limits", {})
    mmap_mb = limits.get("mmap append MB/s (warm)", float("nan"))
    parts = ["# hostmq page-cache tuning bench", ""]
    m = meta.get("machine", {})
    parts += [f"Run {meta.get('started', '?')} ({'quick' if meta.get('quick') else 'full'} sweep, "
              f"{meta.get('duration_s', '?')} s per phase, {meta.get('wall_s', 0):.0f} s in all). Machine: "
              f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores, {m.get('ram_gib', '?')} GiB RAM, kernel "
              f"{m.get('kernel', '?')}, store on {m.get('filesystem', '?')}, Python {m.get('python', '?')}.", "",
              "Raw limits measured in the same run: " + ", ".join(f"{k} **{fmt(v, 0)}**" for k, v in limits.items())
              + ".", "",
              "Every producer sends one message at a time and waits for its acknowledgement (hostmq, Redis) "
              "or for the send call (pyzmq, multiprocessing.Queue, which neither acknowledge nor store). "
              "*caught up*: one consumer in another process reads as messages arrive; end-to-end latency is "
              "receive − send on CLOCK_MONOTONIC. *lagging*: the broker was stopped, its files dropped from "
              "the page cache and the broker started again; a new consumer group reads the whole backlog from "
              "the first offset while the producers send. Numbers from a shared 2-core machine: compare "
              "ratios measured in the same run, not absolute values across runs.", ""]
    # 1. hostmq (default switches) beside the peers
    body = []
    for r in sorted(hostmq_rows(rows, phase="caught_up", **BASE), key=lambda r: (int(r["size_bytes"]), int(r["producers"]))):
        cells = [r["size_bytes"], r["producers"], fmt(num(r, "msgs_per_s")), fmt(num(r, "send_p50_us"), 1),
                 fmt(num(r, "send_p99_us"), 1), fmt(num(r, "e2e_p50_us"), 1), fmt(num(r, "e2e_p99_us"), 1)]
        for peer in ("redis", "zmq_ipc", "mp_queue"):
            p = peer_row(rows, peer, r["size_bytes"], r["producers"])
            cells.append(f"{ratio(num(r, 'msgs_per_s'), num(p, 'msgs_per_s'))} / "
                         f"{ratio(num(r, 'e2e_p50_us'), num(p, 'e2e_p50_us'))}" if p else "–")
        body.append(cells)
    parts += ["## hostmq (default switches, ASYNC_FLUSH) beside the peers", "",
              "Ratio cells: hostmq msgs/s ÷ peer msgs/s / hostmq e2e p50 ÷ peer e2e p50 (below 1× is better "
              "for latency).", "",
              table(["size B", "producers", "msgs/s", "send p50 µs", "send p99 µs", "e2e p50 µs", "e2e p99 µs",
                     "vs Redis", "vs pyzmq ipc", "vs mp.Queue"], body), ""]
    peers = [[r["system"], r["size_bytes"], r["producers"], fmt(num(r, "msgs_per_s")), fmt(num(r, "send_p50_us"), 1),
              fmt(num(r, "e2e_p50_us"), 1), fmt(num(r, "e2e_p99_us"), 1), fmt(num(r, "server_cpu_pct")), r.get("note", "")]
             for r in _ok(rows) if r["system"] != "hostmq"]
    parts += ["### The peers", "", table(["peer", "size B", "producers", "msgs/s", "send p50 µs", "e2e p50 µs",
                                          "e2e p99 µs", "server CPU %", "what"], peers), ""]
    # 2. what each switch does
    parts += ["## What each switch does", "",
              "Median over every pair of runs that differ only in that switch (pairs counted in brackets) "
              "of the ratio on ÷ off.", "",
              table(["switch"] + [m for m, _, _ in METRICS], switch_effects(rows)), ""]
    # 3. every config, one producer
    body = []
    for r in sorted(hostmq_rows(rows, producers=1, phase="caught_up"), key=lambda r: (int(r["size_bytes"]), r["config"])):
        lag = next(iter(hostmq_rows(rows, producers=1, phase="lagging", config=r["config"], size_bytes=r["size_bytes"])), {})
        body.append([r["config"], r["size_bytes"], fmt(num(r, "msgs_per_s")), fmt(num(r, "mb_per_s"), 2),
                     share_pct(num(r, "mb_per_s"), mmap_mb), fmt(num(r, "send_p99_us"), 1), fmt(num(r, "e2e_p50_us"), 1),
                     fmt(num(r, "flush_p99_us")), fmt(num(r, "writer_minflt")), fmt(num(r, "commitlog_resident_pct"), 1),
                     fmt(num(lag, "consume_mb_per_s"), 1), fmt(num(lag, "consumer_majflt"))])
    parts += ["## Every configuration, one producer", "",
              "% of mmap is the producers' payload rate as a share of the raw mmap append bandwidth "
              "(warm pages) measured above.", "",
              table(["config", "size B", "msgs/s", "MB/s", "% of mmap", "send p99 µs", "e2e p50 µs",
                     "flush p99 µs ≤", "writer minor faults", "commitlog cached %", "lagging read MB/s",
                     "lagging major faults"], body), ""]
    failed = [r for r in rows if r not in _ok(rows)]
    if failed:
        parts += ["## Runs that failed", "", table(["system", "config", "size B", "producers", "note"],
                  [[r["system"], r["config"], r["size_bytes"], r["producers"], r.get("note", "")] for r in failed]), ""]
    parts += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + ["",
              "All rows: [results.csv](results.csv); latency quantiles per run: latency.npz."]
    text = "\n".join(parts) + "\n"
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(text)
    return text


# -- plots -------------------------------------------------------------------------------------------------
def make_plots(out_dir: str, rows: list[dict], cdfs: dict) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    made = []
    base_cfgs = sorted({r["config"] for r in hostmq_rows(rows, madvise="NORMAL")})
    sizes = sorted({int(r["size_bytes"]) for r in _ok(rows)})
    # throughput vs size per config (one producer, caught up), peers dashed
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, metric, label in ((axes[0], "msgs_per_s", "messages/s"), (axes[1], "mb_per_s", "MB/s")):
        for cfg in base_cfgs:
            pts = sorted((int(r["size_bytes"]), num(r, metric)) for r in hostmq_rows(rows, config=cfg, producers=1,
                                                                                     phase="caught_up"))
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"hostmq {cfg}")
        for peer in ("redis", "zmq_ipc", "mp_queue"):
            pts = sorted((int(r["size_bytes"]), num(r, metric)) for r in _ok(rows)
                         if r["system"] == peer and r["producers"] == "1")
            if pts:
                ax.plot(*zip(*pts), linestyle="--", marker="x", label=peer)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("Throughput vs message size (1 producer, consumer caught up)")
    made.append(_save(fig, out_dir, PLOTS[0]))
    # latency CDFs at the middle size
    mid = sizes[len(sizes) // 2] if sizes else 0
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    q = np.linspace(0, 1, 401)
    for ax, kind in ((axes[0], "send"), (axes[1], "e2e")):
        for cfg in base_cfgs + ["redis", "zmq_ipc", "mp_queue"]:
            v = cdfs.get(f"{cfg}|{mid}|1|caught_up|{kind}")
            if v is not None:
                ax.plot(v, q, label=cfg, linestyle="--" if cfg in ("redis", "zmq_ipc", "mp_queue") else "-")
        ax.set_xscale("log")
        ax.set_xlabel(f"{'send' if kind == 'send' else 'end-to-end'} latency (µs)")
        ax.set_ylabel("fraction of messages")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Latency CDFs, {mid}-byte messages, 1 producer")
    made.append(_save(fig, out_dir, PLOTS[1]))
    # page faults per config
    cfgs = sorted({r["config"] for r in hostmq_rows(rows)})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(len(sizes), 1)
    for i, size in enumerate(sizes):
        vals = []
        for cfg in cfgs:
            rs = hostmq_rows(rows, config=cfg, size_bytes=size, producers=1, phase="caught_up")
            vals.append(1000 * num(rs[0], "writer_minflt") / max(num(rs[0], "sent"), 1) if rs else 0)
        axes[0].bar(np.arange(len(cfgs)) + i * width, vals, width, label=f"{size} B")
        vals = []
        for cfg in cfgs:
            rs = hostmq_rows(rows, config=cfg, size_bytes=size, producers=1, phase="lagging")
            vals.append(num(rs[0], "consumer_majflt") if rs else 0)
        axes[1].bar(np.arange(len(cfgs)) + i * width, vals, width, label=f"{size} B")
    for ax, title in ((axes[0], "writer minor faults per 1000 messages (caught up)"),
                      (axes[1], "lagging reader's major faults (cold backlog)")):
        ax.set_xticks(np.arange(len(cfgs)) + 0.4 - width / 2)
        ax.set_xticklabels(cfgs, rotation=60, ha="right", fontsize=7)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    made.append(_save(fig, out_dir, PLOTS[2]))
    # lagging read rate per madvise policy
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for advice in ("NORMAL", "SEQUENTIAL", "RANDOM"):
        pts = []
        for size in sizes:
            rs = hostmq_rows(rows, madvise=advice, size_bytes=size, producers=1, phase="lagging", flush="ASYNC_FLUSH",
                             pool="False", warm="False")
            if rs:
                pts.append((size, num(rs[0], "consume_mb_per_s")))
        if pts:
            ax.plot(*zip(*pts), marker="o", label=f"madvise {advice}")
    ax.set_xscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("cold backlog read MB/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Lagging consumer reading a backlog not in the page cache")
    made.append(_save(fig, out_dir, PLOTS[3]))
    return made


def _save(fig, out_dir: str, name: str) -> str:
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, name), dpi=110)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return name
