"""The store fuzz (issue 15): one store file damaged — bit flip, truncation, zeroed range — then
abnormal recovery; no crash, every record before the first damaged commitlog byte readable by queue and
by id, nothing written outside the store. Hypothesis picks the damage; ``hostmq.faults.store_fuzz``
also runs as a tool (thousands of cases)."""
from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostmq.faults import FUZZERS, store_fuzz as F

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pristines(tmp_path_factory):
    """The store closed cleanly, and as a killed process leaves it."""
    out = []
    for killed in (False, True):
        path = str(tmp_path_factory.mktemp("fuzz") / "pristine")
        truth = F.build_pristine(path, seed=11, killed=killed)
        assert len(truth) > 100 and all(len(F.files_of(path, k)) >= (2 if k in ("commitlog", "index") else 1)
                                        for k in F.KINDS)
        assert os.path.exists(os.path.join(path, "abort")) == killed
        out.append((path, truth))
    return out


@pytest.fixture
def pristine(pristines):
    return pristines[0]


@st.composite
def damages(draw, pristine_dir: str):
    kind = draw(st.sampled_from(F.KINDS))
    files = F.files_of(pristine_dir, kind)
    rel = files[draw(st.integers(0, len(files) - 1))]
    size = os.path.getsize(os.path.join(pristine_dir, rel))
    op = draw(st.sampled_from(F.OPS))
    start = draw(st.integers(0, max(size - 1, 0)))
    return F.Damage(kind, rel, op, start, length=draw(st.integers(1, max(size - start, 1))),
                    bit=draw(st.integers(0, 7)))


def _case(tmp_path, pristine_dir: str) -> str:
    store = str(tmp_path / "case" / "store")
    shutil.rmtree(os.path.dirname(store), ignore_errors=True)
    shutil.copytree(pristine_dir, store)
    return store


@pytest.mark.slow      # 300 damaged stores recovered: ~10 s
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(data=st.data())
def test_recovery_survives_any_single_file_damage(pristines, tmp_path, data):
    pristine_dir, truth = pristines[data.draw(st.integers(0, 1))]
    damage = data.draw(damages(pristine_dir))
    store = _case(tmp_path, pristine_dir)
    before = set(os.listdir(tmp_path)) | set(os.listdir(tmp_path / "case"))
    first_bad = F.apply_damage(store, damage)
    assert F.check_recovery(store, truth, first_bad) == [], str(damage)
    assert set(os.listdir(tmp_path)) | set(os.listdir(tmp_path / "case")) == before


def test_the_checks_see_a_broken_promise(pristine, tmp_path):
    """Without checking consume-queue entries at recovery, a flipped entry serves the wrong record:
    the fuzz says so (its checks can fail)."""
    pristine_dir, truth = pristine
    store = _case(tmp_path, pristine_dir)
    cq = F.files_of(pristine_dir, "consumequeue")[0]
    F.apply_damage(store, F.Damage("consumequeue", cq, "flip", 3 * 20 + 6, bit=6))
    problems = F.check_recovery(store, truth, F.NO_DAMAGE, {**F.CONFIG, "verify_consume_queues_on_recover": False})
    assert problems and "not readable as" in problems[0]
    store = _case(tmp_path, pristine_dir)
    F.apply_damage(store, F.Damage("consumequeue", cq, "flip", 3 * 20 + 6, bit=6))
    assert F.check_recovery(store, truth, F.NO_DAMAGE) == []


def test_first_damaged_byte_of_a_commitlog_file(pristine, tmp_path):
    pristine_dir, truth = pristine
    rel = F.files_of(pristine_dir, "commitlog")[1]
    base = int(os.path.basename(rel))
    last = [r for r in truth if r.phys < base + F.CONFIG["commitlog_file_bytes"]][-1]
    end = last.phys + last.total - base                     # where the data of file 1 ends
    body = next(r for r in truth if r.phys >= base).phys - base + 88 + 20      # (b"x" bytes)
    for damage, want in [(F.Damage("commitlog", rel, "flip", 5, bit=0), base + 5),
                         (F.Damage("commitlog", rel, "truncate", body), base + body),
                         (F.Damage("commitlog", rel, "zero", body, length=10), base + body),
                         (F.Damage("commitlog", rel, "zero", end + 10, length=20), F.NO_DAMAGE)]:
        store = _case(tmp_path, pristine_dir)
        assert F.apply_damage(store, damage) == want, damage
    assert F.apply_damage(_case(tmp_path, pristine_dir), F.Damage("index", F.files_of(pristine_dir, "index")[0],
                                                                   "flip", 0)) == F.NO_DAMAGE


def test_run_reports_each_kind(tmp_path):
    results = F.run(str(tmp_path / "w"), cases=20, seed=3)
    assert [r.kind for r in results] == [f"store:{k}" for k in F.KINDS]
    assert all(r.cases == 4 and r.failures == [] for r in results)
    assert sorted(os.listdir(tmp_path / "w")) == ["pristine", "pristine-killed"]
    assert FUZZERS["store"] == "hostmq.faults.store_fuzz:run"
