"""Some rows of the latency bench, repeated — for A/B comparisons of two checkouts.

    .venv/bin/python bench/latency_rows.py [--rows zenoh,redis,hostmq_poll,hostmq_push] [--messages 3000]
                                           [--repeat 1] [--neighbour]

Runs the named rows of ``hostmq bench --latency`` (hostmq/bench/latency.py ``latency_row`` and
``floor_row``: the same processes, pacing — one message every 500 µs — and stamps) against one
LocalCluster of the checkout it runs from, ``--repeat`` times, and prints each row's p50, p90 and p99
and, for hostmq rows, the breakdown (send → ring write, send → consumer woken, woken → returned). To
compare two checkouts, run it from each in turn, several times: figures on a shared 2-vCPU host move
10–30 % between runs, so alternate and compare medians (docs/performance.md, "Issue 29, seventh part").
Rows whose peer is missing (redis-server, eclipse-zenoh, a C compiler) are skipped with a note.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import hostmq  # noqa: E402
from hostmq.bench import latency as L  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="zenoh,redis,hostmq_poll,hostmq_push",
                    help=f"comma-separated, of: {', '.join(L.SYSTEMS)}")
    ap.add_argument("--messages", type=int, default=3000, help="messages measured per row")
    ap.add_argument("--warmup", type=int, default=200, help="messages sent first and not counted")
    ap.add_argument("--repeat", type=int, default=1, help="runs of every row, in turn")
    ap.add_argument("--neighbour", action="store_true", help="beside a CPU-bound busy loop")
    args = ap.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r]
    unknown = [r for r in rows if r not in L.SYSTEMS]
    if unknown or not rows or args.messages < 1 or args.repeat < 1 or args.warmup < 0:
        ap.error(f"unknown rows {unknown}" if unknown else "--rows, --messages and --repeat must name something")
    pl = {"warmup": args.warmup, "floor_spin_us": 0}
    procs = L.Procs()
    with contextlib.ExitStack() as stack:
        stack.callback(procs.kill_all)
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="hqrows-"))
        env = {"procs": procs, "stack": stack, "tmp": tmp, "root": os.path.join(os.path.realpath(tmp), "root")}
        if "redis" in rows:
            env["redis"] = L.RedisServer()
            stack.callback(env["redis"].stop)
            if env["redis"].proc is None:
                print(f"redis row skipped: {env['redis'].why_not}")
                rows.remove("redis")
        if "zenoh" in rows and L._zenoh_version() is None:
            print("zenoh row skipped: eclipse-zenoh not installed")
            rows.remove("zenoh")
        if any(r in L.F.ROWS for r in rows):
            env["floor_exe"], why = L.F.build(tmp)
            if env["floor_exe"] is None:
                print(f"C floor rows skipped: {why}")
                rows = [r for r in rows if r not in L.F.ROWS]
        stack.enter_context(hostmq.LocalCluster(env["root"], config=L.CLUSTER_CONFIG))
        env["admin"] = stack.enter_context(hostmq.Admin(env["root"]))
        stack.callback(procs.kill_all)                  # children go before the cluster stops
        pacing = ("every 500 µs", 500e-6, args.messages)
        row_id = 0
        for run in range(args.repeat):
            for system in rows:
                row_id += 1
                r = (L.floor_row(system, pacing, args.neighbour, env, pl) if system in L.F.ROWS else
                     L.latency_row(system, pacing, args.neighbour, row_id, env, pl))
                x = r["row"]
                parts = ""
                if system in L.HOSTMQ:
                    parts = (f"  send→ring write {x['to_published_p50']}  send→woken {x['to_woken_p50']}  "
                             f"woken→returned {x['woken_to_poll_p50']}")
                print(f"run {run} {system:20} p50 {x['p50']:7.1f}  p90 {x['p90']:7.1f}  p99 {x['p99']:8.1f} µs"
                      f"{parts}  load {x['loadavg_1m']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
