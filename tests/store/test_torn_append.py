"""A process killed in the middle of an append (issue 15, item 1).

The appender copies a record into the commitlog and fills in QUEUEOFFSET, PHYSICALOFFSET, STORETIMESTAMP,
QUEUEID and STOREHOST; the body CRC does not cover those fields. A kill between the copy and the patch
used to leave a record that abnormal recovery kept (its CRC is fine) with queue offset 0, and re-dispatch
then truncated its queue to nothing. These tests build exactly that on-disk state (the unpatched
record after valid ones, ``abort`` present) and check that every earlier message stays reachable, and
that the appenders now make a record valid only once it is complete.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from hostmq import records as R
from hostmq.message import Message
from hostmq.store.encode import encode_message
from hostmq.store.message_store import MessageStore

from .conftest import CL_FILE_BYTES, crash_copy, parse_log, read_queue, small_config

pytestmark = pytest.mark.timeout(120)

TOPIC = "TORN"


def _encoded(store: MessageStore, i: int, queue_id: int = 0) -> bytes:
    """A record as a producer encodes it: QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP still 0."""
    cfg = store.config
    return encode_message(Message(TOPIC, b"torn-%d" % i), TOPIC.encode(), queue_id,
                          max_body_bytes=cfg.max_message_bytes, max_props_bytes=cfg.max_properties_bytes,
                          born_host=store.commitlog.store_host)


def _fill(store: MessageStore, n: int) -> list[bytes]:
    bodies = []
    for i in range(n):
        m = Message(TOPIC, b"m-%05d" % i)
        if i % 7 == 3:
            store.put_batch([m, Message(TOPIC, m.body + b"-b")], queue_id=0)
            bodies += [m.body, m.body + b"-b"]
        else:
            store.put(m, queue_id=0)
            bodies.append(m.body)
    return bodies


def _write_unpatched(crash_dir: str, phys: int, blob: bytes) -> None:
    """Put ``blob`` (records with unpatched header fields) at commitlog offset ``phys``."""
    start = phys - phys % CL_FILE_BYTES
    path = os.path.join(crash_dir, "commitlog", f"{start:020d}")
    with open(path, "r+b") as f:
        f.seek(phys - start)
        f.write(blob)


@pytest.mark.parametrize("records", [1, 5])
@pytest.mark.parametrize("flushed", [False, True])
def test_an_unpatched_record_after_valid_ones_costs_no_earlier_message(open_store, tmp_path, records, flushed):
    store = open_store()
    bodies = _fill(store, 120)
    end = store.commitlog.max_offset()
    if end % CL_FILE_BYTES + 2000 > CL_FILE_BYTES:
        pytest.skip("the layout leaves no room for the torn record in the last file")
    crash = crash_copy(store, tmp_path / "crash", flush=flushed)
    blob, _ = R.encode_batch([_encoded(store, i) for i in range(records)])
    store.close()
    _write_unpatched(crash, end, blob)          # the copy happened, the patch did not

    again = open_store(crash)
    assert again.recovery.abnormal
    got = read_queue(again, TOPIC, 0)
    assert [m.body for m in got] == bodies
    assert [m.queue_offset for m in got] == list(range(len(bodies)))
    assert again.commitlog.max_offset() == end             # the torn record is not kept
    for m in got[::17]:
        assert again.view(m.msg_id).body == m.body
    # New messages continue the queue.
    r = again.put(Message(TOPIC, b"after"), queue_id=0)
    assert r.queue_offset == len(bodies)


def test_recovery_rejects_a_record_whose_physical_offset_is_not_its_position(open_store, tmp_path):
    store = open_store()
    bodies = _fill(store, 40)
    end = store.commitlog.max_offset()
    crash = crash_copy(store, tmp_path / "crash")
    # A complete record whose fields are all patched except PHYSICALOFFSET (it names an earlier record).
    rec = bytearray(_encoded(store, 0))
    hdr = np.frombuffer(rec, R.MSG_HEADER_DTYPE, count=1).copy()
    hdr["queue_offset"] = len(bodies)
    hdr["phys_offset"] = 0
    hdr["store_ts_ms"] = store.commitlog.last_store_ts_ms
    rec[:R.MSG_HEADER.size] = hdr.tobytes()
    store.close()
    _write_unpatched(crash, end, bytes(rec))
    again = open_store(crash)
    assert again.commitlog.max_offset() == end
    assert [m.body for m in read_queue(again, TOPIC, 0)] == bodies


# -- the appenders: a kill at any moment leaves whole records only ------------------------------------
_CHILD = textwrap.dedent("""
    import sys, numpy as np
    from hostmq import records as R
    from hostmq.message import Message
    from hostmq.store.encode import encode_message
    from hostmq.store.message_store import MessageStore
    path, cfg = sys.argv[1], eval(sys.argv[2])
    store = MessageStore(path, cfg)
    cl = store.commitlog
    big = [encode_message(Message("K", b"x" * 300 + b"%d" % i), b"K", 1, max_body_bytes=1 << 20,
                          max_props_bytes=4096, born_host=cl.store_host) for i in range(60)]
    blob, starts = R.encode_batch(big)
    one = bytearray(big[0])
    print("ready", flush=True)
    i = 0
    while True:
        k = i % 3
        if k == 0:
            cl.append_batch("K", 1, blob, starts)
        elif k == 1:
            cl.append_record("K", 1, bytearray(one), len(one))
        else:
            store.put(Message("K", b"y" * 200), queue_id=1)
        i += 1
""")


@pytest.mark.slow      # kills appender processes over and over: ~15 s
def test_a_killed_appender_leaves_only_complete_records(tmp_path):
    """SIGKILL an appender at random moments; after each kill recovery keeps only records whose every
    field is right (PHYSICALOFFSET is the position, queue offsets 0, 1, 2, … per queue)."""
    cfg = small_config(commitlog_file_bytes=256 * 1024, message_index_enable=False)
    path = str(tmp_path / "store")
    rng = np.random.default_rng(7)
    for trial in range(6):
        child = subprocess.Popen([sys.executable, "-c", _CHILD, path, repr(cfg)], stdout=subprocess.PIPE,
                                 text=True)
        try:
            assert child.stdout.readline().strip() == "ready"
            try:
                child.wait(timeout=float(rng.uniform(0.01, 0.1)))
            except subprocess.TimeoutExpired:
                pass
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
            child.stdout.close()
        assert child.returncode == -signal.SIGKILL, trial
        store = MessageStore(path, cfg)
        try:
            assert store.recovery.abnormal
            recs = parse_log(path)
            assert all(r.header_phys == r.phys for r in recs)
            assert [r.queue_offset for r in recs] == list(range(len(recs)))
            cq = store.consume_queue("K", 1)
            assert cq.max_offset() == len(recs)
            stored, off = [], 0
            while off < len(recs):
                part = cq.entries(off, len(recs))
                stored += part["phys_offset"].tolist()
                off += len(part)
            assert stored == [r.phys for r in recs]
        finally:
            store.close()
