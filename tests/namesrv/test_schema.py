"""The NameServer's one control schema (issue 28): every handler that reads fields declares its request
type (``protocol.messages.handles``), is called with the typed request decoded once, and a mistyped
field is answered MESSAGE_ILLEGAL naming it — ValidationError at the client, as the hand validation
this replaced answered — while the server keeps serving. Served in-process on a real socket."""
from __future__ import annotations

import re

import pytest

from hostmq.config import NamesrvConfig
from hostmq.errors import NoRouteError, ValidationError
from hostmq.namesrv.server import NamesrvService
from hostmq.protocol.codes import RequestCode as C
from hostmq.protocol.codes import ResponseCode
from hostmq.protocol.frames import Frame
from hostmq.protocol.messages import (DeleteTopicInNamesrvRequest, GetRouteInfoRequest, KvConfigRequest,
                                      RegisterBrokerPage, RegisterBrokerRequest, TopicsByClusterRequest,
                                      UnregisterBrokerRequest)
from tests.conftest import served

pytestmark = pytest.mark.timeout(60)

A = "ipc:///r/brokers/broker-a/broker.sock"
REG = RegisterBrokerRequest(cluster="c1", broker_name="broker-a", broker_id=0, address=A, ha_address="",
                            topics={"orders": {"read_queues": 4, "write_queues": 4, "perm": 6, "order": False}},
                            data_version=1)

DECLARED = {
    C.REGISTER_BROKER: RegisterBrokerPage, C.UNREGISTER_BROKER: UnregisterBrokerRequest,
    C.GET_ROUTEINFO_BY_TOPIC: GetRouteInfoRequest, C.GET_TOPICS_BY_CLUSTER: TopicsByClusterRequest,
    C.DELETE_TOPIC_IN_NAMESRV: DeleteTopicInNamesrvRequest, C.PUT_KV_CONFIG: KvConfigRequest,
    C.GET_KV_CONFIG: KvConfigRequest, C.DELETE_KV_CONFIG: KvConfigRequest,
}


@pytest.fixture
def client(tmp_path):
    """A RemotingClient of a NamesrvService served on a thread of the test process."""
    with served(NamesrvService(NamesrvConfig()).handlers(), str(tmp_path / "ns.sock"), "namesrv-test") as c:
        yield c


def test_every_handler_that_reads_fields_declares_its_request_type():
    handlers = NamesrvService(NamesrvConfig()).handlers()
    assert {code: h.request_type for code, h in handlers.items() if hasattr(h, "request_type")} == DECLARED
    # the rest read no fields at all
    assert set(handlers) - set(DECLARED) == {C.GET_BROKER_CLUSTER_INFO, C.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, C.PING}


def test_the_handler_as_written_takes_the_typed_request():
    svc = NamesrvService(NamesrvConfig())
    svc.register_broker(Frame(C.REGISTER_BROKER, 1, REG.to_fields(), (), False))
    typed = NamesrvService.route.__wrapped__                # the method under the decode step
    route = typed(svc, GetRouteInfoRequest("orders")).fields
    assert [q["broker_name"] for q in route["queue_datas"]] == ["broker-a"]
    assert svc.route(Frame(C.GET_ROUTEINFO_BY_TOPIC, 2, {"topic": "orders"}, (), False)).fields == route


@pytest.mark.parametrize("code,fields,field", [
    (C.GET_ROUTEINFO_BY_TOPIC, {"topic": 5}, "topic"),
    (C.GET_ROUTEINFO_BY_TOPIC, {}, "topic"),
    (C.REGISTER_BROKER, {**REG.to_fields(), "broker_id": "zero"}, "broker_id"),
    (C.REGISTER_BROKER, {**REG.to_fields(), "page": 1.5}, "page"),
    (C.REGISTER_BROKER, {**REG.to_fields(), "topics": {"orders": {"read_queues": "4", "write_queues": 4}}},
     r"topics\['orders'\]\.read_queues"),
    (C.UNREGISTER_BROKER, {"cluster": "c1", "broker_name": "broker-a", "broker_id": 0, "address": 7}, "address"),
    (C.GET_TOPICS_BY_CLUSTER, {"cluster": None}, "cluster"),
    (C.DELETE_TOPIC_IN_NAMESRV, {"topic": "orders", "cluster": 1}, "cluster"),
    (C.PUT_KV_CONFIG, {"namespace": "n", "key": ["k"], "value": "v"}, "key"),
    (C.GET_KV_CONFIG, {"namespace": False, "key": "k"}, "namespace"),
])
def test_a_mistyped_field_gets_message_illegal_naming_it_and_the_server_keeps_serving(client, code, fields, field):
    raw = client.request_raw(code, fields)
    assert raw.code == ResponseCode.MESSAGE_ILLEGAL and re.search(rf"field {field}\b| lacks field '{field}'", raw.remark)
    with pytest.raises(ValidationError, match=field):
        client.request(code, fields)
    client.request(C.REGISTER_BROKER, REG.to_fields())
    assert client.request(C.GET_ROUTEINFO_BY_TOPIC, GetRouteInfoRequest("orders").to_fields()).fields["queue_datas"]


def test_requests_built_from_the_schema_are_served(client):
    page0 = RegisterBrokerPage(**{**REG.to_fields(), "topics": {"a": {"read_queues": 1, "write_queues": 1}}},
                               page=0, pages=2, registration_id=9)
    assert client.request(C.REGISTER_BROKER, page0.to_fields()).fields["complete"] is False
    page1 = RegisterBrokerPage(**{**page0.to_fields(), "topics": {"b": {"read_queues": 2, "write_queues": 2}},
                                  "page": 1})
    assert client.request(C.REGISTER_BROKER, page1.to_fields()).fields["complete"] is True
    assert client.request(C.GET_TOPICS_BY_CLUSTER, TopicsByClusterRequest("c1").to_fields()).fields["topics"] == ["a", "b"]
    client.request(C.PUT_KV_CONFIG, KvConfigRequest("ns", "k", "v").to_fields())
    assert client.request(C.GET_KV_CONFIG, KvConfigRequest("ns", "k").to_fields()).fields["value"] == "v"
    with pytest.raises(ValidationError, match="value"):           # PUT needs its value
        client.request(C.PUT_KV_CONFIG, KvConfigRequest("ns", "k").to_fields())
    assert client.request(C.DELETE_KV_CONFIG, KvConfigRequest("ns", "k").to_fields()).fields["removed"] is True
    assert client.request(C.DELETE_TOPIC_IN_NAMESRV, DeleteTopicInNamesrvRequest("a").to_fields()).fields["deleted"]
    gone = UnregisterBrokerRequest("c1", "broker-a", 0, A)
    assert client.request(C.UNREGISTER_BROKER, gone.to_fields()).fields["removed"] is True
    with pytest.raises(NoRouteError):
        client.request(C.GET_ROUTEINFO_BY_TOPIC, GetRouteInfoRequest("b").to_fields())


def test_an_unregistration_without_its_address_is_refused_and_removes_nothing(client):
    client.request(C.REGISTER_BROKER, REG.to_fields())
    with pytest.raises(ValidationError, match="address"):
        client.request(C.UNREGISTER_BROKER, {"cluster": "c1", "broker_name": "broker-a", "broker_id": 0})
    assert client.request(C.GET_ROUTEINFO_BY_TOPIC, GetRouteInfoRequest("orders").to_fields()).fields["queue_datas"]
