"""A record no consumer can decode, in a real broker's store (issue 15, item 9): every consumer of
the topic — pull (``poll``, ``poll_batch``) and push (concurrent and orderly), with SQL92, tag and
``*`` subscriptions — skips it, logs it once, counts it and goes on; nothing stalls, every other
message arrives once, and the groups' offsets move past it (lag 0).

The record is what an old store (written before the writer validated properties) or a damaged disk
holds: property bytes that are not UTF-8. It is hand-encoded with ``records.encode_record`` and
appended with the embedded store's ``append_encoded`` into the broker's store directory while the
broker is stopped; the broker then restarts on that store.
"""
from __future__ import annotations

import collections
import logging
import struct
import threading

import pytest

import hostmq
from hostmq import ConsumeFrom, ConsumeResult, Message
from hostmq import records as R
from hostmq.root import RootPaths
from hostmq.store.message_store import MessageStore
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(300)
SEQ = struct.Struct(">q")
TOPIC = "undec"
FAST = {"rebalance_interval_s": 1.0, "heartbeat_interval_s": 1.0, "auto_commit_interval_s": 0.2}
BEFORE, AFTER = 20, 20
# TAGS and region as the good messages have them, then a property value that is not UTF-8
BAD_PROPS = b"TAGS\x01A\x02region\x01eu\x02n\x01\xff\xfe\x02"


def send(root: str, seqs: range) -> None:
    with hostmq.Producer(root) as p:
        for i in seqs:
            p.send(Message(TOPIC, SEQ.pack(i), tags="A", properties={"region": "eu", "n": str(i)}))


def plant_bad_record(c) -> int:
    """Stop the broker, append the undecodable record to queue 0 of its store, start it again; the
    record's queue offset."""
    assert c.stop_process("broker-a") == 0
    with MessageStore(RootPaths(c.root).store_dir("broker-a"), c.config) as store:
        blob, starts = R.encode_batch([R.encode_record(TOPIC.encode(), SEQ.pack(-1), BAD_PROPS)])
        res = store.append_encoded(TOPIC, 0, blob, starts)
        store.dispatch()
        assert store.max_offset(TOPIC, 0) == res.first_queue_offset + 1
    c.start_broker("broker-a")
    return res.first_queue_offset


class Sink:
    def __init__(self) -> None:
        self.counts: collections.Counter = collections.Counter()
        self.lock = threading.Lock()

    def __call__(self, msgs) -> ConsumeResult:
        with self.lock:
            for m in msgs:
                _ = m.properties, m.tags, m.keys        # a listener that reads everything
                self.counts[SEQ.unpack_from(m.body)[0]] += 1
        return ConsumeResult.SUCCESS


def pull_all(pc, batch: bool) -> collections.Counter:
    got: collections.Counter = collections.Counter()

    def step():
        if batch:
            for body in pc.poll_batch(0.05).bodies:
                got[SEQ.unpack_from(body)[0]] += 1
        else:
            for m in pc.poll(0.05):
                _ = m.properties
                got[SEQ.unpack_from(m.body)[0]] += 1
        return len(got) >= BEFORE + AFTER
    wait_until(step, 60, "every good message", step_s=0)
    return got


def lag(admin, group: str) -> int:
    rows = [r for r in admin.consumer_progress(group) if r["queue"].topic == TOPIC]
    return sum(r["lag"] for r in rows) if rows else -1


def test_every_consumer_skips_an_undecodable_record_and_goes_on(cluster, caplog):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        queues = a.create_topic(TOPIC, queues=2)
    send(c.root, range(BEFORE))
    bad_offset = plant_bad_record(c)
    send(c.root, range(BEFORE, BEFORE + AFTER))
    want = collections.Counter(range(BEFORE + AFTER))
    caplog.set_level(logging.ERROR, logger="hostmq.store.read_check")

    pulls = {"sql": hostmq.SQL("region = 'eu' AND n IS NOT NULL"), "tag": "A", "all": "*"}
    for name, expr in pulls.items():
        for batch in (False, True):
            if batch and name == "sql":
                continue                        # poll_batch reads assigned queues without filters
            with hostmq.PullConsumer(c.root, group=f"pull-{name}-{batch}", consume_from=ConsumeFrom.FIRST_OFFSET) as pc:
                if batch:
                    pc.assign(queues, expr)
                else:
                    pc.subscribe(TOPIC, expr)
                assert pull_all(pc, batch) == want, (name, batch)
                assert pc.skipped_records == 1, (name, batch)

    for name, expr, orderly in (("sql", hostmq.SQL("region = 'eu'"), False), ("tag", "A", False),
                                ("orderly", hostmq.SQL("n IS NOT NULL"), True)):
        sink, group = Sink(), f"push-{name}"
        pc = hostmq.PushConsumer(c.root, group=group, consume_from=ConsumeFrom.FIRST_OFFSET, **FAST)
        pc.subscribe(TOPIC, expr)
        pc.register(sink, orderly=orderly)
        with pc.start():
            wait_until(lambda: len(sink.counts) >= BEFORE + AFTER, 60, f"{group} to consume")
            with hostmq.Admin(c.root) as a:
                wait_until(lambda: lag(a, group) == 0, 30, f"{group}'s lag to reach 0")
            assert sink.counts == want and pc.skipped_records == 1 and pc.error is None, group

    lines = [r.getMessage() for r in caplog.records if "skipping a record" in r.getMessage()]
    assert len(lines) == 1, lines                                 # once per record in this process
    assert f"{TOPIC}@broker-a#0 queue offset {bad_offset}," in lines[0] and "not UTF-8" in lines[0]
