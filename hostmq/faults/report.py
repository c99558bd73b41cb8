"""The fault run's results: a row per trial (CSV), a table per fault kind, the fuzzers' table, and
``report.md`` with every failure spelled out. Pure formatting, plus the few writes to ``--out``."""
from __future__ import annotations

import csv
import dataclasses
import io
import os
import statistics
from dataclasses import dataclass, field

from . import FuzzResult

COUNTS = ("lost", "duplicated", "mismatched", "unreachable", "unseen", "out_of_order", "phantom", "corrupt",
          "crashes", "split_brain", "breaches")


@dataclass
class TrialRow:
    """One trial: its fault, what verification found, and how long recovery took."""

    trial: int
    config: str                 # async, sync or pool (the cluster's store configuration)
    kind: str                   # e.g. writer:kill, writer:stop, broker@mid-append
    target: str
    action: str                 # kill or stop
    window: str = ""            # aimed window, "" for a random moment
    hit: str = ""               # aimed: "yes" (killed inside the window) or "no"; "" when not aimed
    acked: int = 0
    lost: int = 0
    duplicated: int = 0
    mismatched: int = 0
    unreachable: int = 0
    unseen: int = 0
    out_of_order: int = 0
    phantom: int = 0
    corrupt: int = 0
    crashes: int = 0            # server processes that died without being killed by the harness
    split_brain: int = 0        # samples in which two running instances of the broker name said master
    breaches: int = 0           # what an attack kind got that it must not (attack_kinds.py)
    recovery_s: float = float("nan")    # fault → first acknowledgement of a send started after it
    restart_s: float = 0.0      # time to restart what the fault killed (0: nothing to restart)
    seconds: float = 0.0        # the whole trial
    details: str = ""           # the first failures in words, "; "-separated

    @property
    def failed(self) -> bool:
        return any(getattr(self, c) for c in COUNTS)


@dataclass
class RunSummary:
    """Everything a run produced, as the report shows it."""

    rows: list[TrialRow] = field(default_factory=list)
    finals: list[TrialRow] = field(default_factory=list)      # end-of-run re-verification per config
    fuzz: list[FuzzResult] = field(default_factory=list)
    skipped_fuzzers: dict[str, str] = field(default_factory=dict)
    leftovers: list[str] = field(default_factory=list)        # /dev/shm names left after the stop
    outside: list[str] = field(default_factory=list)          # files created outside the roots
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(r.failed for r in self.rows + self.finals) or bool(self.leftovers or self.outside) or \
            any(f.failures for f in self.fuzz)


def _fmt_s(values: list[float]) -> str:
    vals = [v for v in values if v == v]       # drop NaN (no acknowledgement after the fault)
    if not vals:
        return "-"
    return f"{statistics.median(vals):.2f} / {max(vals):.2f}"


def aggregate(rows: list[TrialRow]) -> list[dict]:
    """One dict per (config, kind), in first-seen order: trials, sums of every count, aimed hits,
    recovery and restart time (median / max)."""
    groups: dict[tuple[str, str], list[TrialRow]] = {}
    for r in rows:
        groups.setdefault((r.config, r.kind), []).append(r)
    out = []
    for (config, kind), rs in groups.items():
        d = {"config": config, "kind": kind, "trials": len(rs), "acked": sum(r.acked for r in rs)}
        for c in COUNTS:
            d[c] = sum(getattr(r, c) for r in rs)
        aimed = [r for r in rs if r.window]
        d["aimed hits"] = f"{sum(r.hit == 'yes' for r in aimed)}/{len(aimed)}" if aimed else "-"
        d["failed trials"] = sum(r.failed for r in rs)
        d["recovery s (p50 / max)"] = _fmt_s([r.recovery_s for r in rs])
        d["restart s (p50 / max)"] = _fmt_s([r.restart_s for r in rs if r.restart_s > 0])
        out.append(d)
    return out


TABLE_COLUMNS = ["config", "kind", "trials", "acked", "lost", "duplicated", "mismatched", "unreachable",
                 "unseen", "out_of_order", "phantom", "corrupt", "crashes", "split_brain", "breaches",
                 "failed trials",
                 "aimed hits",
                 "recovery s (p50 / max)", "restart s (p50 / max)"]


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(c, "")) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def kinds_table(rows: list[TrialRow]) -> str:
    """The table per fault kind, with a total line."""
    agg = aggregate(rows)
    if not agg:
        return "(no trials)\n"
    total = {"config": "**all**", "kind": "", "trials": sum(a["trials"] for a in agg),
             "acked": sum(a["acked"] for a in agg), "failed trials": sum(a["failed trials"] for a in agg)}
    for c in COUNTS:
        total[c] = sum(a[c] for a in agg)
    total["recovery s (p50 / max)"] = _fmt_s([r.recovery_s for r in rows])
    total["restart s (p50 / max)"] = _fmt_s([r.restart_s for r in rows if r.restart_s > 0])
    return markdown_table(agg + [total], TABLE_COLUMNS)


def fuzz_table(results: list[FuzzResult], skipped: dict[str, str]) -> str:
    rows = [{"fuzzer": f.kind, "cases": f.cases, "failures": len(f.failures), "seconds": f"{f.seconds:.1f}"}
            for f in results]
    rows += [{"fuzzer": name, "cases": 0, "failures": "-", "seconds": f"skipped: {why}"}
             for name, why in skipped.items()]
    if not rows:
        return "(no fuzzers run)\n"
    return markdown_table(rows, ["fuzzer", "cases", "failures", "seconds"])


def trials_csv(rows: list[TrialRow]) -> str:
    buf = io.StringIO()
    names = [f.name for f in dataclasses.fields(TrialRow)]
    w = csv.DictWriter(buf, fieldnames=names, lineterminator="\n")
    w.writeheader()
    for r in rows:
        d = dataclasses.asdict(r)
        for k in ("recovery_s", "restart_s", "seconds"):
            d[k] = "" if d[k] != d[k] else f"{d[k]:.3f}"
        w.writerow(d)
    return buf.getvalue()


def failures_text(summary: RunSummary, limit: int = 200) -> str:
    """Every failed trial (and fuzz failure, leftover, stray file) in words."""
    lines = []
    for r in [*summary.rows, *summary.finals]:
        if r.failed:
            counts = ", ".join(f"{c} {getattr(r, c)}" for c in COUNTS if getattr(r, c))
            aimed = f" aimed {r.window} (hit: {r.hit})" if r.window else ""
            lines.append(f"- trial {r.trial} [{r.config}] {r.kind}{aimed}: {counts} of {r.acked} acked — {r.details}")
    for f in summary.fuzz:
        lines += [f"- fuzz {f.kind}: {x}" for x in f.failures[:20]]
    # Not a failure (the scheduler's commitlog scan found the copy; nothing was doubled), but the
    # index is to be a superset of every key: each miss is listed for whoever explains it.
    lines += [f"- index miss (no duplicate) in trial {r.trial} [{r.config}] {r.kind}: {r.details}"
              for r in summary.rows if not r.failed and "index miss:" in r.details]
    lines += [f"- left in /dev/shm after the stop: {n}" for n in summary.leftovers]
    lines += [f"- created outside the root: {p}" for p in summary.outside]
    if len(lines) > limit:
        lines = lines[:limit] + [f"- … {len(lines) - limit} more (see trials.csv)"]
    return "\n".join(lines) + ("\n" if lines else "none\n")


def report_markdown(summary: RunSummary, title: str = "hostmq fault-injection run") -> str:
    parts = [f"# {title}\n", f"{len(summary.rows)} kill/stop trials in {summary.seconds / 60:.1f} min.\n"]
    parts += [f"{n}\n" for n in summary.notes]
    parts += ["\n## Trials per fault kind\n", kinds_table(summary.rows)]
    if summary.finals:
        parts += ["\n## End-of-run recheck (every acknowledged message a trial found, checked again)\n",
                  kinds_table(summary.finals)]
    parts += ["\n## Fuzzers\n", fuzz_table(summary.fuzz, summary.skipped_fuzzers),
              "\n## Failures\n", failures_text(summary)]
    return "".join(parts)


def write_report(out_dir: str, summary: RunSummary) -> list[str]:
    """``trials.csv``, ``fuzz.csv`` and ``report.md`` in ``out_dir``; their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, n) for n in ("trials.csv", "fuzz.csv", "report.md")]
    with open(paths[0], "w") as f:
        f.write(trials_csv(summary.rows + summary.finals))
    with open(paths[1], "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["fuzzer", "cases", "failures", "seconds", "first_failure"])
        for r in summary.fuzz:
            w.writerow([r.kind, r.cases, len(r.failures), f"{r.seconds:.1f}", r.failures[0] if r.failures else ""])
        for name, why in summary.skipped_fuzzers.items():
            w.writerow([name, 0, "", "", f"skipped: {why}"])
    with open(paths[2], "w") as f:
        f.write(report_markdown(summary))
    return paths
