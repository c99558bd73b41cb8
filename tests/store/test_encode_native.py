"""A producer's messages as records in C (hostmq/store/_encode.c) against the spec in
hostmq/store/encode.py (``py_encode_messages``, ``py_restamp``, ``py_batch_msg_ids``), and a sync
send's SendResult against ``store.gather.py_send_result``.

Hypothesis draws batches of messages — plain ones, tags (unicode, empty, holding the property
separators, lone surrogates), keys, user properties, delays, flags at and past 32 bits, bodies that
are empty, too long, bytearrays or not bytes at all, other topics, subclasses of Message, objects
that are not messages — with the same unique-id counter on both sides. Where C takes the batch it
must give the spec's bytes and sizes and draw the same ids; where it hands it back (None) it must
have drawn none, and the public ``encode_messages`` then gives the spec's outcome, result or error.
The producer's sends (send, send_batch) go through this path; tests/e2e covers them end to end.
"""
from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hostmq import records as R
from hostmq.errors import ValidationError
from hostmq.message import Message, MessageQueue, SendResult, SendStatus
from hostmq.store import encode as E
from hostmq.store.gather import py_send_result

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(E.NATIVE is None, reason="hostmq/store/_encode.c is not built")]
T = "EncT"
PREFIX = "0A0B0C0D00001234"
HOST, STORE = b"\x7f\x00\x00\x01\x00\x00\x10\x00", b"\x7f\x00\x00\x01\x00\x00\x20\x00"
MAX_BODY, MAX_PROPS = 256, 96


class MyMessage(Message):
    __slots__ = ()


def counter(start: int):
    c = itertools.count(start)
    drawn = []

    def nxt() -> int:
        v = next(c)
        drawn.append(v)
        return v
    nxt.drawn = drawn
    return nxt


def args(msgs, *, queue_id=3, born_ts_ms=1_700_000_000_123, max_body=MAX_BODY, max_props=MAX_PROPS, store=STORE):
    return dict(queue_id=queue_id, born_ts_ms=born_ts_ms, born_host=HOST, store_host=store, max_body_bytes=max_body,
                max_props_bytes=max_props, uid_prefix=PREFIX)


def spec(msgs, start, topic=T, **kw):
    return E.py_encode_messages(msgs, topic, topic.encode(), **args(msgs, **kw), uid_next=counter(start))


def native(msgs, nxt, topic=T, **kw):
    a = args(msgs, **kw)
    return E.NATIVE.encode_messages(msgs, topic, topic.encode(), a["queue_id"], a["born_ts_ms"], HOST, STORE,
                                    a["max_body_bytes"], a["max_props_bytes"], E._TAGS_B, E._UNIQ_B, PREFIX, nxt)


def outcome(f):
    try:
        return "ok", f()
    except (ValidationError, AttributeError, TypeError) as e:   # a slot deleted; a tag that is no str
        return "error", (type(e), str(e))


HOSTILE = {      # per field, values the fast path does not take or the spec refuses (and edge values it takes)
    "body": st.sampled_from([b"", b"x" * MAX_BODY, b"x" * (MAX_BODY + 1), bytearray(b"ab"), memoryview(b"ab"), "text"]),
    "tags": st.one_of(st.sampled_from([None, "", "t" * 26, "t" * 27, "t" * 28, "a\x01", "\x02", "\ud800", 5]),
                      st.text(max_size=12)),
    "flag": st.sampled_from([-(1 << 31), (1 << 31) - 1, 1 << 31, -(1 << 31) - 1, True, 1.0, None]),
    "keys": st.sampled_from([("k1",), ("a", "b"), ("",), ()]),
    "properties": st.sampled_from([{"u": "v"}, {"TAGS": "x"}, {"": "v"}, {}, None]),
    "delay_level": st.sampled_from([1, 3, -1, None, 0, False]),
    "topic": st.sampled_from(["Other", T + "\x00", 7, T]),
}
PLAIN_TAGS = st.one_of(st.none(), st.text(alphabet=st.characters(blacklist_characters="\x01\x02",
                                                                 blacklist_categories=("Cs",)), max_size=10))


@st.composite
def messages(draw, kind: str | None = None):
    """A plain message; with ``kind``, one step from one: a field drawn from HOSTILE, a subclass,
    not a message at all, or a slot deleted."""
    m = Message(T, draw(st.binary(min_size=1, max_size=60)), tags=draw(PLAIN_TAGS),
                flag=draw(st.integers(-(1 << 31), (1 << 31) - 1)))
    if kind in HOSTILE:
        setattr(m, kind, draw(HOSTILE[kind]))
    elif kind == "other":
        return draw(st.sampled_from([None, b"bytes", "str"]))
    elif kind == "subclass":
        m = MyMessage(T, m.body, tags=m.tags, flag=m.flag)
    elif kind == "deleted":
        delattr(m, draw(st.sampled_from(["tags", "body", "keys"])))
    return m


@st.composite
def batches(draw, kind: str):
    """Plain messages and, at a drawn place, one message of ``kind``."""
    msgs = draw(st.lists(messages(), min_size=0, max_size=10))
    msgs.insert(draw(st.integers(0, len(msgs))), draw(messages(kind)))
    return msgs


KINDS = [*HOSTILE, "other", "subclass", "deleted", "plain"]


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), start=st.integers(0, (1 << 63)))
def test_native_gives_the_specs_records_or_hands_the_batch_back_untouched(kind, data, start):
    msgs = data.draw(batches(kind))
    nxt = counter(start)
    got = native(msgs, nxt)
    want = outcome(lambda: spec(msgs, start))
    if got is None:
        event("handed back")
        assert nxt.drawn == [], "C drew unique ids for a batch it handed back"
    else:
        event("native")
        assert ("ok", got) == want
        assert nxt.drawn == list(range(start, start + len(msgs)))
    # The public entry point: always the spec's outcome (with the same counter start).
    assert outcome(lambda: E.encode_messages(msgs, T, T.encode(), **args(msgs), uid_next=counter(start))) == want


@settings(max_examples=200, deadline=None)
@given(st.lists(messages(), min_size=1, max_size=40), st.integers(0, (1 << 64) - 100),
       st.integers(-(1 << 31), (1 << 31) - 1))
def test_plain_batches_are_encoded_in_c_exactly_as_the_spec_encodes_them(msgs, start, queue_id):
    got = native(msgs, counter(start), queue_id=queue_id, max_props=4096)
    assert got is not None
    assert got == spec(msgs, start, queue_id=queue_id, max_props=4096)
    payload, sizes = got
    at = 0
    for size in sizes:                          # and every record checks as a stored record would
        assert R.check_record(payload, at, len(payload)) == (R.RecordKind.MESSAGE, size)
        at += size
    assert at == len(payload)


def test_a_record_of_each_shape_decodes_to_its_message():
    msgs = [Message(T, b"body-1", tags="TagA"), Message(T, b"\x00\xff", flag=-7), Message(T, b"z", tags="ünï")]
    payload, sizes = native(msgs, counter(41))
    at = 0
    for i, (m, size) in enumerate(zip(msgs, sizes)):
        assert R.check_record(payload, at, len(payload)) == (R.RecordKind.MESSAGE, size)
        f = R.record_fields(payload, at)
        props = R.decode_properties(payload[f[-2]:f[-2] + f[-1]])
        want = {R.PROP_UNIQ_KEY: f"{PREFIX}{41 + i:016X}"}
        if m.tags:
            want[R.PROP_TAGS] = m.tags
        assert props == want
        assert payload[f[-5]:f[-5] + f[-4]] == m.body and f[-3] == T.encode()
        at += size


def test_the_counter_past_64_bits_is_a_clear_error_and_nothing_half_written():
    msgs = [Message(T, b"a"), Message(T, b"b")]
    with pytest.raises(OverflowError, match="64-bit"):
        native(msgs, counter((1 << 64) - 1))


@settings(max_examples=200, deadline=None)
@given(st.lists(messages(), min_size=1, max_size=10), st.integers(-(1 << 31), (1 << 31) - 1),
       st.binary(max_size=10))
def test_restamp_sets_queue_and_store_host_as_the_spec_does(msgs, queue_id, host):
    payload, sizes = native(msgs, counter(7), max_props=4096)
    got = E.NATIVE.restamp(payload, sizes, queue_id, host)
    assert got == E.py_restamp(payload, sizes, queue_id, host)
    # what the producer does — encode for queue 0 and no broker, then stamp — is encoding for both
    assert got == spec(msgs, 7, queue_id=queue_id, max_props=4096, store=host)[0]


@pytest.mark.parametrize("sizes", [[10], [100, 100, 1], [], [-1, 300], [1 << 40]])
def test_restamp_hands_back_sizes_that_do_not_cover_the_payload(sizes):
    payload, real = native([Message(T, b"q" * 30), Message(T, b"r" * 30)], counter(1), max_props=4096)
    assert sizes != real
    assert E.NATIVE.restamp(payload, sizes, 1, STORE) is None


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="0123456789ABCDEF", max_size=20), st.integers(0, (1 << 62)),
       st.lists(st.integers(0, 1 << 20), min_size=1, max_size=30))
def test_batch_msg_ids_as_the_spec(host, phys, sizes):
    assert E.NATIVE.batch_msg_ids(host, phys, sizes) == E.py_batch_msg_ids(host, phys, sizes)


def test_batch_msg_ids_hands_back_what_it_does_not_take():
    assert E.NATIVE.batch_msg_ids("AB", -1, [1]) is None
    assert E.NATIVE.batch_msg_ids("AB", 1, []) is None
    assert E.NATIVE.batch_msg_ids("ÄB", 1, [1]) is None
    assert E.batch_msg_ids("ÄB", 16, [1, 2]) == E.py_batch_msg_ids("ÄB", 16, [1, 2])


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="0123456789ABCDEF", max_size=40), st.integers(0, (1 << 63) - 1), st.integers(0, (1 << 63) - 1),
       st.sampled_from(list(SendStatus)))
def test_send_result_as_the_spec(host, phys, qoff, status):
    q = MessageQueue("EncT", "broker-a", 3)
    got = E.NATIVE.send_result(SendResult, status, host, phys, q, qoff)
    want = py_send_result(SendResult, status, host, phys, q, qoff)
    assert got == want and hash(got) == hash(want) and type(got) is SendResult
    with pytest.raises(dataclasses.FrozenInstanceError):        # made in C, as frozen as the spec's
        got.queue_offset = 0


def test_send_result_hands_back_what_it_does_not_take():
    q = MessageQueue("EncT", "broker-a", 3)
    ok = SendStatus.SEND_OK
    assert E.NATIVE.send_result(SendResult, ok, "AB", -1, q, 0) is None
    assert E.NATIVE.send_result(SendResult, ok, "AB", 1, q, -1) is None
    assert E.NATIVE.send_result(SendResult, ok, "ÄB", 1, q, 0) is None            # not ASCII
    assert E.NATIVE.send_result(SendResult, ok, "A" * 65, 1, q, 0) is None        # longer than any host
    assert E.NATIVE.send_result(SendResult, ok, b"AB", 1, q, 0) is None

    class NotSlots:
        def __init__(self, *a):
            self.a = a
    assert E.NATIVE.send_result(NotSlots, ok, "AB", 1, q, 0) is None
    assert E.NATIVE.send_result(SendResult, ok, "AB", 1, q, 0) == py_send_result(SendResult, ok, "AB", 1, q, 0)
    with pytest.raises(TypeError):
        E.NATIVE.send_result(SendResult, ok, "AB", 1, q)
