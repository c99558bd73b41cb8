"""``hostmq bench [--quick] [--out DIR]``: the page-cache tuning sweep (``hostmq.bench``);
``hostmq bench --latency [--quick] [--messages N] [--warmup N] [--out DIR]``: the delivery-latency
bench (``hostmq/bench/latency.py``, also ``bench/latency.py``).

Writes ``results.csv`` (a row per run and phase), ``latency.npz`` (latency quantiles per run),
``meta.json`` (machine, raw limits, sweep), ``report.md`` and the PNG plots into DIR.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import tempfile
import time

from .common import EXIT_ERROR, EXIT_OK


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="page-cache tuning sweep: CSV, report.md and plots",
                       description="Sweep the store's tuning switches (transient store pool, warm-up and "
                                   "pre-allocation, madvise, flush mode) over message sizes, producer counts "
                                   "and consumer positions; run the same workloads against Redis Streams, "
                                   "pyzmq ipc and multiprocessing.Queue; write results.csv, report.md and plots.")
    p.add_argument("--quick", action="store_true", help="about a minute: a few configurations and sizes")
    p.add_argument("--out", default="hostmq-bench", help="directory for the results (default: ./hostmq-bench)")
    p.add_argument("--duration", type=float, default=None,
                   help="seconds each phase of a run sends (default 3, quick 0.5)")
    p.add_argument("--root-dir", default=None,
                   help="where the runs' roots (and so their stores) are made (default: the temp dir)")
    p.add_argument("--no-peers", action="store_true", help="skip Redis, pyzmq and multiprocessing.Queue")
    p.add_argument("--report-only", action="store_true", help="rebuild report.md and plots from DIR's CSV")
    p.add_argument("--latency", action="store_true",
                   help="the delivery-latency bench instead: hostmq against a raw shm ring, pyzmq, Redis Streams "
                        "and multiprocessing.Queue, quiet and beside a busy neighbour (docs/performance.md)")
    p.add_argument("--messages", type=int, default=None, help="with --latency: messages measured per row")
    p.add_argument("--warmup", type=int, default=None, help="with --latency: messages not counted, per row")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("hostmq: error: hostmq bench draws its plots with matplotlib: pip install 'hostmq[bench]'",
              file=sys.stderr)
        return EXIT_ERROR
    if args.latency:
        from ..bench import latency
        argv = (["--quick"] if args.quick else []) + ["--out", os.path.abspath(args.out)]
        argv += ["--messages", str(args.messages)] if args.messages is not None else []
        argv += ["--warmup", str(args.warmup)] if args.warmup is not None else []
        argv += ["--root-dir", args.root_dir] if args.root_dir else []
        return latency.main(argv)
    if args.messages is not None or args.warmup is not None:
        print("hostmq: error: --messages and --warmup go with --latency", file=sys.stderr)
        return EXIT_ERROR
    from ..bench import limits, report, runner, scenarios
    if args.duration is not None and not 0.1 <= args.duration <= 600:
        print("hostmq: error: --duration must be within 0.1..600 seconds", file=sys.stderr)
        return EXIT_ERROR
    out = os.path.abspath(args.out)
    if args.report_only:
        if not os.path.exists(os.path.join(out, "results.csv")):
            print(f"hostmq: error: no results.csv in {out}", file=sys.stderr)
            return EXIT_ERROR
        report.write_report(out)
        print(f"report: {os.path.join(out, 'report.md')}")
        return EXIT_OK
    sweep = scenarios.quick_sweep() if args.quick else scenarios.full_sweep()
    if args.duration is not None:
        sweep = dataclasses.replace(sweep, duration_s=args.duration)
    if args.no_peers:
        sweep = dataclasses.replace(sweep, peers=())
    from ..root import MAX_IPC_PATH_BYTES
    base = os.path.abspath(args.root_dir or tempfile.gettempdir())
    if len(base.encode()) + runner.RUN_PATH_EXTRA_BYTES > MAX_IPC_PATH_BYTES:
        print(f"hostmq: error: --root-dir {base} is too long: the runs' socket paths would pass the "
              f"{MAX_IPC_PATH_BYTES}-byte limit of Unix sockets", file=sys.stderr)
        return EXIT_ERROR
    if args.root_dir:
        os.makedirs(args.root_dir, exist_ok=True)
    os.makedirs(out, exist_ok=True)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    print(f"hostmq bench: {len(sweep.runs())} hostmq runs (2 phases each) + {len(sweep.peer_runs())} peer runs, "
          f"about {sweep.estimated_s() / 60:.0f} min; results in {out}", flush=True)
    t0 = time.time()
    probe = tempfile.mkdtemp(prefix="hostmq-limits-", dir=args.root_dir)
    try:
        meta = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "quick": args.quick,
                "duration_s": sweep.duration_s, "commitlog_file_bytes": sweep.commitlog_file_bytes,
                "machine": limits.machine(probe), "limits": limits.measure(probe, args.quick)}
    finally:
        os.rmdir(probe)
    print("raw limits: " + ", ".join(f"{k} {v:,.0f}" for k, v in meta["limits"].items()), flush=True)
    runner.run_sweep(sweep, out, args.root_dir, progress=lambda line: print(line, flush=True))
    meta["wall_s"] = time.time() - t0
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    report.write_report(out)
    print(f"report: {os.path.join(out, 'report.md')}")
    return EXIT_OK
