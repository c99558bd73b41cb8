"""Idle strategies (hostmq/waiting.py, CONVENTIONS §19): each spends its budget as it says, then sleeps
on the futex; ``sleep`` and ``auto`` on a machine without spare cores never spin; strings parse or
fail typed; config keys and client arguments map onto strategies (the old ``spin_s`` too)."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from hostmq.config import BrokerConfig, Config
from hostmq.errors import ConfigError, IdleStrategyError
from hostmq.shm import Flag, FutexWord, WaitStats, wait_for
from hostmq import waiting
from hostmq.waiting import SLEEP, IdleStrategy, available_cores, client_idle

pytestmark = pytest.mark.timeout(60)


def checks_before_blocking(words, seg, idle: IdleStrategy, *, deadline_s: float = 0.05) -> tuple[int, int, WaitStats]:
    """Wait on a predicate that never holds: (checks made before the waiting flag was set — the entry
    check plus the strategy's phase —, checks after it, stats)."""
    flag = Flag(words, 1)
    arr = seg.array(np.int64, 32)
    before, after = [0], [0]

    def never():
        (after if flag.is_set() else before)[0] += 1
        return False
    st = WaitStats()
    assert not wait_for(never, FutexWord(arr, 0), time.monotonic() + deadline_s, flag=flag, idle=idle,
                        block_slice_s=0.01, stats=st)
    assert not flag.is_set()
    return before[0], after[0], st


@pytest.mark.parametrize("kind", ["spin", "yield", "backoff"])
def test_a_spinning_strategy_spends_its_budget_then_sleeps_on_the_futex(words, seg, kind):
    before, after, st = checks_before_blocking(words, seg, IdleStrategy(kind, 2000.0), deadline_s=0.5)
    assert before > 2, f"{kind} re-checked only {before - 1} times in its budget"
    assert after >= 1 and st.blocked == 1 and st.slices >= 1 and st.spin_hits == 0


def test_sleep_goes_to_the_futex_at_once(words, seg):
    before, after, st = checks_before_blocking(words, seg, IdleStrategy("sleep", 5000.0))
    assert before == 1 and after >= 1 and st.blocked == 1


def test_a_spin_sees_a_store_without_blocking(words, seg):
    arr = seg.array(np.int64, 32)
    for kind in ("spin", "yield", "backoff"):
        calls = []
        st = WaitStats()
        assert wait_for(lambda: calls.append(1) or len(calls) >= 5, FutexWord(arr, 0), time.monotonic() + 5,
                        idle=IdleStrategy(kind, 1e6), stats=st)
        assert (st.spin_hits, st.blocked) == (1, 0), kind


def test_yield_gives_the_core_away_and_spin_does_not(words, seg, monkeypatch):
    yields = [0]
    real = os.sched_yield

    def counting():
        yields[0] += 1
        real()
    monkeypatch.setattr(waiting.os, "sched_yield", counting)
    checks_before_blocking(words, seg, IdleStrategy("spin", 2000.0))
    assert yields[0] == 0
    checks_before_blocking(words, seg, IdleStrategy("yield", 2000.0))
    assert yields[0] > 0


def test_auto_never_spins_where_processes_outnumber_cores():
    for cores in (1, 2, 4):
        assert IdleStrategy.auto(cores=cores) == IdleStrategy("sleep", waiting.DEFAULT_SPIN_US)
        assert not IdleStrategy.auto(cores=cores).spins
    assert IdleStrategy.auto(cores=16).kind == "backoff" and IdleStrategy.auto(cores=16).spins
    assert IdleStrategy.auto(1, cores=2).kind == "backoff"          # one process on two cores may


def test_auto_on_two_cores_picks_sleep_for_the_broker_and_clients(words, seg, monkeypatch):
    """Narrow this process to two CPUs (as on the 2-vCPU machine): the broker's keys and a client's
    default resolve to ``sleep``, and a wait with it never re-checks before the futex."""
    monkeypatch.delenv("HOSTMQ_IDLE", raising=False)
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(mask)[:2])
    try:
        assert available_cores() <= 2
        cfg = BrokerConfig()
        for who in ("writer", "dispatcher", "flusher"):
            assert cfg.idle_strategy(who).kind == "sleep", who
        idle = client_idle(None, None, 200e-6)
        assert idle.kind == "sleep" and idle.spin_s == 0.0
        before, _, _ = checks_before_blocking(words, seg, idle)
        assert before == 1
    finally:
        os.sched_setaffinity(0, mask)


@pytest.mark.parametrize("text, want", [
    ("spin", IdleStrategy("spin", 50.0)), ("yield:20", IdleStrategy("yield", 20.0)),
    ("backoff:50", IdleStrategy("backoff", 50.0)), (" Sleep ", IdleStrategy("sleep", 50.0)),
    ("spin:0", IdleStrategy("spin", 0.0)), ("backoff:2.5", IdleStrategy("backoff", 2.5)),
])
def test_strings_parse(text, want):
    assert IdleStrategy.parse(text) == want
    assert IdleStrategy.parse(str(want)) == want or want.kind == "sleep"


def test_without_a_budget_in_the_string_the_legacy_budget_applies():
    assert IdleStrategy.parse("spin", spin_us=120.0) == IdleStrategy("spin", 120.0)
    assert IdleStrategy.parse("spin:7", spin_us=120.0) == IdleStrategy("spin", 7.0)


@pytest.mark.parametrize("bad", ["fast", "spin:", "spin:abc", "spin:-1", "spin:nan", "spin:inf", "backoff:1e9",
                                 "spin:50:3", 50, b"spin"])
def test_bad_strings_raise_a_typed_error(bad):
    with pytest.raises(IdleStrategyError) as e:
        IdleStrategy.parse(bad, what="broker.writer_idle")
    assert isinstance(e.value, ConfigError)


def test_bad_constructor_arguments_raise_a_typed_error():
    with pytest.raises(IdleStrategyError):
        IdleStrategy("busy", 1.0)
    with pytest.raises(IdleStrategyError):
        IdleStrategy("spin", -1.0)
    with pytest.raises(IdleStrategyError):
        IdleStrategy("spin", True)


def test_a_bad_config_key_names_itself():
    with pytest.raises(ConfigError, match="broker.writer_idle"):
        Config.from_dict({"broker": {"writer_idle": "turbo"}})
    with pytest.raises(ConfigError, match="broker.dispatcher_idle"):
        Config.from_dict({"broker": {"dispatcher_idle": "spin:x"}})
    cfg = Config.from_dict({"broker": {"writer_idle": "spin", "writer_spin_s": 80e-6,
                                       "dispatcher_idle": "yield:30", "flusher_idle": "sleep"}}).broker
    assert cfg.idle_strategy("writer") == IdleStrategy("spin", 80.0)
    assert cfg.idle_strategy("dispatcher") == IdleStrategy("yield", 30.0)
    assert not cfg.idle_strategy("flusher").spins


def test_client_arguments_map_onto_strategies(monkeypatch):
    monkeypatch.delenv("HOSTMQ_IDLE", raising=False)
    assert client_idle(None, 300e-6, 50e-6) == IdleStrategy("spin", 300.0)       # the old spin_s meaning
    assert client_idle(None, 0.0, 50e-6) == SLEEP
    assert client_idle("yield", 300e-6, 50e-6) == IdleStrategy("yield", 300.0)
    assert client_idle(IdleStrategy("spin", 9.0), None, 50e-6) == IdleStrategy("spin", 9.0)
    monkeypatch.setenv("HOSTMQ_IDLE", "spin:33")                                  # the per-process default
    assert client_idle(None, None, 50e-6) == IdleStrategy("spin", 33.0)
    monkeypatch.setenv("HOSTMQ_IDLE", "warp")
    with pytest.raises(IdleStrategyError):
        client_idle(None, None, 50e-6)
    with pytest.raises(IdleStrategyError):
        client_idle(None, "fast", 50e-6)
