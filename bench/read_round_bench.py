"""The consumer's read round, native (hostmq/store/_read.c) against the Python read side, in one run.

    .venv/bin/python bench/read_round_bench.py [--backlog 200000] [--rounds 2000] [--repeat 3]

Against a LocalCluster (one broker, ASYNC_FLUSH, on disk), 100-byte bodies, in this process:

* drain rates of a backlog (the consumer's views opened first) with ``PullConsumer.poll``
  (``max_poll_records`` 4096 and the default 32, reading each ``m.body``) and ``poll_batch`` (4096,
  touching each body view, or taking them all at once with ``bodies_joined()``) — what the issue's
  ``poll`` / ``poll_batch`` figures measure (hostmq/bench/latency_workers.py ``hostmq_drain_worker``);
* the in-process round for one message: a sync send, then the time of the ``poll(0)`` that returns
  it (refresh, tail scan, check, MessageExt), median and p90 over ``--rounds`` rounds;
* the store's own read step without a broker or a consumer (a MessageStore in this process, 50,000
  records in one queue): ``get`` of 4096 reading each ``m.body``, and ``get_batch`` of 4096 with and
  without touching each body view — µs per message, the least noisy figures here.

Each measure runs with the native path and with ``read_check.NATIVE = None`` (the Python path)
alternately, ``--repeat`` times; the best of each is printed with the ratio.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import hostmq  # noqa: E402
from hostmq import ConsumeFrom, Message  # noqa: E402
from hostmq.cli import workload  # noqa: E402
from hostmq.store import read_check  # noqa: E402
from hostmq.store.reader import MessageBatch  # noqa: E402

NATIVE = getattr(read_check, "NATIVE", None)     # (absent before the native read round)


def drain(root: str, queues, expect: int, kind: str, max_records: int) -> float:
    with hostmq.PullConsumer(root, group=f"rr-{kind}-{time.time_ns()}", consume_from=ConsumeFrom.FIRST_OFFSET,
                             auto_commit=False, max_poll_records=max_records) as c:
        c.assign(queues)
        for _ in queues:                # open every queue's view and files first, then start over
            c.poll_batch(0.5, 1) if kind.startswith("poll_batch") else c.poll(0.5)
        for q in queues:
            c.seek(q, 0)
        got = nbytes = 0
        t0 = time.perf_counter()
        end = time.monotonic() + 120
        while got < expect and time.monotonic() < end:
            if kind == "poll_batch":
                b = c.poll_batch(0.5, max_records)
                nbytes += sum(len(v) for v in b.bodies)
                got += len(b)
            elif kind == "poll_batch_joined":
                b = c.poll_batch(0.5, max_records)
                joined, _ = b.bodies_joined()
                nbytes += len(joined)
                got += len(b)
            else:
                msgs = c.poll(0.5)
                nbytes += sum(len(m.body) for m in msgs)
                got += len(msgs)
        return got / (time.perf_counter() - t0)


def one_message_rounds(root: str, topic: str, rounds: int) -> tuple[float, float]:
    """(median, p90) µs of the poll(0) round that returns the one message just sent."""
    with hostmq.Admin(root) as a:
        q = a.route(topic)[0]
    out = []
    with hostmq.Producer(root) as p, \
            hostmq.PullConsumer(root, group=f"rr-one-{time.time_ns()}", auto_commit=False) as c:
        c.assign([q])
        for i in range(rounds + 50):
            p.send(Message(topic, b"x" * 100), queue=q)
            t0 = time.perf_counter_ns()
            msgs = c.poll(0)
            t1 = time.perf_counter_ns()
            while not msgs:                 # not readable yet (rare): take it without timing
                msgs = c.poll(0.1)
            if i >= 50:
                out.append((t1 - t0) / 1000)
    out.sort()
    return statistics.median(out), out[int(len(out) * 0.9)]


def store_step(path: str, repeat: int) -> dict[str, float]:
    """µs per message of the store's read step (best of ``repeat``), on the path read_check.NATIVE sets."""
    import timeit
    from hostmq import records as R
    from hostmq.message import MessageQueue
    from hostmq.store.encode import encode_message
    from hostmq.store.message_store import MessageStore, _tag_filter
    from hostmq.store.reader import get_batch, get_messages
    s = MessageStore(path, {"commitlog_file_bytes": 64 << 20, "consume_queue_file_entries": 100_000})
    try:
        recs = [encode_message(Message("T", b"x" * 100, tags="A"), b"T", 0, max_body_bytes=1 << 20,
                               max_props_bytes=1 << 15, born_host=s.commitlog.store_host) for _ in range(1000)]
        blob, starts = R.encode_batch(recs)
        for _ in range(50):
            s.append_encoded("T", 0, blob, starts)
        s.dispatch()
        cq, mq, every = s.queues[("T", 0)], MessageQueue("T", "b", 0), _tag_filter("*")

        def get():
            for m in get_messages(cq, s.commitlog, 0, 4096, every, 1 << 30, "b").messages:
                m.body

        def batch(touch: bool):
            b = get_batch(cq, s.commitlog, mq, 0, 4096)
            if touch:
                sum(len(v) for v in b.bodies)

        def joined():
            get_batch(cq, s.commitlog, mq, 0, 4096).bodies_joined()
        out = {}
        for name, fn in (("store get of 4096, each m.body, µs/msg", get),
                         ("store get_batch of 4096, µs/msg", lambda: batch(False)),
                         ("store get_batch of 4096, each body, µs/msg", lambda: batch(True)),
                         ("store get_batch of 4096 + bodies_joined(), µs/msg", joined)):
            if fn is joined and not hasattr(MessageBatch, "bodies_joined"):
                continue
            out[name] = min(timeit.repeat(fn, number=10, repeat=repeat)) / 10 / 4096 * 1e6
        return out
    finally:
        s.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backlog", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    paths = ("native", "python") if NATIVE is not None else ("python",)
    if NATIVE is None:
        print("hostmq/store/_read.c is not built (or HOSTMQ_NATIVE_READ=0): the Python path alone", flush=True)
    tmp = tempfile.mkdtemp(prefix="hqrr-")
    root = os.path.join(tmp, "root")
    load = os.getloadavg()
    print(f"read round bench: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"load {load[0]:.2f}", flush=True)
    best: dict[tuple[str, str], float] = {}
    try:
        for k in range(args.repeat):
            for path in paths:
                read_check.NATIVE = NATIVE if path == "native" else None
                for name, v in store_step(os.path.join(tmp, f"store-{path}-{k}"), 5).items():
                    best[(name, path)] = min(best.get((name, path), float("inf")), v)
        with hostmq.LocalCluster(root, config={"store": {"commitlog_file_bytes": 256 << 20}}):
            workload.ensure_topic(root, "drain")
            workload.ensure_topic(root, "one", queues=1)
            with hostmq.Producer(root) as p:
                workload.batch_sends(p, "drain", args.backlog)
            with hostmq.Admin(root) as a:
                queues = a.route("drain")
            measures = [("poll msgs/s (max_poll_records 4096)", lambda: drain(root, queues, args.backlog, "poll", 4096)),
                        ("poll msgs/s (max_poll_records 32)", lambda: drain(root, queues, args.backlog, "poll", 32)),
                        ("poll_batch msgs/s (4096)", lambda: drain(root, queues, args.backlog, "poll_batch", 4096))]
            if hasattr(MessageBatch, "bodies_joined"):
                measures.append(("poll_batch msgs/s (4096), bodies_joined()",
                                 lambda: drain(root, queues, args.backlog, "poll_batch_joined", 4096)))
            for _ in range(args.repeat):
                for name, fn in measures:
                    for path in paths:
                        read_check.NATIVE = NATIVE if path == "native" else None
                        v = fn()
                        best[(name, path)] = max(best.get((name, path), 0.0), v)
                for path in paths:
                    read_check.NATIVE = NATIVE if path == "native" else None
                    med, p90 = one_message_rounds(root, "one", args.rounds)
                    for k, v in (("one-message poll round µs, median", med), ("one-message poll round µs, p90", p90)):
                        best[(k, path)] = min(best.get((k, path), float("inf")), v)
                print("  pass done", flush=True)
    finally:
        read_check.NATIVE = NATIVE
        shutil.rmtree(tmp, ignore_errors=True)
    names = list(dict.fromkeys(k for k, _ in best))
    width = max(map(len, names)) + 2
    print(f"\n{'':<{width}}" + "".join(f"{p:>14}" for p in paths) + ("  native/python" if len(paths) == 2 else ""))
    for n in names:
        vals = [best[(n, p)] for p in paths]
        print(f"{n:<{width}}" + "".join(f"{v:>14,.3f}" if v < 10 else f"{v:>14,.1f}" for v in vals) +
              (f"{vals[0] / vals[1]:>15.2f}" if len(vals) == 2 else ""))
    print(f"(best of {args.repeat}; load average at the end {os.getloadavg()[0]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
