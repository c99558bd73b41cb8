"""Batch reads and writes through the ``hostmq`` Spark data source, against real stores."""
from __future__ import annotations

import collections
import json
import math
import os
import time

import pytest

import hostmq
from hostmq import Message
from hostmq.spark.scan import StoreScan
from tests.conftest import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]
SMALL = {"store": {"commitlog_file_bytes": 64 << 10, "consume_queue_file_entries": 500}}


def fill(root: str, n: int = 1200) -> dict:
    """Messages over 2 topics (3 and 2 queues per broker); what was sent, by (topic, broker, qid, offset)."""
    with hostmq.Admin(root) as a:
        a.create_topic("orders", queues=3)
        a.create_topic("audit", queues=2)
    sent = {}
    t0 = int(time.time() * 1000)
    with hostmq.Producer(root) as p:
        for i in range(n):
            m = Message("orders" if i % 4 else "audit", f"body-{i}".encode() * (1 + i % 7),
                        tags=("paid", "new", None)[i % 3], keys=[f"k{i}", f"g{i % 5}"], properties={"n": str(i)})
            r = p.send(m)
            sent[(m.topic, r.queue.broker, r.queue.queue_id, r.queue_offset)] = (m, r.msg_id)
    wait_dispatched(root, sent)
    return {"sent": sent, "t0": t0, "t1": int(time.time() * 1000)}


def wait_dispatched(root: str, sent) -> None:
    """Readers see what the dispatcher has indexed; wait until that covers every acknowledged send."""
    want: dict = {}
    for *q, off in sent:
        want[tuple(q)] = max(want.get(tuple(q), 0), off + 1)
    scan = StoreScan(root)
    try:
        wait_until(lambda: all(scan.bounds(q)[1] >= n for q, n in want.items()), 30, "the dispatcher to catch up")
    finally:
        scan.close()


def load(spark, root, topic, **opts):
    r = spark.read.format("hostmq").option("root", root).option("topic", topic)
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def check_equal(rows, sent, t0, t1):
    got = {(r.topic, r.broker, r.queue_id, r.queue_offset): r for r in rows}
    assert len(got) == len(rows), "a message came twice"
    assert set(got) == set(sent)
    for k, r in got.items():
        m, msg_id = sent[k]
        assert bytes(r.body) == m.body and r.tags == m.tags and list(r.keys) == list(m.keys)
        assert r.msg_id == msg_id
        assert r.properties["n"] == m.properties["n"]
        born = r.born_timestamp.timestamp() * 1000
        stored = r.store_timestamp.timestamp() * 1000
        assert t0 - 1 <= born <= stored <= t1 + 1


@pytest.mark.parametrize("arrow", ["true", "false"])
def test_batch_read_equals_what_the_store_holds_live_and_stopped(spark, cluster, root, arrow):
    c = cluster(brokers=2, **SMALL)
    data = fill(root)
    assert len(os.listdir(f"{root}/brokers/broker-a/store/commitlog")) >= 3     # files rolled
    check_equal(load(spark, root, "orders,audit", arrow=arrow).collect(), data["sent"], data["t0"], data["t1"])
    c.stop()                                     # a stopped broker's store reads the same
    df = load(spark, root, "orders, audit", arrow=arrow, maxRecordsPerPartition="50")
    per_queue = collections.Counter(k[:3] for k in data["sent"])
    assert df.rdd.getNumPartitions() == sum(math.ceil(n / 50) for n in per_queue.values())
    check_equal(df.collect(), data["sent"], data["t0"], data["t1"])
    counts = {(r.topic, r.broker, r.queue_id): r["count"] for r in df.groupBy("topic", "broker", "queue_id").count().collect()}
    assert counts == dict(per_queue)


def test_offsets_timestamp_and_filter_options(spark, cluster, root):
    cluster(brokers=1)
    data = fill(root, 400)
    sent = data["sent"]
    q0 = {k: v for k, v in sent.items() if k[:3] == ("orders", "broker-a", 0)}
    n0 = len(q0)
    start = json.dumps({"broker-a": {"0": 10}})
    end = json.dumps({"broker-a": {"0": 20, "1": -1}})
    rows = load(spark, root, "orders", startingOffsets=start, endingOffsets=end).collect()
    by_q = collections.defaultdict(list)
    for r in rows:
        by_q[r.queue_id].append(r.queue_offset)
    assert sorted(by_q[0]) == list(range(10, 20))                # explicit start and end
    n1 = sum(1 for k in sent if k[:3] == ("orders", "broker-a", 1))
    assert sorted(by_q[1]) == list(range(n1))                     # earliest .. latest (-1)
    nested = json.dumps({"orders": {"broker-a": {"2": 5}}, "audit": {"broker-a": {"0": -1, "1": -1}}})
    rows = load(spark, root, "orders,audit", startingOffsets=nested).collect()
    assert not [r for r in rows if r.topic == "audit"]            # audit started at latest
    assert min(r.queue_offset for r in rows if r.queue_id == 2) == 5
    assert load(spark, root, "orders", startingOffsets="latest").count() == 0
    # startingTimestamp: from the first message stored at or after it, per queue
    offs = sorted(q0)
    mid = offs[n0 // 2]
    ts = int(load(spark, root, "orders").where(f"queue_id = 0 and queue_offset = {mid[3]}").collect()[0]
             .store_timestamp.timestamp() * 1000)
    rows = load(spark, root, "orders", startingTimestamp=str(ts)).where("queue_id = 0").collect()
    assert min(r.queue_offset for r in rows) <= mid[3] and all(r.store_timestamp.timestamp() * 1000 >= ts - 1 for r in rows)
    # filters: tags, and SQL92 over properties
    want_paid = {k for k, (m, _) in sent.items() if k[0] == "orders" and m.tags == "paid"}
    got = {(r.topic, r.broker, r.queue_id, r.queue_offset) for r in load(spark, root, "orders", expression="paid").collect()}
    assert got == want_paid
    def sql_match(n: int) -> bool:
        return n in (3, 13, 23) or 390 < n < 394
    want_sql = {k for k, (m, _) in sent.items() if k[0] == "orders" and sql_match(int(m.properties["n"]))}
    got = {(r.topic, r.broker, r.queue_id, r.queue_offset) for r in
           load(spark, root, "orders", expressionType="SQL92", expression="n IN ('3','13','23') OR n > 390 AND n < 394").collect()}
    assert got == want_sql and want_sql


@pytest.mark.parametrize("opts, needle", [
    ({"topic": "orders"}, "option 'root'"),
    ({"root": "ROOT"}, "option 'topic'"),
    ({"root": "ROOT", "topic": "nope"}, "option 'topic'"),
    ({"root": "ROOT", "topic": "orders", "startingOffsets": "{broker-a"}, "option 'startingOffsets'"),
    ({"root": "ROOT", "topic": "orders", "endingOffsets": json.dumps({"broker-a": {"x": 1}})}, "option 'endingOffsets'"),
    ({"root": "ROOT", "topic": "orders", "expression": "a ||"}, "option 'expression'"),
    ({"root": "ROOT", "topic": "orders", "maxRecordsPerPartition": "0"}, "option 'maxRecordsPerPartition'"),
    ({"root": "/nonexistent/hostmq-root", "topic": "orders"}, "option 'root'"),
])
def test_bad_options_fail_with_a_message_naming_the_option(spark, cluster, root, opts, needle):
    cluster()
    with hostmq.Admin(root) as a:
        a.create_topic("orders", queues=1)
    r = spark.read.format("hostmq")
    for k, v in opts.items():
        r = r.option(k, v.replace("ROOT", root))
    with pytest.raises(Exception) as e:
        r.load().collect()
    assert needle in str(e.value)


def test_batch_write_then_read_back(spark, cluster, root):
    cluster(brokers=2)
    with hostmq.Admin(root) as a:
        a.create_topic("out", queues=2)
        a.create_topic("out2", queues=1)
    rows = [(f"v{i}".encode(), f"t{i % 2}", [f"k{i}"], {"i": str(i)}, "out" if i % 3 else "out2") for i in range(500)]
    df = spark.createDataFrame(rows, "body binary, tags string, keys array<string>, properties map<string,string>, "
                                     "topic string").repartition(3)
    df.write.format("hostmq").option("root", root).mode("append").save()
    back = load(spark, root, "out,out2").collect()
    assert len(back) == 500
    got = {bytes(r.body): r for r in back}
    for body, tags, keys, props, topic in rows:
        r = got[body]
        assert (r.topic, r.tags, list(r.keys), r.properties["i"]) == (topic, tags, keys, props["i"])
    # the topic option overrides the column; a string body is sent as UTF-8
    spark.createDataFrame([("héllo", "out")], "body string, topic string").write.format("hostmq") \
        .option("root", root).option("topic", "out2").mode("append").save()
    assert [bytes(r.body) for r in load(spark, root, "out2").where("tags is null").collect()] == ["héllo".encode()]
    with pytest.raises(Exception, match="append"):
        df.write.format("hostmq").option("root", root).mode("overwrite").save()
    with pytest.raises(Exception, match="'body' column"):
        spark.createDataFrame([("x",)], "value string").write.format("hostmq").option("root", root) \
            .option("topic", "out").mode("append").save()


def test_native_columns_give_spark_the_rows_of_the_python_path(spark, root):
    """Records of every shape (compressed and empty bodies, empty and unicode properties, keys with
    spaces, pairs with empty values) over several commitlog files: what Spark reads — the Arrow
    batches of hostmq/store/_columns.c — is row for row what the Python path builds."""
    from hostmq.spark import scan
    from hostmq.store.message_store import MessageStore
    from tests.store.conftest import small_config
    from tests.store.test_columns_native import BROKER, T, fill
    if scan.NATIVE_COLUMNS is None:
        pytest.skip("hostmq/store/_columns.c is not built")
    with MessageStore(os.path.join(root, "brokers", BROKER, "store"),
                      small_config(consume_queue_file_entries=1000)) as s:
        fill(s)
    got = {(r.queue_id, r.queue_offset): r for r in load(spark, root, T, arrowBatchRows="100").collect()}
    saved, scan.NATIVE_COLUMNS = scan.NATIVE_COLUMNS, None
    try:
        want = [row for q in (0, 1) for b in scan.read_range(root, (T, BROKER, q), 0, 350) for row in b.to_pylist()]
    finally:
        scan.NATIVE_COLUMNS = saved
    assert len(got) == len(want) == 700
    for w in want:
        r = got[w["queue_id"], w["queue_offset"]]
        assert (r.topic, r.broker, r.msg_id, r.tags, list(r.keys), r.properties, bytes(r.body)) == \
            (w["topic"], w["broker"], w["msg_id"], w["tags"], w["keys"], dict(w["properties"]), w["body"])
        assert r.born_timestamp.timestamp() == w["born_timestamp"].timestamp()
        assert r.store_timestamp.timestamp() == w["store_timestamp"].timestamp()
