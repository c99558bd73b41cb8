"""Consumption retries and dead letters (RocketMQ ``sendMessageBack``): the pure parts.

A message whose listener returned RECONSUME_LATER (or raised) goes back to the broker: the broker
decides where (:func:`send_back_target`) — ``%RETRY%<group>`` after delay level 3 + the times it was
consumed again already, or ``%DLQ%<group>`` once that count reaches the group's maximum (16) — and
creates those topics. The consumer then stores the new record (:func:`retry_record`) through its
ingress ring like any send, so the writer stays the only appender: a retry goes under the schedule
topic and the scheduler delivers it to the retry topic when due; a dead letter is stored at once.
The record keeps body, flag, born time and host, unique id and user properties, counts one more
``RECONSUMETIMES``, and records the original topic (``RETRY_TOPIC``) and message id
(``ORIGIN_MESSAGE_ID``) the first time.
"""
from __future__ import annotations

from .. import records as R
from ..errors import ValidationError
from .schedule import schedule_parts

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
RETRY_BASE_LEVEL = 3                # RocketMQ: delay level 3 + reconsume times


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


def send_back_target(group: str, reconsume_times: int, max_reconsume_times: int,
                     delay_level: int = 0) -> tuple[str, int]:
    """``(topic, delay level)`` for a failed message; level 0 means store it at once (the DLQ).
    ``delay_level`` < 0 sends it straight to the DLQ, > 0 overrides the default back-off."""
    if reconsume_times >= max_reconsume_times or delay_level < 0:
        return dlq_topic(group), 0
    return retry_topic(group), delay_level or RETRY_BASE_LEVEL + reconsume_times


def retry_record(raw: bytes, topic: str, queue_id: int, level: int, levels: int, store_host: bytes,
                 msg_id: str) -> bytes:
    """The record that sends message ``raw`` (whose id is ``msg_id``) to ``topic``/``queue_id``,
    delayed ``level`` levels (0: at once)."""
    h, original_topic, body, props = R.decode_record(raw, 0, len(raw), verify_crc=False)
    for k in (R.PROP_DELAY, R.PROP_REAL_TOPIC, R.PROP_REAL_QUEUE_ID):
        props.pop(k, None)
    props.setdefault(R.PROP_RETRY_TOPIC, original_topic)
    props.setdefault(R.PROP_ORIGIN_MSG_ID, msg_id)
    topic_b = R.validate_topic(topic)
    props_b = R.encode_properties(props)
    if level > 0:
        props_b = R.encode_properties({**props, R.PROP_DELAY: str(level)})
        topic_b, queue_id, props_b = schedule_parts(topic, queue_id, props_b, level, levels)
    if h.reconsume_times < 0:
        raise ValidationError(f"record at {h.phys_offset} has a negative reconsume count")
    return R.encode_record(topic_b, body, props_b, queue_id=queue_id, flag=h.flag, sys_flag=h.sys_flag,
                           born_ts_ms=h.born_ts_ms, born_host=bytes(h.born_host), store_host=store_host,
                           reconsume_times=h.reconsume_times + 1)
