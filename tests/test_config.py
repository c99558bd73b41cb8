"""Config: API defaults, typed loading from dicts and TOML, and a ConfigError naming every bad key."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hostmq.config import (ASYNC_FLUSH, SYNC_FLUSH, AccessConfig, BrokerConfig, Config, LoggingConfig,
                           NamesrvConfig, StoreConfig,
                           section_from_dict, store_config)
from hostmq.errors import ConfigError, HostMQError

pytestmark = pytest.mark.timeout(60)

# The keys the public contract promises (docs/api.md), with their documented defaults.
API_DEFAULTS = {
    "namesrv": {"scan_interval_s": 10.0, "broker_expiry_s": 120.0},
    "broker": {"register_interval_s": 30.0, "auto_create_topic": True, "default_topic_queues": 4,
               "message_delay_level": "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h",
               "long_polling_s": 15.0, "transaction_check_interval_s": 60.0, "transaction_check_max": 15},
    "store": {"commitlog_file_bytes": 1 << 30, "flush_disk_type": "ASYNC_FLUSH",
              "transient_store_pool_enable": False, "warm_mapped_file": False,
              "file_reserved_hours": 72, "delete_when": "04", "disk_max_used_ratio": 0.75},
}


@pytest.mark.parametrize("section,key,value", [(s, k, v) for s, kv in API_DEFAULTS.items() for k, v in kv.items()])
def test_api_defaults(section, key, value):
    got = getattr(getattr(Config(), section), key)
    assert got == value
    assert type(got) is type(value) or (type(value) is int and type(got) is float)   # 72 hours is 72.0
    assert getattr(Config.from_dict(None), section) == getattr(Config(), section)


def test_api_dict_is_accepted_as_is():
    assert Config.from_dict(API_DEFAULTS) == Config()
    assert Config.load(API_DEFAULTS) == Config()


def test_section_types():
    c = Config()
    assert isinstance(c.namesrv, NamesrvConfig) and isinstance(c.broker, BrokerConfig)
    assert isinstance(c.store, StoreConfig)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.store.commitlog_file_bytes = 1     # type: ignore[misc]


def test_from_dict_overrides_only_the_given_keys():
    c = Config.from_dict({"store": {"commitlog_file_bytes": 8192, "flush_disk_type": SYNC_FLUSH,
                                    "file_reserved_hours": 1},
                          "broker": {"auto_create_topic": False, "long_polling_s": 2},
                          "namesrv": {"broker_expiry_s": 5.5}})
    assert c.store.commitlog_file_bytes == 8192 and c.store.flush_disk_type == SYNC_FLUSH
    assert c.store.file_reserved_hours == 1.0 and type(c.store.file_reserved_hours) is float
    assert c.broker.auto_create_topic is False
    assert c.broker.long_polling_s == 2.0 and type(c.broker.long_polling_s) is float
    assert c.namesrv.broker_expiry_s == 5.5 and c.namesrv.scan_interval_s == 10.0
    assert c.store.delete_when == "04" and c.broker.default_topic_queues == 4


def test_from_dict_accepts_section_instances():
    sc = StoreConfig(commitlog_file_bytes=8192)
    assert Config.from_dict({"store": sc}).store is sc


def test_with_overrides():
    base = Config.from_dict({"store": {"commitlog_file_bytes": 8192}})
    c = base.with_overrides({"store": {"flush_disk_type": SYNC_FLUSH}, "broker": {"default_topic_queues": 8}})
    assert c.store.commitlog_file_bytes == 8192 and c.store.flush_disk_type == SYNC_FLUSH
    assert c.broker.default_topic_queues == 8
    assert base.store.flush_disk_type == ASYNC_FLUSH       # the original is untouched
    assert base.with_overrides(None) is base and base.with_overrides({}) is base
    for bad in ({"nope": {}}, {"store": 3}, {"store": {"commitlog_file_bytes": "x"}}, [("store", {})]):
        with pytest.raises(ConfigError):
            base.with_overrides(bad)


@pytest.mark.parametrize("data,names", [
    ({"nope": {}}, "nope"),
    ({"store": {"nope": 1}}, "store.nope"),
    ({"broker": {"commitlog_file_bytes": 8192}}, "broker.commitlog_file_bytes"),   # right key, wrong section
    ({"store": {"commitlog_file_bytes": "x"}}, "store.commitlog_file_bytes"),
    ({"store": {"commitlog_file_bytes": True}}, "store.commitlog_file_bytes"),
    ({"store": {"commitlog_file_bytes": 8192.0}}, "store.commitlog_file_bytes"),
    ({"broker": {"default_topic_queues": True}}, "broker.default_topic_queues"),
    ({"broker": {"auto_create_topic": 1}}, "broker.auto_create_topic"),
    ({"broker": {"auto_create_topic": "true"}}, "broker.auto_create_topic"),
    ({"namesrv": {"scan_interval_s": "10"}}, "namesrv.scan_interval_s"),
    ({"namesrv": {"scan_interval_s": False}}, "namesrv.scan_interval_s"),
    ({"store": {"delete_when": 4}}, "store.delete_when"),
    ({"store": {"flush_disk_type": "sync"}}, "store.flush_disk_type"),
    ({"store": {"file_reserved_hours": 10 ** 400}}, "store.file_reserved_hours"),
    ({"store": {"disk_max_used_ratio": 1.5}}, "store.disk_max_used_ratio"),
    ({"store": {"disk_refuse_ratio": 0.0}}, "store.disk_refuse_ratio"),
    ({"store": {"disk_force_clean_ratio": float("nan")}}, "store.disk_force_clean_ratio"),
    ({"store": {"commitlog_file_bytes": 100}}, "store.commitlog_file_bytes"),
    ({"store": {"max_properties_bytes": 40000}}, "store.max_properties_bytes"),
    ({"store": {"flush_interval_ms": -1}}, "store.flush_interval_ms"),
    ({"store": {"file_reserved_hours": float("inf")}}, "store.file_reserved_hours"),
    ({"broker": {"default_topic_queues": 0}}, "broker.default_topic_queues"),
    ({"broker": {"long_polling_s": -0.5}}, "broker.long_polling_s"),
    ({"broker": {"message_delay_level": "1s 5x"}}, "broker.message_delay_level"),
    ({"broker": {"message_delay_level": "1s -5s"}}, "broker.message_delay_level"),
    ({"namesrv": {"broker_expiry_s": -1}}, "namesrv.broker_expiry_s"),
    ({"store": []}, "store"),
    ({"store": "big"}, "store"),
])
def test_bad_config_raises_config_error_naming_the_key(data, names):
    with pytest.raises(ConfigError) as ei:
        Config.from_dict(data)
    assert names in str(ei.value)
    assert isinstance(ei.value, HostMQError) and isinstance(ei.value, ValueError)


@pytest.mark.parametrize("bad", ["store", 3, [("store", {})], ["store"]])
def test_from_dict_rejects_non_tables(bad):
    with pytest.raises(ConfigError):
        Config.from_dict(bad)


def test_bad_config_type_is_not_a_bare_type_error():
    with pytest.raises(ConfigError):
        section_from_dict(StoreConfig, {"flush_disk_type": None}, "store")


def test_zero_is_a_valid_duration():
    c = Config.from_dict({"broker": {"long_polling_s": 0}, "store": {"flush_interval_ms": 0}})
    assert c.broker.long_polling_s == 0.0 and c.store.flush_interval_ms == 0


def test_load_toml(tmp_path):
    path = tmp_path / "hostmq.toml"
    path.write_text(
        "[namesrv]\nscan_interval_s = 1\n\n"
        "[broker]\nauto_create_topic = false\nmessage_delay_level = \"1s 2s\"\n\n"
        "[store]\ncommitlog_file_bytes = 65536\nflush_disk_type = \"SYNC_FLUSH\"\n"
        "disk_max_used_ratio = 0.5\nfile_reserved_hours = 2\n",
        encoding="utf-8")
    for source in (path, str(path)):
        c = Config.load(source)
        assert c.namesrv.scan_interval_s == 1.0 and c.namesrv.broker_expiry_s == 120.0
        assert c.broker.auto_create_topic is False and c.broker.message_delay_level == "1s 2s"
        assert c.store.commitlog_file_bytes == 65536 and c.store.flush_disk_type == SYNC_FLUSH
        assert c.store.disk_max_used_ratio == 0.5 and c.store.file_reserved_hours == 2.0


@pytest.mark.parametrize("text,names", [
    ("[store]\ncommitlog_file_bytes = \"big\"\n", "store.commitlog_file_bytes"),
    ("[store]\nno_such_key = 1\n", "store.no_such_key"),
    ("[stor]\ncommitlog_file_bytes = 8192\n", "stor"),
    ("[store\n", "TOML"),
    ("store = 3\n", "store"),
])
def test_load_bad_toml(tmp_path, text, names):
    path = tmp_path / "hostmq.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as ei:
        Config.load(path)
    assert names in str(ei.value)


def test_load_missing_file_and_passthrough(tmp_path):
    with pytest.raises(ConfigError) as ei:
        Config.load(tmp_path / "missing.toml")
    assert "missing.toml" in str(ei.value)
    with pytest.raises(ConfigError):
        Config.load(tmp_path)                 # a directory
    c = Config.from_dict({"store": {"commitlog_file_bytes": 8192}})
    assert Config.load(c) is c
    assert Config.load(None) == Config()


def test_store_config_accepts_every_form():
    sc = StoreConfig(commitlog_file_bytes=8192)
    assert store_config(sc) is sc
    assert store_config(Config(store=sc)) is sc
    assert store_config(None) == StoreConfig()
    assert store_config({}) == StoreConfig()
    assert store_config({"commitlog_file_bytes": 8192}) == sc
    assert store_config({"store": {"commitlog_file_bytes": 8192}}) == sc
    assert store_config({"store": {"commitlog_file_bytes": 8192}, "broker": {"default_topic_queues": 2}}) == sc
    assert store_config({"broker": {"default_topic_queues": 2}}) == StoreConfig()


@pytest.mark.parametrize("bad", [
    {"flush_disk_type": "FAST"}, {"store": {"flush_disk_type": "FAST"}}, {"nope": 1},
    {"store": {"nope": 1}}, {"commitlog_file_bytes": "x"}, "store", 5,
])
def test_store_config_rejects_bad_input(bad):
    with pytest.raises(ConfigError):
        store_config(bad)


def test_bad_flush_disk_type_direct():
    with pytest.raises(ConfigError) as ei:
        StoreConfig(flush_disk_type="ASYNC")
    assert "flush_disk_type" in str(ei.value)
    assert StoreConfig(flush_disk_type=SYNC_FLUSH).flush_disk_type == SYNC_FLUSH


@settings(max_examples=200, deadline=None)
@given(st.integers(4096, 1 << 40), st.floats(0.01, 1.0), st.integers(1, 1024), st.booleans(),
       st.floats(0, 1e6, allow_nan=False))
def test_valid_values_survive_a_dict_round_trip(file_bytes, ratio, queues, flag, hours):
    c = Config.from_dict({"store": {"commitlog_file_bytes": file_bytes, "disk_max_used_ratio": ratio,
                                    "warm_mapped_file": flag, "file_reserved_hours": hours},
                          "broker": {"default_topic_queues": queues}})
    again = Config.from_dict({s: dataclasses.asdict(getattr(c, s)) for s in ("namesrv", "broker", "store")})
    assert again == c
    assert (c.store.commitlog_file_bytes, c.store.disk_max_used_ratio, c.store.warm_mapped_file,
            c.store.file_reserved_hours, c.broker.default_topic_queues) == (file_bytes, ratio, flag, hours, queues)


def test_the_configuration_reference_lists_every_key_with_its_default():
    """docs/api.md "Configuration reference" is the user's list of settings: it must not fall behind."""
    import os
    import re
    doc = open(os.path.join(os.path.dirname(__file__), "..", "docs", "api.md"), encoding="utf-8").read()
    ref = doc[doc.index("## Configuration reference"):]
    for section, cls in (("namesrv", NamesrvConfig), ("broker", BrokerConfig), ("store", StoreConfig),
                         ("logging", LoggingConfig), ("access", AccessConfig)):
        part = ref[ref.index(f"### `[{section}]`"):]
        part = part[:part.index("### ", 4)] if "### " in part[4:] else part
        rows = dict(re.findall(r"^\| `(\w+)` \| `([^`]*)`", part, re.M))
        for f in dataclasses.fields(cls):
            assert f.name in rows, f"docs/api.md does not list {section}.{f.name}"
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            assert rows[f.name] in (repr(default), f"{default:,}" if isinstance(default, int) else ""), \
                f"{section}.{f.name}: docs/api.md says {rows[f.name]}, the code {default!r}"
