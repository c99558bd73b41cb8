"""``hostmq offsets reset [ROOT] --group G --topic T --timestamp TS``: backtrack a group (RocketMQ
``mqadmin resetOffsetByTime``); running consumers continue from the new offsets at once."""
from __future__ import annotations

import argparse

from ..admin.admin import Admin
from .common import parse_time_ms, print_table


def add_parser(sub) -> None:
    p = sub.add_parser("offsets", help="consumer group offsets")
    verbs = p.add_subparsers(dest="offsets_command", metavar="ACTION")
    verbs.required = True
    r = verbs.add_parser("reset", help="move a group's offsets of a topic to a point in time")
    r.add_argument("root", nargs="?", default=None)
    r.add_argument("--group", required=True)
    r.add_argument("--topic", required=True)
    r.add_argument("--timestamp", required=True,
                   help="milliseconds since the epoch, or an ISO time such as 2026-11-23T07:30:00 (local time)")
    r.set_defaults(func=reset)


def reset(args: argparse.Namespace) -> int:
    with Admin(args.root) as a:
        moved = a.reset_offset(args.group, args.topic, parse_time_ms(args.timestamp))
    print_table([{"queue": str(q), "offset": o} for q, o in sorted(moved.items())], ["queue", "offset"])
    return 0
