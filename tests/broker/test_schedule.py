"""Delay messages, the pure parts: where a delay message is stored and what is delivered when due."""
from __future__ import annotations

import json

import pytest

from hostmq import Message, records as R
from hostmq.semantics.schedule import SCHEDULE_TOPIC_B, DelayOffsets, corrected_due_ms, schedule_parts, timeup_record
from hostmq.errors import ValidationError
from hostmq.store.encode import properties_bytes

pytestmark = pytest.mark.timeout(60)
HOST = b"\x01\x02\x03\x04\x00\x00\x00\x05"
STORE = b"\x0a\x0b\x0c\x0d\x00\x00\x00\x06"


def delayed_record(level: int, levels: int = 18, body: bytes = b"payload") -> bytes:
    msg = Message("orders", body, tags="t", keys=["k1"], properties={"region": "eu"}, delay_level=level)
    props = properties_bytes(msg, "AB" * 16, 32767)
    topic_b, qid, props = schedule_parts("orders", 3, props, level, levels)
    return R.encode_record(topic_b, body, props, queue_id=qid, flag=7, sys_flag=0, born_ts_ms=1234,
                           born_host=HOST, store_host=HOST, reconsume_times=2)


def test_a_delay_message_is_stored_under_the_schedule_topic_at_its_level():
    h, topic, _, props = R.decode_record(delayed_record(5), 0)
    assert topic == "SCHEDULE_TOPIC_XXXX" and h.queue_id == 4
    assert props[R.PROP_REAL_TOPIC] == "orders" and props[R.PROP_REAL_QUEUE_ID] == "3"
    assert props[R.PROP_DELAY] == "5"
    assert R.decode_record(delayed_record(40), 0)[0].queue_id == 17          # clamped to the last level
    assert schedule_parts("t", 0, b"", 9, 3)[:2] == (SCHEDULE_TOPIC_B, 2)
    for bad in (0, -1, True, "2"):
        with pytest.raises(ValidationError):
            schedule_parts("t", 0, b"", bad, 18)
    with pytest.raises(ValidationError, match="no delay levels"):
        schedule_parts("t", 0, b"", 1, 0)


def test_the_delivered_record_is_the_original_message_on_its_real_topic():
    topic, qid, rec, uniq = timeup_record(delayed_record(2), STORE)
    assert (topic, qid, uniq) == ("orders", 3, "AB" * 16)
    h, t, body, props = R.decode_record(rec, 0)                 # a valid record (CRC checked)
    assert t == "orders" and h.queue_id == 3 and body == b"payload"
    assert (h.flag, h.born_ts_ms, bytes(h.born_host), h.reconsume_times) == (7, 1234, HOST, 2)
    assert bytes(h.store_host) == STORE
    assert props == {"region": "eu", R.PROP_TAGS: "t", R.PROP_KEYS: "k1", R.PROP_UNIQ_KEY: "AB" * 16}


def test_a_schedule_record_without_its_destination_is_refused():
    plain = R.encode_record(SCHEDULE_TOPIC_B, b"x", R.encode_properties({R.PROP_DELAY: "1"}), queue_id=0)
    with pytest.raises(ValidationError, match="no real topic"):
        timeup_record(plain, STORE)
    other = R.encode_record(b"orders", b"x", R.encode_properties({R.PROP_REAL_TOPIC: "a", R.PROP_REAL_QUEUE_ID: "1"}))
    with pytest.raises(ValidationError):
        timeup_record(other, STORE)


def test_an_entry_due_later_than_its_level_allows_is_due_now():
    # stored at 10 000 with a 1 s level: due at 11 000
    assert corrected_due_ms(11_000, 10_500, 1000) == 11_000          # not yet due
    assert corrected_due_ms(11_000, 11_000, 1000) == 11_000
    assert corrected_due_ms(11_000, 10_000, 1000) == 11_000          # exactly one level ahead: waits
    # the clock went back an hour after it was stored: due now, not in an hour
    assert corrected_due_ms(11_000, 10_000 - 3_600_000, 1000) == 10_000 - 3_600_000
    assert corrected_due_ms(11_000, 9_999, 1000) == 9_999


def test_delay_offsets_persist_only_changes(tmp_path):
    path = str(tmp_path / "delayOffset.json")
    d = DelayOffsets(path)
    assert d.get(3) == 0 and not d.persist()
    d.set(3, 17)
    d.set(1, 2)
    assert d.persist() and not d.persist()
    assert json.load(open(path)) == {"offset_table": {"1": 2, "3": 17}}
    again = DelayOffsets(path)
    assert (again.get(1), again.get(3), again.get(2)) == (2, 17, 0)


def test_delay_offsets_keep_the_write_position_they_were_saved_at(tmp_path):
    """``write_pos`` goes with the offsets; a file without one (an older version's) or with a wrong
    one has none; a position known for the first time is saved even if the offsets did not move."""
    path = str(tmp_path / "delayOffset.json")
    d = DelayOffsets(path)
    assert d.write_pos is None and not d.persist(None)
    assert d.persist(4096) and not d.persist(8192)             # first known: saved; then only with moves
    assert json.load(open(path)) == {"offset_table": {}, "write_pos": 4096}
    d.set(1, 5)
    assert d.persist(9000) and DelayOffsets(path).write_pos == 9000 and DelayOffsets(path).get(1) == 5
    for bad in (-1, "12", True, None, 1.5):
        with open(path, "w") as f:
            json.dump({"offset_table": {"1": 5}, "write_pos": bad}, f)
        assert DelayOffsets(path).write_pos is None and DelayOffsets(path).get(1) == 5
