"""Structured Streaming reads (and a streaming write) through the ``hostmq`` data source."""
from __future__ import annotations

import collections
import os
import time

import pytest

import hostmq
from hostmq import Message
from hostmq.spark.options import read_options
from hostmq.store import MessageStore
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from tests.spark.test_batch import wait_dispatched

pytestmark = [pytest.mark.spark, pytest.mark.timeout(400)]


def send(root: str, topic: str, start: int, n: int) -> dict:
    sent = {}
    with hostmq.Producer(root) as p:
        for i in range(start, start + n):
            r = p.send(Message(topic, f"m{i}".encode(), keys=[f"k{i}"]))
            sent[(topic, r.queue.broker, r.queue.queue_id, r.queue_offset)] = f"m{i}".encode()
    return sent


def settle(root: str, all_sent: dict) -> None:
    wait_dispatched(root, all_sent)


def stream(spark, root, topic, **opts):
    r = spark.readStream.format("hostmq").option("root", root).option("topic", topic)
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def run_available_now(df, sink, checkpoint: str, **kw):
    w = df.writeStream.option("checkpointLocation", checkpoint).trigger(availableNow=True)
    if callable(sink):
        q = w.foreachBatch(sink).start()
    else:
        q = w.format("parquet").option("path", sink).start()
    q.awaitTermination(180)
    assert not q.isActive, "the availableNow query did not finish"
    return q


def test_available_now_into_parquet_restarted_twice_is_exactly_once(spark, cluster, root, tmp_path):
    cluster(brokers=2)
    with hostmq.Admin(root) as a:
        a.create_topic("s", queues=3)
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    sent: dict = {}
    for run, n in enumerate((300, 200, 100)):
        sent.update(send(root, "s", len(sent), n))
        settle(root, sent)
        df = stream(spark, root, "s", startingOffsets="earliest", group="pipeline") \
            .select("topic", "broker", "queue_id", "queue_offset", "body")
        run_available_now(df, out, ckpt)
        rows = spark.read.parquet(out).collect()
        keys = [(r.topic, r.broker, r.queue_id, r.queue_offset) for r in rows]
        assert len(keys) == len(set(keys)), f"run {run}: a message was written twice"
        assert {k: bytes(r.body) for k, r in zip(keys, rows)} == sent, f"run {run}: not every message exactly once"
    # the group's offsets were committed back (Spark commits a run's last batch when the next starts)
    with hostmq.PullConsumer(root, group="pipeline") as pc:
        per_queue = collections.Counter(k[:3] for k in sent)
        committed = {q: pc.committed(hostmq.MessageQueue(*q)) for q in per_queue}
    assert all(v is not None and 0 < v <= per_queue[q] for q, v in committed.items()), committed


def test_max_offsets_per_trigger_splits_the_backlog(spark, cluster, root, tmp_path):
    cluster()
    with hostmq.Admin(root) as a:
        a.create_topic("m", queues=4)
    sent = send(root, "m", 0, 230)
    settle(root, sent)
    sizes, seen = [], []

    def sink(df, batch_id):
        rows = df.select("queue_id", "queue_offset").collect()
        sizes.append(len(rows))
        seen.extend((r.queue_id, r.queue_offset) for r in rows)
    run_available_now(stream(spark, root, "m", startingOffsets="earliest", maxOffsetsPerTrigger="50"), sink,
                      str(tmp_path / "ckpt"))
    assert sum(sizes) == 230 and len(seen) == len(set(seen))
    assert max(sizes) <= 50 and len([s for s in sizes if s]) >= 5, sizes


def test_the_initial_offset_is_pinned_before_any_data_is_read(spark, cluster, root, tmp_path):
    """Spark trap: a crash before batch 0 commits makes Spark ask for the initial offset again.
    With startingOffsets=latest, messages sent after the query started must still be read."""
    cluster()
    with hostmq.Admin(root) as a:
        a.create_topic("p", queues=2)
    settle(root, send(root, "p", 0, 30))            # before the query: not to be read (latest)
    # The reader itself: batch 0 ends where it starts, whatever arrives meanwhile.
    r = read_options({"root": root, "topic": "p"}, streaming=True)
    from hostmq.spark.source import StreamReader
    reader = StreamReader(r)
    first = reader.initialOffset()
    settle(root, send(root, "p", 30, 10))
    assert reader.latestOffset(first, ReadAllAvailable()) == first
    nxt = reader.latestOffset(first, ReadAllAvailable())
    assert sum(v for b in nxt["p"].values() for v in b.values()) == 40
    assert sum(v for b in reader.latestOffset(first, ReadMaxRows(3))["p"].values() for v in b.values()) == 33
    reader.stop()
    # End to end: run 1 sends during batch 0 and crashes; run 2 must read exactly those messages.
    ckpt = str(tmp_path / "ckpt")
    during: dict = {}

    def crash(df, batch_id):
        during.update(send(root, "p", 100, 25))
        raise RuntimeError("sink failed in batch 0")
    q = stream(spark, root, "p").writeStream.option("checkpointLocation", ckpt).foreachBatch(crash).start()
    with pytest.raises(Exception):
        q.awaitTermination(120)
    assert during, "batch 0 never ran"
    settle(root, during)
    got = []
    run_available_now(stream(spark, root, "p"), lambda df, i: got.extend(bytes(x.body) for x in df.collect()), ckpt)
    assert sorted(got) == sorted(during.values())


def _store(root: str):
    path = os.path.join(root, "brokers", "broker-a", "store")
    return MessageStore(path, config={"commitlog_file_bytes": 16 << 10, "consume_queue_file_entries": 100})


def _put(root: str, start: int, n: int) -> None:
    with _store(root) as s:
        for i in range(start, start + n):
            s.put(Message("r", f"r{i}".encode() + b"." * 60))
        s.dispatch()


@pytest.mark.parametrize("fail", [True, False])
def test_fail_on_data_loss_after_files_expire(spark, root, tmp_path, fail):
    """A store without a running broker: the stream read the first 300, then retention deleted
    files holding offsets it had not read yet."""
    _put(root, 0, 300)
    ckpt = str(tmp_path / "ckpt")
    got = []

    def sink(df, batch_id):
        got.extend(r.queue_offset for r in df.select("queue_offset").collect())
    opts = {"startingOffsets": "earliest", "failOnDataLoss": str(fail).lower()}
    run_available_now(stream(spark, root, "r", **opts), sink, ckpt)
    assert sorted(got) == list(range(300))
    _put(root, 300, 600)
    with _store(root) as s:
        while s.clean_expired(now_ms=time.time() * 1000 + 1e12, force=True):
            pass
        first_live = s.min_offset("r", 0)
    assert first_live > 300, "retention deleted nothing unread"
    got.clear()
    if fail:
        with pytest.raises(Exception, match="failOnDataLoss"):
            run_available_now(stream(spark, root, "r", **opts), sink, ckpt)
        assert not got
    else:
        run_available_now(stream(spark, root, "r", **opts), sink, ckpt)
        assert sorted(got) == list(range(first_live, 900))


def test_stream_write_into_a_topic(spark, cluster, root, tmp_path):
    cluster()
    with hostmq.Admin(root) as a:
        a.create_topic("src", queues=2)
        a.create_topic("dst", queues=2)
    sent = send(root, "src", 0, 120)
    settle(root, sent)
    df = stream(spark, root, "src", startingOffsets="earliest").selectExpr("body", "concat('t', queue_id) as tags")
    q = df.writeStream.format("hostmq").option("root", root).option("topic", "dst") \
        .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start()
    q.awaitTermination(180)
    back = spark.read.format("hostmq").option("root", root).option("topic", "dst").load().collect()
    assert sorted(bytes(r.body) for r in back) == sorted(sent.values())
