"""``hostmq query [ROOT] --id MSGID | --topic T --key K [--begin TS --end TS]``."""
from __future__ import annotations

import argparse

from ..admin.admin import Admin
from ..errors import ValidationError
from .common import body_text, iso_ms, parse_time_ms


def add_parser(sub) -> None:
    p = sub.add_parser("query", help="find messages by id or by key")
    p.add_argument("root", nargs="?", default=None)
    p.add_argument("--id", default=None, help="message id (32 hex digits)")
    p.add_argument("--topic", default=None)
    p.add_argument("--key", default=None, help="a message key or unique id")
    p.add_argument("--begin", default="0", help="store time from: ms since the epoch or ISO 8601")
    p.add_argument("--end", default=None, help="store time to: ms since the epoch or ISO 8601")
    p.set_defaults(func=main)


def _show(m) -> None:
    print(f"{m.msg_id} {m.queue} offset {m.queue_offset} stored {iso_ms(m.store_timestamp_ms)} tags {m.tags or '-'} "
          f"keys {','.join(m.keys) or '-'}: {body_text(m.body)}")


def main(args: argparse.Namespace) -> int:
    with Admin(args.root) as a:
        if args.id:
            _show(a.view_message(args.id))
            return 0
        if not (args.topic and args.key):
            raise ValidationError("query needs --id, or --topic and --key")
        end = None if args.end is None else parse_time_ms(args.end, "--end")
        found = a.query_by_key(args.topic, args.key, parse_time_ms(args.begin, "--begin"), end)
    for m in found:
        _show(m)
    if not found:
        print("no message found")
        return 1
    return 0
