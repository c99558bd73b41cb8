"""``hostmq faults [ROOT] [--trials N] [--kinds K,..] [--configs C,..] [--out DIR] [--fuzz-cases N] [--seed S]``:
the fault-injection run (``hostmq.faults``).

Runs N kill/stop trials against real clusters on a fresh directory (ROOT, which must be new or
empty; default a temp dir, removed afterwards unless something failed), then the registered fuzzers.
Prints a line per trial and the table per fault kind; writes ``trials.csv``, ``fuzz.csv`` and
``report.md`` into ``--out``. Exit status: 0 every promise held, 3 a trial, the end-of-run check or a
fuzzer found a broken promise (lost, duplicated, unreachable … messages, a server crash, names left
in /dev/shm, a file outside the root), 1 the harness could not run, 2 usage.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

from .common import EXIT_ERROR, EXIT_OK

EXIT_PROMISE_BROKEN = 3


def add_parser(sub) -> None:
    p = sub.add_parser("faults", help="fault-injection run: kill trials against a real cluster, fuzzers",
                       description="Kill or stop one process at a time (broker children, the whole broker, the "
                                   "NameServer, a producer, the consumer) — at random moments or aimed inside "
                                   "narrow windows — under a mixed load, restart it, and verify that every "
                                   "acknowledged message is stored exactly once and reachable; then run the "
                                   "fuzzers. Writes trials.csv, fuzz.csv and report.md.",
                       epilog="exit status: 0 every promise held; 3 something was lost, duplicated, unreachable, "
                              "a server crashed, names were left in /dev/shm or a file was made outside the root "
                              "(see report.md); 1 the harness could not run; 2 usage")
    p.add_argument("root", nargs="?", default=None,
                   help="a new or empty directory for the run's clusters and logs (default: a temp dir)")
    p.add_argument("--trials", type=int, default=16, help="kill/stop trials in all (default 16)")
    p.add_argument("--kinds", default=None,
                   help="fault kinds, comma-separated: targets (writer, dispatcher, flusher, scheduler, broker, "
                        "namesrv, producer, consumer, and with --configs ha: slave, replica, ha, master, attack: every "
                        "kind of that target) or kinds such as writer:kill, writer:stop, broker@mid-append, "
                        "master:promote (kill the master, promote its slave, the old master rejoins), "
                        "attack:forged-master, attack:squat, attack:promote-recovering, attack:relay (ha), "
                        "attack:member-admin (a hostile member of the root's group; needs root) (default: all)")
    p.add_argument("--configs", default="async,pool,sync",
                   help="cluster configurations, comma-separated: async (the default store), pool (transient store "
                        "pool), sync (SYNC_FLUSH), ha (a SYNC_MASTER and its slave: replication faults, the slave "
                        "checked byte for byte); one cluster each, trials shared among them (default async,pool,sync)")
    p.add_argument("--out", default="hostmq-faults", help="directory for the results (default ./hostmq-faults)")
    p.add_argument("--fuzz-cases", type=int, default=0, help="cases per registered fuzzer (default 0: no fuzzing)")
    p.add_argument("--seed", type=int, default=0, help="seed of the plan, the moments and the fuzzers (default 0)")
    p.add_argument("--quiet", action="store_true", help="no line per trial")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from ..errors import FaultHarnessError
    from ..faults.runner import run
    from ..faults.plan import RunOptions, parse_configs, parse_kinds
    from ..faults.report import fuzz_table, kinds_table, write_report
    if args.trials < 0 or args.fuzz_cases < 0:
        print("hostmq: error: --trials and --fuzz-cases must be ≥ 0", file=sys.stderr)
        return EXIT_ERROR
    try:
        opts = RunOptions(trials=args.trials, kinds=tuple(parse_kinds(args.kinds)),
                          configs=tuple(parse_configs(args.configs)), seed=args.seed, work_dir=args.root,
                          fuzz_cases=args.fuzz_cases)
    except FaultHarnessError as e:
        print(f"hostmq: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    say = (lambda line: None) if args.quiet else (lambda line: print(line, flush=True))
    summary = run(opts, progress=say)
    paths = write_report(os.path.abspath(args.out), summary)
    print(kinds_table(summary.rows), end="")
    if summary.finals:
        print("end-of-run recheck:")
        print(kinds_table(summary.finals), end="")
    if summary.fuzz or summary.skipped_fuzzers:
        print(fuzz_table(summary.fuzz, summary.skipped_fuzzers), end="")
    for n in summary.notes:
        print(n)
    print(f"results: {', '.join(paths)}")
    return EXIT_PROMISE_BROKEN if summary.failed else EXIT_OK
