"""A consumer-group worker: every worker started with the same --group shares the topic's queues
(each message goes to one of them, at least once: a queue that moves to another worker before its
offset was committed is read again from there); a worker that stops or dies hands its queues on.
Ctrl-C (or --idle-exit S without messages) stops it after the running batch, committing its offsets.

    python tools/examples/worker.py /tmp/mq --topic jobs --group workers
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time

import hostmq
from hostmq import ConsumeFrom, ConsumeResult


class Worker:
    """Counts and prints what its listener handled; ``idle_s`` is how long it has been without work."""

    def __init__(self) -> None:
        self.handled = 0
        self.last_s = time.monotonic()
        self.lock = threading.Lock()

    def on_messages(self, msgs) -> ConsumeResult:
        lines = []
        for m in msgs:
            job = json.loads(m.body)
            # A real worker does its job here; raising or returning RECONSUME_LATER retries it later.
            lines.append(f"job {job.get('job')} from {m.queue}\n")
        with self.lock:                 # listener threads run at once: one whole line each
            sys.stdout.write("".join(lines))
            sys.stdout.flush()
            self.handled += len(msgs)
            self.last_s = time.monotonic()
        return ConsumeResult.SUCCESS

    def idle_s(self) -> float:
        with self.lock:
            return time.monotonic() - self.last_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default=None, help="the cluster's root (default $HOSTMQ_ROOT, else ~/.hostmq)")
    ap.add_argument("--topic", default="jobs")
    ap.add_argument("--group", default="workers")
    ap.add_argument("--idle-exit", type=float, default=0.0, help="stop after S seconds without a message")
    args = ap.parse_args(argv)
    # SIGTERM is taken with sigtimedwait below, never by a handler: a handler that sets an Event
    # can deadlock on the Event's lock when a second signal comes while it runs. Blocked before the
    # consumer starts its threads, so they inherit the mask and only this loop receives it.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    worker = Worker()
    consumer = hostmq.PushConsumer(args.root, group=args.group, consume_from=ConsumeFrom.FIRST_OFFSET,
                                   batch_size=16)
    consumer.subscribe(args.topic, "*")
    consumer.register(worker.on_messages)
    consumer.start()
    try:
        while signal.sigtimedwait({signal.SIGTERM}, 0.2) is None:
            if args.idle_exit and worker.idle_s() >= args.idle_exit:
                break
    except KeyboardInterrupt:
        pass
    finally:
        consumer.shutdown()         # finishes the running batches, commits, leaves: the group rebalances
    print(f"worker handled {worker.handled} message(s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
