"""Recovery rebuilds consume queues that lost entries or whole directories (issue 15, items 1 and 11b).

A consume queue is derived data: whatever happened to its files, after recovery every message the
commitlog holds is readable through its queue at its queue offset. Damage is applied to a copy of a
store as a killed process leaves it (``abort`` present) or after a clean close.
"""
from __future__ import annotations

import os
import shutil

import pytest

from hostmq import records as R
from hostmq.message import Message
from hostmq.store.cq_manifest import MANIFEST_FILE, parse_manifest, read_manifest

from .conftest import CQ_FILE_BYTES, crash_copy, parse_log, read_queue

pytestmark = pytest.mark.timeout(120)

QUEUES = [("A", 0), ("A", 1), ("B", 0)]
PER_QUEUE = 150                    # a little over two consume-queue files of 64 entries


def _fill(store) -> dict:
    sent = {k: [] for k in QUEUES}
    for i in range(PER_QUEUE):
        for topic, qid in QUEUES:
            body = b"%s|%d|%d" % (topic.encode(), qid, i)
            store.put(Message(topic, body), queue_id=qid)
            sent[(topic, qid)].append(body)
    store.dispatch()
    return sent


def _check(store, sent: dict) -> None:
    for (topic, qid), bodies in sent.items():
        got = read_queue(store, topic, qid)
        assert [m.body for m in got] == bodies, (topic, qid, len(got))
        assert [m.queue_offset for m in got] == list(range(len(bodies)))


def _damaged_copy(open_store, tmp_path, crash: bool, flush: bool = True):
    store = open_store()
    sent = _fill(store)
    if crash:
        path = crash_copy(store, tmp_path / "copy", flush=flush)
        store.close()
    else:
        store.close()
        path = str(tmp_path / "copy")
        shutil.copytree(store.path, path)
        os.unlink(os.path.join(path, "lock"))
    return path, sent


def _cq_file(path, topic, qid, n):
    d = os.path.join(path, "consumequeue", topic, str(qid))
    return os.path.join(d, sorted(os.listdir(d))[n])


@pytest.mark.parametrize("crash", [True, False], ids=["abnormal", "normal"])
def test_a_deleted_topic_directory_is_rebuilt(open_store, tmp_path, crash):
    path, sent = _damaged_copy(open_store, tmp_path, crash)
    shutil.rmtree(os.path.join(path, "consumequeue", "A"))
    store = open_store(path)
    assert store.recovery.abnormal == crash and store.recovery.full_redispatch
    _check(store, sent)


def test_a_deleted_queue_directory_is_rebuilt_after_a_crash_before_any_flush(open_store, tmp_path):
    path, sent = _damaged_copy(open_store, tmp_path, crash=True, flush=False)
    shutil.rmtree(os.path.join(path, "consumequeue", "B", "0"))
    _check(open_store(path), sent)


@pytest.mark.parametrize("what", ["flip_phys", "flip_size", "zero_tail", "zero_middle", "truncate_middle",
                                  "delete_middle", "delete_newest", "garbage_file"])
def test_damaged_consume_queue_files_are_rebuilt(open_store, tmp_path, what):
    path, sent = _damaged_copy(open_store, tmp_path, crash=True)
    first, last = _cq_file(path, "A", 1, 0), _cq_file(path, "A", 1, -1)
    entry = R.CQ_ENTRY.itemsize
    with open(first, "r+b") as f:
        if what == "flip_phys":                     # entry 10's commitlog offset moves by 64 bytes
            f.seek(10 * entry + 6)
            b = f.read(1)[0]
            f.seek(10 * entry + 6)
            f.write(bytes([b ^ 0x40]))
        elif what == "flip_size":
            f.seek(20 * entry + 11)
            b = f.read(1)[0]
            f.seek(20 * entry + 11)
            f.write(bytes([b ^ 0x01]))
        elif what == "zero_middle":
            f.seek(30 * entry)
            f.write(bytes(5 * entry))
        elif what == "truncate_middle":
            f.truncate(CQ_FILE_BYTES // 2)
        elif what == "garbage_file":
            f.write(os.urandom(CQ_FILE_BYTES))
    if what == "zero_tail":                         # looks like a queue that simply ends earlier
        with open(last, "r+b") as f:
            f.seek(3 * entry)
            f.write(bytes(CQ_FILE_BYTES - 3 * entry))
    elif what == "delete_middle":
        os.unlink(_cq_file(path, "A", 1, 1))
    elif what == "delete_newest":
        os.unlink(last)
    store = open_store(path)
    assert store.recovery.abnormal
    _check(store, sent)


def test_the_manifest_follows_the_queues_and_a_bad_one_means_a_full_rebuild(open_store, tmp_path):
    path, sent = _damaged_copy(open_store, tmp_path, crash=True)
    m = read_manifest(path)
    assert m == {k: (PER_QUEUE, m[k][1]) for k in QUEUES}
    last = {}
    for r in parse_log(path):
        last[(r.topic, r.queue_id)] = r.phys + r.total
    assert {k: end for k, (_, end) in m.items()} == last
    for bad in (b"{", b'{"version": 1, "queues": [["../x", 0, 1, 2]]}', b'{"version": 9, "queues": []}'):
        with open(os.path.join(path, MANIFEST_FILE), "wb") as f:
            f.write(bad)
        with open(os.path.join(path, MANIFEST_FILE + ".bak"), "wb") as f:
            f.write(bad)
        assert read_manifest(path) is None
    shutil.rmtree(os.path.join(path, "consumequeue", "B"))
    store = open_store(path)
    assert store.recovery.full_redispatch
    _check(store, sent)
    store.flush()
    assert read_manifest(path) == {k: (PER_QUEUE, m[k][1]) for k in QUEUES}


def test_parse_manifest_refuses_what_write_manifest_never_writes():
    assert parse_manifest({"version": 1, "queues": [["T", 0, 5, 900]]}) == {("T", 0): (5, 900)}
    for rows in ([["T", -1, 5, 9]], [["T", 0, 5]], [["", 0, 1, 1]], [["T", 0, True, 1]], [[1, 0, 1, 1]],
                 "x", [["a/b", 0, 1, 1]]):
        assert parse_manifest({"version": 1, "queues": rows}) is None
    assert parse_manifest([]) is None and parse_manifest({"queues": []}) is None
