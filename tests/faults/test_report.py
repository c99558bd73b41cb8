"""Report formatting: the table per fault kind, the CSV, the failures in words."""
from __future__ import annotations

import csv
import io
import math

import pytest

from hostmq.faults import FuzzResult
from hostmq.faults.report import (RunSummary, TrialRow, aggregate, failures_text, fuzz_table, kinds_table,
                                  report_markdown, trials_csv, write_report)

pytestmark = pytest.mark.timeout(60)


def rows() -> list[TrialRow]:
    return [
        TrialRow(1, "async", "writer:kill", "writer", "kill", acked=100, recovery_s=0.5, restart_s=0.6),
        TrialRow(2, "async", "writer:kill", "writer", "kill", acked=50, lost=2, recovery_s=1.5, restart_s=0.4,
                 details="lost: p0.1.7"),
        TrialRow(3, "async", "broker@mid-patch", "broker", "kill", "mid-patch", "yes", acked=10, crashes=1),
        TrialRow(4, "pool", "broker@mid-patch", "broker", "kill", "mid-patch", "no", acked=5),
    ]


def test_aggregate_sums_per_config_and_kind():
    agg = aggregate(rows())
    assert [(a["config"], a["kind"], a["trials"]) for a in agg] == [
        ("async", "writer:kill", 2), ("async", "broker@mid-patch", 1), ("pool", "broker@mid-patch", 1)]
    w = agg[0]
    assert (w["acked"], w["lost"], w["failed trials"], w["aimed hits"]) == (150, 2, 1, "-")
    assert w["recovery s (p50 / max)"] == "1.00 / 1.50" and w["restart s (p50 / max)"] == "0.50 / 0.60"
    assert agg[1]["aimed hits"] == "1/1" and agg[2]["aimed hits"] == "0/1"
    assert agg[1]["crashes"] == 1 and agg[1]["recovery s (p50 / max)"] == "-"     # NaN: no ack after the fault


def test_kinds_table_is_markdown_with_a_total():
    text = kinds_table(rows())
    lines = text.strip().splitlines()
    assert lines[0].startswith("| config | kind | trials | acked | lost |")
    assert len(lines) == 2 + 3 + 1
    total = lines[-1].split("|")
    assert "**all**" in total[1] and total[3].strip() == "4" and total[4].strip() == "165"
    assert kinds_table([]) == "(no trials)\n"


def test_csv_has_a_row_per_trial_and_empty_nan():
    text = trials_csv(rows())
    got = list(csv.DictReader(io.StringIO(text)))
    assert len(got) == 4 and got[1]["lost"] == "2" and got[1]["details"] == "lost: p0.1.7"
    assert got[2]["recovery_s"] == "" and got[0]["recovery_s"] == "0.500"
    assert math.isnan(TrialRow(0, "a", "k", "t", "kill").recovery_s)


def test_failures_text_names_failed_trials_fuzz_failures_and_leftovers():
    s = RunSummary(rows=rows(), fuzz=[FuzzResult("ring", 100, ["case 7: writer died"])],
                   leftovers=["/hostmq.abc.ring.1"], outside=["/tmp/x/PWNED"])
    text = failures_text(s)
    assert "trial 2 [async] writer:kill: lost 2 of 50 acked — lost: p0.1.7" in text
    assert "trial 3 [async] broker@mid-patch aimed mid-patch (hit: yes): crashes 1" in text
    assert "fuzz ring: case 7: writer died" in text and "/hostmq.abc.ring.1" in text and "PWNED" in text
    assert "trial 1 " not in text and "trial 4 " not in text
    assert failures_text(RunSummary(rows=rows()[:1])) == "none\n"
    assert s.failed and not RunSummary(rows=rows()[:1]).failed


def test_an_index_miss_without_a_duplicate_is_listed_but_fails_nothing():
    row = TrialRow(5, "pool", "broker:kill", "broker", "kill", acked=9,
                   details="index miss: 1 delivered copies the restarted scheduler's index query missed")
    s = RunSummary(rows=[row])
    assert not s.failed
    assert failures_text(s).startswith("- index miss (no duplicate) in trial 5 [pool] broker:kill: index miss: 1")


def test_fuzz_table_shows_skipped_fuzzers():
    text = fuzz_table([FuzzResult("store:commitlog", 500, [], 2.5)], {"frames": "not written yet"})
    assert "| store:commitlog | 500 | 0 | 2.5 |" in text and "skipped: not written yet" in text


def test_write_report_writes_three_files(tmp_path):
    s = RunSummary(rows=rows(), finals=[TrialRow(0, "async", "final", "all", "verify", acked=165)],
                   fuzz=[FuzzResult("ring", 10)], skipped_fuzzers={"frames": "missing"}, seconds=90)
    paths = write_report(str(tmp_path / "out"), s)
    assert [p.rsplit("/", 1)[1] for p in paths] == ["trials.csv", "fuzz.csv", "report.md"]
    md = open(paths[2]).read()
    assert md == report_markdown(s) and "4 kill/stop trials in 1.5 min" in md and "End-of-run" in md
    assert len(open(paths[0]).read().splitlines()) == 1 + 5
    assert open(paths[1]).read().splitlines()[2] == "frames,0,,,skipped: missing"
