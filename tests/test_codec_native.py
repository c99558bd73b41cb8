"""hostmq/_codec.c against its Python reference (records.py_*, record_check.py_single_record), byte for
byte: the same bytes, tuples and ints for valid input, the same exception type and message for
hostile input (mutated, truncated, garbage buffers; positions and limits out of range; values that
do not fit their fields; every buffer type a reader hands in)."""
from __future__ import annotations

import contextlib
import mmap
import struct
import subprocess
import sys
import warnings
import zlib

import numpy as np
import pytest
from hypothesis import assume, HealthCheck, given, settings
from hypothesis import strategies as st

from hostmq import records as R
from hostmq import record_check as V

C = R.NATIVE_CODEC          # None when not built: the tests below skip, test_native_codec_is_built fails

pytestmark = pytest.mark.timeout(60)

PROPS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

I32 = st.integers(-(1 << 31), (1 << 31) - 1)
I64 = st.integers(-(1 << 63), (1 << 63) - 1)
# Integers around every field's range: in it, at its edges, past them, far past int64.
EDGY = st.one_of(I32, I64, st.sampled_from([-(1 << 63) - 1, 1 << 63, (1 << 64) - 1, 1 << 64, 1 << 31, -(1 << 31) - 1,
                                            (1 << 32) - 1, 1 << 32, -1, 0]), st.integers(-(1 << 80), 1 << 80))
topics = st.from_regex(r"[%|a-zA-Z0-9_-]{1,127}", fullmatch=True).map(str.encode)
_text = st.text(st.characters(exclude_characters="\x01\x02", exclude_categories=("Cs",)), max_size=12)
RESERVED = [R.PROP_DELAY, R.PROP_REAL_QUEUE_ID, R.PROP_TRANSACTION_PREPARED, R.PROP_REAL_TOPIC, R.PROP_RETRY_TOPIC]
_names = st.one_of(st.sampled_from(RESERVED + [R.PROP_TAGS, R.PROP_KEYS]), _text)
_values = st.one_of(_text, st.sampled_from(["0", "17", "2147483648", "-1", "true", "false", "TRUE", "T%1", "a b", "²"]))


@st.composite
def property_bytes(draw):
    """PROPERTIES bytes: mostly what an encoder writes (system properties included), sometimes broken
    (a \\x01 in a value, an empty name or pair, invalid UTF-8, a missing final \\x02)."""
    pairs = draw(st.lists(st.tuples(_names, _values), max_size=5))
    out = b"".join(n.encode() + b"\x01" + v.encode() + b"\x02" for n, v in pairs)
    kind = draw(st.integers(0, 9))
    if kind == 0:
        out += draw(st.binary(max_size=8)) + b"\x02"
    elif kind == 1 and out:
        i = draw(st.integers(0, len(out) - 1))
        out = out[:i] + draw(st.sampled_from([b"\x01", b"\x02", b"\xff", b"\xed\xa0\x80", b"\xc0\x80", b"\xf4\x90\x80\x80",
                                              b"\xe2\x82", b""])) + out[i + 1:]
    elif kind == 2:
        out += b"\x01v\x02"                    # an empty name
    elif kind == 3 and pairs:
        out += pairs[0][0].encode() + b"\x01w\x02"      # a name given twice (issue 31)
    elif kind == 4:
        out += draw(_names).encode() + b"\x01\x02"      # an empty value (issue 31)
    elif kind == 5:                              # more pairs than C compares names of (MAX_PLAIN_PAIRS)
        out += b"".join(b"n%d\x01v\x02" % i for i in range(draw(st.integers(15, 18))))
        if draw(st.booleans()):
            out += b"n3\x01again\x02"
    return out


@st.composite
def records(draw, max_body=300):
    """Encode arguments of a valid record (or one with any PROPERTIES bytes)."""
    return dict(
        topic_b=draw(topics), body=draw(st.binary(max_size=max_body)), props_b=draw(property_bytes()),
        queue_id=draw(I32), flag=draw(I32), sys_flag=draw(I32), born_ts_ms=draw(I64),
        born_host=draw(st.binary(min_size=8, max_size=8)), store_ts_ms=draw(I64),
        store_host=draw(st.binary(min_size=8, max_size=8)), reconsume_times=draw(I32),
        prepared_tx_offset=draw(I64), queue_offset=draw(I64), phys_offset=draw(I64))


def enc(a: dict) -> bytes:
    a = dict(a)
    return R.py_encode_record(a.pop("topic_b"), a.pop("body"), a.pop("props_b"), **a)


def outcome(f, *args, **kwargs):
    """What a call gives: ("ok", result) or the exception's type, message and fields."""
    try:
        return "ok", f(*args, **kwargs)
    except Exception as e:   # noqa: BLE001 - comparing whatever each side raises is the point
        return type(e), str(e), getattr(e, "why", None), getattr(e, "phys_offset", None)


def same(native, reference, *args, **kwargs):
    got, want = outcome(native, *args, **kwargs), outcome(reference, *args, **kwargs)
    assert got == want, (args, kwargs)
    return want


# Every kind of buffer a reader hands in: built from bytes, cleaned up after use.
BUFFER_KINDS = ["bytes", "bytearray", "memoryview", "numpy", "mmap"]


def as_buffer(data: bytes, kind: str):
    if kind == "bytearray":
        return bytearray(data)
    if kind == "memoryview":
        return memoryview(data)
    if kind == "numpy":
        return np.frombuffer(data, np.uint8)
    if kind == "mmap" and data:
        m = mmap.mmap(-1, len(data))
        m[:] = data
        return m
    return data


def done_with(buf) -> None:
    if isinstance(buf, mmap.mmap):
        buf.close()


@st.composite
def hostile(draw):
    """A record inside a buffer, then damaged: header fields and length bytes overwritten with
    interesting values, bytes flipped, the buffer cut short; or a blank record; or garbage."""
    what = draw(st.integers(0, 9))
    if what == 0:
        return draw(st.binary(max_size=200)), 0
    if what == 1:
        size = draw(st.integers(-20, 120))
        return struct.pack(">iI", size, R.BLANK_MAGIC_CODE) + bytes(draw(st.integers(0, 120))), 0
    prefix = draw(st.binary(max_size=6))
    rec = bytearray(enc(draw(records(max_body=60))))
    fields = {"total_size": ">i", "body_length": ">i", "magic": ">I", "body_crc": ">I", "queue_id": ">i",
              "queue_offset": ">q", "phys_offset": ">q"}
    for name in draw(st.lists(st.sampled_from(sorted(fields)), max_size=2)):
        fmt = fields[name]
        lo, hi = (0, (1 << 32) - 1) if fmt == ">I" else (-(1 << 31), (1 << 31) - 1) if fmt == ">i" else (-(1 << 63), (1 << 63) - 1)
        near = len(rec) if name in ("total_size", "body_length") else 0
        value = draw(st.one_of(st.integers(lo, hi), st.integers(max(lo, near - 100), min(hi, near + 100)),
                               st.sampled_from([R.MAGIC_CODE, R.BLANK_MAGIC_CODE]) if name == "magic" else st.just(0)))
        struct.pack_into(fmt, rec, R.FIELD[name], value)
    blen = struct.unpack_from(">i", rec, R.FIELD["body_length"])[0]
    tpos = R.MSG_HEADER.size + blen
    spots = [len(rec) - 1, len(rec) - 2] + ([tpos, tpos + 1, tpos + 2] if 0 <= tpos < len(rec) - 2 else [])
    for _ in range(draw(st.integers(0, 2))):
        i = draw(st.one_of(st.sampled_from(spots), st.integers(0, len(rec) - 1)))
        rec[i] = draw(st.sampled_from([0, 1, 2, 0xFF, rec[i] ^ 1]))
    buf = prefix + bytes(rec) + draw(st.binary(max_size=6))
    if draw(st.booleans()):
        buf = buf[:draw(st.integers(0, len(buf)))]
    return buf, len(prefix)


_REFERENCES = {"encode_record": R.py_encode_record, "check_record": R.py_check_record,
               "check_stored_record": R.py_check_stored_record, "record_fields": R.py_record_fields,
               "java_string_hash": R.py_java_string_hash, "cq_entries": R.py_cq_entries, "cq_entry": R.py_cq_entry,
               "single_record": V.py_single_record}


def _handed_over(*args, **kwargs):
    raise AssertionError("the C fast path handed an ordinary call to the Python reference")


@contextlib.contextmanager
def c_only():
    """Within: the C functions may not hand a call to the Python reference (so a comparison with
    the reference really compares two implementations)."""
    C._bind(**{name: _handed_over for name in _REFERENCES})
    try:
        yield
    finally:
        C._bind(**_REFERENCES)


positions = st.one_of(st.integers(-10, 300), st.sampled_from([-(1 << 63), (1 << 63) - 1, 1 << 70, -(1 << 70)]))


# -- the build --------------------------------------------------------------------------------------
@pytest.mark.timeout(10)
def test_native_codec_is_built():
    """pip builds hostmq/_codec.c on install; if this fails the Python reference is serving."""
    assert R.NATIVE, "hostmq._codec did not build: see the pip log (tools/_venv.sh: .venv/pip.log)"
    assert R.check_record is R.NATIVE_CODEC.check_record and V.single_record is R.NATIVE_CODEC.single_record


needs_native = pytest.mark.skipif(not R.NATIVE, reason="hostmq._codec was not built")


# -- encode -----------------------------------------------------------------------------------------
@needs_native
@PROPS
@given(records(max_body=2000))
def test_encode_record_is_byte_identical(a):
    a = dict(a)
    t, b, p = a.pop("topic_b"), a.pop("body"), a.pop("props_b")
    with c_only():
        assert C.encode_record(t, b, p, **a) == R.py_encode_record(t, b, p, **a)
        assert C.encode_record(t, b, p) == R.py_encode_record(t, b, p)
        assert C.encode_record(bytearray(t), bytearray(b), p, crc=7) == R.py_encode_record(bytearray(t), bytearray(b), p, crc=7)


@needs_native
@pytest.mark.timeout(30)
@PROPS
@given(st.dictionaries(st.sampled_from(["queue_id", "flag", "sys_flag", "born_ts_ms", "store_ts_ms", "reconsume_times",
                                        "prepared_tx_offset", "queue_offset", "phys_offset", "crc"]),
                       st.one_of(EDGY, st.none(), st.floats(allow_nan=False), st.just(True)), max_size=3),
       st.dictionaries(st.sampled_from(["born_host", "store_host"]),
                       st.one_of(st.binary(max_size=12), st.text(max_size=3), st.none(), st.builds(memoryview, st.binary())),
                       max_size=2),
       st.one_of(st.binary(max_size=300), st.text(max_size=3)), st.binary(max_size=80), st.integers(0, 3))
def test_encode_record_refuses_what_the_reference_refuses(ints, hosts, topic, body, props_kind):
    props = [b"", b"k\x01v\x02", b"x" * 0x10000, b"x" * 0xFFFF][props_kind]
    same(C.encode_record, R.py_encode_record, topic, body, props, **ints, **hosts)


@needs_native
@pytest.mark.timeout(20)
def test_encode_record_argument_errors_are_the_references():
    for args, kw in [((b"t", b""), {}), ((b"t", b"", b"", 1), {}), ((b"t", b"", b""), {"bogus": 1}),
                     ((b"t",), {"body": b"", "props_b": b""}), ((b"t", b"", b""), {"topic_b": b"t"}),
                     ((), {"topic_b": b"t", "body": b"b", "props_b": b"", "queue_id": 4})]:
        same(C.encode_record, R.py_encode_record, *args, **kw)
    big = b"b" * (64 * 1024)       # the C path drops the GIL for bodies this large
    assert C.encode_record(b"t", big, b"") == R.py_encode_record(b"t", big, b"")


# -- check ------------------------------------------------------------------------------------------
@needs_native
@PROPS
@given(records(), st.binary(max_size=9), st.sampled_from(BUFFER_KINDS), st.booleans())
def test_valid_records_check_and_decode_identically_in_every_buffer(a, pad, kind, verify):
    # records() may break PROPERTIES (the property-check tests want that); a record whose properties do
    # not end with \x02 is not valid — check_record refuses it, which the hostile tests cover.
    assume(not a["props_b"] or a["props_b"].endswith(b"\x02"))
    rec = enc(a)
    buf = as_buffer(pad + rec + pad, kind)
    try:
        with c_only():
            at, end = len(pad), len(pad) + len(rec)
            assert C.check_record(buf, at, end, verify) == R.py_check_record(buf, at, end, verify) == (R.RecordKind.MESSAGE, len(rec))
            same(C.check_stored_record, R.py_check_stored_record, buf, at, end, a["phys_offset"], verify)
            fields = C.record_fields(buf, at)
            assert fields == R.py_record_fields(buf, at)
            f = R.RecordFields._make(fields)
            assert R.RecordHeader._make(fields[:len(R.RecordHeader._fields)]) == R.RecordHeader._make(R.MSG_HEADER.unpack_from(rec))
            assert (f.topic_b, f.body_len, rec[f.body_start - at:][:f.body_len]) == (a["topic_b"], len(a["body"]), a["body"])
            assert rec[f.props_start - at:][:f.props_len] == a["props_b"]
    finally:
        done_with(buf)


@needs_native
@pytest.mark.timeout(60)
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile(), st.sampled_from(BUFFER_KINDS), st.booleans(), st.data())
def test_hostile_buffers_fail_identically(case, kind, verify, data):
    raw, at = case
    pos = data.draw(st.one_of(st.just(at), positions))
    limit = data.draw(st.one_of(st.just(len(raw)), positions))
    phys = data.draw(st.one_of(st.just(0), I64, st.integers(-(1 << 70), 1 << 70)))
    buf = as_buffer(raw, kind)
    try:
        with c_only():
            same(C.check_record, R.py_check_record, buf, pos, limit, verify)
            same(C.check_record, R.py_check_record, buf, pos, limit)
            same(C.check_stored_record, R.py_check_stored_record, buf, pos, limit, phys, verify)
            same(C.record_fields, R.py_record_fields, buf, pos)
    finally:
        done_with(buf)


@needs_native
@pytest.mark.timeout(20)
def test_odd_arguments_are_the_references():
    rec = enc({"topic_b": b"T", "body": b"x", "props_b": b""})
    for args in [(rec, 0.0, 100), (rec, 0, None), (rec, "0", 10), ("not a buffer", 0, 10), (np.zeros(200, np.int8), 0, 200),
                 (np.zeros((2, 100), np.uint8), 0, 200), (np.frombuffer(rec * 2, np.uint8)[::2], 0, 200), (rec, np.int64(0), np.int64(len(rec))),
                 (rec, True, 100), (memoryview(rec).cast("I", (len(rec) // 4,)) if len(rec) % 4 == 0 else rec, 0, 200)]:
        same(C.check_record, R.py_check_record, *args)
        same(C.check_stored_record, R.py_check_stored_record, *args, 0)
        same(C.record_fields, R.py_record_fields, *args[:2])
    for kw in [{"buf": rec, "pos": 0, "limit": 200}, {"buf": rec, "pos": 0}, {"buf": rec, "pos": 0, "limit": 9, "nope": 1}]:
        same(C.check_record, R.py_check_record, **kw)
    same(C.check_record, R.py_check_record, rec, 0, 200, verify_crc=False)
    same(C.check_stored_record, R.py_check_stored_record, rec, 0, 200, phys_offset=0, verify_crc=0)
    same(C.check_stored_record, R.py_check_stored_record, rec, 0, 200, None)
    closed = mmap.mmap(-1, 200)
    closed.close()
    same(C.check_record, R.py_check_record, closed, 0, 200)


# -- single_record ------------------------------------------------------------------------------------
@needs_native
@PROPS
@given(records(max_body=200), st.sampled_from(BUFFER_KINDS), st.integers(0, 400), st.integers(0, 200), st.data())
def test_single_record_is_identical(a, kind, max_body, max_props, data):
    rec = enc(a)
    if data.draw(st.booleans()):
        raw, _ = data.draw(hostile())
    else:
        raw = rec
    buf = as_buffer(raw, kind)
    try:
        with c_only():
            same(C.single_record, V.py_single_record, buf, max_body, max_props)
            same(C.single_record, V.py_single_record, buf, 1 << 70, 1 << 70)
    finally:
        done_with(buf)


@needs_native
@PROPS
@given(property_bytes())
def test_properties_checked_in_c_or_python_give_one_answer(props):
    rec = R.py_encode_record(b"T", b"body", props)
    with c_only():
        same(C.single_record, V.py_single_record, rec, 100, 1000)


@needs_native
@pytest.mark.timeout(20)
def test_single_record_odd_arguments_are_the_references():
    rec = R.py_encode_record(b"T", b"body", b"TAGS\x01a\x02")
    for args in [(rec, 100.0, 10), (rec, 100, "10"), ("text", 1, 1), (rec, -(1 << 70), 10), (rec, 100, -(1 << 70))]:
        same(C.single_record, V.py_single_record, *args)
    same(C.single_record, V.py_single_record, payload=rec, max_body_bytes=10, max_props_bytes=10)
    same(C.single_record, V.py_single_record, rec, 10)


# -- java_string_hash ----------------------------------------------------------------------------------
@needs_native
@PROPS
@given(st.one_of(st.text(st.characters(exclude_categories=())), st.text(max_size=600),
                 st.text(st.characters(max_codepoint=127), min_size=500, max_size=700)))
def test_java_string_hash_is_identical(s):
    with c_only():
        assert C.java_string_hash(s) == R.py_java_string_hash(s)


@needs_native
@pytest.mark.timeout(10)
def test_java_string_hash_surrogates_and_non_strings():
    for s in ["", "\ud800", "a\udc00", "\U0001F600", "\ud83d\ude00", "é" * 600, "x" * 512, "x" * 513, "\U0010FFFF" * 3]:
        assert C.java_string_hash(s) == R.py_java_string_hash(s)
    for odd in (b"abc", 5, None):
        same(C.java_string_hash, R.py_java_string_hash, odd)
    same(C.java_string_hash, R.py_java_string_hash, s="abc")


# -- consume-queue entries -----------------------------------------------------------------------------
_DTYPES = [np.int64, np.int32, np.uint64, np.uint32, np.int16, np.uint8, np.int8, np.float64, np.bool_]


@needs_native
@PROPS
@given(st.integers(0, 6), st.lists(st.tuples(EDGY, EDGY, EDGY), max_size=6), st.data())
def test_cq_entries_are_identical(n, edgy, data):
    cols = [data.draw(st.lists(ints, min_size=n, max_size=n)) for ints in (I64, I32, I64)]
    arrays = [np.array(c, np.int64) for c in cols]
    with c_only():
        assert C.cq_entries(*cols) == R.py_cq_entries(*cols)
        assert C.cq_entries(*arrays) == R.py_cq_entries(*arrays) == R.py_cq_entries(*cols)
        assert C.cq_entries(arrays[0], arrays[1].astype(np.int32), arrays[2]) == R.py_cq_entries(*cols)
        assert len(C.cq_entries(*arrays)) == n * R.CQ_ENTRY.itemsize
        if n:
            got = np.frombuffer(C.cq_entries(*arrays), R.CQ_ENTRY)
            assert got["phys_offset"].tolist() == cols[0] and got["tag_hash"].tolist() == cols[2]
            assert C.cq_entry(cols[0][0], cols[1][0], cols[2][0]) == R.py_cq_entry(cols[0][0], cols[1][0], cols[2][0])
    if edgy:
        hostile_cols = [list(c) for c in zip(*edgy)]
        same(C.cq_entries, R.py_cq_entries, *hostile_cols)
        same(C.cq_entries, R.py_cq_entries, *(tuple(c) for c in hostile_cols))
        same(C.cq_entry, R.py_cq_entry, *edgy[0])
        dtypes = data.draw(st.lists(st.sampled_from(_DTYPES), min_size=3, max_size=3))
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                typed = [np.array(c).astype(d) for c, d in zip(hostile_cols, dtypes)]
        except (OverflowError, ValueError, TypeError):
            return
        same(C.cq_entries, R.py_cq_entries, *typed)
    same(C.cq_entries, R.py_cq_entries, cols[0], cols[1] + [1], cols[2])


@needs_native
@pytest.mark.timeout(10)
def test_cq_entries_odd_arguments_are_the_references():
    for args in [(range(3), range(3), range(3)), (iter([1]), [1], [1]), ([1], [1]), (None, [1], [1]),
                 (np.arange(6).reshape(2, 3), np.arange(2), np.arange(2)), (np.arange(6)[::2], [1, 2, 3], [1, 2, 3]),
                 (np.array([1, 2], ">i8"), [1, 2], [3, 4]), ([1.5], [1], [1])]:
        same(C.cq_entries, R.py_cq_entries, *args)
    same(C.cq_entries, R.py_cq_entries, phys_offsets=[1], sizes=[2], tag_codes=[3])
    same(C.cq_entry, R.py_cq_entry, phys_offset=1, size=2, tag_code=3)
    same(C.cq_entry, R.py_cq_entry, 1, 2)


# -- the layout the C code was written against is records.py's ----------------------------------------------
@needs_native
@pytest.mark.timeout(10)
def test_layout_is_the_one_declared_in_records():
    assert C.LAYOUT["FIELD"] == R.FIELD and C.LAYOUT["MSG_HEADER"] == R.MSG_HEADER.size
    rec = C.encode_record(b"T", b"x", b"", crc=None)
    assert struct.unpack_from(">I", rec, R.FIELD["body_crc"])[0] == zlib.crc32(b"x") & 0x7FFFFFFF


def test_a_native_codec_whose_layout_differs_is_refused_even_under_python_O():
    """The codec's layout check is not an ``assert`` (``python -O`` would drop it): a codec built
    from another layout would write records every reader rejects."""
    code = ("import sys, types\n"
            "m = types.ModuleType('hostmq._codec'); m.LAYOUT = {'MSG_HEADER': 89}\n"
            "sys.modules['hostmq._codec'] = m\n"
            "import hostmq.records\n")
    p = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "hostmq/_codec.c's layout differs" in p.stderr, p.stderr[-2000:]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("which", ["codec", "step"])
def test_a_bad_reserved_mark_is_refused_and_leaves_the_bound_marks(which):
    """Both native modules load the reserved property names with one loader (include/record_check.h
    ``hm_set_reserved``): a bad sequence raises ValueError and changes nothing."""
    from hostmq.ingress import step
    from hostmq.record_fields import _RESERVED_MARKS
    module = R.NATIVE_CODEC if which == "codec" else step.NATIVE_STEP
    if module is None:
        pytest.fail(f"the native {which} is not built")
    from hostmq.errors import ValidationError
    from hostmq.record_check import single_record
    bad_delay = R.encode_record(b"t", b"body", R.encode_properties({"DELAY": "soon"}))
    with pytest.raises(ValidationError):
        single_record(bad_delay, 1 << 20, 1 << 15)       # DELAY is reserved: its value is checked
    for bad, why in [([b"X\x01"] * 17, "too many"), ([b""], "1..32 bytes"), ([b"x" * 33], "1..32 bytes"),
                     (["KEYS\x01"], "1..32 bytes"), (5, "sequence of bytes")]:
        with pytest.raises((ValueError, TypeError), match=why):
            module._bind(reserved_property_marks=bad)
        if which == "codec":
            with pytest.raises(ValidationError):
                single_record(bad_delay, 1 << 20, 1 << 15)   # the marks bound before still hold
    module._bind(reserved_property_marks=_RESERVED_MARKS)
