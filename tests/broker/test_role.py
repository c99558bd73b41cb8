"""Role records, the group's master on a root and when a promotion is refused (``live/role.py``,
``live/group.py``, ``broker/promotion.py``, ``admin/promotion.py``): pure rules and real files, no processes."""
from __future__ import annotations

import os

import pytest

from hostmq.admin import promotion
from hostmq.broker import promotion as broker_promotion
from hostmq.live import group, role
from hostmq.live.runtime import BrokerRuntime
from hostmq.config import Config
from hostmq.errors import ConfigError, PromotionRefusedError
from hostmq.jsonfile import write_json
from hostmq.root import RootPaths

pytestmark = pytest.mark.timeout(30)
SLAVE = Config().with_overrides({"broker": {"role": "SLAVE"}})


def test_an_id_says_the_role_until_a_record_changes_it(tmp_path):
    master = BrokerRuntime(str(tmp_path), "broker-a", 0)
    slave = BrokerRuntime(str(tmp_path), "broker-a", 1, SLAVE)
    assert (master.is_slave, master.registered_id) == (False, 0)
    assert (slave.is_slave, slave.registered_id) == (True, 1)
    assert role.current(slave) is slave                          # no record: as started
    role.save(slave, role.RoleRecord("SYNC_MASTER", 3))
    promoted = role.current(slave)
    assert (promoted.is_slave, promoted.registered_id, promoted.epoch) == (False, 0, 3)
    assert promoted.config.broker.role == "SYNC_MASTER" and promoted.instance == "broker-a.1"
    role.save(master, role.demoted(0, 1, 3))
    demoted = role.current(master)
    assert (demoted.is_slave, demoted.registered_id, demoted.epoch, demoted.instance) == (True, 1, 3, "broker-a")


def test_the_configuration_alone_cannot_swap_roles(tmp_path):
    with pytest.raises(ConfigError, match="id 0 is the master"):
        BrokerRuntime(str(tmp_path), "broker-a", 0, SLAVE)
    with pytest.raises(ConfigError, match="hostmq ha promote"):
        BrokerRuntime(str(tmp_path), "broker-a", 2)


@pytest.mark.parametrize("bad", [{"role": "BOSS"}, {"role": "SLAVE", "epoch": -1}, {"role": "SLAVE", "epoch": "1"},
                                 {"role": "SLAVE", "slave_id": 2000}, {"role": "SLAVE", "extra": 1}, [1], "x"])
def test_a_broken_role_record_is_a_config_error_naming_the_file(tmp_path, bad):
    rt = BrokerRuntime(str(tmp_path), "broker-a", 1, SLAVE)
    write_json(role.path(rt), bad)
    with pytest.raises(ConfigError, match="role.json"):
        role.current(rt)


def _instance(root: str, name: str, record: role.RoleRecord | None = None) -> None:
    paths = RootPaths(root)
    os.makedirs(paths.config_dir(name))
    if record is not None:
        write_json(role.instance_path(paths, name), record.to_dict())


def test_a_stopped_group_is_read_at_the_instance_its_records_say_is_the_master(tmp_path):
    root = str(tmp_path)
    _instance(root, "broker-a")
    _instance(root, "broker-a.1")
    _instance(root, "broker-a.2")
    _instance(root, "broker-ab")                     # another name that shares the prefix
    assert group.instance_ids(root, "broker-a") == [0, 1, 2]
    assert group.recorded_master(root, "broker-a") == "broker-a" and group.newest_epoch(root, "broker-a") == 0
    write_json(role.instance_path(RootPaths(root), "broker-a.2"), role.RoleRecord("ASYNC_MASTER", 1).to_dict())
    write_json(role.instance_path(RootPaths(root), "broker-a"), role.demoted(0, 2, 1).to_dict())
    assert group.recorded_master(root, "broker-a") == "broker-a.2" and group.newest_epoch(root, "broker-a") == 1
    write_json(role.instance_path(RootPaths(root), "broker-a.1"), role.RoleRecord("SYNC_MASTER", 2).to_dict())
    assert group.recorded_master(root, "broker-a") == "broker-a.1" and group.newest_epoch(root, "broker-a") == 2
    assert group.running_master(root, "broker-a") is None and group.running_slave(root, "broker-a") is None


def test_demote_writes_a_slave_record_for_a_stopped_master_only(tmp_path):
    root = str(tmp_path)
    _instance(root, "broker-a")
    out = promotion.demote(root, "broker-a", 0, epoch=4, slave_id=2)
    assert out == {"instance": "broker-a", "role": "SLAVE", "epoch": 4, "slave_id": 2}
    assert role.current(BrokerRuntime(root, "broker-a", 0)).registered_id == 2
    import fcntl
    fd = os.open(RootPaths(root).broker_lock("broker-a"), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)              # as a running broker holds it
        with pytest.raises(PromotionRefusedError, match="runs"):
            promotion.demote(root, "broker-a", 0, epoch=5)
    finally:
        os.close(fd)


BASE = dict(is_slave=True, replica_connected=False, write_pos=1000, master_end_pos=1000, master_running=None,
            force=False)


@pytest.mark.parametrize("change,why", [
    ({}, None),
    ({"write_pos": 1200}, None),                                   # more than it heard of: fine
    ({"is_slave": False}, "master of its group already"),
    ({"master_running": "broker-a"}, "runs on this root"),
    ({"replica_connected": True}, "connected to the master"),
    ({"write_pos": 900}, "100 bytes would be lost"),
    ({"write_pos": 900, "force": True}, None),
    ({"replica_connected": True, "force": True}, "connected to the master"),   # force never passes a live master
])
def test_when_a_promotion_is_refused(change, why):
    got = broker_promotion.refusal(**{**BASE, **change})
    assert (got is None) if why is None else (why in got)


def test_the_slave_read_bound_is_a_share_of_ram_published_by_masters_with_slave_reads_on(tmp_path):
    on = Config().with_overrides({"broker": {"slave_read_enable": True}})
    gib = 1 << 30
    assert role.slave_read_lag_bytes(BrokerRuntime(str(tmp_path), "broker-a", 0), 24 * gib) == 0     # off by default
    assert role.slave_read_lag_bytes(BrokerRuntime(str(tmp_path), "broker-a", 0, on), 10 * gib) == 4 * gib  # 40 %
    quarter = on.with_overrides({"broker": {"access_message_in_memory_max_ratio": 25}})
    assert role.slave_read_lag_bytes(BrokerRuntime(str(tmp_path), "broker-a", 0, quarter), 8 * gib) == 2 * gib
    slave = on.with_overrides({"broker": {"role": "SLAVE"}})
    assert role.slave_read_lag_bytes(BrokerRuntime(str(tmp_path), "broker-a", 1, slave), 8 * gib) == 0
    for bad in (0, 101, -1):
        with pytest.raises(ConfigError, match="access_message_in_memory_max_ratio"):
            Config().with_overrides({"broker": {"access_message_in_memory_max_ratio": bad}})
