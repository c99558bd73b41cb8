"""Retries and dead letters, the pure parts: where a failed message goes and what is stored."""
from __future__ import annotations

import pytest

from hostmq import Message, records as R
from hostmq.semantics.retry import dlq_topic, retry_record, retry_topic, send_back_target
from hostmq.store.encode import properties_bytes

pytestmark = pytest.mark.timeout(60)
HOST = b"\x01\x02\x03\x04\x00\x00\x00\x05"
STORE = b"\x0a\x0b\x0c\x0d\x00\x00\x00\x06"


@pytest.mark.parametrize("reconsume,maximum,level,expect", [
    (0, 16, 0, ("%RETRY%g", 3)), (1, 16, 0, ("%RETRY%g", 4)), (15, 16, 0, ("%RETRY%g", 18)),
    (16, 16, 0, ("%DLQ%g", 0)), (2, 2, 0, ("%DLQ%g", 0)), (0, 16, -1, ("%DLQ%g", 0)), (0, 16, 5, ("%RETRY%g", 5)),
])
def test_send_back_targets_follow_rocketmq(reconsume, maximum, level, expect):
    assert send_back_target("g", reconsume, maximum, level) == expect
    assert retry_topic("g") == "%RETRY%g" and dlq_topic("g") == "%DLQ%g"


def original(reconsume: int = 0) -> bytes:
    msg = Message("orders", b"body", tags="t", keys=["k"], properties={"region": "eu"})
    return R.encode_record(b"orders", b"body", properties_bytes(msg, "CD" * 16, 32767), queue_id=2, flag=3,
                           born_ts_ms=99, born_host=HOST, store_host=HOST, reconsume_times=reconsume)


def test_a_retry_goes_under_the_schedule_topic_and_counts_one_more_attempt():
    rec = retry_record(original(), "%RETRY%g", 0, 3, 18, STORE, "MSGID-1")
    h, topic, body, props = R.decode_record(rec, 0)
    assert topic == "SCHEDULE_TOPIC_XXXX" and h.queue_id == 2 and body == b"body" and h.reconsume_times == 1
    assert props[R.PROP_REAL_TOPIC] == "%RETRY%g" and props[R.PROP_REAL_QUEUE_ID] == "0" and props[R.PROP_DELAY] == "3"
    assert props[R.PROP_RETRY_TOPIC] == "orders" and props[R.PROP_ORIGIN_MSG_ID] == "MSGID-1"
    assert (props["region"], props[R.PROP_TAGS], props[R.PROP_UNIQ_KEY]) == ("eu", "t", "CD" * 16)
    assert (h.flag, h.born_ts_ms, bytes(h.born_host), bytes(h.store_host)) == (3, 99, HOST, STORE)


def test_a_second_failure_keeps_the_first_origin_and_a_dead_letter_is_stored_at_once():
    first = retry_record(original(), "%RETRY%g", 0, 3, 18, STORE, "MSGID-1")
    # What the scheduler delivers to the retry topic, failing again:
    from hostmq.semantics.schedule import timeup_record
    _, _, delivered, _ = timeup_record(first, STORE)
    dead = retry_record(delivered, "%DLQ%g", 0, 0, 18, STORE, "MSGID-2")
    h, topic, _, props = R.decode_record(dead, 0)
    assert topic == "%DLQ%g" and h.queue_id == 0 and h.reconsume_times == 2
    assert props[R.PROP_RETRY_TOPIC] == "orders" and props[R.PROP_ORIGIN_MSG_ID] == "MSGID-1"
    assert R.PROP_DELAY not in props and R.PROP_REAL_TOPIC not in props
