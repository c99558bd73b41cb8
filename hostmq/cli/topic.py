"""``hostmq topic create|delete|list|route``."""
from __future__ import annotations

import argparse

from ..admin.admin import Admin
from .common import print_json, print_table


def add_parser(sub) -> None:
    p = sub.add_parser("topic", help="create, delete, list topics or show a topic's route")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    c = verbs.add_parser("create", help="create (or update) a topic on every broker, or on --brokers")
    c.add_argument("root", nargs="?", default=None)
    c.add_argument("topic")
    c.add_argument("--queues", type=int, default=4, help="queues per broker (default 4)")
    c.add_argument("--order", action="store_true", help="ordered topic (recorded in the NameServers' KV)")
    c.add_argument("--brokers", default=None, help="comma-separated broker names (default: all)")
    c.set_defaults(func=create)
    d = verbs.add_parser("delete", help="delete a topic from every broker and NameServer")
    d.add_argument("root", nargs="?", default=None)
    d.add_argument("topic")
    d.set_defaults(func=delete)
    li = verbs.add_parser("list", help="list the topics the NameServers know")
    li.add_argument("root", nargs="?", default=None)
    li.add_argument("--json", action="store_true")
    li.set_defaults(func=list_)
    r = verbs.add_parser("route", help="the queues of a topic")
    r.add_argument("root", nargs="?", default=None)
    r.add_argument("topic")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=route)


def create(args: argparse.Namespace) -> int:
    brokers = args.brokers.split(",") if args.brokers else None
    with Admin(args.root) as a:
        qs = a.create_topic(args.topic, queues=args.queues, order=args.order, brokers=brokers)
    per_broker: dict[str, int] = {}
    for q in qs:
        per_broker[q.broker] = per_broker.get(q.broker, 0) + 1
    each = ", ".join(f"{b} {n}" for b, n in sorted(per_broker.items()))
    print(f"topic {args.topic}: queues per broker: {each} ({len(qs)} in all)")
    return 0


def delete(args: argparse.Namespace) -> int:
    with Admin(args.root) as a:
        gone = a.delete_topic(args.topic)
    print(f"topic {args.topic}: {'deleted' if gone else 'did not exist'}")
    return 0


def list_(args: argparse.Namespace) -> int:
    with Admin(args.root) as a:
        topics = a.topics()
    if args.json:
        print_json(topics)
    else:
        for t in topics:
            print(t)
    return 0


def route(args: argparse.Namespace) -> int:
    with Admin(args.root) as a:
        qs = a.route(args.topic)
    rows = [{"topic": q.topic, "broker": q.broker, "queue_id": q.queue_id} for q in qs]
    if args.json:
        print_json(rows)
    else:
        print_table(rows, ["topic", "broker", "queue_id"])
    return 0
