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
    # An empty DELAY is no longer written (issue 31); a record stored before that still reads.
    props = r.encode_properties({r.PROP_DELAY: stored}) if stored else b"DELAY\x01\x02"
    ext = MessageExt(r.encode_record(b"T", b"x", props))
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


# -- MessageExt.check: the read side's decode check (issue 15, item 9) ----------------------------------
def reference_decodes(raw: bytes) -> bool:
    """The slow, canonical answer: records.decode_record without the body CRC, plus an inflating
    compressed body."""
    try:
        h, _, body, _ = r.decode_record(raw, 0, len(raw), verify_crc=False)
        if h.sys_flag & r.SYSFLAG_COMPRESSED:
            r.decompress_body(body)
    except CorruptRecordError:
        return False
    return True


def checks(raw) -> bool:
    try:
        MessageExt(raw).check()
    except CorruptRecordError:
        return False
    return True


GOOD = to_record(Message("TopicTest", b"hello", tags="TagA", keys=["k1"], properties={"u": "v"}))


def with_props(props: bytes, **kw) -> bytes:
    return r.encode_record(b"TopicTest", b"hello", props, **kw)


@pytest.mark.parametrize("props,ok", [
    (b"", True), (b"a\x01b\x02", True), (b"a\x01\x02", True), (b"a\x01b\x01c\x02", True), (b"\x02", True),
    (b"a\x01b\x02\x02", True), ("k\x01\u00e9\u4e2d\x02".encode(), True),
    (b"a\x01\xff\xfe\x02", False),           # not UTF-8: the review's stalled-consumer record
    (b"\xc3\x02", False), (b"ab\x02", False), (b"\x01b\x02", False), (b"a\x01b", False),
    (b"a\x01b\x02c\x02", False), (b"\xed\xa0\x80\x01x\x02", False),     # a UTF-8-encoded surrogate
])
def test_check_accepts_what_decode_properties_accepts(props, ok):
    raw = with_props(props)
    assert checks(raw) is ok is reference_decodes(raw)
    if ok:
        assert MessageExt(raw).properties == r.decode_properties(props)


def test_every_accessor_of_an_undecodable_record_raises_the_typed_error():
    bad = with_props(b"TAGS\x01\xff\x02")
    for raw in (bad, bad[:50], b"", GOOD[:-1] + b"\x00", b"\x00" * 200):
        m = MessageExt(raw)
        for name in ("topic", "body", "tags", "keys", "properties", "delay_level", "unique_id", "msg_id",
                     "queue_id", "queue_offset", "store_timestamp_ms", "flag", "queue"):
            try:
                getattr(m, name)
            except CorruptRecordError:
                pass
        with pytest.raises(CorruptRecordError):
            m.check()


def test_check_names_the_place_the_entry_expected():
    raw = to_record(Message("TopicTest", b"x"), queue_id=1, queue_offset=9)
    MessageExt(raw).check(b"TopicTest", 1, 9)
    for args, why in (((b"Other", 1, 9), "topic"), ((b"TopicTest", 2, 9), "queue 1"),
                      ((b"TopicTest", 1, 8), "queue offset 9")):
        with pytest.raises(CorruptRecordError, match=why):
            MessageExt(raw).check(*args)


def test_check_inflates_a_compressed_body_once():
    raw = to_record(Message("T", b"data" * 50), body=zlib.compress(b"data" * 50), sys_flag=r.SYSFLAG_COMPRESSED)
    m = MessageExt(raw)
    m.check()
    assert m.body == b"data" * 50 and m.body is m.body
    with pytest.raises(CorruptRecordError, match="inflate"):
        MessageExt(to_record(Message("T", b"x"), body=b"not zlib", sys_flag=r.SYSFLAG_COMPRESSED)).check()


@settings(max_examples=500, deadline=None)
@given(st.data())
def test_check_agrees_with_the_reference_decoder_on_damaged_records(data):
    raw = bytearray(data.draw(st.sampled_from([GOOD, with_props(b"a\x01b\x02c\x01\x02"), with_props(b""),
                                               to_record(Message("T", b"z"), body=zlib.compress(b"z"),
                                                         sys_flag=r.SYSFLAG_COMPRESSED)])))
    for _ in range(data.draw(st.integers(0, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        # mostly the tail (topic, properties), where the body CRC does not look
        if data.draw(st.booleans()):
            at = data.draw(st.integers(max(0, len(raw) - 40), len(raw) - 1))
        raw[at] = data.draw(st.sampled_from([0, 1, 2, 0x80, 0xC3, 0xFF, data.draw(st.integers(0, 255))]))
    cut = data.draw(st.sampled_from([len(raw), len(raw), data.draw(st.integers(0, len(raw)))]))
    raw = bytes(raw[:cut])
    assert checks(raw) is reference_decodes(raw)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=64))
def test_check_agrees_with_the_reference_decoder_on_any_property_bytes(props, body):
    for tail in (props, props + b"\x02"):
        raw = r.encode_record(b"T", body, tail)
        assert checks(raw) is reference_decodes(raw)
