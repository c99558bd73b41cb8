"""Where end-to-end latency goes when a producer sends flat out (the `hostmq bench` caught-up phase).

    .venv/bin/python bench/e2e_breakdown.py [--seconds 3]

A LocalCluster (one broker, ASYNC_FLUSH), one producer process sending 100-byte messages one at a time
as fast as acknowledgements come, one PullConsumer thread in this process reading as they arrive.
Every 5 ms the broker's state segment is sampled for the dispatcher's lag behind the writer
(``write_pos − dispatched_pos``, in records); each consumed message gives born → store (the writer)
and store → received (dispatch and the consumer) from its timestamps (milliseconds, wall clock).
Prints the quantiles.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import hostmq  # noqa: E402
from hostmq import ConsumeFrom, Message  # noqa: E402
from hostmq import records as R  # noqa: E402
from hostmq.live.state import BrokerState  # noqa: E402
from hostmq.root import shm_name  # noqa: E402

BODY = b"x" * 100
RECORD_BYTES = R.record_size(len(BODY), 1, 60)      # topic "t" and typical properties


def produce(root: str, seconds: float) -> None:
    with hostmq.Producer(root) as p:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            p.send(Message("t", BODY))


def q(values: list[float], f: float) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * f))] if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="e2e-")
    try:
        with hostmq.LocalCluster(root):
            with hostmq.Admin(root) as a:
                a.create_topic("t", queues=4)
            st = BrokerState.attach(shm_name(root, "broker-a", "state"), readonly=True)
            stop, got = threading.Event(), []

            def consume() -> None:
                with hostmq.PullConsumer(root, group="g", consume_from=ConsumeFrom.FIRST_OFFSET) as pc:
                    pc.subscribe("t", "*")
                    while not stop.is_set():
                        msgs = pc.poll(0.2)
                        now_ms = time.time() * 1000
                        got.extend((m.store_timestamp_ms - m.born_timestamp_ms, now_ms - m.store_timestamp_ms)
                                   for m in msgs)
            reader = threading.Thread(target=consume)
            reader.start()
            producer = multiprocessing.get_context("spawn").Process(target=produce, args=(root, args.seconds))
            producer.start()
            lags = []
            while producer.is_alive():
                lags.append((int(st.get("write_pos")) - int(st.get("dispatched_pos"))) / RECORD_BYTES)
                time.sleep(0.005)
            producer.join()
            time.sleep(0.5)                 # let the consumer read the tail
            stop.set()
            reader.join()
            st.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    writer = [a for a, _ in got]
    after = [b for _, b in got]
    print(f"{len(got)} messages in {args.seconds:g} s")
    print(f"{'measure':34} {'p50':>8} {'p90':>8} {'max':>8}")
    print(f"{'dispatcher lag, records':34} {q(lags, .5):>8.0f} {q(lags, .9):>8.0f} {max(lags, default=0):>8.0f}")
    print(f"{'born -> stored, ms':34} {q(writer, .5):>8.1f} {q(writer, .9):>8.1f} {max(writer, default=0):>8.1f}")
    print(f"{'stored -> consumed, ms':34} {q(after, .5):>8.1f} {q(after, .9):>8.1f} {max(after, default=0):>8.1f}")


if __name__ == "__main__":
    main()
