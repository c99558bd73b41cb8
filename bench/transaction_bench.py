"""Transactional sends beside plain sends and the control round trip they include.

    .venv/bin/python bench/transaction_bench.py [--messages 3000]

Against a LocalCluster (one broker, ASYNC_FLUSH, on disk), 100-byte bodies, one producer process
sending one at a time: plain ``Producer.send``; ``TransactionProducer.send_in_transaction`` with a
local transaction that commits at once — a half send, then the committed message and the op message
published together (one ring round trip; no END_TRANSACTION, since the broker cannot have handed a
check-back of the half to anyone yet) — and the same against a broker that checks halves back after
0.5 s, where every end asks the broker first (END_TRANSACTION: a control round trip); and a PING
request to the broker — the raw cost of one control round trip. Prints a table and writes
``bench/out/transaction_bench.csv``.
"""
from __future__ import annotations

import argparse
import csv
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import hostmq  # noqa: E402
from hostmq import Message, TransactionState  # noqa: E402
from hostmq.protocol.codes import RequestCode  # noqa: E402

WARMUP = 200


def per_second(fn, n: int) -> tuple[float, float]:
    """(calls per second, p50 µs) of ``n`` calls of ``fn`` after a warm-up."""
    for _ in range(WARMUP):
        fn()
    lat = []
    t0 = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        fn()
        lat.append(time.perf_counter() - t)
    total = time.perf_counter() - t0
    lat.sort()
    return n / total, lat[len(lat) // 2] * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=3000)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="txb-")
    asking = tempfile.mkdtemp(prefix="txb-ask-")     # a broker whose every transaction end asks
    rows = []
    try:
        with hostmq.LocalCluster(root):
            with hostmq.Admin(root) as a:
                a.create_topic("t", queues=4)
                address = a.instance.broker_address("broker-a")
                rows.append(("PING round trip", *per_second(
                    lambda: a.instance.broker_request(address, RequestCode.PING), args.messages)))
            with hostmq.Producer(root) as p:
                rows.append(("send", *per_second(lambda: p.send(Message("t", b"x" * 100)), args.messages)))
            with hostmq.TransactionProducer(root, group="tx", checker=lambda m: TransactionState.COMMIT) as tp:
                commit = lambda m, arg: TransactionState.COMMIT  # noqa: E731
                rows.append(("send_in_transaction (COMMIT)", *per_second(
                    lambda: tp.send_in_transaction(Message("t", b"y" * 100), local=commit), args.messages)))
        with hostmq.LocalCluster(asking, config={"broker": {"transaction_timeout_s": 0.5}}):
            with hostmq.Admin(asking) as a:
                a.create_topic("t", queues=4)
            with hostmq.TransactionProducer(asking, group="tx", checker=lambda m: TransactionState.COMMIT) as tp:
                rows.append(("send_in_transaction (asking)", *per_second(
                    lambda: tp.send_in_transaction(Message("t", b"y" * 100), local=commit), args.messages)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(asking, ignore_errors=True)
    send_rate = rows[1][1]
    print(f"{'operation':32} {'per s':>10} {'p50 µs':>10} {'÷ send':>8}")
    for name, rate, p50 in rows:
        print(f"{name:32} {rate:>10,.0f} {p50:>10,.0f} {rate / send_rate:>7.2f}×")
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "transaction_bench.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["operation", "per_s", "p50_us"])
        w.writerows([(n, round(r, 1), round(p, 1)) for n, r, p in rows])


if __name__ == "__main__":
    main()
