"""The NameServer route table: registration, versions, master/slave, expiry, admin, KV, codecs, validation.

Time is a number the tests pass in (``T0 + offset``); no test reads a clock or sleeps.
"""
from __future__ import annotations

import copy
import dataclasses

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hostmq.errors import ValidationError
from hostmq.protocol.route_data import (MAX_QUEUES, PERM_READ, PERM_WRITE, cluster_info_from_dict,
                                       cluster_info_to_dict)
from hostmq.namesrv.routes import (DEFAULT_BROKER_EXPIRY_MS, ORDER_TOPIC_CONFIG_NAMESPACE, BrokerData,
                                   QueueData, RegisterResult, RouteTable, TopicConfig, TopicRouteData)

pytestmark = pytest.mark.timeout(30)

T0 = 1_700_000_000_000
EXPIRY = DEFAULT_BROKER_EXPIRY_MS
A0 = "ipc:///r/brokers/broker-a/broker.sock"
A1 = "ipc:///r/a-slave.sock"
B0 = "ipc:///r/brokers/broker-b/broker.sock"


def tc(name: str, queues: int = 4, **kw) -> TopicConfig:
    return TopicConfig(name, read_queues=queues, write_queues=queues, **kw)


def topics(*configs: TopicConfig) -> dict[str, TopicConfig]:
    return {c.topic_name: c for c in configs}


def register(table: RouteTable, name: str, address: str, configs=(), *, broker_id: int = 0,
             version: int = 1, now_ms: int = T0, cluster: str = "c1",
             ha: str | None = None) -> RegisterResult:
    return table.register_broker(cluster, name, broker_id, address, ha, topics(*configs), version, now_ms)


def snapshot(table: RouteTable) -> dict:
    """Every table of the object, deep-copied, so any change at all shows up in a comparison."""
    return copy.deepcopy(vars(table))


def route_brokers(table: RouteTable, topic: str) -> list[str]:
    route = table.topic_route(topic)
    return [] if route is None else [q.broker_name for q in route.queue_datas]


def check_invariants(table: RouteTable) -> None:
    info = table.cluster_info()
    addresses = [a for b in info["brokers"].values() for a in b.addrs.values()]
    assert len(addresses) == len(set(addresses)), "an address is in two records"
    assert set(addresses) == set(info["live"]), "live table and broker table disagree"
    assert all(b.addrs for b in info["brokers"].values())
    in_clusters = [n for names in info["clusters"].values() for n in names]
    assert sorted(in_clusters) == sorted(info["brokers"]), "every broker name in exactly one cluster"
    assert all(info["clusters"].values())
    for name, b in info["brokers"].items():
        assert name in info["clusters"][b.cluster]
    for topic in table.all_topics():
        route = table.topic_route(topic)
        assert route is not None and route.queue_datas
        assert [b.broker_name for b in route.broker_datas] == [q.broker_name for q in route.queue_datas]


# ---------------------------------------------------------------------------------------------
# Registration and routes
# ---------------------------------------------------------------------------------------------
def test_two_brokers_with_overlapping_topics():
    t = RouteTable()
    assert register(t, "broker-b", B0, [tc("shared", 8), tc("only-b")]) == RegisterResult()
    assert register(t, "broker-a", A0, [tc("shared"), tc("only-a", perm=PERM_READ)]) == RegisterResult()

    route = t.topic_route("shared")
    assert route == TopicRouteData(
        queue_datas=[QueueData("broker-a", 4, 4, PERM_READ | PERM_WRITE), QueueData("broker-b", 8, 8, 6)],
        broker_datas=[BrokerData("c1", "broker-a", {0: A0}), BrokerData("c1", "broker-b", {0: B0})])
    assert t.topic_route("only-a") == TopicRouteData([QueueData("broker-a", 4, 4, PERM_READ)],
                                                     [BrokerData("c1", "broker-a", {0: A0})])
    assert route_brokers(t, "only-b") == ["broker-b"]
    assert t.topic_route("nobody") is None
    assert t.all_topics() == ["only-a", "only-b", "shared"]
    assert t.topics_by_cluster("c1") == ["only-a", "only-b", "shared"]
    assert t.topics_by_cluster("other") == []
    assert t.cluster_info() == {
        "brokers": {"broker-a": BrokerData("c1", "broker-a", {0: A0}),
                    "broker-b": BrokerData("c1", "broker-b", {0: B0})},
        "clusters": {"c1": ["broker-a", "broker-b"]},
        "live": {A0: T0, B0: T0}}
    check_invariants(t)


def test_returned_values_do_not_alias_the_table():
    t = RouteTable()
    register(t, "broker-a", A0, [tc("t")])
    t.topic_route("t").broker_datas[0].addrs[7] = "x"
    t.cluster_info()["brokers"]["broker-a"].addrs.clear()
    t.cluster_info()["clusters"]["c1"].append("ghost")
    assert t.topic_route("t").broker_datas[0].addrs == {0: A0}
    assert t.cluster_info()["clusters"] == {"c1": ["broker-a"]}


def test_same_data_version_keeps_queue_data_new_version_replaces_it():
    t = RouteTable()
    register(t, "broker-a", A0, [tc("keep"), tc("drop"), tc("resize", 4)], version=1)
    register(t, "broker-b", B0, [tc("drop")], version=1)

    # Same version: whatever is sent, the queue data stays as registered (RocketMQ trusts the version).
    register(t, "broker-a", A0, [tc("keep"), tc("resize", 16), tc("new")], version=1, now_ms=T0 + 30_000)
    assert t.all_topics() == ["drop", "keep", "resize"]
    assert t.topic_route("resize").queue_datas[0].write_queues == 4
    assert t.cluster_info()["live"][A0] == T0 + 30_000    # liveness is still refreshed

    # New version: the broker's queue data becomes exactly what it sent.
    register(t, "broker-a", A0, [tc("keep"), tc("resize", 16), tc("new")], version=2, now_ms=T0 + 60_000)
    assert t.all_topics() == ["drop", "keep", "new", "resize"]
    assert t.topic_route("resize").queue_datas == [QueueData("broker-a", 16, 16, 6)]
    assert route_brokers(t, "drop") == ["broker-b"]     # broker-a stopped sending it; broker-b still has it
    assert route_brokers(t, "new") == ["broker-a"]

    register(t, "broker-b", B0, [], version=2)
    assert "drop" not in t.all_topics()                  # no queue data left: the topic goes
    assert t.topic_route("drop") is None
    assert t.cluster_info()["clusters"] == {"c1": ["broker-a", "broker-b"]}   # broker-b stays registered
    check_invariants(t)


def test_master_and_slave():
    t = RouteTable()
    # A slave registering before its master learns nothing, and its topics make no route.
    assert register(t, "broker-a", A1, [tc("t")], broker_id=1, ha="ignored") == RegisterResult()
    assert t.topic_route("t") is None
    assert register(t, "broker-a", A0, [tc("t")], ha="ha-a:10912") == RegisterResult()
    result = register(t, "broker-a", A1, [tc("t"), tc("slave-only")], broker_id=1, now_ms=T0 + 1)
    assert result == RegisterResult(master_address=A0, ha_server_address="ha-a:10912")
    assert t.all_topics() == ["t"]
    assert t.topic_route("t").broker_datas == [BrokerData("c1", "broker-a", {0: A0, 1: A1})]
    # A master without an HA server: the slave gets the address and None.
    register(t, "broker-a", A0, [tc("t")], ha="")
    assert register(t, "broker-a", A1, [tc("t")], broker_id=1).ha_server_address is None
    check_invariants(t)


def test_slave_promoted_at_the_same_address_replaces_its_old_record():
    t = RouteTable()
    register(t, "broker-a", A0, [tc("t")])
    register(t, "broker-a", A1, [tc("t")], broker_id=1)
    t.unregister_broker("c1", "broker-a", 0, A0, T0)
    # Without a master the topic stays readable on the slave.
    assert t.topic_route("t").broker_datas == [BrokerData("c1", "broker-a", {1: A1})]
    register(t, "broker-a", A1, [tc("t"), tc("u")], broker_id=0, version=1)   # same version, new role
    assert t.cluster_info()["brokers"]["broker-a"].addrs == {0: A1}
    assert route_brokers(t, "u") == ["broker-a"]          # a new record always brings its topics
    check_invariants(t)


def test_an_id_at_a_new_address_drops_the_old_address():
    t = RouteTable()
    register(t, "broker-a", A0, [tc("t")])
    register(t, "broker-a", "ipc:///moved.sock", [tc("t")], now_ms=T0 + 5)
    info = t.cluster_info()
    assert info["brokers"]["broker-a"].addrs == {0: "ipc:///moved.sock"}
    assert info["live"] == {"ipc:///moved.sock": T0 + 5}
    assert t.heartbeat(A0, T0 + 6) is False
    check_invariants(t)


def test_an_address_moving_to_another_broker_name_leaves_the_old_one():
    t = RouteTable()
    register(t, "broker-a", A0, [tc("a")])
    register(t, "broker-b", A0, [tc("b")])
    assert t.cluster_info()["brokers"] == {"broker-b": BrokerData("c1", "broker-b", {0: A0})}
    assert t.all_topics() == ["b"]
    check_invariants(t)


def test_a_broker_name_cannot_be_in_two_clusters():
    t = RouteTable()
    register(t, "broker-a", A0, [tc("t")])
    before = snapshot(t)
    with pytest.raises(ValidationError, match="^cluster: .*registered in cluster 'c1'"):
        register(t, "broker-a", A1, [tc("t")], broker_id=1, cluster="c2")
    assert snapshot(t) == before
    t.unregister_broker("c1", "broker-a", 0, A0, T0)
    register(t, "broker-a", A0, [tc("t")], cluster="c2")
    assert t.cluster_info()["clusters"] == {"c2": ["broker-a"]}


# ---------------------------------------------------------------------------------------------
# Liveness and expiry
# ---------------------------------------------------------------------------------------------
def test_silent_broker_expires_heartbeating_broker_stays_and_reregistration_restores():
    t = RouteTable()
    register(t, "broker-a", A0, [tc("shared"), tc("only-a")])
    register(t, "broker-b", B0, [tc("shared")], cluster="c2")
    for now in range(T0 + 30_000, T0 + EXPIRY + 1, 30_000):       # broker-b heartbeats every 30 s
        assert t.heartbeat(B0, now) is True
        assert t.scan_expired(now, EXPIRY) == []    # at the last scan broker-a is exactly at the limit
    assert now == T0 + EXPIRY and t.broker_alive(A0, now, EXPIRY) is True
    assert t.broker_alive(A0, T0 + EXPIRY + 1, EXPIRY) is False
    assert t.scan_expired(T0 + EXPIRY + 1) == [A0]

    assert t.topic_route("only-a") is None
    assert route_brokers(t, "shared") == ["broker-b"]
    assert t.cluster_info() == {"brokers": {"broker-b": BrokerData("c2", "broker-b", {0: B0})},
                                "clusters": {"c2": ["broker-b"]}, "live": {B0: T0 + EXPIRY}}
    assert t.heartbeat(A0, T0 + EXPIRY + 2) is False               # an expired broker must register again
    assert t.broker_live(A0) is None

    register(t, "broker-a", A0, [tc("shared"), tc("only-a")], now_ms=T0 + EXPIRY + 3)   # same version
    assert route_brokers(t, "shared") == ["broker-a", "broker-b"]
    assert route_brokers(t, "only-a") == ["broker-a"]
    assert t.broker_alive(A0, T0 + EXPIRY + 3, EXPIRY)
    check_invariants(t)


def test_expired_slave_leaves_the_master_and_the_routes():
    t = RouteTable()
    register(t, "broker-a", A0, [tc("t")])
    register(t, "broker-a", A1, [tc("t")], broker_id=1, now_ms=T0 - 10)
    assert t.scan_expired(T0 + EXPIRY + 1 - 10, EXPIRY) == [A1]
    assert t.topic_route("t").broker_datas == [BrokerData("c1", "broker-a", {0: A0})]
    assert t.scan_expired(T0 + EXPIRY + 1, EXPIRY) == [A0]
    assert t.cluster_info() == {"brokers": {}, "clusters": {}, "live": {}}
    assert t.all_topics() == []


def test_heartbeat_keeps_data_version_and_ha_address():
    t = RouteTable()
    register(t, "broker-a", A0, [tc("t")], version=7, ha="ha")
    assert t.heartbeat(A0, T0 + 10)
    live = t.broker_live(A0)
    assert (live.last_update_ms, live.data_version, live.ha_address) == (T0 + 10, 7, "ha")


# ---------------------------------------------------------------------------------------------
# Unregister and admin
# ---------------------------------------------------------------------------------------------
def test_unregister():
    t = RouteTable()
    register(t, "broker-a", A0, [tc("shared"), tc("only-a")])
    register(t, "broker-a", A1, [], broker_id=1)
    register(t, "broker-b", B0, [tc("shared")], cluster="c2")

    before = snapshot(t)
    assert t.unregister_broker("c1", "broker-a", 0, A1, T0) is False     # not what the table holds
    assert t.unregister_broker("c2", "broker-a", 0, A0, T0) is False
    assert t.unregister_broker("c1", "nobody", 0, A0, T0) is False
    assert snapshot(t) == before

    assert t.unregister_broker("c1", "broker-a", 1, A1, T0) is True
    assert t.topic_route("only-a").broker_datas == [BrokerData("c1", "broker-a", {0: A0})]
    assert t.unregister_broker("c1", "broker-a", 0, A0, T0) is True
    assert t.topic_route("only-a") is None
    assert route_brokers(t, "shared") == ["broker-b"]
    assert t.cluster_info()["clusters"] == {"c2": ["broker-b"]}           # empty cluster c1 removed
    assert t.cluster_info()["live"] == {B0: T0}
    check_invariants(t)


def test_delete_topic():
    t = RouteTable()
    register(t, "broker-a", A0, [tc("t"), tc("u")])
    register(t, "broker-b", B0, [tc("t"), tc("u")], cluster="c2")
    assert t.delete_topic("t") is True
    assert t.topic_route("t") is None and t.all_topics() == ["u"]
    assert t.delete_topic("t") is False
    assert t.delete_topic("u", cluster="c2") is True                      # only that cluster's brokers
    assert route_brokers(t, "u") == ["broker-a"]
    assert t.delete_topic("u", cluster="nowhere") is False
    assert t.delete_topic("u", cluster="c1") is True
    assert t.all_topics() == []
    # The same data version does not bring a deleted topic back; a new one does.
    register(t, "broker-a", A0, [tc("t"), tc("u")], now_ms=T0 + 1)
    assert t.all_topics() == []
    register(t, "broker-a", A0, [tc("t"), tc("u")], version=2)
    assert t.all_topics() == ["t", "u"]


def test_wipe_and_add_write_perm():
    t = RouteTable()
    register(t, "broker-a", A0, [tc("t"), tc("u", perm=PERM_READ)])
    register(t, "broker-b", B0, [tc("t")])
    assert t.wipe_write_perm("broker-a") == 2
    assert [q.perm for q in t.topic_route("t").queue_datas] == [PERM_READ, PERM_READ | PERM_WRITE]
    assert t.add_write_perm("broker-a") == 2
    assert t.topic_route("u").queue_datas[0].perm == PERM_READ | PERM_WRITE
    assert t.wipe_write_perm("nobody") == 0


# ---------------------------------------------------------------------------------------------
# KV config
# ---------------------------------------------------------------------------------------------
def test_kv():
    t = RouteTable()
    assert t.get_kv("ns", "k") is None and t.kv_namespace("ns") == {}
    t.put_kv("ns", "k", "v1")
    t.put_kv("ns", "k", "v2")
    t.put_kv("ns", "j", "")
    assert t.get_kv("ns", "k") == "v2"
    assert t.kv_namespace("ns") == {"j": "", "k": "v2"}
    t.kv_namespace("ns")["k"] = "changed"                  # a copy
    assert t.get_kv("ns", "k") == "v2"
    assert t.delete_kv("ns", "k") is True and t.delete_kv("ns", "k") is False
    assert t.delete_kv("ns", "j") is True
    assert t.kv_snapshot() == {}                             # an emptied namespace goes

    t.put_kv("a", "x", "1")
    saved = orjson.loads(orjson.dumps(t.kv_snapshot()))
    other = RouteTable()
    other.load_kv(saved)
    assert other.kv_snapshot() == {"a": {"x": "1"}}
    before = snapshot(other)
    with pytest.raises(ValidationError, match=r"kv\['b'\]\['y'\]"):
        other.load_kv({"b": {"x": "1", "y": 2}})
    assert snapshot(other) == before


def test_order_topic_conf_comes_with_the_route():
    t = RouteTable()
    register(t, "broker-a", A0, [tc("ordered", order=True)])
    assert t.topic_route("ordered").order_topic_conf is None
    t.put_kv(ORDER_TOPIC_CONFIG_NAMESPACE, "ordered", "broker-a:4")
    route = t.topic_route("ordered")
    assert route.order_topic_conf == "broker-a:4" and route.queue_datas[0].order is True


# ---------------------------------------------------------------------------------------------
# Validation leaves the table unchanged
# ---------------------------------------------------------------------------------------------
GOOD = dict(cluster="c1", broker_name="broker-a", broker_id=0, address=A0, ha_address=None,
            topics={"t": TopicConfig("t")}, data_version=1, now_ms=T0)
BAD_REGISTRATIONS = [
    ("cluster", ""), ("cluster", None), ("broker_name", ""), ("broker_name", 3), ("broker_name", "x" * 256),
    ("broker_id", -1), ("broker_id", True), ("broker_id", 1.0), ("broker_id", 1 << 63),
    ("address", b"ipc://a"), ("address", ""), ("address", None), ("ha_address", 5),
    ("topics", None), ("topics", [TopicConfig("t")]), ("topics", {"t": {"topic_name": "t"}}),
    ("topics", {"t": TopicConfig("u")}), ("topics", {"bad topic": TopicConfig("t")}),
    ("data_version", -1), ("data_version", "1"), ("now_ms", -5), ("now_ms", 1.5),
]


@pytest.mark.parametrize("field,value", BAD_REGISTRATIONS,
                         ids=[f"{f}={v!r}"[:40] for f, v in BAD_REGISTRATIONS])
def test_bad_registration_changes_nothing(field, value):
    t = RouteTable()
    register(t, "broker-a", A0, [tc("t"), tc("u")])
    register(t, "broker-a", A1, [], broker_id=1)
    t.put_kv("ns", "k", "v")
    before = snapshot(t)
    with pytest.raises(ValidationError, match=f"^{field}"):
        t.register_broker(**{**GOOD, "data_version": 2, field: value})
    assert snapshot(t) == before


@pytest.mark.parametrize("call", [
    lambda t: t.unregister_broker("c1", "broker-a", -1, A0, T0),
    lambda t: t.unregister_broker("c1", "", 0, A0, T0),
    lambda t: t.unregister_broker("c1", "broker-a", 0, None, T0),
    lambda t: t.heartbeat(None, T0),
    lambda t: t.heartbeat(A0, -1),
    lambda t: t.scan_expired(T0, -1),
    lambda t: t.scan_expired("now"),
    lambda t: t.broker_alive(A0, T0, None),
    lambda t: t.topic_route(None),
    lambda t: t.topic_route(["t"]),
    lambda t: t.topics_by_cluster(""),
    lambda t: t.delete_topic(""),
    lambda t: t.delete_topic("t", cluster=""),
    lambda t: t.wipe_write_perm(""),
    lambda t: t.put_kv("", "k", "v"),
    lambda t: t.put_kv("ns", "", "v"),
    lambda t: t.put_kv("ns", "k", None),
    lambda t: t.delete_kv("ns", None),
    lambda t: t.load_kv([("ns", {})]),
    lambda t: t.load_kv({"ns": {"": "v"}}),
])
def test_bad_arguments_change_nothing(call):
    t = RouteTable()
    register(t, "broker-a", A0, [tc("t")])
    t.put_kv("ns", "k", "v")
    before = snapshot(t)
    with pytest.raises(ValidationError):
        call(t)
    assert snapshot(t) == before


@pytest.mark.parametrize("kwargs,field", [
    (dict(read_queues=0), "read_queues"), (dict(write_queues=MAX_QUEUES + 1), "write_queues"),
    (dict(read_queues="4"), "read_queues"), (dict(perm=16), "perm"), (dict(perm=-1), "perm"),
    (dict(order=1), "order"), (dict(topic_name=""), "topic_name"), (dict(topic_name="a b"), "topic_name"),
    (dict(topic_name="t" * 128), "topic_name"),
])
def test_topic_config_validates(kwargs, field):
    with pytest.raises(ValidationError, match=f"^{field}: "):
        TopicConfig(**{"topic_name": "t", **kwargs})


# ---------------------------------------------------------------------------------------------
# Dict round trips
# ---------------------------------------------------------------------------------------------
names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20)
topic_names = st.text("abcXYZ019_-%|", min_size=1, max_size=127)
queue_counts = st.integers(1, MAX_QUEUES)
perms = st.integers(0, 15)
broker_ids = st.integers(0, (1 << 63) - 1)
topic_configs = st.builds(TopicConfig, topic_names, queue_counts, queue_counts, perms, st.booleans())
queue_datas = st.builds(QueueData, names, queue_counts, queue_counts, perms, st.booleans())
broker_datas = st.builds(BrokerData, names, names, st.dictionaries(broker_ids, names, max_size=4))
route_datas = st.builds(TopicRouteData, st.lists(queue_datas, max_size=4), st.lists(broker_datas, max_size=4),
                        st.none() | st.text(max_size=30))
register_results = st.builds(RegisterResult, st.none() | names, st.none() | names)


@settings(max_examples=150, deadline=None)
@given(st.one_of(topic_configs, queue_datas, broker_datas, route_datas, register_results))
def test_records_round_trip_through_dicts_and_json(record):
    as_dict = record.to_dict()
    assert type(record).from_dict(as_dict) == record
    assert type(record).from_dict(orjson.loads(orjson.dumps(as_dict))) == record


WRONG_TYPED = {bool: [None, 1, "true", []], int: [None, "1", 1.5, True, []], str: [None, 7, b"x", []],
               list: [None, "x", {}, 3], dict: [None, "x", [], 3], type(None): [7, [], {}]}


@settings(max_examples=60, deadline=None)
@given(st.one_of(topic_configs, queue_datas, broker_datas, route_datas, register_results))
def test_broken_dicts_raise_validation_error(record):
    kind = type(record)
    as_dict = record.to_dict()
    defaulted = {f.name for f in dataclasses.fields(kind)
                 if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
    optional = {"order_topic_conf", "master_address", "ha_server_address"}     # may be None
    for key, value in as_dict.items():
        dropped = {k: v for k, v in as_dict.items() if k != key}
        if key in defaulted:
            kind.from_dict(dropped)
        else:
            with pytest.raises(ValidationError, match=f"^{key}: missing"):
                kind.from_dict(dropped)
        for wrong in WRONG_TYPED[type(value)]:
            if wrong is None and key in optional:
                continue
            with pytest.raises(ValidationError, match=f"^{key}"):
                kind.from_dict({**as_dict, key: wrong})
    with pytest.raises(ValidationError, match="^unknown_field: unknown"):
        kind.from_dict({**as_dict, "unknown_field": 1})
    for not_a_dict in (None, [], "{}", 3):
        with pytest.raises(ValidationError):
            kind.from_dict(not_a_dict)


@pytest.mark.parametrize("data,field", [
    ({"cluster": "c", "broker_name": "b", "addrs": {"-1": "a"}}, "addrs"),
    ({"cluster": "c", "broker_name": "b", "addrs": {"x": "a"}}, "addrs"),
    ({"cluster": "c", "broker_name": "b", "addrs": {"0": ""}}, "addrs"),
    ({"cluster": "c", "broker_name": "b", "addrs": []}, "addrs"),
    ({"cluster": "c", "broker_name": "", "addrs": {}}, "broker_name"),
])
def test_broker_data_from_dict_names_the_bad_field(data, field):
    with pytest.raises(ValidationError, match=f"^{field}"):
        BrokerData.from_dict(data)


def test_route_from_dict_names_the_nested_field():
    good = TopicRouteData([QueueData("a", 1, 1, 6)], [BrokerData("c", "a", {0: "x"})]).to_dict()
    good["queue_datas"][0]["perm"] = 99
    with pytest.raises(ValidationError, match=r"^queue_datas\[0\]\.perm: "):
        TopicRouteData.from_dict(good)


def test_cluster_info_round_trips_through_json():
    t = RouteTable()
    register(t, "broker-a", A0, [tc("t")])
    register(t, "broker-a", A1, [], broker_id=1, now_ms=T0 + 3)
    register(t, "broker-b", B0, [tc("t")], cluster="c2")
    info = t.cluster_info()
    wire = orjson.loads(orjson.dumps(cluster_info_to_dict(info)))
    assert cluster_info_from_dict(wire) == info
    with pytest.raises(ValidationError):
        cluster_info_from_dict({**wire, "live": {A0: "soon"}})


# ---------------------------------------------------------------------------------------------
# Random operation sequences keep the invariants
# ---------------------------------------------------------------------------------------------
BROKERS = [("c1", "broker-a"), ("c1", "broker-b"), ("c2", "broker-c")]
ADDRESSES = ["ipc:///a", "ipc:///b", "ipc:///c", "ipc:///d"]
operations = st.one_of(
    st.tuples(st.just("register"), st.sampled_from(BROKERS), st.integers(0, 2), st.sampled_from(ADDRESSES),
              st.lists(st.sampled_from(["t1", "t2", "t3"]), unique=True), st.integers(0, 3)),
    st.tuples(st.just("unregister"), st.sampled_from(BROKERS), st.integers(0, 2), st.sampled_from(ADDRESSES)),
    st.tuples(st.just("heartbeat"), st.sampled_from(ADDRESSES)),
    st.tuples(st.just("advance"), st.integers(0, 100_000)),
    st.tuples(st.just("delete"), st.sampled_from(["t1", "t2", "t3"])),
)


def served_by(table: RouteTable, name: str) -> set[str]:
    return {x for x in table.all_topics() if name in route_brokers(table, x)}


@settings(max_examples=300, deadline=None)
@given(st.lists(operations, max_size=40))
def test_random_operations_keep_invariants(ops):
    t = RouteTable()
    now = T0
    for op in ops:
        if op[0] == "register":
            _, (cluster, name), broker_id, address, topic_list, version = op
            row = t.cluster_info()["brokers"].get(name)
            prev = t.broker_live(address)
            replaces = (row is None or row.addrs.get(broker_id) != address or prev is None
                        or prev.data_version != version)
            served_before = served_by(t, name)
            register(t, name, address, [tc(x) for x in topic_list], broker_id=broker_id,
                     version=version, now_ms=now, cluster=cluster)
            if broker_id == 0 and replaces:
                assert served_by(t, name) == set(topic_list)
            elif row is not None:
                assert served_by(t, name) == served_before
        elif op[0] == "unregister":
            _, (cluster, name), broker_id, address = op
            t.unregister_broker(cluster, name, broker_id, address, now)
        elif op[0] == "heartbeat":
            t.heartbeat(op[1], now)
        elif op[0] == "advance":
            now += op[1]
            removed = t.scan_expired(now, EXPIRY)
            assert all(not t.broker_alive(a, now, EXPIRY) for a in removed)
            assert all(t.broker_alive(a, now, EXPIRY) for a in t.cluster_info()["live"])
        else:
            t.delete_topic(op[1])
        check_invariants(t)


# ---------------------------------------------------------------------------------------------
# Bounds (issue 15): what clients can make the table hold
# ---------------------------------------------------------------------------------------------
def test_more_broker_addresses_than_max_brokers_are_refused_and_change_nothing():
    from hostmq.errors import BrokerBusyError
    t = RouteTable(max_brokers=2)
    register(t, "broker-a", A0, [tc("orders")])
    register(t, "broker-b", B0, [tc("orders")])
    before = snapshot(t)
    with pytest.raises(BrokerBusyError, match="max_brokers"):
        register(t, "broker-c", "ipc:///r/c.sock", [tc("other")])
    assert snapshot(t) == before
    register(t, "broker-a", A0, [tc("orders"), tc("more")], version=2)       # a known address may re-register
    t.unregister_broker("c1", "broker-b", 0, B0, T0)
    register(t, "broker-c", "ipc:///r/c.sock", [tc("other")])               # a freed place can be taken
    check_invariants(t)


def test_kv_config_is_bounded_in_characters():
    from hostmq.errors import BrokerBusyError
    t = RouteTable(kv_max_chars=20)
    t.put_kv("ns", "k1", "0123456789")                 # 14 characters
    with pytest.raises(BrokerBusyError, match="kv_max_chars"):
        t.put_kv("ns", "k2", "01234")                  # 14 + 9 > 20
    assert t.kv_namespace("ns") == {"k1": "0123456789"}
    t.put_kv("ns", "k1", "0123456789abcd")             # replacing counts only the difference: 18
    t.put_kv("ns", "k1", "x")                          # and shrinking is always allowed
    t.put_kv("ns", "k2", "01234")
    assert t.delete_kv("ns", "k1") and t.delete_kv("ns", "k2")
    t.put_kv("other", "key", "0" * 12)                 # everything freed again: 20 characters
    t.load_kv({"ns": {"k": "v" * 100}})                # a saved file is loaded as it is ...
    with pytest.raises(BrokerBusyError):
        t.put_kv("ns", "k3", "x")                      # ... but nothing more fits


# -- epochs (issue 27): a registration older than the newest seen for its name and id is refused ----
def test_a_registration_of_an_older_epoch_is_refused_and_changes_nothing():
    from hostmq.errors import FencedError
    t = RouteTable()
    t.register_broker("c1", "broker-a", 0, A0, None, topics(tc("t")), 1, T0, epoch=0)
    t.register_broker("c1", "broker-a", 0, A1, None, topics(tc("t")), 1, T0 + 1, epoch=1)   # promoted
    before = snapshot(t)
    with pytest.raises(FencedError, match="epoch 1 registered before") as e:
        t.register_broker("c1", "broker-a", 0, A0, None, topics(tc("u")), 2, T0 + 2, epoch=0)
    assert (e.value.epoch, e.value.newest) == (0, 1)
    assert snapshot(t) == before
    assert t.topic_route("t").broker_datas[0].addrs == {0: A1}
    t.register_broker("c1", "broker-a", 1, A0, None, {}, 1, T0 + 3, epoch=1)     # the old master, as a slave
    t.register_broker("c1", "broker-a", 0, A1, None, topics(tc("t")), 1, T0 + 4, epoch=1)
    t.register_broker("c1", "broker-b", 0, B0, None, {}, 1, T0 + 5)         # another name has its own epochs
    assert t.newest_epoch("broker-a", 0) == 1 and t.newest_epoch("broker-b", 0) == 0
    with pytest.raises(ValidationError):
        t.register_broker("c1", "broker-a", 0, A1, None, {}, 1, T0 + 6, epoch=-1)


def test_the_newest_epoch_outlives_the_registration():
    from hostmq.errors import FencedError
    t = RouteTable()
    t.register_broker("c1", "broker-a", 0, A1, None, {}, 1, T0, epoch=2)
    t.unregister_broker("c1", "broker-a", 0, A1, T0 + 1)
    t.scan_expired(T0 + 10 * EXPIRY)
    with pytest.raises(FencedError):
        t.register_broker("c1", "broker-a", 0, A0, None, {}, 1, T0 + 10 * EXPIRY, epoch=1)
