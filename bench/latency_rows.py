"""Some rows of the latency bench, repeated — for A/B comparisons of two checkouts.

    .venv/bin/python bench/latency_rows.py [--rows zenoh,redis,hostmq_poll,hostmq_push] [--messages 3000]
                                           [--repeat 1] [--neighbour] [--idle SPEC] [--floor-spin US]

Runs the named rows of ``hostmq bench --latency`` (hostmq/bench/latency.py ``latency_row`` and
``floor_row``: the same processes, pacing — one message every 500 µs — and stamps) against one
LocalCluster of the checkout it runs from, ``--repeat`` times, and prints each row's p50, p90 and p99
and, for hostmq rows, the breakdown (send → ring write, send → consumer woken, woken → returned). To
compare two checkouts, run it from each in turn, several times: figures on a shared 2-vCPU host move
10–30 % between runs, so alternate and compare medians (docs/performance.md, "Issue 29, seventh part").
Rows whose peer is missing (redis-server, eclipse-zenoh, a C compiler) are skipped with a note.
``--idle spin:1000`` runs every hostmq process of the rows under one idle strategy (the broker's
writer and dispatcher, ``broker.writer_idle`` / ``dispatcher_idle``, and the producer and consumer,
``$HOSTMQ_IDLE``; the ``hostmq_poll_*`` idle rows keep their own): a spin budget longer than the
500 µs pacing keeps them all spinning between messages — only where cores are spare (16-core
runs: docs/performance.md). ``--floor-spin`` is the C floor rows' spin, as in the bench.
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
from hostmq.errors import IdleStrategyError  # noqa: E402
from hostmq.waiting import IdleStrategy  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="zenoh,redis,hostmq_poll,hostmq_push",
                    help=f"comma-separated, of: {', '.join(L.SYSTEMS)}")
    ap.add_argument("--messages", type=int, default=3000, help="messages measured per row")
    ap.add_argument("--warmup", type=int, default=200, help="messages sent first and not counted")
    ap.add_argument("--repeat", type=int, default=1, help="runs of every row, in turn")
    ap.add_argument("--neighbour", action="store_true", help="beside a CPU-bound busy loop")
    ap.add_argument("--idle", default=None,
                    help="one idle strategy for every hostmq process of the rows, e.g. spin:1000 (default: auto)")
    ap.add_argument("--floor-spin", type=int, default=0,
                    help="µs the C floor rows' readers spin before the futex (default 0: sleep at once)")
    args = ap.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r]
    unknown = [r for r in rows if r not in L.SYSTEMS]
    if unknown or not rows or args.messages < 1 or args.repeat < 1 or args.warmup < 0:
        ap.error(f"unknown rows {unknown}" if unknown else "--rows, --messages and --repeat must name something")
    if not 0 <= args.floor_spin <= 100_000:
        ap.error("--floor-spin must be within 0..100000")
    config = {k: dict(v) for k, v in L.CLUSTER_CONFIG.items()}
    if args.idle is not None:
        try:                                                    # a bad string fails here, not in a worker
            idle = IdleStrategy.parse(args.idle, what="--idle")
        except IdleStrategyError as e:
            ap.error(str(e))
        config.setdefault("broker", {}).update(writer_idle=args.idle, dispatcher_idle=args.idle)
        os.environ["HOSTMQ_IDLE"] = args.idle                   # the producer and consumer workers inherit it
        print(f"idle strategy of every hostmq process: {idle} (from --idle {args.idle})", flush=True)
    pl = {"warmup": args.warmup, "floor_spin_us": args.floor_spin}
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
            elif (why := L.F.split_why()) and any(r in L.F.SPLIT_ROWS for r in rows):
                print(f"split rows skipped: {why}")
                rows = [r for r in rows if r not in L.F.SPLIT_ROWS]
        stack.enter_context(hostmq.LocalCluster(env["root"], config=config))
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
                    parts = (f"  send→ring write {x['to_published_p50']}  →step {x['to_step_p50']}  "
                             f"→queues woken {x['to_wake_p50']}  send→woken {x['to_woken_p50']}  "
                             f"woken→returned {x['woken_to_poll_p50']}  on the writer's CPU "
                             f"{x['same_cpu_share']:.0%} p50 {x['same_cpu_p50']} (else {x['other_cpu_p50']})")
                print(f"run {run} {system:20} p50 {x['p50']:7.1f}  p90 {x['p90']:7.1f}  p99 {x['p99']:8.1f} µs"
                      f"{parts}  load {x['loadavg_1m']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
