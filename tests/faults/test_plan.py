"""Fault kinds, configurations and the trial plan (pure)."""
from __future__ import annotations

import collections

import pytest

from hostmq.errors import FaultHarnessError
from hostmq.faults.plan import (TARGETS, FaultKind, RunOptions, all_kinds, cluster_config, make_plan, parse_configs,
                                parse_kinds)

pytestmark = pytest.mark.timeout(60)


def test_kind_names():
    assert FaultKind("writer").name == "writer:kill"
    assert FaultKind("broker", "stop").name == "broker:stop"
    assert FaultKind("broker", "kill", "mid-patch").name == "broker@mid-patch"
    names = [k.name for k in all_kinds()]
    assert len(names) == len(set(names))
    assert {k.target for k in all_kinds()} == set(TARGETS)


def test_parse_kinds_expands_targets_and_accepts_names():
    assert parse_kinds(None) == all_kinds()
    ks = parse_kinds("writer, consumer:stop,broker@mid-append,writer,broker:kill")
    assert [k.name for k in ks] == ["writer:kill", "writer:stop", "writer@mid-append", "writer@mid-patch",
                                    "writer@mid-journal", "writer@mid-roll", "writer@mid-commit", "consumer:stop",
                                    "broker@mid-append", "broker:kill"]
    for bad in ("kernel", "writer@mid-nothing", "consumer@mid-append"):
        with pytest.raises(FaultHarnessError, match="unknown fault kind"):
            parse_kinds(bad)


def test_configs():
    assert parse_configs(None) == ["async"]
    assert parse_configs("pool,async,pool") == ["pool", "async"]
    with pytest.raises(FaultHarnessError):
        parse_configs("fast")
    assert cluster_config("sync")["store"]["flush_disk_type"] == "SYNC_FLUSH"
    assert cluster_config("pool")["store"]["transient_store_pool_enable"] is True
    assert "transient_store_pool_enable" not in cluster_config("async")["store"]


def test_the_failover_kind_exists_only_with_a_slave():
    """``master:promote`` — kill the master, promote its slave — is the master target's one kind,
    and only the ha configuration has a slave to promote."""
    kind = FaultKind("master", "promote")
    assert kind.name == "master:promote"
    assert [k for k in all_kinds() if k.target == "master"] == [kind]
    assert parse_kinds("master") == parse_kinds("master:promote") == [kind]
    assert [k.name for k in parse_kinds("slave:kill,master,broker:kill")] == ["slave:kill", "master:promote",
                                                                             "broker:kill"]
    for bad in ("master:kill", "master:stop", "master@mid-append"):
        with pytest.raises(FaultHarnessError, match="unknown fault kind"):
            parse_kinds(bad)
    assert kind.applies("ha") and not any(kind.applies(c) for c in ("async", "sync", "pool"))
    plan = make_plan(9, parse_kinds("master,broker:kill,slave:kill"), ["async", "ha"], seed=3)
    assert ("async", kind) not in plan
    ha = collections.Counter(k.name for c, k in plan if c == "ha")
    assert set(ha) == {"master:promote", "broker:kill", "slave:kill"} and sorted(ha.values()) == [1, 1, 2]


def test_attack_kinds_apply_where_their_target_exists():
    """Replication attacks need the ha configuration's slave; a hostile group member works against
    every configuration."""
    kinds = {k.action: k for k in parse_kinds("attack")}
    assert set(kinds) == {"forged-master", "squat", "promote-recovering", "member-admin", "relay"}
    assert all(k.name == f"attack:{a}" for a, k in kinds.items())
    for action in ("forged-master", "squat", "promote-recovering", "relay"):
        assert kinds[action].applies("ha") and not any(kinds[action].applies(c) for c in ("async", "sync", "pool"))
    assert all(kinds["member-admin"].applies(c) for c in ("async", "sync", "pool", "ha"))
    with pytest.raises(FaultHarnessError, match="unknown fault kind"):
        parse_kinds("attack:kill")


def test_windows_only_where_they_exist():
    assert not FaultKind("broker", "kill", "mid-commit").applies("async")
    assert FaultKind("broker", "kill", "mid-commit").applies("pool")
    assert not FaultKind("broker", "kill", "mid-patch").applies("pool")
    assert FaultKind("writer").applies("pool")


def test_plan_spreads_trials_evenly_and_is_seeded():
    kinds = parse_kinds("writer,broker")
    plan = make_plan(50, kinds, ["async", "pool"], seed=3)
    assert plan == make_plan(50, kinds, ["async", "pool"], seed=3) != make_plan(50, kinds, ["async", "pool"], seed=4)
    per_config = collections.Counter(c for c, _ in plan)
    assert per_config == {"async": 25, "pool": 25}
    async_kinds = collections.Counter(k.name for c, k in plan if c == "async")
    usable = [k for k in kinds if k.applies("async")]
    assert set(async_kinds) == {k.name for k in usable}
    assert max(async_kinds.values()) - min(async_kinds.values()) <= 1
    assert all(k.applies(c) for c, k in plan)
    assert make_plan(0, kinds, ["async"], 0) == []
    assert len(make_plan(7, kinds, ["async", "pool", "sync"], 0)) == 7


def test_options_are_checked():
    with pytest.raises(FaultHarnessError):
        RunOptions(trials=-1)
    with pytest.raises(FaultHarnessError):
        RunOptions(fuzz_cases=-5)
