"""Property and table tests for hostmq.records: every layout round-trips, every bad input is typed."""
from __future__ import annotations

import re
import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostmq import records as r
from hostmq.errors import CorruptRecordError, ValidationError
from hostmq.message import MessageExt

pytestmark = pytest.mark.timeout(60)

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

I32 = st.integers(-(1 << 31), (1 << 31) - 1)
I64 = st.integers(-(1 << 63), (1 << 63) - 1)
U63 = st.integers(0, (1 << 63) - 1)

topics = st.from_regex(r"[%|a-zA-Z0-9_-]{1,127}", fullmatch=True)
prop_chars = st.characters(exclude_characters="\x01\x02", exclude_categories=("Cs",))
prop_text = st.text(prop_chars, min_size=1, max_size=30)     # an empty value is never written (issue 31)
prop_names = st.text(prop_chars, min_size=1, max_size=20)
prop_dicts = st.dictionaries(prop_names, prop_text, max_size=8)
hosts = st.binary(min_size=8, max_size=8)
key_words = st.text(st.characters(exclude_characters="\x01\x02 ", exclude_categories=("Cs",)),
                    min_size=1, max_size=10)

# Byte ranges of the header fields, from the one declaration in records.
FIELD_RANGE = {name: (off, off + r.MSG_HEADER_DTYPE.fields[name][0].itemsize)
               for name, off in r.FIELD.items()}


@st.composite
def record_args(draw, max_body=2000):
    """Keyword arguments of encode_record plus the decoded values they should give back."""
    props = draw(prop_dicts)
    tags = draw(st.none() | key_words)
    keys = draw(st.lists(key_words, max_size=3))
    if tags is not None:
        props[r.PROP_TAGS] = tags
    if keys:
        props[r.PROP_KEYS] = r.KEY_SEPARATOR.join(keys)
    return dict(
        topic=draw(topics), body=draw(st.binary(max_size=max_body)), props=props,
        queue_id=draw(I32), flag=draw(I32), sys_flag=draw(I32), born_ts_ms=draw(I64),
        born_host=draw(hosts), store_ts_ms=draw(I64), store_host=draw(hosts),
        reconsume_times=draw(I32), prepared_tx_offset=draw(I64), queue_offset=draw(I64),
        phys_offset=draw(U63),
    )


def encode(a: dict, **over) -> bytes:
    a = {**a, **over}
    kw = {k: v for k, v in a.items() if k not in ("topic", "body", "props")}
    return r.encode_record(a["topic"].encode("ascii"), a["body"], r.encode_properties(a["props"]), **kw)


def simple_record(body=b"hello body", topic="TopicTest", props=None) -> bytes:
    return encode(dict(topic=topic, body=body, props=props if props is not None else
                       {r.PROP_TAGS: "TagA", r.PROP_KEYS: "k1 k2", "user": "v\u00e9"},
                       queue_id=3, flag=7, sys_flag=0, born_ts_ms=1_700_000_000_000,
                       born_host=b"ABCD\0\0\0\x01", store_ts_ms=1_700_000_000_123,
                       store_host=b"WXYZ\0\0\0\x02", reconsume_times=2, prepared_tx_offset=0,
                       queue_offset=41, phys_offset=4096))


BUFFER_KINDS = {
    "bytes": bytes,
    "bytearray": bytearray,
    "memoryview": memoryview,
    "numpy": lambda b: np.frombuffer(b, dtype=np.uint8),
}


# ---------------------------------------------------------------------------------------------
# 1. Round trip
# ---------------------------------------------------------------------------------------------
@SETTINGS
@given(record_args(), st.sampled_from(sorted(BUFFER_KINDS)), st.integers(0, 64))
def test_record_round_trip(a, kind, pad):
    rec = encode(a)
    assert len(rec) == r.record_size(len(a["body"]), len(a["topic"]), len(r.encode_properties(a["props"])))
    buf = BUFFER_KINDS[kind](b"\xee" * pad + rec + b"\xff" * pad)
    assert r.check_record(buf, pad, pad + len(rec)) == (r.RecordKind.MESSAGE, len(rec))
    h, topic, body, props = r.decode_record(buf, pad, pad + len(rec), verify_crc=True)
    assert (topic, body, props) == (a["topic"], a["body"], a["props"])
    assert h.total_size == len(rec) and h.magic == r.MAGIC_CODE and h.body_length == len(a["body"])
    assert h.body_crc == zlib.crc32(a["body"]) & 0x7FFFFFFF
    for name in ("queue_id", "flag", "sys_flag", "born_ts_ms", "born_host", "store_ts_ms", "store_host",
                 "reconsume_times", "prepared_tx_offset", "queue_offset", "phys_offset"):
        assert getattr(h, name) == a[name], name
    assert r.record_topic(buf, pad) == a["topic"]
    assert r.decode_properties(r.record_properties_bytes(buf, pad)) == a["props"]


@SETTINGS
@given(record_args())
def test_message_ext_reads_what_was_encoded(a):
    a["sys_flag"] &= ~r.SYSFLAG_COMPRESSED   # a compressed body is covered in test_message.py
    raw = encode(a)
    m = MessageExt(raw, broker="b0")
    assert m.raw == raw and m.store_size == len(raw)
    assert m.topic == a["topic"] and m.body == a["body"]
    assert m.properties == a["props"]
    assert m.tags == a["props"].get(r.PROP_TAGS)
    want_keys = tuple(k for k in a["props"].get(r.PROP_KEYS, "").split(" ") if k)
    assert m.keys == want_keys
    assert (m.queue_id, m.queue_offset, m.commitlog_offset) == (a["queue_id"], a["queue_offset"],
                                                                 a["phys_offset"])
    assert (m.flag, m.sys_flag, m.reconsume_times) == (a["flag"], a["sys_flag"], a["reconsume_times"])
    assert (m.born_timestamp_ms, m.store_timestamp_ms) == (a["born_ts_ms"], a["store_ts_ms"])
    assert m.msg_id == r.encode_msg_id(a["store_host"], a["phys_offset"])
    assert r.decode_msg_id(m.msg_id) == (a["store_host"], a["phys_offset"])
    assert m.queue.queue_id == a["queue_id"] and m.queue.broker == "b0"


def test_record_layout_offsets_match_the_docstring():
    assert r.MSG_HEADER.size == 88
    assert [r.FIELD[n] for n in ("total_size", "magic", "body_crc", "queue_id", "flag", "queue_offset",
                                 "phys_offset", "sys_flag", "born_ts_ms", "born_host", "store_ts_ms",
                                 "store_host", "reconsume_times", "prepared_tx_offset", "body_length")] == \
        [0, 4, 8, 12, 16, 20, 28, 36, 40, 48, 56, 64, 72, 76, 84]
    assert r.record_size(0, 0, 0) == 91
    assert struct.unpack(">i", struct.pack(">I", r.MAGIC_CODE))[0] == -626843481
    assert struct.unpack(">i", struct.pack(">I", r.BLANK_MAGIC_CODE))[0] == -875286124


def test_encode_record_rejects_lengths_its_fields_cannot_hold():
    with pytest.raises(ValidationError):
        r.encode_record(b"t" * 256, b"", b"")
    with pytest.raises(ValidationError):
        r.encode_record(b"t", b"", b"a\x01" + b"v" * 0xFFFF + b"\x02")
    rec = r.encode_record(b"t" * 255, b"", b"")        # the largest that fits still decodes
    assert r.decode_record(rec)[1] == "t" * 255


def test_check_record_limit_past_the_buffer_is_a_corrupt_record():
    rec = simple_record()
    with pytest.raises(CorruptRecordError):
        r.check_record(rec[:50], 0, len(rec))
    with pytest.raises(CorruptRecordError):
        r.decode_record(rec[:-1], 0, len(rec))


# ---------------------------------------------------------------------------------------------
# 2. Truncation
# ---------------------------------------------------------------------------------------------
def _assert_every_prefix_is_corrupt(rec: bytes) -> None:
    for n in range(len(rec)):
        prefix = rec[:n]
        with pytest.raises(CorruptRecordError):
            r.check_record(prefix, 0, n)
        with pytest.raises(CorruptRecordError):
            r.decode_record(prefix, 0, n)
        with pytest.raises(CorruptRecordError):   # a full buffer but a limit inside the record
            r.check_record(rec, 0, n)


def test_every_prefix_of_a_fixed_record_is_corrupt():
    _assert_every_prefix_is_corrupt(simple_record())
    _assert_every_prefix_is_corrupt(encode(dict(topic="T", body=b"", props={})))


@FEW
@given(record_args(max_body=300))
def test_every_prefix_of_a_random_record_is_corrupt(a):
    _assert_every_prefix_is_corrupt(encode(a))


# ---------------------------------------------------------------------------------------------
# 3. Bit flips and garbage
# ---------------------------------------------------------------------------------------------
MUST_RAISE_FIELDS = ("total_size", "magic", "body_crc", "body_length")
UNCHECKED_FIELDS = tuple(n for n in r.FIELD if n not in MUST_RAISE_FIELDS)


def _flip(rec: bytes, bit: int) -> bytes:
    b = bytearray(rec)
    b[bit // 8] ^= 1 << (bit % 8)
    return bytes(b)


def _decode_or_corrupt(buf):
    try:
        return r.decode_record(buf, 0, len(buf), verify_crc=True)
    except CorruptRecordError:
        return None


def _must_raise(byte: int, body_len: int) -> bool:
    in_body = r.MSG_HEADER.size <= byte < r.MSG_HEADER.size + body_len
    return in_body or any(lo <= byte < hi for lo, hi in (FIELD_RANGE[n] for n in MUST_RAISE_FIELDS))


def test_every_single_bit_flip_of_a_fixed_record():
    rec = simple_record(body=bytes(range(256)) * 2)
    original = r.decode_record(rec)
    for bit in range(len(rec) * 8):
        flipped = _flip(rec, bit)
        byte = bit // 8
        if _must_raise(byte, 512):
            with pytest.raises(CorruptRecordError):
                r.decode_record(flipped, 0, len(flipped), verify_crc=True)
            continue
        got = _decode_or_corrupt(flipped)
        field = next((n for n in UNCHECKED_FIELDS if FIELD_RANGE[n][0] <= byte < FIELD_RANGE[n][1]), None)
        if field is not None:
            # V1 has only the body CRC: an unchecked header field decodes, with just that field changed.
            assert got is not None
            changed = [n for n in r.RecordHeader._fields if getattr(got[0], n) != getattr(original[0], n)]
            assert changed == [field]
            assert got[1:] == original[1:]


@SETTINGS
@given(record_args(max_body=500), st.data())
def test_random_bit_flip_raises_only_corrupt_record_error(a, data):
    rec = encode(a)
    bit = data.draw(st.integers(0, len(rec) * 8 - 1))
    flipped = _flip(rec, bit)
    if _must_raise(bit // 8, len(a["body"])):
        with pytest.raises(CorruptRecordError):
            r.decode_record(flipped, 0, len(flipped), verify_crc=True)
    else:
        _decode_or_corrupt(flipped)
        _decode_or_corrupt(np.frombuffer(flipped, dtype=np.uint8))


@SETTINGS
@given(st.binary(max_size=400))
def test_garbage_raises_only_corrupt_record_error(garbage):
    _decode_or_corrupt(garbage)
    try:
        r.check_record(garbage, 0, len(garbage), verify_crc=True)
    except CorruptRecordError:
        pass


@SETTINGS
@given(st.integers(-(1 << 31), (1 << 31) - 1) | st.integers(0, 600), st.binary(max_size=500),
       st.sampled_from([r.MAGIC_CODE, r.BLANK_MAGIC_CODE]), st.booleans())
def test_garbage_behind_a_valid_magic_raises_only_corrupt_record_error(total, garbage, magic, exact):
    """Garbage reaches the length checks only behind a real magic code, so put one there."""
    size = 8 + len(garbage) if exact else total
    buf = r.SIZE_MAGIC.pack(size, magic) + garbage
    for b in (buf, np.frombuffer(buf, dtype=np.uint8)):
        _decode_or_corrupt(b)
        try:
            r.check_record(b, 0, len(buf), verify_crc=False)
        except CorruptRecordError:
            pass


# ---------------------------------------------------------------------------------------------
# 4. Blank record
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [8, 9, 91, 4096])
def test_blank_record(n):
    buf = r.BLANK.pack(n, r.BLANK_MAGIC_CODE) + b"\0" * (n - 8)
    assert r.check_record(buf, 0, n) == (r.RecordKind.BLANK, n)
    assert r.check_record(b"x" * 5 + buf, 5, 5 + n) == (r.RecordKind.BLANK, n)
    with pytest.raises(CorruptRecordError):
        r.decode_record(buf)           # a blank is not a message


@pytest.mark.parametrize("n", [-(1 << 31), -1, 0, 1, 7])
def test_blank_record_too_small(n):
    buf = r.BLANK.pack(n, r.BLANK_MAGIC_CODE) + b"\0" * 64
    with pytest.raises(CorruptRecordError):
        r.check_record(buf, 0, len(buf))


def test_blank_record_larger_than_the_room():
    buf = r.BLANK.pack(100, r.BLANK_MAGIC_CODE) + b"\0" * 92
    assert r.check_record(buf, 0, 100) == (r.RecordKind.BLANK, 100)
    with pytest.raises(CorruptRecordError):
        r.check_record(buf, 0, 99)
    with pytest.raises(CorruptRecordError):
        r.check_record(buf[:99], 0, 99)


# ---------------------------------------------------------------------------------------------
# 5. Properties
# ---------------------------------------------------------------------------------------------
@SETTINGS
@given(prop_dicts)
def test_properties_round_trip(props):
    data = r.encode_properties(props)
    assert r.decode_properties(data) == props
    assert data.count(b"\x02") == len(props)


def test_properties_exact_bytes():
    assert r.encode_properties({}) == b""
    assert r.encode_properties({"TAGS": "A", "k": None}) == b"TAGS\x01A\x02"   # None is left out
    assert r.encode_properties({"k": "", "TAGS": "A"}) == b"TAGS\x01A\x02"     # so is an empty value
    assert r.decode_properties(b"TAGS\x01A\x02k\x01\x02") == {"TAGS": "A"}     # an empty value is dropped
    assert r.decode_properties(b"k\x01v\x02k\x01\x02") == {"k": "v"}         # ... before it could overwrite
    assert r.decode_properties(b"k\x01v\x02k\x01w\x02") == {"k": "w"}        # a name twice: the last value
    assert r.decode_properties(b"a\x01b") == {"a": "b"}   # RocketMQ tolerates a missing final \x02


@pytest.mark.parametrize("props", [
    {"a\x01": "v"}, {"a\x02": "v"}, {"a": "v\x01"}, {"a": "v\x02"}, {"": "v"}, {"\x01": "v"},
    {"a": "\ud800"}, {"\udfff": "v"}, {None: "v"},
])
def test_properties_that_cannot_be_encoded(props):
    with pytest.raises(ValidationError):
        r.encode_properties(props)


@pytest.mark.parametrize("data", [
    b"abc\x02", b"abc", b"\x01v\x02", b"a\x01b\x02noseparator\x02", b"\xff\x01v\x02", b"a\x01\xc3\x02",
    b"\xed\xa0\x80\x01v\x02",
])
def test_malformed_properties(data):
    with pytest.raises(CorruptRecordError):
        r.decode_properties(data)


@SETTINGS
@given(st.binary(max_size=200))
def test_random_property_bytes_raise_only_corrupt_record_error(data):
    try:
        out = r.decode_properties(data)
    except CorruptRecordError:
        return
    assert all(isinstance(k, str) and k and isinstance(v, str) for k, v in out.items())


# ---------------------------------------------------------------------------------------------
# 6. Message id
# ---------------------------------------------------------------------------------------------
@SETTINGS
@given(hosts, U63)
def test_msg_id_round_trip(host, phys):
    mid = r.encode_msg_id(host, phys)
    assert re.fullmatch(r"[0-9A-F]{32}", mid)
    assert r.decode_msg_id(mid) == (host, phys)
    assert r.decode_msg_id(mid.lower()) == (host, phys)


def test_msg_id_exact():
    assert r.encode_msg_id(b"\x01\x02\x03\x04\0\0\0\x05", 4096) == "0102030400000005" + "0000000000001000"


@pytest.mark.parametrize("bad", [
    "", "0" * 31, "0" * 33, "G" * 32, "0" * 30 + "zz", "00  " + "0" * 28, " " + "0" * 31, "0" * 31 + "\n",
    "\uff10" * 32, "FFFFFFFFFFFFFFFF" + "8000000000000000", "0" * 16 + "F" * 16,
    None, 12, b"0" * 32, ["0" * 32],
])
def test_bad_msg_id(bad):
    with pytest.raises(ValidationError):
        r.decode_msg_id(bad)


@SETTINGS
@given(st.text(max_size=40) | st.binary(max_size=40) | st.integers())
def test_random_msg_id_input_raises_only_validation_error(value):
    try:
        host, phys = r.decode_msg_id(value)
    except ValidationError:
        return
    assert len(host) == 8 and phys >= 0


# ---------------------------------------------------------------------------------------------
# 7. Batches
# ---------------------------------------------------------------------------------------------
@SETTINGS
@given(st.lists(record_args(max_body=200), min_size=0, max_size=12), st.integers(0, 300), I64,
       st.integers(0, 1 << 40), st.integers(0, 1 << 40), st.integers(0, 64))
def test_batch_patch_and_decode(args, base, store_ts, q0, file_from, tail):
    recs = [encode(a) for a in args]
    blob, starts = r.encode_batch(recs)
    assert blob == b"".join(recs)
    assert starts.dtype == np.int64
    assert starts.tolist() == [sum(map(len, recs[:i])) for i in range(len(recs))]
    assert r.batch_record_sizes(blob, starts).tolist() == [len(x) for x in recs]

    buf = np.zeros(base + len(blob) + tail, dtype=np.uint8)
    buf[base:base + len(blob)] = np.frombuffer(blob, dtype=np.uint8)
    abs_starts = base + starts
    queue_offsets = q0 + np.arange(len(recs), dtype=np.int64)
    phys_offsets = file_from + abs_starts
    r.patch_batch(buf, abs_starts, queue_offsets, phys_offsets, store_ts)

    assert r.batch_record_sizes(buf[base:base + len(blob)], starts).tolist() == [len(x) for x in recs]
    for i, a in enumerate(args):
        pos = int(abs_starts[i])
        assert r.check_record(buf, pos, len(buf)) == (r.RecordKind.MESSAGE, len(recs[i]))
        h, topic, body, props = r.decode_record(buf, pos, len(buf), verify_crc=True)
        assert (h.queue_offset, h.phys_offset, h.store_ts_ms) == (q0 + i, file_from + pos, store_ts)
        assert (topic, body, props) == (a["topic"], a["body"], a["props"])
        assert (h.queue_id, h.born_ts_ms, h.store_host) == (a["queue_id"], a["born_ts_ms"], a["store_host"])
        # Nothing but the three patched fields changed.
        assert bytes(buf[pos:pos + len(recs[i])]) == encode(a, queue_offset=q0 + i, phys_offset=file_from + pos,
                                                             store_ts_ms=store_ts)
    assert not buf[:base].any() and not buf[base + len(blob):].any()


def test_batch_record_sizes_rejects_starts_outside_the_blob():
    blob, starts = r.encode_batch([simple_record(), simple_record()])
    for bad in ([0, len(blob)], [len(blob) - 3], [-1], [len(blob) + 100, 0]):
        with pytest.raises(CorruptRecordError):
            r.batch_record_sizes(blob, np.array(bad, dtype=np.int64))
    assert r.batch_record_sizes(blob, np.array([], dtype=np.int64)).tolist() == []


# ---------------------------------------------------------------------------------------------
# 8. Java String.hashCode
# ---------------------------------------------------------------------------------------------
def java_hash_reference(s: str) -> int:
    """Independent reference: s[0]*31^(n-1) + ... over UTF-16 code units, wrapped to a signed int."""
    units = []
    for ch in s:
        cp = ord(ch)
        if cp > 0xFFFF:
            cp -= 0x10000
            units += [0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)]
        else:
            units.append(cp)
    n = len(units)
    h = sum(u * 31 ** (n - 1 - i) for i, u in enumerate(units)) % (1 << 32)
    return h - (1 << 32) if h >= 1 << 31 else h


JAVA_HASHES = [
    ("", 0),
    ("a", 97),
    ("TagA", 2598919),
    ("hello world", 1794106052),
    ("The quick brown fox jumps over the lazy dog", -609428141),
    ("polygenelubricants", -2147483648),     # the classic Integer.MIN_VALUE hashCode
    ("x" * 300, -1757771264),
    ("\u00e9", 233),
    ("\u4e2d\u6587", 646394),
    ("\U0001F600", 1772899),                  # surrogate pair D83D DE00
    ("a\U0001F600b", 57849694),
]


@pytest.mark.parametrize("s,want", JAVA_HASHES)
def test_java_string_hash_table(s, want):
    assert java_hash_reference(s) == want
    assert r.java_string_hash(s) == want
    assert r.tag_hash(s) == want
    assert int(r.java_string_hash_many([s])[0]) == want


def test_java_string_hash_many_table():
    strings = [s for s, _ in JAVA_HASHES]
    got = r.java_string_hash_many(strings)
    assert got.dtype == np.int32 and got.tolist() == [w for _, w in JAVA_HASHES]
    bmp_only = [s for s in strings if all(ord(c) <= 0xFFFF for c in s) and len(s) < 256]
    assert r.java_string_hash_many(bmp_only).tolist() == [java_hash_reference(s) for s in bmp_only]
    assert r.java_string_hash_many([]).tolist() == []


def test_java_string_hash_lone_surrogate():
    assert r.java_string_hash("\ud800") == 0xD800
    assert r.java_string_hash("a\udc00") == 97 * 31 + 0xDC00
    assert r.java_string_hash_many(["\ud800", "a\udc00", "\U0001F600"]).tolist() == \
        [0xD800, 97 * 31 + 0xDC00, 1772899]


any_chars = st.characters(codec=None, categories=None, exclude_categories=())
hash_texts = st.text(any_chars, max_size=40) | st.sampled_from(["", "\x00", "a\x00", "\x00a", "\U0001F600"]) \
    | st.text(st.sampled_from("ab\x00\u00e9\u4e2d"), min_size=200, max_size=300)


@SETTINGS
@given(st.lists(hash_texts, max_size=20))
def test_java_string_hash_many_matches_scalar(strings):
    got = r.java_string_hash_many(strings)
    assert got.dtype == np.int32 and got.shape == (len(strings),)
    assert got.tolist() == [r.java_string_hash(s) for s in strings]
    assert got.tolist() == [java_hash_reference(s) for s in strings]


@SETTINGS
@given(st.text(max_size=60))
def test_java_string_hash_matches_reference(s):
    assert r.java_string_hash(s) == java_hash_reference(s)


# ---------------------------------------------------------------------------------------------
# 9. Consume queue entry, index entry, index header, checkpoint
# ---------------------------------------------------------------------------------------------
@SETTINGS
@given(I64, I32, I64)
def test_cq_entry_dtype_and_struct_agree(phys, size, tag):
    assert r.CQ_ENTRY.itemsize == r.CQ_ENTRY_STRUCT.size == 20
    raw = r.CQ_ENTRY_STRUCT.pack(phys, size, tag)
    e = np.frombuffer(raw, dtype=r.CQ_ENTRY)[0]
    assert (int(e["phys_offset"]), int(e["size"]), int(e["tag_hash"])) == (phys, size, tag)
    arr = np.zeros(1, dtype=r.CQ_ENTRY)
    arr[0] = (phys, size, tag)
    assert arr.tobytes() == raw


@SETTINGS
@given(I32, I64, I32, I32)
def test_index_entry_dtype_and_struct_agree(key_hash, phys, diff, prev):
    assert r.INDEX_ENTRY.itemsize == r.INDEX_ENTRY_STRUCT.size == 20
    raw = r.INDEX_ENTRY_STRUCT.pack(key_hash, phys, diff, prev)
    e = np.frombuffer(raw, dtype=r.INDEX_ENTRY)[0]
    assert (int(e["key_hash"]), int(e["phys_offset"]), int(e["time_diff_s"]), int(e["prev_index"])) == \
        (key_hash, phys, diff, prev)
    arr = np.zeros(1, dtype=r.INDEX_ENTRY)
    arr[0] = (key_hash, phys, diff, prev)
    assert arr.tobytes() == raw


def test_index_header_and_file_size():
    assert r.INDEX_HEADER.size == 40
    hdr = r.IndexHeader(1, 2, 3, 4, 5, 6)
    assert r.IndexHeader._make(r.INDEX_HEADER.unpack(r.INDEX_HEADER.pack(*hdr))) == hdr
    assert r.INDEX_SLOT.itemsize == 4
    assert r.index_file_bytes(0, 0) == 40
    assert r.index_file_bytes(5_000_000, 20_000_000) == 40 + 5_000_000 * 4 + 20_000_000 * 20


checkpoints = st.builds(r.Checkpoint, *([I64] * 8))


@SETTINGS
@given(checkpoints, st.binary(max_size=64))
def test_checkpoint_round_trip(cp, trailer):
    data = r.encode_checkpoint(cp)
    assert len(data) == r.CHECKPOINT.size == 68
    assert r.decode_checkpoint(data) == cp
    assert r.decode_checkpoint(data + trailer) == cp        # the file is padded to CHECKPOINT_FILE_BYTES
    assert r.decode_checkpoint(np.frombuffer(data, dtype=np.uint8)) == cp


def _checkpoint_corruptions(data: bytes):
    for n in range(len(data)):
        yield data[:n]
    for bit in range(r.CHECKPOINT.size * 8):
        yield _flip(data, bit)


def test_every_truncated_or_flipped_checkpoint_is_corrupt():
    data = r.encode_checkpoint(r.Checkpoint(1_700_000_000_000, 2, 3, 4, 5, 1 << 40, 7, -8)) + b"\0" * 100
    for bad in _checkpoint_corruptions(data[:r.CHECKPOINT.size]):
        with pytest.raises(CorruptRecordError):
            r.decode_checkpoint(bad)
    for bit in range(r.CHECKPOINT.size * 8):
        with pytest.raises(CorruptRecordError):
            r.decode_checkpoint(_flip(data, bit))


@FEW
@given(checkpoints)
def test_random_checkpoint_corruptions(cp):
    data = r.encode_checkpoint(cp)
    for bad in _checkpoint_corruptions(data):
        with pytest.raises(CorruptRecordError):
            r.decode_checkpoint(bad)


# ---------------------------------------------------------------------------------------------
# 10. Topic validation
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("topic", ["a", "TopicTest", "%RETRY%group", "a|b", "A-b_9", "x" * 127])
def test_valid_topics(topic):
    assert r.validate_topic(topic) == topic.encode("ascii")


@pytest.mark.parametrize("topic", ["", None, 1, b"abc", "x" * 128, "a b", "a/b", "\u4e2d", "abc\n", "\nabc",
                                   "a\x00", "a.b", "\u00e9"])
def test_invalid_topics(topic):
    with pytest.raises(ValidationError):
        r.validate_topic(topic)


@SETTINGS
@given(topics)
def test_generated_topics_are_valid(topic):
    assert r.validate_topic(topic) == topic.encode("ascii")


@SETTINGS
@given(st.text(max_size=130))
def test_validate_topic_agrees_with_the_rule(topic):
    ok = 0 < len(topic) <= 127 and all(c.isascii() and (c.isalnum() or c in "%|_-") for c in topic)
    if ok:
        assert r.validate_topic(topic) == topic.encode("ascii")
    else:
        with pytest.raises(ValidationError):
            r.validate_topic(topic)


# ---------------------------------------------------------------------------------------------
# 11. Unique ids and hosts
# ---------------------------------------------------------------------------------------------
def test_new_unique_id_distinct_and_increasing():
    ids = [r.new_unique_id() for _ in range(10_000)]
    assert all(re.fullmatch(r"[0-9A-F]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    assert all(a < b for a, b in zip(ids, ids[1:]))
    assert {i[:16] for i in ids} == {r.host_bytes().hex().upper()}


def test_host_bytes():
    assert len(r.host_tag()) == 4
    assert r.host_bytes(1234) == r.host_tag() + struct.pack(">I", 1234)
    assert len(r.host_bytes()) == 8
