"""Delay messages (RocketMQ ``ScheduleMessageService``): the pure parts.

A message sent with ``delay_level`` n (1 … number of levels; larger is clamped to the last level) is
stored under ``SCHEDULE_TOPIC_XXXX``, queue n − 1, with its real topic and queue in the properties
``REAL_TOPIC`` / ``REAL_QID`` — the producer encodes it that way (:func:`schedule_parts`), so the
writer stays the only appender and appends bytes as they come. The dispatcher writes the due time
(store time + the level's delay) as the consume-queue tag code. The broker's scheduler process
delivers each due message to its real topic and queue as a new record (:func:`timeup_record`:
same body, flag, born time and host, unique id and user properties; ``DELAY`` / ``REAL_*`` removed)
and keeps each level's next offset in ``config/delayOffset.json`` (:class:`DelayOffsets`).
"""
from __future__ import annotations

from .. import records as R
from ..errors import ValidationError
from ..jsonfile import read_json, write_json
from ..store.commitlog import SCHEDULE_TOPIC

SCHEDULE_TOPIC_B = SCHEDULE_TOPIC.encode()
_STRIP = (R.PROP_DELAY, R.PROP_REAL_TOPIC, R.PROP_REAL_QUEUE_ID)


def schedule_parts(topic: str, queue_id: int, props_b: bytes, level: int, levels: int) -> tuple[bytes, int, bytes]:
    """Where a delay message is stored: ``(topic bytes, queue id, properties)`` of its record."""
    if levels < 1:
        raise ValidationError("this broker has no delay levels")
    if not isinstance(level, int) or isinstance(level, bool) or level < 1:
        raise ValidationError(f"delay_level must be an int ≥ 1, got {level!r}")
    level = min(level, levels)
    extra = R.encode_properties({R.PROP_REAL_TOPIC: topic, R.PROP_REAL_QUEUE_ID: str(queue_id)})
    return SCHEDULE_TOPIC_B, level - 1, props_b + extra


def timeup_record(raw: bytes, store_host: bytes) -> tuple[str, int, bytes, str | None]:
    """The record to deliver for a due schedule-topic record: ``(real topic, real queue id, record,
    unique id)``. ValidationError if the record does not say where it goes."""
    h, topic, body, props = R.decode_record(raw, 0, len(raw), verify_crc=False)
    real_topic, real_qid = props.get(R.PROP_REAL_TOPIC), props.get(R.PROP_REAL_QUEUE_ID)
    if topic != SCHEDULE_TOPIC or not real_topic or not (real_qid or "").isdigit():
        raise ValidationError(f"schedule record at {h.phys_offset} has no real topic and queue")
    kept = {k: v for k, v in props.items() if k not in _STRIP}
    rec = R.encode_record(R.validate_topic(real_topic), body, R.encode_properties(kept), queue_id=int(real_qid),
                          flag=h.flag, sys_flag=h.sys_flag, born_ts_ms=h.born_ts_ms, born_host=bytes(h.born_host),
                          store_host=store_host, reconsume_times=h.reconsume_times)
    return real_topic, int(real_qid), rec, props.get(R.PROP_UNIQ_KEY)


class DelayOffsets:
    """Each level's next schedule-queue offset to deliver (``delayOffset.json``; the scheduler is its
    only writer)."""

    def __init__(self, path: str) -> None:
        self.path = path
        data = read_json(path, {"offset_table": {}})
        table = data.get("offset_table", {}) if isinstance(data, dict) else {}
        self.offsets: dict[int, int] = {int(k): int(v) for k, v in table.items()
                                        if str(k).isdigit() and isinstance(v, int) and v >= 0}
        # The commitlog's write position when these offsets were saved (None in a file written
        # before it was kept): every delivery of an entry at or past them is stored at or after it.
        pos = data.get("write_pos") if isinstance(data, dict) else None
        self.write_pos: int | None = pos if isinstance(pos, int) and not isinstance(pos, bool) and pos >= 0 else None
        self._saved = dict(self.offsets)

    def get(self, level: int) -> int:
        return self.offsets.get(level, 0)

    def set(self, level: int, offset: int) -> None:
        self.offsets[level] = offset

    def persist(self, write_pos: int | None = None) -> bool:
        """Save the offsets if they moved (or a ``write_pos`` is known for the first time) with
        ``write_pos``: a commitlog position before every delivery of an entry at or past them."""
        if self.offsets == self._saved and (self.write_pos is not None or write_pos is None):
            return False
        data: dict = {"offset_table": {str(k): v for k, v in sorted(self.offsets.items())}}
        if write_pos is not None:
            data["write_pos"] = int(write_pos)
        write_json(self.path, data)
        self._saved, self.write_pos = dict(self.offsets), write_pos
        return True


def corrected_due_ms(due_ms: int, now_ms: int, level_delay_ms: int) -> int:
    """When a schedule-queue entry is due, corrected for a wall clock that went back since it was
    stored: an entry due later than its level's delay from now is due now (RocketMQ
    ``correctDeliverTimestamp``) — rather than held until the clock catches up (an hour, after a
    one-hour step). Store times never go back (``CommitLog._store_ts``), so a step back leaves them
    ahead of the clock until it catches up."""
    return now_ms if due_ms > now_ms + level_delay_ms else due_ms

