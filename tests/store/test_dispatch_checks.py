"""The dispatcher re-checks what it reads back from the commitlog (issue 15, item 2), and re-dispatch
never cuts a consume queue below entries of valid records (item 1).

Records are put through the embedded store's appender (which copies a blob without parsing it, as the
writer copies what a producer encoded) or damaged in the files afterwards.
"""
from __future__ import annotations

import os
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostmq import records as R
from hostmq.errors import CorruptRecordError
from hostmq.message import Message
from hostmq.store.consume_queue import ConsumeQueue
from hostmq.store.dispatch import scan_batch
from hostmq.store.encode import encode_message

from .conftest import CL_FILE_BYTES, crash_copy, parse_log, read_queue

pytestmark = pytest.mark.timeout(120)


def _record(store, topic_b: bytes, body: bytes, queue_id: int = 0) -> bytes:
    cfg = store.config
    return encode_message(Message("X", body), topic_b, queue_id, max_body_bytes=cfg.max_message_bytes,
                          max_props_bytes=cfg.max_properties_bytes, born_host=store.commitlog.store_host)


def _append_raw(store, blob_records: list[bytes], topic: str = "OK", queue_id: int = 0):
    blob, starts = R.encode_batch(blob_records)
    return store.append_encoded(topic, queue_id, blob, starts)


def _patch_file(store_dir, phys: int, at: int, data: bytes) -> None:
    start = phys - phys % CL_FILE_BYTES
    with open(os.path.join(store_dir, "commitlog", f"{start:020d}"), "r+b") as f:
        f.seek(phys - start + at)
        f.write(data)


@pytest.mark.parametrize("small", [True, False], ids=["record-by-record", "columnar"])
def test_a_forged_topic_never_becomes_a_path(open_store, tmp_path, small):
    store = open_store(tmp_path / "root" / "store")
    n = 3 if small else 200
    recs = [(0, _record(store, b"OK", b"a%d" % i)) for i in range(n)]
    # (appended as queue 1 of OK: the appender counts queue offsets by the topic it is given)
    recs.insert(n // 2, (1, _record(store, b"../../PWNED", b"forged")))
    recs.insert(n // 2 + 1, (1, _record(store, b"bad topic", b"forged too")))
    for qid, r in recs:
        _append_raw(store, [r], queue_id=qid)
    store.dispatch()
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "root" / "PWNED").exists()
    assert sorted(os.listdir(os.path.join(store.path, "consumequeue"))) == ["OK"]
    assert [m.body for m in read_queue(store, "OK", 0)] == [b"a%d" % i for i in range(n)]
    assert store.cq_store.skipped_records == 2
    assert store.cq_store.dispatch_error is None
    assert store.dispatched_phys == store.commitlog.max_offset()


@pytest.mark.parametrize("field,value", [
    ("total_size", 10 ** 6), ("total_size", 5), ("magic", 0x12345678), ("phys_offset", 0),
    ("body_length", 1 << 20), ("body_length", -4), ("queue_offset", -1), ("queue_id", -2)])
@pytest.mark.parametrize("count", [5, 120])
def test_a_broken_record_stops_dispatch_there_until_it_is_readable(open_store, field, value, count):
    store = open_store(message_index_enable=False)
    res = [store.put(Message("T", b"m%03d" % i), queue_id=0) for i in range(count)]
    bad = res[count // 2].phys_offset
    at = R.FIELD[field]
    width = 8 if R.MSG_HEADER_DTYPE[field].itemsize == 8 else 4
    original = store.commitlog.read(bad + at, width).tobytes()
    _patch_file(store.path, bad, at, struct.pack(">q" if width == 8 else ">i" if value < 0 else ">I", value))
    for _ in range(2):                      # retried: stops at the same place, dispatches nothing more
        store.dispatch()
        assert store.cq_store.dispatch_error is not None and store.cq_store.dispatch_error[0] == bad
        assert store.dispatched_phys == bad
        assert store.max_offset("T", 0) == count // 2
    _patch_file(store.path, bad, at, original)          # readable again: dispatch resumes
    store.dispatch()
    assert store.cq_store.dispatch_error is None
    assert [m.body for m in read_queue(store, "T", 0)] == [b"m%03d" % i for i in range(count)]


def _reference_scan(cl, end: int) -> tuple[list[int], int]:
    """Positions of the records a dispatch scan must yield, and where it must stop: a walk with
    records.check_stored_record (no CRC) that leaves out records of invalid topics."""
    out, phys = [], cl.min_offset()
    while phys < end:
        mf = cl.mfq.find(phys)
        rel = phys - mf.file_from_offset
        try:
            kind, total = R.check_stored_record(mf.mm, rel, cl.file_bytes, phys, verify_crc=False)
        except CorruptRecordError:
            return out, phys
        if kind == R.RecordKind.BLANK:
            phys = mf.file_end_offset
            continue
        if phys + total > end:
            return out, phys
        if R.stored_topic(_topic_bytes(mf.mm, rel)) is not None:
            out.append(phys)
        phys += total
    return out, phys


def _topic_bytes(mm, rel: int) -> bytes:
    tpos = rel + R.MSG_HEADER.size + struct.unpack_from(">i", mm, rel + R.FIELD["body_length"])[0]
    return bytes(mm[tpos + 1:tpos + 1 + mm[tpos]])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2 ** 32 - 1),
       flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 7)), min_size=1, max_size=3))
def test_both_scans_stop_where_check_stored_record_does(open_store, tmp_path_factory, seed, flips):
    """Whatever bits are flipped, the columnar and the record-by-record scans yield exactly the
    records ``records.check_stored_record`` accepts (valid topics only) and stop where it stops."""
    rng = np.random.default_rng(seed)
    store = open_store(tmp_path_factory.mktemp("s"), message_index_enable=False)
    for i in range(400):
        store.put(Message("T%d" % (i % 3), b"b" * int(rng.integers(1, 400))), queue_id=i % 2)
    cl = store.commitlog
    end = cl.max_offset()
    assert len(cl.mfq.files) > 2
    for frac, bit in flips:
        phys = int(frac * end)
        mf = cl.mfq.find(phys)
        mf.mm[phys - mf.file_from_offset] ^= 1 << bit
    want, stop = _reference_scan(cl, end)
    got, phys = [], 0
    while True:
        batch, nxt = scan_batch(cl, phys, end, 97)
        got += batch.phys_offsets.tolist()
        if nxt <= phys or batch.error is not None or nxt >= end:
            break
        phys = nxt
    reqs, nxt2 = cl.scan(0, end, 10 ** 6)
    assert got == want == [r.phys_offset for r in reqs]
    assert nxt == nxt2 == stop
    assert (batch.error is None) == (cl.scan_error is None) == (stop >= end)


def test_redispatch_keeps_entries_of_valid_records_and_refuses_a_disagreeing_one(open_store, tmp_path):
    store = open_store()
    for i in range(30):
        store.put(Message("Q", b"q%d" % i), queue_id=1)
    end = store.commitlog.max_offset()
    crash = crash_copy(store, tmp_path / "crash", flush=True)
    store.close()
    # A complete, sealed record that claims queue offset 3 of Q/1 (as a record whose queue offset was
    # never patched would, but with a correct PHYSICALOFFSET): recovery keeps it, re-dispatch must not
    # cut the queue for it.
    rec = bytearray(encode_message(Message("Q", b"impostor"), b"Q", 1, max_body_bytes=1 << 20,
                                   max_props_bytes=4096, born_host=R.host_bytes()))
    struct.pack_into(">qq", rec, R.FIELD["queue_offset"], 3, end)
    _patch_file(crash, end, 0, bytes(rec))
    again = open_store(crash)
    assert [m.body for m in read_queue(again, "Q", 1)] == [b"q%d" % i for i in range(30)]
    assert again.consume_queue("Q", 1).refused == 1
    assert len(parse_log(crash)) == 31       # the impostor is still in the log, in no queue


def _cq(tmp_path) -> ConsumeQueue:
    return ConsumeQueue(str(tmp_path), "T", 0, 8)


def _arrays(phys):
    n = len(phys)
    return np.array(phys, np.int64), np.full(n, 100, np.int64), np.zeros(n, np.int64)


def test_put_many_with_holds(tmp_path):
    cq = _cq(tmp_path)
    cq.put_many(0, *_arrays([1000 * i for i in range(20)]))
    valid = {1000 * i for i in range(20)}
    holds = lambda phys, size, qoff: phys in valid and phys == 1000 * qoff   # noqa: E731
    # disagreeing entries for offsets 5..7 of valid records are refused, 20.. appended
    assert cq.put_many(5, *_arrays([77_000, 78_000, 79_000]), holds)
    assert cq.refused == 3 and cq.max_offset() == 20 and cq.entry(5)[0] == 5000
    assert cq.put_many(18, *_arrays([18_000, 19_000, 20_000, 21_000]), holds)
    assert cq.max_offset() == 22
    # a stale entry (its record is not valid) is replaced with everything after it
    valid.discard(21_000)
    assert cq.put_many(21, *_arrays([99_000]), holds)
    assert cq.max_offset() == 22 and cq.entry(21)[0] == 99_000
    # newer records claiming offsets below the head are refused, not a reason to drop the queue
    cq.min_logic_offset = 4 * 20
    assert cq.put_many(1, *_arrays([120_000]), holds)
    assert cq.max_offset() == 22 and cq.min_offset() == 4 and cq.refused == 4
    assert cq.tail_holds(lambda p, s, q: True) and not cq.tail_holds(lambda p, s, q: False)
    cq.close()
