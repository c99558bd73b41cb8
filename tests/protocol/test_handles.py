"""One control schema (issue 28): ``protocol.messages.handles`` decodes a request once for its handler,
the servers declare every request type there is (no dead types), and clients build the same types.

A handler table served in-process by ``transport.Server`` on a real socket shows the replies: a
mistyped field gets BAD_REQUEST (ProtocolError), or MESSAGE_ILLEGAL (ValidationError at the client)
where the handler says so, naming the field, and the server keeps serving."""
from __future__ import annotations

import dataclasses
import inspect

import pytest

from hostmq.broker.client_handlers import ClientHandlers
from hostmq.broker.registration import paginate
from hostmq.broker.service import BrokerService
from hostmq.broker.supervisor import Broker
from hostmq.errors import ProtocolError, RemoteError, ValidationError
from hostmq.namesrv.server import NamesrvService
from hostmq.protocol import messages
from hostmq.protocol.codes import RequestCode, ResponseCode
from hostmq.protocol.frames import Frame
from hostmq.protocol.messages import (ControlMessage, GetRouteInfoRequest, GroupRequest, KvConfigRequest,
                                      RegisterBrokerPage, RegisterBrokerRequest, TopicRequest, handles)
from hostmq.transport import Reply
from tests.conftest import served

pytestmark = pytest.mark.timeout(60)


class Probe:
    """Two handlers over one schema: the broker's kind (ProtocolError) and the NameServer's kind."""

    def __init__(self) -> None:
        self.got: list = []

    @handles(GetRouteInfoRequest)
    def strict(self, req: GetRouteInfoRequest, token=None) -> Reply:
        self.got.append((req, token))
        return Reply(fields={"topic": req.topic})

    @handles(GroupRequest, invalid=ValidationError)
    def lenient(self, req: GroupRequest, token=None) -> Reply:
        self.got.append((req, token))
        return Reply(fields={"group": req.group})


def frame(fields) -> Frame:
    return Frame(RequestCode.PING, 1, fields, (), False)


def test_a_handler_receives_the_typed_request_and_the_token():
    p = Probe()
    assert p.strict(frame({"topic": "orders", "newer_field": 1}), "tok").fields == {"topic": "orders"}
    assert p.got == [(GetRouteInfoRequest("orders"), "tok")]
    assert Probe.strict.request_type is GetRouteInfoRequest and Probe.lenient.request_type is GroupRequest


@pytest.mark.parametrize("fields", [{"topic": 5}, {}, {"topic": None}])
def test_a_mistyped_field_never_reaches_the_handler(fields):
    p = Probe()
    with pytest.raises(ProtocolError, match="topic") as e:
        p.strict(frame(fields))
    assert not isinstance(e.value, ValidationError)
    with pytest.raises(ValidationError, match="group") as e:
        p.lenient(frame({"group": fields.get("topic", 7)} if fields else {}))
    assert not isinstance(e.value, ProtocolError)
    assert p.got == []


def test_of_names_a_callers_bad_argument_as_a_validation_error():
    assert KvConfigRequest.of(namespace="n", key="k", value="v") == KvConfigRequest("n", "k", "v")
    with pytest.raises(ValidationError, match="field key must be str"):
        KvConfigRequest.of(namespace="n", key=3)
    with pytest.raises(ProtocolError):                      # the constructor itself stays ProtocolError
        KvConfigRequest(namespace="n", key=3)


@pytest.fixture
def client(tmp_path):
    p = Probe()
    with served({RequestCode.GET_ROUTEINFO_BY_TOPIC: p.strict, RequestCode.GET_CONSUME_STATS: p.lenient},
                str(tmp_path / "p.sock"), "probe") as c:
        yield c, p


def test_served_a_mistyped_field_gets_the_typed_error_reply_and_the_server_survives(client):
    c, p = client
    raw = c.request_raw(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": ["x"]})
    assert raw.code == ResponseCode.BAD_REQUEST and "field topic must be str" in raw.remark
    with pytest.raises(RemoteError, match="field topic"):
        c.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": 1})
    raw = c.request_raw(RequestCode.GET_CONSUME_STATS, {"group": 1})
    assert raw.code == ResponseCode.MESSAGE_ILLEGAL and "field group must be str" in raw.remark
    with pytest.raises(ValidationError, match="lacks field 'group'"):
        c.request(RequestCode.GET_CONSUME_STATS, {})
    assert p.got == []
    assert c.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "t"}).fields == {"topic": "t"}
    assert c.request(RequestCode.GET_CONSUME_STATS, GroupRequest("g").to_fields()).fields == {"group": "g"}


# --- the schema is whole: every request type is served, every served handler declares one -------------

def _declared(*classes) -> dict[str, type]:
    return {f"{cls.__name__}.{name}": fn.request_type for cls in classes
            for name, fn in inspect.getmembers(cls, inspect.isfunction) if hasattr(fn, "request_type")}


def test_no_request_type_is_dead():
    types = {obj for obj in vars(messages).values()
             if isinstance(obj, type) and dataclasses.is_dataclass(obj) and issubclass(obj, ControlMessage)}
    served = set(_declared(NamesrvService, BrokerService, ClientHandlers, Broker).values())
    # RegisterBrokerRequest is served as its paged form (a whole registration is page 0 of 1)
    assert types - served == {RegisterBrokerRequest}
    assert issubclass(RegisterBrokerPage, RegisterBrokerRequest)


@pytest.mark.parametrize("cls", [NamesrvService, BrokerService, Broker])
def test_no_handler_reads_fields_by_hand(cls):
    """A handler either declares its request type or takes ``frame`` and never reads its fields."""
    for name, fn in inspect.getmembers(cls, inspect.isfunction):
        if hasattr(fn, "request_type") or "frame" not in inspect.signature(fn, follow_wrapped=False).parameters:
            continue
        assert "frame.fields" not in inspect.getsource(fn), f"{cls.__name__}.{name} reads frame.fields by hand"


def test_the_brokers_pages_decode_as_the_namesrvs_request():
    topics = {f"t{i}": {"read_queues": 1, "write_queues": 1, "perm": 6, "order": False} for i in range(5)}
    pages = paginate(topics, max_topics=2)
    base = dict(cluster="c", broker_name="b", broker_id=0, address="ipc:///r/b.sock", ha_address="",
                data_version=3, epoch=1)
    got = {}
    for i, page in enumerate(pages):
        wire = RegisterBrokerPage(**base, topics=page, page=i, pages=len(pages), registration_id=4).to_fields()
        req = RegisterBrokerPage.from_fields(wire)
        assert (req.page, req.pages, req.registration_id) == (i, 3, 4)
        got.update(req.topics)
    assert got == topics
    whole = RegisterBrokerPage.from_fields(RegisterBrokerRequest(**base, topics=topics).to_fields())
    assert (whole.page, whole.pages) == (0, 1)
    assert TopicRequest.from_fields({"topic": "t"}).read_queues == 4
