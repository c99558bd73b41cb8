"""Typed control messages (hostmq.protocol.messages): round trips and field validation."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hostmq.errors import ProtocolError
from hostmq.protocol import RequestCode, decode, encode_request
from hostmq.protocol.messages import GetRouteInfoRequest, KvConfigRequest, RegisterBrokerRequest, UnregisterBrokerRequest

pytestmark = pytest.mark.timeout(60)

text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=16)
i64 = st.integers(-(2**63), 2**63 - 1)
topic_configs = st.fixed_dictionaries({"read_queues": i64, "write_queues": i64, "perm": i64, "order": st.booleans()})
json_objects = st.dictionaries(text, st.none() | st.booleans() | i64 | text | st.lists(text, max_size=3), max_size=4)

messages = st.one_of(
    st.builds(RegisterBrokerRequest, cluster=text, broker_name=text, broker_id=i64, address=text,
              ha_address=text, topics=st.dictionaries(text, topic_configs, max_size=5), data_version=i64),
    st.builds(UnregisterBrokerRequest, cluster=text, broker_name=text, broker_id=i64),
    st.builds(GetRouteInfoRequest, topic=text),
    st.builds(KvConfigRequest, namespace=text, key=text, value=st.none() | text),
)

VALID = {
    RegisterBrokerRequest: {"cluster": "c", "broker_name": "broker-a", "broker_id": 0, "address": "ipc:///r/b.sock",
                            "ha_address": "", "data_version": 3, "epoch": 1,
                            "topics": {"orders": {"read_queues": 4, "write_queues": 4, "perm": 6, "order": False}}},
    UnregisterBrokerRequest: {"cluster": "c", "broker_name": "broker-a", "broker_id": 1},
    GetRouteInfoRequest: {"topic": "orders"},
    KvConfigRequest: {"namespace": "ns", "key": "k", "value": "v"},
}
# values of the wrong type for each declared type (dataclass field types are strings: postponed annotations)
WRONG = {"str": [1, 1.5, True, None, [], {}], "int": ["1", 1.0, True, None, [1], {}],
         "str | None": [1, True, [], {}], "list[dict]": ["x", {}, None, [1], [[]], ["x"]],
         "dict[str, TopicConfigData]": [[], "x", None, {"t": 1}, {"t": []}]}


@given(messages)
def test_round_trip_through_fields_and_the_wire(msg):
    assert type(msg).from_fields(msg.to_fields()) == msg
    wire = decode(encode_request(RequestCode.REGISTER_BROKER, 1, msg.to_fields()))
    assert type(msg).from_fields(wire.fields) == msg


def test_fields_use_the_python_names():
    r = RegisterBrokerRequest.from_fields(VALID[RegisterBrokerRequest])
    assert r.to_fields() == VALID[RegisterBrokerRequest]
    assert r.topics["orders"]["perm"] == 6 and r.broker_id == 0


def _bad_cases() -> list:
    return [pytest.param(cls, f.name, value, id=f"{cls.__name__}.{f.name}={value!r}")
            for cls in VALID for f in dataclasses.fields(cls) for value in WRONG[f.type]]


@pytest.mark.parametrize("cls,name,value", _bad_cases())
def test_a_mistyped_field_is_named(cls, name, value):
    with pytest.raises(ProtocolError, match=rf"field {name}\b"):
        cls.from_fields({**VALID[cls], name: value})
    with pytest.raises(ProtocolError, match=rf"field {name}\b"):
        cls(**{**VALID[cls], name: value})


@pytest.mark.parametrize("cls", list(VALID))
def test_a_missing_required_field_is_named(cls):
    for f in dataclasses.fields(cls):
        if f.default is dataclasses.MISSING:
            fields = dict(VALID[cls])
            del fields[f.name]
            with pytest.raises(ProtocolError, match=f"lacks field '{f.name}'"):
                cls.from_fields(fields)


@pytest.mark.parametrize("entry,why", [
    ({"read_queues": 4, "write_queues": 4, "perm": "6", "order": False}, r"topics\['orders'\]\.perm must be int"),
    ({"read_queues": 4, "write_queues": 4, "perm": 6, "order": 0}, r"topics\['orders'\]\.order must be bool"),
    ({"read_queues": True, "write_queues": 4, "perm": 6, "order": False}, r"topics\['orders'\]\.read_queues"),
    ({"write_queues": 4, "perm": 6, "order": False}, r"topics\['orders'\] lacks key 'read_queues'"),
    ({}, r"topics\['orders'\] lacks key"),
])
def test_topic_entries_are_checked_key_by_key(entry, why):
    with pytest.raises(ProtocolError, match=why):
        RegisterBrokerRequest.from_fields({**VALID[RegisterBrokerRequest], "topics": {"orders": entry}})


def test_unknown_keys_are_ignored_at_top_level_and_kept_in_entries():
    fields = dict(VALID[RegisterBrokerRequest], newer_field=1)
    fields["topics"] = {"t": {"read_queues": 1, "write_queues": 1, "perm": 6, "order": True, "sys_flag": 0}}
    r = RegisterBrokerRequest.from_fields(fields)
    assert "newer_field" not in r.to_fields() and r.topics["t"]["sys_flag"] == 0


def test_optional_value_defaults_to_none():
    assert KvConfigRequest.from_fields({"namespace": "n", "key": "k"}) == KvConfigRequest("n", "k")
    assert KvConfigRequest("n", "k").to_fields() == {"namespace": "n", "key": "k", "value": None}
    assert KvConfigRequest.from_fields({"namespace": "n", "key": "k", "value": None}).value is None


@pytest.mark.parametrize("fields", [None, [], "x", 3])
def test_fields_that_are_not_an_object_are_refused(fields):
    with pytest.raises(ProtocolError, match="GetRouteInfoRequest fields must be an object"):
        GetRouteInfoRequest.from_fields(fields)


def test_messages_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        GetRouteInfoRequest("t").topic = "u"
