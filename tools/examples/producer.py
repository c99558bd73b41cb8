"""A producer service: sends COUNT JSON jobs to a topic, one acknowledged send at a time, and says how
many were stored. Run it against a root a cluster serves (`hostmq up ROOT` in another terminal):

    python tools/examples/producer.py /tmp/mq --topic jobs --count 200
"""
from __future__ import annotations

import argparse
import json
import sys

import hostmq
from hostmq import Message, SendStatus


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default=None, help="the cluster's root (default $HOSTMQ_ROOT, else ~/.hostmq)")
    ap.add_argument("--topic", default="jobs")
    ap.add_argument("--count", type=int, default=100)
    args = ap.parse_args(argv)
    stored = 0
    with hostmq.Producer(args.root, group="example-producer") as producer:
        for i in range(args.count):
            body = json.dumps({"job": i}).encode()
            # The key makes the job findable by `hostmq query ROOT --topic jobs --key job-7`.
            r = producer.send(Message(args.topic, body, tags="job", keys=[f"job-{i}"]))
            stored += r.status is SendStatus.SEND_OK
    print(f"sent {args.count} message(s) to {args.topic}, {stored} stored (SEND_OK)", flush=True)
    return 0 if stored == args.count else 1


if __name__ == "__main__":
    sys.exit(main())
