"""Message nouns: Message properties, MessageQueue ordering, MessageExt decoding from a record."""
from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hostmq import records as r
from hostmq.errors import CorruptRecordError
from hostmq.message import Message, MessageExt, MessageQueue, SendResult, SendStatus

pytestmark = pytest.mark.timeout(60)

HOST = b"HOST\0\0\0\x07"


def to_record(msg: Message, *, sys_flag=0, body=None, queue_id=1, queue_offset=9, phys_offset=1234,
              extra_props=None) -> bytes:
    props = {**msg.all_properties(), **(extra_props or {})}
    return r.encode_record(r.validate_topic(msg.topic), msg.body if body is None else body,
                           r.encode_properties(props), queue_id=queue_id, flag=msg.flag, sys_flag=sys_flag,
                           born_ts_ms=111, born_host=HOST, store_ts_ms=222, store_host=HOST,
                           reconsume_times=3, queue_offset=queue_offset, phys_offset=phys_offset)


def test_message_keys_str_and_iterable():
    assert Message("T", b"x", keys="k1").keys == ("k1",)
    assert Message("T", b"x", keys="k1 k2").keys == ("k1 k2",)     # one string is one key, as given
    assert Message("T", b"x", keys=["k1", "k2"]).keys == ("k1", "k2")
    assert Message("T", b"x", keys=("k1",)).keys == ("k1",)
    assert Message("T", b"x", keys=(k for k in ("a", "b"))).keys == ("a", "b")
    assert Message("T", b"x").keys == ()


def test_message_defaults_and_property_copy():
    user = {"a": "1"}
    m = Message("T", b"body", properties=user)
    user["b"] = "2"                      # the message keeps its own copy
    assert m.properties == {"a": "1"}
    assert (m.tags, m.delay_level, m.flag) == (None, 0, 0)
    assert Message("T", b"x").properties == {}


def test_all_properties_adds_system_properties():
    m = Message("T", b"x", tags="TagA", keys=["k1", "k2"], properties={"u": "v"}, delay_level=3)
    assert m.all_properties() == {"u": "v", r.PROP_TAGS: "TagA", r.PROP_KEYS: "k1 k2", r.PROP_DELAY: "3"}
    assert m.properties == {"u": "v"}                     # all_properties does not mutate the message
    assert Message("T", b"x", keys="k").all_properties() == {r.PROP_KEYS: "k"}
    assert Message("T", b"x", properties={"u": "v"}).all_properties() == {"u": "v"}
    assert "Message(" in repr(m) and "TagA" in repr(m)


def test_message_queue_ordering_and_hashing():
    a = MessageQueue("A", "b0", 1)
    qs = [MessageQueue("B", "b0", 0), MessageQueue("A", "b1", 0), MessageQueue("A", "b0", 10), a,
          MessageQueue("A", "b0", 2)]
    assert sorted(qs) == [a, MessageQueue("A", "b0", 2), MessageQueue("A", "b0", 10),
                          MessageQueue("A", "b1", 0), MessageQueue("B", "b0", 0)]
    assert MessageQueue("A", "b0", 1) == a and hash(MessageQueue("A", "b0", 1)) == hash(a)
    assert len({a, MessageQueue("A", "b0", 1), MessageQueue("A", "b0", 2)}) == 2
    assert {a: 1}[MessageQueue("A", "b0", 1)] == 1
    assert a != MessageQueue("A", "b0", 2) and a < MessageQueue("A", "b0", 2)
    assert str(a) == "A@b0#1"
    with pytest.raises(AttributeError):
        a.queue_id = 3      # type: ignore[misc]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=3), st.text(max_size=3), st.integers(-5, 5)), max_size=8))
def test_message_queue_order_is_tuple_order(items):
    assert [(q.topic, q.broker, q.queue_id) for q in sorted(MessageQueue(*t) for t in items)] == sorted(items)


def test_send_result_is_frozen():
    res = SendResult(SendStatus.SEND_OK, "ID", MessageQueue("A", "b0", 0), 5)
    with pytest.raises(AttributeError):
        res.queue_offset = 6        # type: ignore[misc]


def test_message_ext_from_a_record():
    m = Message("TopicTest", b"hello", tags="TagA", keys=["k1", "k2"], properties={"u": "v"}, delay_level=2,
                flag=5)
    raw = to_record(m, extra_props={r.PROP_UNIQ_KEY: "U1"})
    ext = MessageExt(raw, broker="broker-a")
    assert (ext.topic, ext.body, ext.tags, ext.keys, ext.delay_level, ext.flag) == \
        ("TopicTest", b"hello", "TagA", ("k1", "k2"), 2, 5)
    assert ext.properties == {**m.all_properties(), r.PROP_UNIQ_KEY: "U1"}
    assert ext.unique_id == "U1"
    assert (ext.queue_id, ext.queue_offset, ext.commitlog_offset) == (1, 9, 1234)
    assert (ext.born_timestamp_ms, ext.store_timestamp_ms, ext.reconsume_times) == (111, 222, 3)
    assert ext.msg_id == r.encode_msg_id(HOST, 1234) and r.decode_msg_id(ext.msg_id) == (HOST, 1234)
    assert ext.queue == MessageQueue("TopicTest", "broker-a", 1)
    assert ext.store_size == len(raw) and ext.raw is raw and ext.sys_flag == 0
    assert isinstance(ext, Message)
    assert "msg_id=" in repr(ext)


def test_message_ext_without_system_properties():
    ext = MessageExt(to_record(Message("T", b"")))
    assert (ext.tags, ext.keys, ext.delay_level, ext.unique_id, ext.properties) == (None, (), 0, None, {})
    assert ext.body == b""


@pytest.mark.parametrize("stored,level", [("12", 12), ("0", 0), ("-1", 0), ("abc", 0), ("", 0), ("\u00b2", 0),
                                          ("\u0663", 3), ("1.5", 0)])
def test_message_ext_delay_level_from_stored_text(stored, level):
    ext = MessageExt(to_record(Message("T", b"x"), extra_props={r.PROP_DELAY: stored}))
    assert ext.delay_level == level


def test_message_ext_keys_drop_empty_words():
    ext = MessageExt(to_record(Message("T", b"x"), extra_props={r.PROP_KEYS: " a  b "}))
    assert ext.keys == ("a", "b")


@pytest.mark.parametrize("body", [b"", b"x", b"hello world " * 100, bytes(range(256))])
def test_message_ext_decompresses_a_compressed_body(body):
    packed = zlib.compress(body)
    raw = to_record(Message("T", body, tags="A"), body=packed,
                    sys_flag=r.SYSFLAG_COMPRESSED | r.SYSFLAG_TX_PREPARED)
    ext = MessageExt(raw)
    assert ext.body == body
    assert ext.sys_flag & r.SYSFLAG_COMPRESSED
    assert r.decode_record(raw)[2] == packed            # the record keeps the compressed bytes
    assert ext.tags == "A"
    plain = MessageExt(to_record(Message("T", packed)))   # without the flag the bytes are returned as stored
    assert plain.body == packed


def test_message_ext_bad_compressed_body_is_corrupt():
    ext = MessageExt(to_record(Message("T", b"not zlib"), sys_flag=r.SYSFLAG_COMPRESSED))
    with pytest.raises(CorruptRecordError):
        _ = ext.body


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(exclude_characters="\x01\x02", exclude_categories=("Cs",)), min_size=1,
               max_size=10),
       st.lists(st.text("abcXYZ019-_", min_size=1, max_size=8), max_size=4), st.integers(0, 18),
       st.binary(max_size=100))
def test_message_round_trips_through_a_record(tags, keys, delay, body):
    m = Message("T", body, tags=tags, keys=keys, delay_level=delay)
    ext = MessageExt(to_record(m))
    assert (ext.body, ext.tags, ext.keys, ext.delay_level) == (body, tags, tuple(keys), delay)
