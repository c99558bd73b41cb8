"""A batch's Arrow columns in C (hostmq/store/_columns.c) against their spec, the Python path of
hostmq/spark/scan.py (``batch_columns`` + ``arrow_batch``).

Both read the same store files: messages with and without tags, keys (several, empty ones, spaces),
properties (unicode, empty values, values holding \\x01, empty pairs, a name given twice),
compressed and empty bodies, over several commitlog files — and bytes the test damages after the
batch was checked. Wherever the C path gives a batch it must ``.equals`` the Python path's, row by
row too; where it hands the batch back (None) ``read_range`` takes the Python path, so the outcome
is the spec's by construction.
"""
from __future__ import annotations

import os
import subprocess
import sys
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hostmq import records as R
from hostmq.errors import CorruptRecordError
from hostmq.message import Message
from hostmq.store.message_store import MessageStore
from tests.store.conftest import put_at, small_config

pa = pytest.importorskip("pyarrow", reason="the spark extra is not installed (pip install -e .[spark])")
from hostmq.spark import scan  # noqa: E402  (after the skip: scan builds pyarrow arrays)

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(scan.NATIVE_COLUMNS is None, reason="hostmq/store/_columns.c is not built")]
T = "CN"
BROKER = "broker-a"
NOW_MS = 1_700_000_000_000


def append_raw(store: MessageStore, queue_id: int, body: bytes, props: bytes, sys_flag: int = 0,
               topic: str = T) -> None:
    """One record as a client could have written it (no encoder rules beyond the record's shape)."""
    rec = R.encode_record(topic.encode(), body, props, queue_id=queue_id, sys_flag=sys_flag, born_ts_ms=NOW_MS,
                          store_host=store.commitlog.store_host)
    blob, starts = R.encode_batch([rec])
    store.append_encoded(topic, queue_id, blob, starts, now_ms=NOW_MS)


def by_row(batch) -> list[dict]:
    """Row by row, timestamps as their µs (a damaged one may lie outside what datetime holds)."""
    cols = [c.view(pa.int64()) if pa.types.is_timestamp(c.type) else c for c in batch.columns]
    return pa.RecordBatch.from_arrays(cols, names=batch.schema.names).to_pylist()


def python_batch(b, key):
    return scan.arrow_batch(scan.batch_columns(b, key), key)


def same(b, key) -> bool:
    """The C batch equals the Python one (True), or C handed the batch back (False)."""
    native = scan.native_arrow_batch(b, key)
    if native is None:
        return False
    native.validate(full=True)
    want = python_batch(b, key)
    assert native.schema.equals(scan.arrow_schema())
    assert native.equals(want)
    assert by_row(native) == by_row(want)
    return True


def fill(s: MessageStore) -> None:
    """~700 records in two queues over several 64 KiB commitlog files, dispatched. Record ``i`` is
    queue ``i % 2``, offset ``i // 2``."""
    for i in range(700):
        q = i % 2
        if i % 37 == 5:
            append_raw(s, q, zlib.compress(b"z%d" % i * 30), b"TAGS\x01C\x02KEYS\x01 a  b \x02", R.SYSFLAG_COMPRESSED)
        elif i % 41 == 6:
            append_raw(s, q, b"", b"")                                                     # empty body, no props
        elif i % 43 == 7:
            append_raw(s, q, b"e" * (i % 3), b"x\x01\x02TAGS\x01\x02KEYS\x01\x02\x02n\x01v\x01w\x02")   # empty values
        elif i % 47 == 8:
            append_raw(s, q, zlib.compress(b""), b"KEYS\x01   \x02", R.SYSFLAG_COMPRESSED)   # inflates to nothing
        else:
            props = {"n": str(i), "ünï": "çødé €" * (i % 4), "empty": ""} if i % 5 else {}
            keys = (("k%d" % i, "x", "y") if i % 3 else ("solo",)) if i % 4 else ()
            put_at(s, Message(T, b"b%d" % i * (1 + i % 30), tags=(None, "A", "日本")[i % 3], keys=keys,
                              properties=props), NOW_MS + i, q)
    s.dispatch()
    assert len(s.commitlog.mfq.files) >= 3


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A stopped broker's directory under a root, holding :func:`fill`'s records."""
    top = tmp_path_factory.mktemp("cn")
    with MessageStore(str(top / "brokers" / BROKER / "store"), small_config(consume_queue_file_entries=1000)) as s:
        fill(s)
    return str(top)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """An open store holding :func:`fill`'s records (writable: tests damage and restore its bytes)."""
    s = MessageStore(str(tmp_path_factory.mktemp("cnd") / "store"), small_config(consume_queue_file_entries=1000))
    fill(s)
    yield s
    s.close()


def read_both(root: str, key, rows: int) -> tuple[list, list]:
    native = list(scan.read_range(root, key, 0, 350, batch_rows=rows))
    saved, scan.NATIVE_COLUMNS = scan.NATIVE_COLUMNS, None
    try:
        python = list(scan.read_range(root, key, 0, 350, batch_rows=rows))
    finally:
        scan.NATIVE_COLUMNS = saved
    return native, python


@pytest.mark.parametrize("rows", [1, 7, 64, 8192])
def test_native_batches_equal_the_python_path(root, rows):
    for qid in (0, 1):
        native, python = read_both(root, (T, BROKER, qid), rows)
        assert sum(b.num_rows for b in native) == 350
        assert len(native) == len(python)
        for a, b in zip(native, python):
            a.validate(full=True)
            assert a.equals(b)
            assert by_row(a) == by_row(b)


def test_every_batch_of_the_store_takes_the_native_path(store):
    """Undamaged records are read by C itself — batches within one file and across files alike —
    and what they hold is what was written."""
    spans = 0
    for qid in (0, 1):
        for off in range(0, 350, 50):
            b = store.get_batch(T, qid, off, 50)
            assert len(b) == 50
            spans += b._file is not None
            assert same(b, (T, store.broker, qid))
    assert spans >= 2
    row = {(q, r["queue_offset"]): r for q in (0, 1)
           for r in scan.native_arrow_batch(store.get_batch(T, q, 0, 350), (T, store.broker, q)).to_pylist()}
    compressed = row[1, 2]                          # i = 5: compressed; keys with spaces around them
    assert compressed["body"] == b"z5" * 30 and compressed["tags"] == "C" and compressed["keys"] == ["a", "b"]
    empty = row[0, 3]                               # i = 6: empty body, no properties
    assert empty["body"] == b"" and empty["tags"] is None and empty["keys"] == [] and empty["properties"] == []
    dropped = row[1, 3]                             # i = 7: pairs with empty values are dropped
    assert dropped["body"] == b"e" and dropped["tags"] is None and dropped["keys"] == []
    assert dropped["properties"] == [("n", "v\x01w")]
    nothing = row[0, 4]                             # i = 8: inflates to nothing; keys all separators
    assert nothing["body"] == b"" and nothing["keys"] == [] and nothing["properties"] == [("KEYS", "   ")]
    plain = row[1, 5]                               # i = 11: tags, three keys, unicode properties
    assert plain["tags"] == "日本" and plain["keys"] == ["k11", "x", "y"] and plain["body"] == b"b11" * 12
    assert dict(plain["properties"])["ünï"] == "çødé €" * 3 and "empty" not in dict(plain["properties"])


def test_a_repeated_name_is_left_to_the_python_path(tmp_path):
    """decode_properties keeps a repeated name's last value at its first place: C hands the batch back."""
    s = MessageStore(str(tmp_path / "store"), small_config())
    try:
        append_raw(s, 0, b"a", b"TAGS\x01A\x02")
        append_raw(s, 0, b"b", b"TAGS\x01A\x02n\x011\x02TAGS\x01B\x02")
        s.dispatch()
        b = s.get_batch(T, 0, 0, 10)
        assert len(b) == 2 and scan.native_arrow_batch(b, (T, s.broker, 0)) is None
        assert python_batch(b, (T, s.broker, 0)).column("tags").to_pylist() == ["A", "B"]
        assert same(s.get_batch(T, 0, 0, 1), (T, s.broker, 0))
        many = b"".join(b"p%d\x01v\x02" % k for k in range(65))     # C compares at most 64 names pairwise
        append_raw(s, 1, b"c", many[:-len(b"p64\x01v\x02")])
        append_raw(s, 1, b"d", many)
        s.dispatch()
        assert same(s.get_batch(T, 1, 0, 1), (T, s.broker, 1))
        assert not same(s.get_batch(T, 1, 0, 2), (T, s.broker, 1))
        assert len(python_batch(s.get_batch(T, 1, 1, 1), (T, s.broker, 1)).column("properties")[0]) == 65
    finally:
        s.close()


# --- hypothesis: random records, then random damage --------------------------------------------

_NAME = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), min_size=1, max_size=6)
_VALUE = st.text(st.characters(blacklist_characters="\x02", blacklist_categories=("Cs",)), max_size=8)
_KEY = st.text(st.sampled_from("ab é\u4e2d"), max_size=5)


@st.composite
def records(draw):
    """(body, properties bytes, sys_flag) of one record: pairs, empty pairs, tags and keys in any order."""
    parts = [(n.encode(), v.encode()) for n, v in draw(st.lists(st.tuples(_NAME, _VALUE), max_size=5))]
    tags = draw(st.none() | _VALUE)
    if tags is not None:
        parts.insert(draw(st.integers(0, len(parts))), (R.PROP_TAGS.encode(), tags.encode()))
    keys = draw(st.none() | st.lists(_KEY, max_size=4))
    if keys is not None:
        parts.insert(draw(st.integers(0, len(parts))), (R.PROP_KEYS.encode(), R.KEY_SEPARATOR.join(keys).encode()))
    # each pair possibly after an empty one
    props = b"".join(b"\x02" * draw(st.integers(0, 1)) + n + b"\x01" + v + b"\x02" for n, v in parts)
    body = draw(st.binary(max_size=300))
    if draw(st.booleans()):
        return zlib.compress(body, draw(st.integers(0, 9))), props, R.SYSFLAG_COMPRESSED
    return body, props, 0


def _repeats(props: bytes) -> bool:
    names = [p.partition(b"\x01")[0] for p in props.split(b"\x02") if p.partition(b"\x01")[2]]
    return len(names) != len(set(names))


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    s = MessageStore(str(tmp_path_factory.mktemp("cnh") / "store"), small_config(consume_queue_file_entries=100_000))
    yield s
    s.close()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(recs=st.lists(records(), min_size=1, max_size=12))
def test_random_records_read_the_same(live, recs):
    first = live.max_offset(T, 0)
    for body, props, flag in recs:
        append_raw(live, 0, body, props, flag)
    live.dispatch()
    b = live.get_batch(T, 0, first, len(recs))
    assert len(b) == len(recs)
    key = (T, live.broker, 0)
    assert same(b, key) == (not any(_repeats(p) for _, p, _ in recs))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damaged_records_give_the_python_result_or_none(store, data):
    """Bytes changed after the batch was checked (a client or another process writing): C gives
    the Python path's batch, or hands the batch back; it never reads outside a record."""
    saved: list[tuple] = []
    try:
        qid = data.draw(st.integers(0, 1))
        off = data.draw(st.integers(0, 340))
        b = store.get_batch(T, qid, off, data.draw(st.integers(1, 10)))
        assert len(b)
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, len(b) - 1))
            mf = b._files[0 if b._file is None else int(b._file[i])]
            pos, size = int(b._pos[i]), int(b._sizes[i])
            blen = int.from_bytes(mf.mm[pos + R.FIELD["body_length"]:pos + R.MSG_HEADER.size], "big")
            where = data.draw(st.sampled_from(["body_length", "sys_flag", "props_length", "props", "anywhere"]))
            if where == "body_length":
                at = pos + R.FIELD["body_length"] + data.draw(st.integers(0, 3))
            elif where == "sys_flag":
                at = pos + R.FIELD["sys_flag"] + 3
            elif where == "props_length":
                at = pos + R.MSG_HEADER.size + blen + 1 + len(T) + data.draw(st.integers(0, 1))
            elif where == "props":
                at = pos + size - data.draw(st.integers(1, max(1, min(40, size - R.MSG_HEADER.size))))
            else:
                at = pos + data.draw(st.integers(0, size - 1))
            at = pos + (at - pos) % size            # an earlier damage may have moved the lengths: stay inside
            saved.append((mf, at, int(mf.wu8[at])))
            mf.wu8[at] = data.draw(st.sampled_from([0, 1, 2, 0x20, 0x7F, 0x80, 0xC3, 0xED, 0xFF]))
        key = (T, store.broker, qid)
        native = scan.native_arrow_batch(b, key)
        event("read natively" if native is not None else "handed back")
        if native is not None:
            native.validate(full=True)
            want = python_batch(b, key)          # C accepted it: the spec must read the same
            assert native.equals(want) and by_row(native) == by_row(want)
    finally:
        for mf, at, v in reversed(saved):
            mf.wu8[at] = v


def test_columns_refuses_arguments_that_do_not_fit():
    cols = scan.NATIVE_COLUMNS.columns
    i64 = lambda *v: np.array(v, np.int64)      # noqa: E731
    names = (b"TAGS", b"KEYS", b" ", R.SYSFLAG_COMPRESSED)
    rec = R.encode_record(b"t", b"body", b"TAGS\x01x\x02")
    assert cols((rec,), None, i64(0), i64(len(rec)), 1, *names) is not None
    for args in (((rec,), i64(1), i64(0), i64(len(rec))), ((rec,), None, i64(0, 0), i64(len(rec))),
                 ((), None, i64(0), i64(len(rec))), ((rec, rec), None, i64(0), i64(len(rec)))):
        with pytest.raises(ValueError):
            cols(*args, 1, *names)
    with pytest.raises(ValueError):
        cols((rec,), None, i64(0), i64(len(rec)), 256, *names)
    # A record that does not fit its buffer, or whose lengths leave it: handed back, nothing read outside.
    for pos, size in ((1, len(rec)), (-1, len(rec)), (0, len(rec) + 1), (0, 10), (0, len(rec) - 1)):
        assert cols((rec,), None, i64(pos), i64(size), 1, *names) is None, (pos, size)
    assert cols((rec,), None, i64(0), i64(len(rec)), 9, *names) is None       # topic length past the record
    # Properties decode_properties refuses (it raises CorruptRecordError): handed back.
    for props in (b"TAGS\x02", b"\x01x\x02", b"TAGS\x01\xff\x02", b"a\x01b\x02TAGS\x01\xed\xa0\x80\x02", b"no pair"):
        bad = R.encode_record(b"t", b"body", props)
        assert cols((bad,), None, i64(0), i64(len(bad)), 1, *names) is None, props
    with pytest.raises(CorruptRecordError):
        R.decode_properties(b"TAGS\x02")


def test_the_environment_switch_turns_the_native_path_off():
    code = "from hostmq.spark import scan; print(scan.NATIVE_COLUMNS is None)"
    for value, off in (("0", "True"), ("1", "False")):
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "HOSTMQ_NATIVE_COLUMNS": value})
        assert p.stdout.strip() == off, p.stderr
