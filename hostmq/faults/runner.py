"""A fault run: every trial of every configuration (``harness.ClusterUnderTest``), the end-of-run
checks, then the registered fuzzers (``hostmq.faults.FUZZERS``).

The run's directory (ROOT of ``hostmq faults``; must be new or empty, default a temp dir removed
afterwards unless something failed) holds ``CONFIG/fence/root`` (a cluster root) and ``CONFIG/logs``
(worker logs) per configuration, and ``fuzz/`` for the fuzzers; anything else that appears there was
made outside a root (:func:`stray_files`).
"""
from __future__ import annotations

import importlib
import os
import random
import shutil
import tempfile
import time

from ..errors import FaultHarnessError, HostMQError
from ..root import RootPaths, ipc_address
from . import FUZZERS, FuzzResult
from .harness import BROKER, ClusterUnderTest
from .plan import CONFIGS, RunOptions, all_kinds, make_plan
from .report import COUNTS, RunSummary, TrialRow


def run(opts: RunOptions, progress=lambda line: None) -> RunSummary:
    """Every trial of ``opts`` (configuration by configuration), then the fuzzers; the summary."""
    t0 = time.monotonic()
    summary = RunSummary()
    work, created = _work_dir(opts.work_dir)
    plan = make_plan(opts.trials, list(opts.kinds) or all_kinds(), list(opts.configs), opts.seed)
    rng = random.Random(opts.seed)
    try:
        no = 0
        for config in opts.configs:
            kinds = [k for c, k in plan if c == config]
            if not kinds:
                continue
            cut = ClusterUnderTest(os.path.join(work, config), config, opts, rng)
            progress(f"{config}: starting a cluster under {cut.root}")
            with cut:
                no = _trials(cut, kinds, no, len(plan), summary, progress)
                try:
                    summary.finals.append(cut.final())
                except (HostMQError, OSError) as e:
                    summary.finals.append(TrialRow(0, config, "final", "all", "verify", crashes=1,
                                                   details=f"the end-of-run check failed: {type(e).__name__}: {e}"))
                progress(progress_line(summary.finals[-1], len(plan)))
            summary.leftovers += cut.leftovers
        summary.outside = stray_files(work, list(opts.configs))
        if opts.fuzz_cases:
            summary.fuzz, summary.skipped_fuzzers = run_fuzzers(os.path.join(work, "fuzz"), opts.fuzz_cases,
                                                                opts.seed, progress)
    finally:
        summary.seconds = time.monotonic() - t0
        if created and not summary.failed:
            shutil.rmtree(work, ignore_errors=True)
        else:
            summary.notes.append(f"Cluster roots, worker logs and server logs are kept in {work}.")
    return summary


def _trials(cut: ClusterUnderTest, kinds: list, no: int, total: int, summary: RunSummary, progress) -> int:
    """Run ``kinds`` as trials ``no + 1`` …; the last trial number. A trial that cannot finish (a
    process that never came back) is a failed trial and ends this configuration's trials."""
    for kind in kinds:
        no += 1
        try:
            row, broken = cut.trial(no, kind), False
        except (HostMQError, OSError) as e:
            row, broken = TrialRow(no, cut.config, kind.name, kind.target, kind.action, kind.window, crashes=1,
                                   details=f"the trial could not finish: {type(e).__name__}: {e}"), True
            summary.notes.append(f"{cut.config}: no more trials after trial {no} ({kind.name}) could not finish.")
        summary.rows.append(row)
        progress(progress_line(row, total))
        if broken:
            break
    return no


def progress_line(row: TrialRow, total: int) -> str:
    counts = " ".join(f"{c} {getattr(row, c)}" for c in COUNTS if getattr(row, c))
    hit = f" hit={row.hit}" if row.window else ""
    rec = "" if row.recovery_s != row.recovery_s else f" recovery {row.recovery_s:.2f}s"
    head = f"[{row.trial}/{total}] {row.config:5} {row.kind:22} acked {row.acked:5}{hit}{rec} ({row.seconds:.1f}s)"
    return head + (f"  FAILED: {counts}: {row.details[:300]}" if row.failed else "")


def _work_dir(path: str | None) -> tuple[str, bool]:
    """The run's directory: ``path`` if it is new or empty (a fresh root), else a new temp dir."""
    if path is None:
        return tempfile.mkdtemp(prefix="hmqf-"), True
    path = os.path.abspath(path)
    if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
        raise FaultHarnessError(f"{path} is not empty: the fault harness needs a fresh directory")
    longest = os.path.join(path, max(CONFIGS, key=len), "fence", "root")
    ipc_address(RootPaths(longest).broker_socket(BROKER))     # a clear error now, not a broker that fails
    os.makedirs(path, exist_ok=True)
    return path, False


def stray_files(work: str, configs: list[str]) -> list[str]:
    """Anything in the run's directory outside the expected layout ``CONFIG/{fence/root,logs}`` and
    ``fuzz``: a file a server made outside its root (two levels of ``..`` land here)."""
    out = [os.path.join(work, n) for n in os.listdir(work) if n not in set(configs) | {"fuzz"}]
    for c in configs:
        d = os.path.join(work, c)
        if os.path.isdir(d):
            out += [os.path.join(d, n) for n in os.listdir(d) if n not in ("fence", "logs")]
            fence = os.path.join(d, "fence")
            if os.path.isdir(fence):
                out += [os.path.join(fence, n) for n in os.listdir(fence) if n != "root"]
    return sorted(out)


def run_fuzzers(work: str, cases: int, seed: int, progress=lambda line: None
                ) -> tuple[list[FuzzResult], dict[str, str]]:
    """Every registered fuzzer (``FUZZERS``) with ``cases`` cases; a module not written yet is skipped."""
    results: list[FuzzResult] = []
    skipped: dict[str, str] = {}
    for name, target in FUZZERS.items():
        module, _, func = target.partition(":")
        try:
            fn = getattr(importlib.import_module(module), func or "run")
        except ModuleNotFoundError as e:
            if e.name == module:
                skipped[name] = f"{module} does not exist yet"
                progress(f"fuzz {name}: skipped ({module} does not exist yet)")
            else:                       # the module exists but cannot be imported: a failure
                results.append(FuzzResult(name, 0, [f"cannot import {module}: {e}"]))
            continue
        d = os.path.join(work, name)
        os.makedirs(d, exist_ok=True)
        t0 = time.monotonic()
        try:
            got = list(fn(d, cases, seed))
        except Exception as e:          # a fuzzer that breaks is a finding, not the end of the run
            got = [FuzzResult(name, 0, [f"the fuzzer raised {type(e).__name__}: {e}"], time.monotonic() - t0)]
        results += got
        for r in got:
            progress(f"fuzz {r.kind}: {r.cases} cases, {len(r.failures)} failures ({r.seconds:.1f}s)")
    return results, skipped
