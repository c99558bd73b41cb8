"""``hostmq`` command line: one subcommand per verb, a one-line error and a named exit code on misuse."""
from __future__ import annotations

import argparse
import os
import sys

from ..errors import HostMQError

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    from . import (bench, broker, consume, demo, dlq, exporter, faults, ha, namesrv, offsets, query, send,
                   status, systemd, topic, up)
    p = argparse.ArgumentParser(prog="hostmq", description="RocketMQ's design on one host.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    demo.add_parser(sub)
    for verb in (up, namesrv, broker, send, consume, topic, status, query, offsets, dlq, ha, bench, faults, systemd,
                 exporter):
        verb.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    if os.environ.get("HOSTMQ_DIE_WITH_PARENT"):     # started by LocalCluster: die with it
        from ..process import set_parent_death_signal
        set_parent_death_signal()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except HostMQError as e:
        print(f"hostmq: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
