"""``hostmq consume [ROOT] TOPIC --group G [--expr EXPR] [--from first|last|TIMESTAMP] [--count N]``:
read every queue of a topic and print the messages."""
from __future__ import annotations

import argparse
import signal
import threading
import time

from ..admin.admin import Admin
from ..client.pull_consumer import PullConsumer
from ..message import ConsumeFrom
from ..process import on_signal
from .common import body_text, parse_time_ms


def add_parser(sub) -> None:
    p = sub.add_parser("consume", help="print a topic's messages (assigns every queue)")
    p.add_argument("root", nargs="?", default=None)
    p.add_argument("topic")
    p.add_argument("--group", required=True, help="consumer group (offsets are committed for it)")
    p.add_argument("--expr", default="*", help="tag expression, e.g. 'a || b' (default *)")
    p.add_argument("--from", dest="start", default="last",
                   help="first | last | a time, ms or ISO 8601 (for a group with no committed offset)")
    p.add_argument("--count", type=int, default=0, help="stop after N messages (default: run until Ctrl-C)")
    p.add_argument("--idle-exit", type=float, default=0.0, help="stop after S seconds without messages")
    p.set_defaults(func=main)


def _start(value: str) -> tuple[ConsumeFrom, int | None]:
    if value == "first":
        return ConsumeFrom.FIRST_OFFSET, None
    if value == "last":
        return ConsumeFrom.LAST_OFFSET, None
    return ConsumeFrom.TIMESTAMP, parse_time_ms(value, "--from")


def main(args: argparse.Namespace) -> int:
    start, ts = _start(args.start)
    with Admin(args.root) as a:
        queues = a.route(args.topic)
    stop = threading.Event()
    on_signal(signal.SIGTERM, lambda _s: stop.set())     # from a relay thread: never a lock in a handler
    n = 0
    idle_since = time.monotonic()
    with PullConsumer(args.root, group=args.group, consume_from=start, consume_timestamp_ms=ts) as c:
        c.assign(queues, expression=args.expr)
        try:
            while not stop.is_set():
                msgs = c.poll(0.5)
                if not msgs:
                    if args.idle_exit and time.monotonic() - idle_since >= args.idle_exit:
                        break
                    continue
                idle_since = time.monotonic()
                for i, m in enumerate(msgs):
                    print(f"{m.queue} offset {m.queue_offset} id {m.msg_id} tags {m.tags or '-'} "
                          f"keys {','.join(m.keys) or '-'}: {body_text(m.body)}", flush=False)
                    n += 1
                    if args.count and n >= args.count:
                        _rewind(c, msgs[i + 1:])      # the group resumes after the last one printed
                        stop.set()
                        break
                print(end="", flush=True)
        except KeyboardInterrupt:
            pass
    return 0


def _rewind(consumer: PullConsumer, unprinted) -> None:
    first: dict = {}
    for m in unprinted:
        q = m.queue
        if q not in first or m.queue_offset < first[q]:
            first[q] = m.queue_offset
    for q, off in first.items():
        consumer.seek(q, off)
