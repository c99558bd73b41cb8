"""The broker's consumer-group table (pure: time and liveness are arguments)."""
from __future__ import annotations

import pytest

from hostmq.broker.consumers import ConsumerTable

pytestmark = pytest.mark.timeout(60)


def test_members_join_change_groups_and_leave():
    t = ConsumerTable()
    assert t.heartbeat("c1", 10, [], ["g"], 0.0) == {"g"}
    assert t.heartbeat("c2", 11, ["pg"], ["g", "h"], 0.0) == {"g", "h"}
    assert t.heartbeat("c1", 10, [], ["g"], 5.0) == set()          # a repeat changes nothing
    assert t.members("g") == ["c1", "c2"] and t.members("h") == ["c2"] and t.groups() == ["g", "h"]
    assert t.heartbeat("c2", 11, ["pg"], ["h", "k"], 6.0) == {"g", "k"}
    assert t.members("g") == ["c1"]
    assert t.unregister("c1") == {"g"} and t.unregister("c1") == set()
    assert t.members("g") == [] and len(t) == 1


def test_silent_or_dead_clients_expire():
    t = ConsumerTable()
    t.heartbeat("old", 1, [], ["g"], 0.0)
    t.heartbeat("dead", 2, [], ["g", "x"], 100.0)
    t.heartbeat("alive", 3, [], ["g"], 100.0)
    t.heartbeat("nopid", 0, [], ["y"], 100.0)                        # pid unknown: only expiry applies
    changed = t.expire(120.5, 120.0, alive=lambda pid: pid != 2)
    assert changed == {"g", "x"}
    assert t.members("g") == ["alive"] and t.members("y") == ["nopid"]
    assert t.expire(200.0, 120.0, alive=lambda pid: True) == set()
    assert t.expire(221.0, 120.0, alive=lambda pid: True) == {"g", "y"} and len(t) == 0
