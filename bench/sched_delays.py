"""Where the scheduler makes a delivery wait: latency rows under ``perf sched``, per task and CPU.

    .venv/bin/python bench/sched_delays.py [--rows hostmq_poll] [--messages 3000] [--top 8]

Runs ``bench/latency_rows.py`` for the named rows under ``perf sched record`` (the ``perf`` binary
must be on PATH and allowed to trace the scheduler: root, or ``kernel.perf_event_paranoid`` ≤ -1),
then reads ``perf sched timehist`` and prints, for the busiest tasks, how long each waited between
being woken and running (its *scheduling delay*) — p50, p90 and p99 in µs, on each CPU it ran on —
and how long it ran per slice. On the 2-vCPU dev VM this showed that a consumer woken onto the
other, idle vCPU waits a median 26 µs before it runs (the guest halts idle vCPUs:
``/sys/module/haltpoll/parameters/guest_halt_poll_ns`` is 0) and one woken onto the vCPU its waker
leaves runs at once, while the C floor's three processes (``c_relay``) stay on one vCPU
(docs/performance.md, "Issue 29, tenth part"). Tracing slows every context switch by a few µs:
compare tasks within one run, not a traced run's latencies with an untraced one's.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
LINE = re.compile(r"\s*([\d.]+)\s+\[(\d+)\]\s+(\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")


def quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))] if s else float("nan")


def summarize(timehist: str, top: int) -> list[str]:
    """Table lines from ``perf sched timehist`` output (its times are ms; the table's µs)."""
    by_task: dict[str, list[tuple[int, float, float]]] = collections.defaultdict(list)
    for line in timehist.splitlines():
        m = LINE.match(line)
        if m and not m.group(3).startswith("<idle>"):
            by_task[m.group(3)].append((int(m.group(2)), float(m.group(5)) * 1000, float(m.group(6)) * 1000))
    out = ["| task | CPU | slices | sched delay p50 µs | p90 | p99 | run per slice p50 µs |",
           "|---|---|---|---|---|---|---|"]
    for task, rows in sorted(by_task.items(), key=lambda kv: -len(kv[1]))[:top]:
        per_cpu: dict[int, list[tuple[float, float]]] = collections.defaultdict(list)
        for cpu, delay, run in rows:
            per_cpu[cpu].append((delay, run))
        for cpu, v in sorted(per_cpu.items()):
            d, r = [x[0] for x in v], [x[1] for x in v]
            out.append(f"| {task} | {cpu} | {len(v):,} | {quantile(d, .5):.0f} | {quantile(d, .9):.0f} | "
                       f"{quantile(d, .99):.0f} | {quantile(r, .5):.0f} |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="hostmq_poll", help="rows of bench/latency_rows.py, comma-separated")
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--top", type=int, default=8, help="tasks shown, the most often scheduled first")
    args = ap.parse_args(argv)
    perf = shutil.which("perf")
    if perf is None:
        print("perf is not on PATH: nothing to trace with")
        return 2
    with tempfile.TemporaryDirectory(prefix="hqsched-") as tmp:
        data = os.path.join(tmp, "sched.data")
        rows = subprocess.run([perf, "sched", "record", "-o", data, "--", sys.executable,
                               os.path.join(HERE, "latency_rows.py"), "--rows", args.rows,
                               "--messages", str(args.messages)], capture_output=True, text=True, timeout=600)
        print("\n".join(line for line in rows.stdout.splitlines() if line.startswith("run ")))
        if rows.returncode != 0 or not os.path.exists(data):
            print(f"perf sched record failed ({rows.returncode}): {rows.stderr.strip()[-500:]}")
            return 1
        hist = subprocess.run([perf, "sched", "timehist", "-i", data], capture_output=True, text=True, timeout=600)
    print("\n".join(summarize(hist.stdout, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
