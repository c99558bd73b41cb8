"""``hostmq demo [ROOT]``: write and read back messages through the embedded store, print rates.

The store lives at ``ROOT/brokers/demo/store``; the demo leaves it in place (a second run appends
and recovers it), so ``hostmq demo`` is also a quick check that a root's disk performs.
"""
from __future__ import annotations

import argparse
import time

from ..message import Message
from ..records import encode_batch
from ..root import broker_store_dir, resolve_root
from ..store import MessageStore
from ..store.encode import encode_message

TOPIC = "DemoTopic"
QUEUES = 4


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="store demo: write and read back N messages, print rates")
    p.add_argument("root", nargs="?", default=None, help="root directory (default $HOSTMQ_ROOT or ~/.hostmq)")
    p.add_argument("--messages", type=int, default=1_000_000, help="messages to write (default 1 000 000)")
    p.add_argument("--body-bytes", type=int, default=100, help="body size (default 100)")
    p.set_defaults(func=run)


def _rate(n: int, seconds: float) -> str:
    return f"{n / seconds:>12,.0f} msgs/s  ({seconds:.2f} s)"


def run(args: argparse.Namespace) -> int:
    root = resolve_root(args.root)
    path = broker_store_dir(root, "demo")
    n, body = max(1, args.messages), b"x" * max(1, args.body_bytes)
    print(f"hostmq demo: {n:,} messages of {len(body)} B into {path}")
    with MessageStore(path, {"commitlog_file_bytes": 256 << 20}) as store:
        print(f"  opened (recovery: {store.recovery.abnormal and 'abnormal' or 'normal'}, "
              f"{store.recovery.redispatched} re-dispatched)")
        start = [store.max_offset(TOPIC, q) for q in range(QUEUES)]
        single = min(n, 100_000)
        t = time.perf_counter()
        for i in range(single):
            store.put(Message(TOPIC, body, tags="demo"), i % QUEUES)
        print("  put, one at a time    " + _rate(single, time.perf_counter() - t))
        rest = n - single
        t = time.perf_counter()
        done = 0
        while done < rest:
            k = min(100, rest - done)
            q = (done // 100) % QUEUES
            recs = [encode_message(Message(TOPIC, body, tags="demo"), TOPIC.encode(), q,
                                   max_body_bytes=1 << 22, max_props_bytes=32767,
                                   born_host=store.commitlog.store_host) for _ in range(k)]
            blob, starts = encode_batch(recs)
            store.append_encoded(TOPIC, q, blob, starts)
            done += k
        if rest:
            print("  encode + batch append " + _rate(rest, time.perf_counter() - t))
        t = time.perf_counter()
        d = store.dispatch()
        print("  dispatch (CQ + index) " + _rate(d, time.perf_counter() - t))
        t = time.perf_counter()
        read = 0
        for q in range(QUEUES):
            off = start[q]
            while True:
                b = store.get_batch(TOPIC, q, off, 4096)
                if not len(b):
                    break
                read += len(b)
                off = b.next_offset
        print("  batched read          " + _rate(read, time.perf_counter() - t))
        t = time.perf_counter()
        store.flush()
        print(f"  flush                 {time.perf_counter() - t:.2f} s")
    print(f"  read back {read:,} of {n:,} written")
    return 0 if read == n else 1
