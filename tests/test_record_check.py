"""The writer's checks of producer frames (pure): every bad record refuses the whole frame."""
from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hostmq import Message, records as R
from hostmq.record_check import frame_records, record_starts, single_record
from hostmq.errors import ValidationError
from hostmq.store.encode import encode_records, properties_bytes

pytestmark = pytest.mark.timeout(60)
MAX_BODY = 4 * 1024 * 1024
MAX_PROPS = 32 * 1024 - 1
HOST = b"\x01\x02\x03\x04\x00\x00\x00\x07"


def rec(body: bytes = b"hello", topic: bytes = b"T", props: bytes = b"TAGS\x01a\x02", queue_id: int = 0) -> bytes:
    return R.encode_record(topic, body, props, queue_id=queue_id, born_ts_ms=1_700_000_000_000, born_host=HOST,
                           store_host=HOST)


def patched(record: bytes, field: str, value: int) -> bytes:
    b = bytearray(record)
    fmt = {"magic": ">I", "body_crc": ">I", "queue_id": ">i", "body_length": ">i", "total_size": ">i"}[field]
    struct.pack_into(fmt, b, R.FIELD[field], value)
    return bytes(b)


# -- one record (the scalar path) ---------------------------------------------------------------------
def test_a_good_single_record_passes_with_its_topic_queue_and_size():
    r = rec(b"x" * 100, b"orders", queue_id=3)
    assert single_record(r, MAX_BODY, MAX_PROPS) == (b"orders", 3, len(r))


@pytest.mark.parametrize("field,value,why", [
    ("magic", 0x12345678, ""),
    ("body_crc", 1, "CRC"),
    ("queue_id", -1, "negative queue id"),
    ("total_size", 10, ""),
])
def test_a_single_record_with_a_bad_field_is_refused(field, value, why):
    bad = patched(rec(), field, value)
    with pytest.raises(ValidationError, match=why or None):
        single_record(bad, MAX_BODY, MAX_PROPS)


def test_body_and_properties_limits_are_exact():
    body = b"b" * 1000
    assert single_record(rec(body), 1000, MAX_PROPS)[2] == len(rec(body))
    with pytest.raises(ValidationError, match="over 999 bytes"):
        single_record(rec(body), 999, MAX_PROPS)
    props = b"k\x01" + b"v" * 98 + b"\x02"                 # 101 bytes
    assert single_record(rec(props=props), MAX_BODY, 101)
    with pytest.raises(ValidationError, match="properties over 100"):
        single_record(rec(props=props), MAX_BODY, 100)


def test_truncated_padded_and_empty_frames_are_refused():
    r = rec()
    for payload in (r[:-1], r[:20], r + b"\0" * 8, r + r, b"", b"\0" * 4):
        with pytest.raises(ValidationError):
            single_record(payload, MAX_BODY, MAX_PROPS)


# -- batches (the vectorised path) --------------------------------------------------------------------
def batch(n: int, topic: bytes = b"T", queue_id: int = 1, sizes_vary: bool = False) -> tuple[bytes, list[int]]:
    bodies = [b"m%05d" % i + (b"." * (i % 7) if sizes_vary else b"") for i in range(n)]
    props = [properties_bytes(Message("T", b"x", tags="t"), "%032X" % i, MAX_PROPS) for i in range(n)]
    return encode_records(topic, bodies, props, queue_id=queue_id, flags=[0] * n, born_ts_ms=5, born_host=HOST,
                          store_host=HOST)


@pytest.mark.parametrize("n,vary", [(1, False), (3, True), (8, False), (100, False), (100, True)])
def test_a_good_batch_gives_every_record_start(n, vary):
    payload, sizes = batch(n, sizes_vary=vary)
    fr = frame_records(payload, n, MAX_BODY, MAX_PROPS)
    assert fr.topic_b == b"T" and fr.queue_id == 1
    assert fr.sizes.tolist() == sizes
    assert fr.starts.tolist() == np.concatenate(([0], np.cumsum(sizes)[:-1])).tolist()


def test_the_vectorised_batch_encoding_equals_record_by_record():
    n = 50
    bodies = [b"body-%03d" % i for i in range(n)]                 # equal sizes: the numpy path
    props = [properties_bytes(Message("T", b"x", tags="t", keys=["k"]), "%032X" % i, MAX_PROPS) for i in range(n)]
    payload, sizes = encode_records(b"Topic", bodies, props, queue_id=2, flags=[i for i in range(n)],
                                    born_ts_ms=123, born_host=HOST, store_host=HOST)
    one_by_one = b"".join(R.encode_record(b"Topic", b, p, queue_id=2, flag=i, born_ts_ms=123, born_host=HOST,
                                          store_host=HOST) for i, (b, p) in enumerate(zip(bodies, props)))
    assert payload == one_by_one and sizes == [len(one_by_one) // n] * n


def test_a_batch_mixing_topics_or_queues_is_refused():
    a = rec(b"aaaa", b"T", queue_id=0)
    for other in (rec(b"aaaa", b"U", queue_id=0), rec(b"aaaa", b"T", queue_id=1), rec(b"aaaa", b"TT", queue_id=0)):
        with pytest.raises(ValidationError, match="another topic or queue"):
            frame_records(a + other, 2, MAX_BODY, MAX_PROPS)


@pytest.mark.parametrize("field,value,why", [
    ("magic", 0xDEADBEEF, "magic"),
    ("body_crc", 7, "CRC"),
    ("body_length", 0, "empty"),
    ("body_length", 10 ** 6, ""),
])
def test_one_bad_record_refuses_the_whole_batch(field, value, why):
    payload, sizes = batch(10)
    start = sum(sizes[:6])
    bad = payload[:start] + patched(payload[start:start + sizes[6]], field, value) + payload[start + sizes[6]:]
    with pytest.raises(ValidationError, match=why or None):
        frame_records(bad, 10, MAX_BODY, MAX_PROPS)


def test_record_counts_that_do_not_match_the_payload_are_refused():
    payload, _ = batch(5)
    for count in (4, 6):
        with pytest.raises(ValidationError):
            record_starts(payload, count)
    with pytest.raises(ValidationError):
        frame_records(payload + b"\0" * 3, 5, MAX_BODY, MAX_PROPS)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10_000), st.binary(min_size=1, max_size=8))
def test_any_corruption_is_refused_or_leaves_a_consistent_batch(pos_seed, garbage):
    """Overwrite some bytes anywhere: either refused, or every record still chains and its body
    passes its CRC (the bytes hit padding-free fields the writer patches or the born fields)."""
    payload, sizes = batch(6, sizes_vary=True)
    pos = pos_seed % len(payload)
    bad = bytearray(payload)
    bad[pos:pos + len(garbage)] = garbage[:len(payload) - pos]
    bad = bytes(bad)
    try:
        fr = frame_records(bad, 6, MAX_BODY, MAX_PROPS)
    except ValidationError:
        return
    for s, n in zip(fr.starts.tolist(), fr.sizes.tolist()):
        body_len = struct.unpack_from(">i", bad, s + R.FIELD["body_length"])[0]
        body = bad[s + R.MSG_HEADER.size:s + R.MSG_HEADER.size + body_len]
        assert zlib.crc32(body) & 0x7FFFFFFF == struct.unpack_from(">I", bad, s + R.FIELD["body_crc"])[0]
        assert bad[s + n - 1] == 2        # properties end where the record ends


# -- the configured limits, exactly at their edges -------------------------------------------------
FOUR_MIB = 4 * 1024 * 1024           # store.max_message_bytes default (RocketMQ maxMessageSize)
PROPS_LIMIT = 32 * 1024 - 1          # RocketMQ: PROPERTIES shorter than 32 KiB


def props_of(n: int) -> bytes:
    """Well-formed PROPERTIES of exactly ``n`` bytes (n >= 4: a value is never empty): one
    name\\x01value\\x02 pair."""
    return b"k\x01" + b"v" * (n - 3) + b"\x02"


def test_the_default_limits_are_the_documented_ones():
    from hostmq.config import StoreConfig
    assert R.MAX_BODY_BYTES_DEFAULT == FOUR_MIB and StoreConfig().max_message_bytes == FOUR_MIB
    assert R.MAX_PROPERTIES_BYTES == PROPS_LIMIT == StoreConfig().max_properties_bytes == 32767


def test_a_body_of_exactly_4_mib_passes_and_one_byte_more_is_refused_in_both_paths():
    at = rec(b"\xab" * FOUR_MIB, b"big", queue_id=2)
    assert single_record(at, FOUR_MIB, PROPS_LIMIT) == (b"big", 2, len(at))
    fr = frame_records(at + at, 2, FOUR_MIB, PROPS_LIMIT)
    assert fr.sizes.tolist() == [len(at)] * 2 and fr.starts.tolist() == [0, len(at)]
    over = rec(b"\xab" * (FOUR_MIB + 1), b"big", queue_id=2)
    with pytest.raises(ValidationError, match="record 0: body of 4194305 bytes is empty or over 4194304 bytes"):
        single_record(over, FOUR_MIB, PROPS_LIMIT)
    with pytest.raises(ValidationError, match="record 1: body of 4194305 bytes"):
        frame_records(at + over, 2, FOUR_MIB, PROPS_LIMIT)


def test_properties_of_32767_bytes_pass_and_32768_are_refused_in_both_paths():
    ok = rec(props=props_of(PROPS_LIMIT))
    assert single_record(ok, FOUR_MIB, PROPS_LIMIT)[2] == len(ok)
    assert frame_records(ok + ok + ok, 3, FOUR_MIB, PROPS_LIMIT).sizes.tolist() == [len(ok)] * 3
    over = rec(props=props_of(PROPS_LIMIT + 1))
    with pytest.raises(ValidationError, match="record 0: properties over 32767 bytes"):
        single_record(over, FOUR_MIB, PROPS_LIMIT)
    with pytest.raises(ValidationError, match="record 2: properties over 32767 bytes"):
        frame_records(ok + ok + over, 3, FOUR_MIB, PROPS_LIMIT)


def test_no_properties_at_all_are_fine():
    r = rec(props=b"")
    assert single_record(r, FOUR_MIB, PROPS_LIMIT) == (b"T", 0, len(r))
    assert frame_records(r + r, 2, FOUR_MIB, PROPS_LIMIT).sizes.tolist() == [len(r)] * 2
    assert single_record(r, FOUR_MIB, 0)[2] == len(r)            # a limit of 0 still allows none


def test_an_empty_body_is_refused_in_both_paths():
    empty = rec(b"")
    with pytest.raises(ValidationError, match="record 0: body of 0 bytes is empty"):
        single_record(empty, FOUR_MIB, PROPS_LIMIT)
    good = rec(b"\0")                                    # one byte is enough
    assert single_record(good, FOUR_MIB, PROPS_LIMIT)[2] == len(good)
    with pytest.raises(ValidationError, match="record 1: body of 0 bytes is empty"):
        frame_records(good + empty, 2, FOUR_MIB, PROPS_LIMIT)


def test_the_topic_name_is_passed_through_for_the_topic_table_to_judge():
    # Documented: record_check.py does not apply the topic name rules (the writer's topic table holds only
    # valid names and refuses frames for any other), so a name the rules refuse comes back as is.
    r = rec(topic=b"not a valid name!")
    assert single_record(r, FOUR_MIB, PROPS_LIMIT)[0] == b"not a valid name!"
    assert frame_records(r + r, 2, FOUR_MIB, PROPS_LIMIT).topic_b == b"not a valid name!"


def test_a_blank_record_is_not_a_message():
    blank = R.BLANK.pack(200, R.BLANK_MAGIC_CODE) + b"\0" * 192
    with pytest.raises(ValidationError, match="holds a 200-byte record"):
        single_record(blank, FOUR_MIB, PROPS_LIMIT)
    with pytest.raises(ValidationError, match="bad magic"):
        frame_records(blank, 1, FOUR_MIB, PROPS_LIMIT)


def _tail_positions(record: bytes) -> tuple[int, int]:
    """(topic length byte, properties length field) positions of a record, from its header."""
    body_len = struct.unpack_from(">i", record, R.FIELD["body_length"])[0]
    tpos = R.MSG_HEADER.size + body_len
    return tpos, tpos + 1 + record[tpos]


def test_batch_records_with_broken_tails_are_refused_and_named():
    good = rec(b"abcd", b"T", props=b"TAGS\x01x\x02")
    tpos, ppos = _tail_positions(good)
    no_topic = rec(b"abcd", b"", props=b"TAGS\x01xy\x02")          # same size, topic length 0
    assert len(no_topic) == len(good)
    torn_props = bytearray(good)
    torn_props[-1] = 0                                              # properties not ending with \x02
    lying = bytearray(good)
    struct.pack_into(">H", lying, ppos, 3)                          # properties length off by -4
    huge_topic = bytearray(good)
    huge_topic[tpos] = 250                                          # topic runs past the record
    for bad, why in ((no_topic, "record 1: bad topic length"),
                     (bytes(torn_props), r"record 1: properties do not end with \\x02"),
                     (bytes(lying), "record 1: lengths do not add up"),
                     (bytes(huge_topic), "record 1: bad topic length")):
        with pytest.raises(ValidationError, match=why):
            frame_records(good + bad + good, 3, FOUR_MIB, PROPS_LIMIT)
    for bad, why in ((torn_props, "torn tail"), (lying, "lengths do not add up"), (huge_topic, "does not fit")):
        with pytest.raises(ValidationError, match=f"record 0: .*{why}"):
            single_record(bytes(bad), FOUR_MIB, PROPS_LIMIT)


def test_a_batch_for_a_negative_queue_is_refused():
    r = rec(queue_id=-3)
    with pytest.raises(ValidationError, match="negative queue id -3"):
        frame_records(r + r, 2, FOUR_MIB, PROPS_LIMIT)
    with pytest.raises(ValidationError, match="negative queue id -3"):
        single_record(r, FOUR_MIB, PROPS_LIMIT)


def test_the_failing_record_is_named_in_a_batch():
    payload, sizes = batch(10)
    start = sum(sizes[:6])
    bad = payload[:start] + patched(payload[start:start + sizes[6]], "body_crc", 7) + payload[start + sizes[6]:]
    with pytest.raises(ValidationError, match="record 6: body CRC mismatch"):
        frame_records(bad, 10, MAX_BODY, MAX_PROPS)


def test_record_starts_errors_say_where_the_chain_breaks():
    r = rec()
    with pytest.raises(ValidationError, match="holds no record"):
        record_starts(b"\0\0\0", 1)
    with pytest.raises(ValidationError, match=f"record 1 claims 5000 bytes with {len(r)} left"):
        record_starts(r + patched(r, "total_size", 5000), 2)
    with pytest.raises(ValidationError, match=f"record 1 of 2 starts at byte {len(r)}"):
        record_starts(r + b"\0" * 10, 2)
    with pytest.raises(ValidationError, match=f"1 records end at byte {len(r)} of a {len(r) + 8}-byte frame"):
        record_starts(r + b"\0" * 8, 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300), st.integers(0, 120)), min_size=1, max_size=12),
       st.integers(0, 1023))
def test_any_good_batch_passes_with_limits_at_its_largest_parts_and_fails_one_below(parts, queue_id):
    """Random body and properties sizes: starts/sizes are those of the records as encoded one by one;
    limits equal to the largest body / properties pass, one byte lower is refused."""
    recs = [rec(bytes([i % 251]) * b, b"Topic-x", props=props_of(p) if p >= 4 else b"", queue_id=queue_id)
            for i, (b, p) in enumerate(parts)]
    payload = b"".join(recs)
    max_b = max(b for b, _ in parts)
    max_p = max((p if p >= 4 else 0) for _, p in parts)
    fr = frame_records(payload, len(recs), max_b, max_p)
    expected_starts = [sum(len(x) for x in recs[:i]) for i in range(len(recs))]
    assert (fr.topic_b, fr.queue_id) == (b"Topic-x", queue_id)
    assert fr.starts.tolist() == expected_starts and fr.sizes.tolist() == [len(x) for x in recs]
    with pytest.raises(ValidationError, match="over"):
        frame_records(payload, len(recs), max_b - 1, max_p)
    if max_p:
        with pytest.raises(ValidationError, match="properties over"):
            frame_records(payload, len(recs), max_b, max_p - 1)


# -- the properties rules of issue 31: empty values and names given twice --------------------------------
@pytest.mark.parametrize("props,why", [
    (b"TAGS\x01x\x02TAGS\x01y\x02", "'TAGS' is given twice"),
    (b"k\x01v\x02UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x01u\x02k\x01w\x02", "'k' is given twice"),
    (b"TAGS\x01a\x02k2\x01\x02", "'k2' has an empty value"),
    (b"DELAY\x013\x02DELAY\x013\x02", "'DELAY' is given twice"),
])
def test_records_with_a_name_twice_or_an_empty_value_are_refused_in_both_paths(props, why):
    bad = rec(b"abcd", props=props)
    with pytest.raises(ValidationError, match=f"record 0: property {why}"):
        single_record(bad, FOUR_MIB, PROPS_LIMIT)
    good = rec(b"abcd", props=b"TAGS\x01a\x02")
    with pytest.raises(ValidationError, match=f"record 1: property {why}"):
        frame_records(good + bad + good, 3, FOUR_MIB, PROPS_LIMIT)


def test_the_same_name_in_different_records_of_a_batch_is_fine():
    payload, sizes = batch(12)
    assert len(frame_records(payload, 12, MAX_BODY, MAX_PROPS).starts) == 12


# Short names, and long ones alike in their first 16 bytes (which the vectorised check keys names by).
_pnames = st.sampled_from(["a", "b", "ab", "ba", "TAGS", "KEYS", "acb", "bac", "k1", "k10", "x" * 17 + "a",
                           "x" * 17 + "b", "x" * 16, "x" * 8, "x" * 9])
_pvalues = st.sampled_from(["", "v", "1", "x y"])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.tuples(_pnames, _pvalues), max_size=5), min_size=1, max_size=8))
def test_the_vectorised_check_of_a_batch_agrees_with_the_check_of_each_record(records_pairs):
    """check_properties_many hashes names to find repeats; it must name the first record that
    check_properties refuses, and pass a batch only when every record passes."""
    props = [b"".join(n.encode() + b"\x01" + v.encode() + b"\x02" for n, v in pairs) for pairs in records_pairs]
    expected = -1
    for i, p in enumerate(props):
        try:
            R.check_properties(p)
        except ValidationError:
            expected = i
            break
    u8 = np.frombuffer(b"".join(props), np.uint8)
    lengths = np.array([len(p) for p in props], np.int64)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    assert R.check_properties_many(u8, starts, lengths) == expected
