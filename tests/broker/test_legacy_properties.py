"""Records stored before the property rules of issue 31 stay readable and movable.

Before issue 31 a record could carry a name twice, an empty value, a reserved name as a user
property, or a blank name or value. The broker now refuses the first two from clients, the producer
all of them; but a record already stored is data: the read side takes it as before (an empty value is
dropped, as RocketMQ's decoder drops it), and what the broker and its clients write again from a
stored record — a due delay message, a committed half message, a retry — passes the broker's check,
so no such record is lost on its way.
"""
from __future__ import annotations

import pytest

from hostmq import records as R
from hostmq.semantics.retry import retry_record
from hostmq.semantics.schedule import timeup_record
from hostmq.semantics.transaction import HALF_TOPIC, commit_record
from hostmq.record_check import single_record
from hostmq.message import MessageExt
from hostmq.store.message_store import MessageStore
from tests.store.conftest import small_config

pytestmark = pytest.mark.timeout(60)
HOST = b"\x01\x02\x03\x04\x00\x00\x00\x05"
FOUR_MIB, PROPS_LIMIT = 4 * 1024 * 1024, 32767

# PROPERTIES a client could write before issue 31, and what reading them gives now.
LEGACY = {
    "a name twice": (b"TAGS\x01A\x02TAGS\x01B\x02", {"TAGS": "B"}),
    "an empty value": (b"TAGS\x01A\x02k\x01\x02", {"TAGS": "A"}),
    "an empty value after a value": (b"k\x01v\x02k\x01\x02", {"k": "v"}),
    "a reserved user name": (b"TAGS\x01A\x02TRACE_ON\x01true\x02", {"TAGS": "A", "TRACE_ON": "true"}),
    "a blank value": (b"TAGS\x01A\x02k\x01 \x02", {"TAGS": "A", "k": " "}),
    "a blank name": (b"TAGS\x01A\x02 \x01v\x02", {"TAGS": "A", " ": "v"}),
}
UNIQ = b"UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x01" + b"AB" * 16 + b"\x02"


def record(topic: bytes, props: bytes) -> bytes:
    return R.encode_record(topic, b"body", props, queue_id=0, born_ts_ms=99, born_host=HOST, store_host=HOST)


@pytest.mark.parametrize("case", LEGACY)
def test_a_stored_legacy_record_reads_as_before_with_empty_values_dropped(case):
    props, expected = LEGACY[case]
    ext = MessageExt(record(b"orders", props))
    ext.check()                                  # the read side's check: not skipped
    assert ext.properties == expected


@pytest.mark.parametrize("case", LEGACY)
def test_a_store_serves_legacy_records_without_skipping_them(tmp_path, case):
    props, expected = LEGACY[case]
    with MessageStore(str(tmp_path / "s"), small_config()) as store:
        blob, starts = R.encode_batch([record(b"orders", props)] * 3)
        store.append_encoded("orders", 0, blob, starts)        # as stored before the check existed
        store.dispatch()
        got = store.get("orders", 0, 0, max_count=8)
        assert got.skipped == 0 and [m.properties for m in got.messages] == [expected] * 3


@pytest.mark.parametrize("case", LEGACY)
def test_what_is_written_again_from_a_legacy_record_passes_the_brokers_check(case):
    props, _ = LEGACY[case]
    due = record(b"SCHEDULE_TOPIC_XXXX", props + UNIQ + b"REAL_TOPIC\x01orders\x02REAL_QID\x011\x02DELAY\x013\x02")
    _, _, delivered, _ = timeup_record(due, HOST)
    half = record(HALF_TOPIC.encode(), props + UNIQ + b"REAL_TOPIC\x01orders\x02REAL_QID\x011\x02TRAN_MSG\x01true\x02"
                                                      b"PGROUP\x01tx\x02")
    _, _, committed = commit_record(half, 4096, HOST)
    retried = retry_record(record(b"orders", props + UNIQ), "%RETRY%g", 0, 3, 18, HOST, "MSGID")
    dead = retry_record(record(b"orders", props + UNIQ), "%DLQ%g", 0, 0, 18, HOST, "MSGID")
    for rec in (delivered, committed, retried, dead):
        topic_b, _, size = single_record(rec, FOUR_MIB, PROPS_LIMIT)
        assert size == len(rec) and MessageExt(rec).properties[R.PROP_UNIQ_KEY] == "AB" * 16
