"""Caps on what group members' requests create (issue 27), pure."""
from __future__ import annotations

import pytest

from hostmq.config import BrokerConfig
from hostmq.errors import PermissionDeniedError
from hostmq.broker.quotas import MemberLedger, Quota

pytestmark = pytest.mark.timeout(60)


def test_a_quota_caps_each_uid_and_all_together_and_counts_nothing_it_refuses():
    q = Quota("consumer groups", "max_groups", per_uid=3, total=5)
    q.charge(1, 3)
    with pytest.raises(PermissionDeniedError, match=r"uid 1 has made 3 consumer groups.*max_groups_per_uid = 3"):
        q.charge(1)
    q.charge(2, 2)
    with pytest.raises(PermissionDeniedError, match=r"max_groups = 5"):
        q.charge(3)
    assert (q.of(1), q.of(2), q.of(3), q.count) == (3, 2, 0, 5)
    with pytest.raises(PermissionDeniedError):
        q.charge(2, 2)                                # all or nothing
    assert q.of(2) == 2
    q.release(1, 2)
    q.charge(3)
    assert (q.of(1), q.of(3), q.count) == (1, 1, 4)
    q.release(9, 5)                                   # a uid with nothing gives nothing back
    assert q.count == 4


def ledger(**caps) -> MemberLedger:
    return MemberLedger(BrokerConfig(**caps), "broker broker-a", "the owner of /r")


def test_a_flood_of_new_client_ids_and_groups_stops_at_the_uid_caps():
    m = ledger(max_groups_per_uid=10, max_clients_per_uid=20)
    refused = 0
    for i in range(100):
        try:
            m.admit_heartbeat(7, f"c{i}", 1, [f"g{i}"])
        except PermissionDeniedError:
            refused += 1
    assert refused == 90 and m.groups.of(7) == 10 and m.clients.of(7) == 10   # a refused heartbeat counts nothing
    m.admit_heartbeat(8, "other", 1, ["h"])           # another uid is not held back by uid 7's flood
    for i in range(10):
        m.admit_heartbeat(None, f"owner-{i}", 1, [f"o{i}"])    # an owner's requests are not counted
    assert m.groups.count == 11


def test_a_client_id_belongs_to_the_uid_that_named_it_first():
    m = ledger()
    m.admit_heartbeat(7, "c1", 1, [])
    m.admit_heartbeat(7, "c1", 1, [])                 # again: no new count
    assert m.clients.of(7) == 1
    with pytest.raises(PermissionDeniedError, match="client id 'c1' is uid 7's"):
        m.admit_heartbeat(8, "c1", 1, [])
    with pytest.raises(PermissionDeniedError):
        m.check_client(8, "c1")
    m.check_client(None, "c1")                        # the owner may act for anyone
    m.forget_clients(["c1"])
    assert m.clients.of(7) == 0
    m.admit_heartbeat(8, "c1", 1, [])                 # gone: the id is free again


def test_a_heartbeat_naming_too_many_groups_is_refused():
    m = ledger(max_heartbeat_groups=4)
    with pytest.raises(PermissionDeniedError, match="at most 4 groups"):
        m.admit_heartbeat(None, "c", 5, [])
