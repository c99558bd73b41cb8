"""Who may send which control request (issue 27): the pure policy and its peer parsing."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from hostmq.errors import PermissionDeniedError
from hostmq.protocol.codes import RequestCode, ResponseCode, error_for_response, response_code_for
from hostmq.protocol.permissions import ADMIN_CODES, ControlPolicy, PeerCred

pytestmark = pytest.mark.timeout(60)

POLICY = ControlPolicy(frozenset({0, 1000}), where="/srv/mq")
MEMBER = PeerCred(1001, 1001, 4242)
OWNER = PeerCred(1000, 1000, 77)


def test_libzmq_peer_address_of_an_ipc_connection_gives_uid_gid_pid():
    assert PeerCred.parse("localhost:54321:54322:9296") == PeerCred(54321, 54322, 9296)
    assert PeerCred.parse(":0:0:1") == PeerCred(0, 0, 1)


@pytest.mark.parametrize("text", [None, "", "127.0.0.1", "localhost:1:2", "a:b:c:d", "x:1:2:-3", "1:2:3:4:x"])
def test_a_peer_address_without_credentials_is_none(text):
    assert PeerCred.parse(text) is None


@given(st.text(max_size=40))
def test_parsing_any_text_never_raises(text):
    cred = PeerCred.parse(text)
    assert cred is None or min(cred.uid, cred.gid, cred.pid) >= 0


@pytest.mark.parametrize("code", sorted(ADMIN_CODES))
def test_every_admin_code_is_refused_to_a_member_and_to_an_unknown_peer(code):
    for peer in (MEMBER, None):
        with pytest.raises(PermissionDeniedError, match=r"only the owner of /srv/mq \(uids 0, 1000\)"):
            POLICY.check(code, peer, "broker broker-a")
    POLICY.check(code, OWNER)
    POLICY.check(code, PeerCred(0, 0, 1))         # root


@pytest.mark.parametrize("code", [RequestCode.PULL_MESSAGE, RequestCode.HEART_BEAT, RequestCode.UPDATE_CONSUMER_OFFSET,
                                  RequestCode.AUTO_CREATE_TOPIC, RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                  RequestCode.CONSUMER_SEND_MSG_BACK, RequestCode.GET_KV_CONFIG])
def test_members_produce_consume_heartbeat_and_commit(code):
    POLICY.check(code, MEMBER)


def test_the_refusal_names_the_code_the_peer_and_what_members_may_do():
    with pytest.raises(PermissionDeniedError) as e:
        POLICY.check(RequestCode.REGISTER_BROKER, MEMBER, "namesrv")
    text = str(e.value)
    assert "REGISTER_BROKER(103)" in text and "uid 1001 (pid 4242)" in text and "produce, consume" in text


def test_the_refusal_has_its_own_wire_code_both_ways():
    assert response_code_for(PermissionDeniedError("x")) == ResponseCode.PERMISSION_DENIED
    err = error_for_response(ResponseCode.PERMISSION_DENIED, "no")
    assert type(err) is PermissionDeniedError and str(err) == "no"
    assert ResponseCode.PERMISSION_DENIED != ResponseCode.NO_PERMISSION     # that one means "a slave"
