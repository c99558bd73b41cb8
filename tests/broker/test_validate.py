"""The writer's checks of producer frames (pure): every bad record refuses the whole frame."""
from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hostmq import Message, records as R
from hostmq.broker.validate import frame_records, record_starts, single_record
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
