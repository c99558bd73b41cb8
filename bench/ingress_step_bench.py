"""The writer's batch step (hostmq/ingress/step.py serve_once), Python steps against the native step.

    .venv/bin/python bench/ingress_step_bench.py [--frames 20000] [--repeat 3]

One process, no broker: a producer ring, the writer's end of it, a commitlog in a temporary
directory (/dev/shm when it exists) and a state segment — what the writer process serves. Each
workload writes frames of 100-byte bodies into the ring and times ``serve_once`` + ``release``
until the ring is empty, once with the native step off and once with it on, alternating, best of
``--repeat``:

* ``single, 1 frame/step``: one MESSAGE frame per step (the latency path: the writer wakes for each);
* ``single, 64 frames/step``: 64 MESSAGE frames per step (a busy producer);
* ``batch of 100, 1 frame/step``: BATCH frames of 100 records (``send_batch``).

The Python side keeps its queue offsets in a plain dict, as the writer does with the native step off.

Prints µs per frame and per message for each side and their ratio; the ratio is what to compare
across machines (both sides run in the same process, one after the other).
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile
import time

import numpy as np

from hostmq import records as R
from hostmq.ingress import step
from hostmq.ingress.ring import IngressRing
from hostmq.shm import Segment
from hostmq.store.commitlog import CommitLog
from hostmq.store.queue_table import QueueTable

TOPIC = b"bench-topic"
BODY = b"b" * 100


def run(native: bool, frames: int, per_step: int, batch: int, root: str) -> float:
    """Seconds of serve_once + release for ``frames`` frames, ``per_step`` frames visible per step."""
    d = tempfile.mkdtemp(dir=root)
    p = IngressRing.create(f"bench-{os.getpid()}-{time.monotonic_ns()}", 1 << 22, 1 << 12)
    w = IngressRing.from_fd(p.segment.fd)
    state = Segment.create_memfd("state", 4096, "bench-state", 1)
    words = state.array(np.int64, max(R.STATE_WORD.values()) + 1)
    cl = CommitLog(d, 1 << 28, store_host=b"HOSTHOST")
    cl.mfq.load()
    queues = {TOPIC: 4}
    if native:      # as the writer keeps it: a QueueTable for the native step, else a plain dict
        cl.topic_queue_table = QueueTable()
        cl.topic_queue_table.set_topics(queues)
    if batch == 1:
        payload, kind = R.encode_record(TOPIC, BODY, b"KEYS\x01k1\x02", queue_id=1), R.FRAME_MESSAGE
    else:
        payload = b"".join(R.encode_record(TOPIC, BODY, b"", queue_id=1) for _ in range(batch))
        kind = R.FRAME_BATCH
    limits = step.Limits(1 << 22, 1 << 15, 1 << 20)
    saved, step.USE_NATIVE = step.USE_NATIVE, native
    woken: set = set()
    total = 0.0
    try:
        step.serve_once(w, 1, 1, words, cl, limits, queues, 1)     # nothing yet: warms the path
        p.try_write(kind, 0, payload, batch)                        # the first append makes the file
        step.serve_once(w, 1, 1, words, cl, limits, queues, 1)
        step.release(w, w.staged_position, w.handed_position)
        p.completion_tuples()
        done, seq = 0, 1
        while done < frames:
            k = min(per_step, frames - done)
            for _ in range(k):
                p.try_write(kind, seq, payload, batch)
                seq += 1
            t0 = time.perf_counter()
            b = step.serve_once(w, 1, 1, words, cl, limits, queues, 1_700_000_000_000, woken=woken)
            step.release(w, b.cw_end, b.data_end)
            total += time.perf_counter() - t0
            woken.clear()
            p.completion_tuples()
            done += k
    finally:
        step.USE_NATIVE = saved
        w.close()
        p.close()
        cl.close()
        del words
        state.close()
        shutil.rmtree(d, ignore_errors=True)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    if step.NATIVE_STEP is None:
        raise SystemExit("hostmq/ingress/_step.c is not built (pip install -e .)")
    root = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}")
    print(f"{'workload':<30} {'python µs/frame':>16} {'native µs/frame':>16} {'µs/msg py':>10} "
          f"{'µs/msg C':>9} {'py ÷ C':>7}")
    try:
        for name, per_step, batch, frames in (("single, 1 frame/step", 1, 1, a.frames),
                                              ("single, 64 frames/step", 64, 1, a.frames),
                                              ("batch of 100, 1 frame/step", 1, 100, max(1, a.frames // 20))):
            best = {True: float("inf"), False: float("inf")}
            for _ in range(a.repeat):
                for native in (False, True):
                    best[native] = min(best[native], run(native, frames, per_step, batch, root))
            py, c = best[False] / frames * 1e6, best[True] / frames * 1e6
            print(f"{name:<30} {py:>16.2f} {c:>16.2f} {py / batch:>10.2f} {c / batch:>9.2f} {py / c:>7.1f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
