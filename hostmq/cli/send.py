"""``hostmq send [ROOT] TOPIC [--tags T] [--keys K,..] [--property k=v ..] BODY|-``."""
from __future__ import annotations

import argparse
import sys

from .. import records as R
from ..client.producer import Producer
from ..errors import ValidationError
from ..message import Message


def add_parser(sub) -> None:
    p = sub.add_parser("send", help="send a message (or one per line of standard input with '-')")
    p.add_argument("root", nargs="?", default=None)
    p.add_argument("topic")
    p.add_argument("body", help="message body, or - to send each line of standard input")
    p.add_argument("--tags", default=None)
    p.add_argument("--keys", default=None, help="comma-separated keys")
    p.add_argument("--property", action="append", default=[], metavar="K=V", help="a user property (repeatable)")
    p.add_argument("--delay-level", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="print only a count at the end")
    p.set_defaults(func=main)


def _props(items: list[str]) -> dict[str, str]:
    """The ``--property`` pairs, checked before anything is sent (reserved names, blank names or
    values: ``records.check_user_properties``)."""
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise ValidationError(f"--property wants KEY=VALUE, got {item!r}")
        if k in out:
            raise ValidationError(f"--property {k!r} is given twice")
        out[k] = v
    return R.check_user_properties(out)


def main(args: argparse.Namespace) -> int:
    props = _props(args.property)
    keys = [k for k in args.keys.split(",") if k] if args.keys else ()
    bodies = (line.rstrip("\n").encode() for line in sys.stdin) if args.body == "-" else [args.body.encode()]
    n = 0
    with Producer(args.root) as p:
        for body in bodies:
            if not body:
                continue
            r = p.send(Message(args.topic, body, tags=args.tags, keys=keys, properties=props,
                               delay_level=args.delay_level))
            n += 1
            if not args.quiet:
                print(f"{r.status.value} {r.msg_id} {r.queue} offset {r.queue_offset}")
    if args.quiet:
        print(f"sent {n} message(s)")
    return 0
