"""The harness runs every registered fuzzer; one that does not exist yet is skipped, one that raises
is reported as a failure."""
from __future__ import annotations

import os

import pytest

from hostmq import faults
from hostmq.faults.runner import run_fuzzers

pytestmark = pytest.mark.timeout(60)


def test_registered_fuzzers_run_skip_or_fail(tmp_path, monkeypatch):
    monkeypatch.setattr(faults, "FUZZERS", {
        "later": "hostmq.faults.not_written_yet:run",
        "ok": "tests.faults.fuzz_examples:ok",
        "boom": "tests.faults.fuzz_examples:boom",
    })
    import hostmq.faults.runner as h
    monkeypatch.setattr(h, "FUZZERS", faults.FUZZERS)
    lines = []
    results, skipped = run_fuzzers(str(tmp_path), 25, 7, lines.append)
    assert skipped == {"later": "hostmq.faults.not_written_yet does not exist yet"}
    assert [(r.kind, r.cases, len(r.failures)) for r in results] == [("example:a", 25, 0), ("example:b", 25, 1),
                                                                    ("boom", 0, 1)]
    assert "RuntimeError: the fuzzer itself is broken" in results[2].failures[0]
    assert open(os.path.join(tmp_path, "ok", "ran")).read() == "25 7"
    assert any("skipped" in line for line in lines)


def test_a_fuzzer_whose_own_import_fails_is_a_failure_not_a_skip(tmp_path, monkeypatch):
    import hostmq.faults.runner as h
    p = tmp_path / "pkg"
    p.mkdir()
    (p / "fuzz_broken_import.py").write_text("import hostmq_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(p))
    monkeypatch.setattr(h, "FUZZERS", {"bad": "fuzz_broken_import:run"})
    results, skipped = run_fuzzers(str(tmp_path / "w"), 1, 0)
    assert skipped == {}
    assert [(r.kind, r.failures) for r in results] == [
        ("bad", ["cannot import fuzz_broken_import: No module named 'hostmq_no_such_dependency'"])]


def test_stray_files_are_anything_outside_the_expected_layout(tmp_path):
    from hostmq.faults.runner import stray_files
    for d in ("async/fence/root/brokers", "async/logs", "fuzz/ring", "pool/fence/root"):
        (tmp_path / d).mkdir(parents=True)
    assert stray_files(str(tmp_path), ["async", "pool"]) == []
    (tmp_path / "async" / "fence" / "PWNED").write_text("")
    (tmp_path / "async" / "x").mkdir()
    (tmp_path / "top").write_text("")
    assert stray_files(str(tmp_path), ["async", "pool"]) == sorted(
        str(p) for p in (tmp_path / "async" / "fence" / "PWNED", tmp_path / "async" / "x", tmp_path / "top"))


def test_restarted_children_are_read_from_the_supervisors_own_log_line(tmp_path, caplog):
    """A real supervised child killed with SIGKILL: the line the supervisor logs names it and its pid."""
    import logging
    import signal
    import time

    from hostmq.faults.harness import restarted_children
    from hostmq.process import Child, Supervisor
    c = Child("writer", "tests.procs.targets:until_stopped", {"pidfile": str(tmp_path / "pids")})
    sup = Supervisor([c])
    sup.start()
    try:
        pid = c.pid
        os.kill(pid, signal.SIGKILL)
        c.process.join(10)
        with caplog.at_level(logging.WARNING, logger="hostmq.process"):
            sup.check(now=time.monotonic())
        text = "\n".join(f"2026-01-01 00:00:00,000 hostmq.process WARNING {r.getMessage()}" for r in caplog.records)
        assert restarted_children(text) == [("writer", pid, "-9")]
    finally:
        sup.stop(10)
    assert restarted_children("broker-a running\nwriter (pid x) exited with 1; restarting") == []
