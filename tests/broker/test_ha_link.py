"""What both ends of a replication link share (``broker/ha_link.py``): the owner-only secret, the
endpoint a proof binds, and when a master listens at all."""
from __future__ import annotations

import os
import stat

import pytest

from hostmq.broker.ha_link import endpoint, listen_address, replication_secret
from hostmq.live.runtime import BrokerRuntime
from hostmq.config import Config

pytestmark = pytest.mark.timeout(30)


def test_the_secret_is_made_owner_only_and_a_group_readable_one_is_tightened(tmp_path):
    path = str(tmp_path / "ha.secret")
    assert replication_secret(path, create=False) is None
    made = replication_secret(path, create=True)
    assert len(made) == 32 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert replication_secret(path, create=True) == made
    os.chmod(path, 0o640)                                   # as an older hostmq made it
    assert replication_secret(path, create=False) == made
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


@pytest.mark.parametrize("addr,text", [(("127.0.0.1", 10912), "127.0.0.1:10912"),
                                       (("::ffff:127.0.0.1", 5, 0, 0), "127.0.0.1:5"),
                                       (("::1", 7, 0, 0), "[::1]:7"),
                                       (("fe80::1%eth0", 7, 0, 2), "[fe80::1]:7")])
def test_both_ends_name_one_endpoint_alike(addr, text):
    assert endpoint(addr) == text


def test_a_master_listens_only_when_a_slave_is_configured_or_it_is_told_to(tmp_path):
    root = str(tmp_path)

    def rt(broker: dict, broker_id: int = 0, epoch: int = 0) -> BrokerRuntime:
        return BrokerRuntime(root, "broker-a", broker_id, Config.from_dict({"broker": broker}), epoch=epoch)
    assert listen_address(rt({})) == ""
    assert listen_address(rt({"ha_listen": "tcp://10.0.0.1:10912"})) == "tcp://10.0.0.1:10912"
    assert listen_address(rt({"role": "SYNC_MASTER"})) == "tcp://127.0.0.1:0"
    assert listen_address(rt({}, 1, epoch=1)) == "tcp://127.0.0.1:0"              # promoted: its old master rejoins
    assert listen_address(rt({"role": "SLAVE"}, 1)) == ""                        # a slave never listens
    os.makedirs(os.path.join(root, "brokers", "broker-a.1"))                     # a slave of it on this root
    assert listen_address(rt({})) == "tcp://127.0.0.1:0"
