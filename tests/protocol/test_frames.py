"""Frame codec (hostmq.protocol.frames) and the code tables (hostmq.protocol.codes): pure, no sockets."""
from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hostmq.errors import (BrokerBusyError, HostMQError, MessageNotFoundError, NoRouteError, ProtocolError,
                           RemoteError, StoreFullError, ValidationError)
from hostmq.protocol import codes, frames
from hostmq.protocol.codes import RequestCode, ResponseCode
from hostmq.protocol.frames import (MAX_HEADER_BYTES, PROTOCOL_VERSION, Frame, decode, encode_request,
                                    encode_response, peek_request_id)

pytestmark = pytest.mark.timeout(60)

# --- strategies: anything orjson round-trips exactly -------------------------------------------------
text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20)   # no lone surrogates
json_scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
                | st.floats(allow_nan=False, allow_infinity=False) | text)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(text, inner, max_size=4), max_leaves=16)
field_dicts = st.dictionaries(text, json_values, max_size=6)
body_lists = st.lists(st.binary(max_size=300), max_size=4)
codes_st = st.integers(0, frames.MAX_CODE)
ids_st = st.integers(0, frames.MAX_REQUEST_ID)


def valid_header(**overrides) -> dict:
    return {"v": 1, "code": 10, "id": 7, "resp": False, "remark": "", "f": {"topic": "t"}, **overrides}


# --- round trips ---------------------------------------------------------------------------------------

@given(code=codes_st, rid=ids_st, fields=field_dicts, bodies=body_lists)
def test_request_round_trip(code, rid, fields, bodies):
    msg = encode_request(code, rid, fields, bodies)
    assert all(isinstance(f, bytes) for f in msg) and len(msg) == 1 + len(bodies)
    assert decode(msg) == Frame(code, rid, fields, tuple(bodies), response=False, remark="")


@given(code=codes_st, rid=ids_st, fields=field_dicts, bodies=body_lists, remark=text)
def test_response_round_trip(code, rid, fields, bodies, remark):
    got = decode(encode_response(code, rid, fields, bodies, remark))
    assert got == Frame(code, rid, fields, tuple(bodies), response=True, remark=remark)


def test_wire_format_is_the_documented_json_object():
    msg = encode_request(RequestCode.PULL_MESSAGE, 42, {"topic": "orders"}, [b"\x00\x01"])
    assert orjson.loads(msg[0]) == {"v": PROTOCOL_VERSION, "code": 11, "id": 42, "resp": False, "remark": "",
                                    "f": {"topic": "orders"}}
    assert msg[1] == b"\x00\x01"
    assert orjson.loads(encode_response(0, 42, remark="ok")[0]) == {
        "v": 1, "code": 0, "id": 42, "resp": True, "remark": "ok", "f": {}}


def test_decode_accepts_any_bytes_like_frames():
    msg = encode_request(1, 2, {}, [b"abc"])
    got = decode([bytearray(msg[0]), memoryview(msg[1])])
    assert got.bodies == (b"abc",) and type(got.bodies[0]) is bytes
    assert decode((msg[0],)).bodies == ()


def test_unknown_header_keys_are_ignored():
    assert decode([orjson.dumps(valid_header(future="x"))]).fields == {"topic": "t"}


def test_header_of_exactly_the_limit_is_accepted_one_more_byte_is_not():
    base = len(orjson.dumps(valid_header(remark="")))
    exact = orjson.dumps(valid_header(remark="x" * (MAX_HEADER_BYTES - base)))
    assert len(exact) == MAX_HEADER_BYTES
    assert decode([exact]).remark == "x" * (MAX_HEADER_BYTES - base)
    over = orjson.dumps(valid_header(remark="x" * (MAX_HEADER_BYTES - base + 1)))
    with pytest.raises(ProtocolError, match="limit"):
        decode([over])


# --- malformed input: always ProtocolError -----------------------------------------------------------

@settings(max_examples=60)
@given(code=codes_st, rid=ids_st, fields=field_dicts, bodies=body_lists)
def test_every_truncation_of_frame0_is_a_protocol_error(code, rid, fields, bodies):
    msg = encode_request(code, rid, fields, bodies)
    for cut in range(len(msg[0])):
        with pytest.raises(ProtocolError):
            decode([msg[0][:cut], *msg[1:]])


@given(fields=field_dicts, data=st.data())
def test_a_bit_flip_in_frame0_decodes_or_raises_protocol_error(fields, data):
    frame0 = bytearray(encode_response(3, 9, fields, remark="r")[0])
    pos = data.draw(st.integers(0, len(frame0) - 1))
    frame0[pos] ^= 1 << data.draw(st.integers(0, 7))
    try:
        assert isinstance(decode([bytes(frame0)]), Frame)
    except ProtocolError:
        pass


@given(garbage=st.binary(max_size=200))
def test_random_bytes_decode_or_raise_protocol_error(garbage):
    try:
        assert isinstance(decode([garbage]), Frame)
    except ProtocolError:
        pass


@given(value=json_values)
def test_any_json_that_is_not_a_header_is_a_protocol_error(value):
    with pytest.raises(ProtocolError):
        decode([orjson.dumps(value)])


@pytest.mark.parametrize("key", ["v", "code", "id", "resp", "remark", "f"])
def test_missing_header_key_is_named(key):
    header = valid_header()
    del header[key]
    with pytest.raises(ProtocolError, match=f"lacks key.*{key}"):
        decode([orjson.dumps(header)])


@pytest.mark.parametrize("key,value", [
    ("v", "1"), ("v", True), ("v", 1.0), ("v", None),
    ("code", "10"), ("code", True), ("code", 10.0), ("code", -1), ("code", 2**31), ("code", None),
    ("id", "7"), ("id", False), ("id", -1), ("id", 2**63), ("id", [7]),
    ("resp", 0), ("resp", "false"), ("resp", None),
    ("remark", 3), ("remark", None), ("remark", ["x"]),
    ("f", []), ("f", "x"), ("f", None), ("f", 3),
])
def test_wrong_header_type_is_named(key, value):
    with pytest.raises(ProtocolError, match=f"'{key}'"):
        decode([orjson.dumps(valid_header(**{key: value}))])


@given(version=st.integers(-(2**63), 2**63 - 1).filter(lambda v: v != PROTOCOL_VERSION))
def test_other_versions_are_refused_naming_the_version(version):
    with pytest.raises(ProtocolError, match=f"version {version} is not supported"):
        decode([orjson.dumps(valid_header(v=version))])


@pytest.mark.parametrize("msg", [
    [], None, b"{}", "not frames", 42, [None], ["{}"], [42], [b"{}", "body"],
    [b""], [b"\xff\xfe"], [b"[" * 5000], [b"1e400"], [b'{"v":NaN}'], [b"x" * (MAX_HEADER_BYTES + 1)],
])
def test_malformed_messages_are_protocol_errors(msg):
    with pytest.raises(ProtocolError):
        decode(msg)


def test_a_body_frame_that_is_not_bytes_is_named():
    with pytest.raises(ProtocolError, match="frame 2"):
        decode([encode_request(1, 1)[0], b"ok", 3])


# --- encoding refuses what the peer would refuse -----------------------------------------------------

@pytest.mark.parametrize("fields", [
    {"b": b"bytes"}, {"s": {1, 2}}, {1: "int key"}, {"x": "\ud800"}, {"big": 2**64}, {"o": object()},
])
def test_unencodable_fields_are_protocol_errors(fields):
    with pytest.raises(ProtocolError, match="JSON"):
        encode_request(1, 1, fields)


@pytest.mark.parametrize("code,rid,fields,bodies", [
    (-1, 1, None, ()), (True, 1, None, ()), ("1", 1, None, ()), (2**31, 1, None, ()),
    (1, -1, None, ()), (1, 2**63, None, ()), (1, 1.5, None, ()),
    (1, 1, [], ()), (1, 1, "f", ()),
    (1, 1, None, b"one body"), (1, 1, None, ["text"]), (1, 1, None, [None]),
])
def test_bad_encode_arguments_are_protocol_errors(code, rid, fields, bodies):
    with pytest.raises(ProtocolError):
        encode_request(code, rid, fields, bodies)


def test_encode_refuses_a_header_over_the_limit():
    """A request header is held to MAX_HEADER_BYTES (what servers accept); a response header to the
    larger MAX_RESPONSE_HEADER_BYTES (a status of 100,000 topics is several MiB)."""
    with pytest.raises(ProtocolError, match="limit"):
        encode_request(1, 1, {"x": "y" * MAX_HEADER_BYTES})
    assert len(encode_response(0, 1, {"x": "y" * MAX_HEADER_BYTES})[0]) > MAX_HEADER_BYTES
    with pytest.raises(ProtocolError, match="limit"):
        encode_response(0, 1, {"x": "y" * frames.MAX_RESPONSE_HEADER_BYTES})
    with pytest.raises(ProtocolError):
        encode_response(0, 1, remark=3)


def test_encode_request_refuses_what_a_server_would_drop_but_a_response_may_carry_more():
    """A request frame over MAX_REQUEST_FRAME_BYTES would cost the client its connection (the server's
    ZMQ_MAXMSGSIZE), so the client learns at once; responses carry message bodies and are not limited."""
    big = b"b" * (frames.MAX_REQUEST_FRAME_BYTES + 1)
    with pytest.raises(ProtocolError, match="at most"):
        encode_request(1, 1, None, [big])
    with pytest.raises(ProtocolError, match="frames"):
        encode_request(1, 1, None, [b""] * frames.MAX_REQUEST_FRAMES)
    assert len(encode_request(1, 1, None, [b""] * (frames.MAX_REQUEST_FRAMES - 1))) == frames.MAX_REQUEST_FRAMES
    assert encode_response(0, 1, None, [big])[1] == big


def test_bodies_may_be_any_bytes_like_and_are_sent_as_bytes():
    msg = encode_request(1, 1, None, [bytearray(b"ab"), memoryview(b"cd"), b""])
    assert msg[1:] == [b"ab", b"cd", b""] and all(type(b) is bytes for b in msg)


# --- peek_request_id ---------------------------------------------------------------------------------

@pytest.mark.parametrize("frame0,expected", [
    (orjson.dumps(valid_header(id=5, v=99)), 5),
    (orjson.dumps({"id": 12}), 12),
    (orjson.dumps({"id": "12"}), 0), (orjson.dumps({"id": True}), 0), (orjson.dumps({"id": -3}), 0),
    (orjson.dumps([1]), 0), (b"garbage", 0), (b"", 0), (None, 0), (b" " * (MAX_HEADER_BYTES + 1), 0),
])
def test_peek_request_id_never_raises(frame0, expected):
    assert peek_request_id(frame0) == expected


# --- codes ---------------------------------------------------------------------------------------------

def test_codes_are_rocketmqs_numbers():
    assert (RequestCode.SEND_MESSAGE, RequestCode.PULL_MESSAGE, RequestCode.HEART_BEAT,
            RequestCode.REGISTER_BROKER, RequestCode.GET_ROUTEINFO_BY_TOPIC,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, RequestCode.GET_TOPICS_BY_CLUSTER) == (
        10, 11, 34, 103, 105, 206, 224)
    assert (ResponseCode.SUCCESS, ResponseCode.SYSTEM_BUSY, ResponseCode.TOPIC_NOT_EXIST,
            ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_OFFSET_MOVED, ResponseCode.BAD_REQUEST) == (
        0, 2, 17, 19, 21, 400)
    assert len({c.value for c in RequestCode}) == len(RequestCode)
    assert len({c.value for c in ResponseCode}) == len(ResponseCode)


def test_code_name():
    assert codes.code_name(11) == "PULL_MESSAGE(11)"
    assert codes.code_name(17, ResponseCode) == "TOPIC_NOT_EXIST(17)"
    assert codes.code_name(7777) == "7777"


@pytest.mark.parametrize("exc,code,back", [
    (ValidationError("bad topic"), ResponseCode.MESSAGE_ILLEGAL, ValidationError),
    (NoRouteError("no route"), ResponseCode.TOPIC_NOT_EXIST, NoRouteError),
    (BrokerBusyError("busy"), ResponseCode.SYSTEM_BUSY, BrokerBusyError),
    (StoreFullError("full"), ResponseCode.SYSTEM_BUSY, BrokerBusyError),
    (MessageNotFoundError("gone"), ResponseCode.QUERY_NOT_FOUND, MessageNotFoundError),
    (ProtocolError("bad field"), ResponseCode.BAD_REQUEST, RemoteError),
    (HostMQError("other"), ResponseCode.SYSTEM_ERROR, RemoteError),
    (RuntimeError("bug"), ResponseCode.SYSTEM_ERROR, RemoteError),
])
def test_errors_map_to_codes_and_back(exc, code, back):
    assert codes.response_code_for(exc) == code
    err = codes.error_for_response(code, str(exc), "ipc:///x.sock")
    assert type(err) is back and str(exc) in str(err)
    if back is RemoteError:
        assert err.code == code and err.remark == str(exc) and "ipc:///x.sock" in str(err)


def test_protocol_package_does_not_import_zmq():
    import subprocess
    import sys
    code = "import sys, hostmq.protocol; print('zmq' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
