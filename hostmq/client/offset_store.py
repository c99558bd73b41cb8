"""Where a consumer group's progress lives (RocketMQ ``OffsetStore``).

* :class:`BrokerOffsets` — clustering: each queue's offset is kept by the broker that holds the
  queue (``consumerOffset.json`` there); every member of the group sees the same offsets. While a
  broker name's master is down they go to its slave, which carries them back to the master when it
  returns (``broker/replica.py``; the larger offset wins).
* :class:`LocalOffsets` — broadcasting: every consumer instance keeps its own offsets in
  ``ROOT/consumer-offsets/<instance>/<group>.json`` (RocketMQ ``LocalFileOffsetStore``), written
  atomically; the same ``instance_name`` resumes where it stopped.
"""
from __future__ import annotations

import os

from ..errors import ValidationError
from ..jsonfile import read_json, write_json
from ..message import MessageQueue
from ..protocol.codes import RequestCode, ResponseCode, error_for_response
from ..protocol.messages import OffsetRequest


class BrokerOffsets:
    def __init__(self, instance, group: str) -> None:
        self.instance = instance
        self.group = group

    def query(self, mq: MessageQueue) -> int | None:
        req = OffsetRequest(group=self.group, topic=mq.topic, queue_id=mq.queue_id)
        f = self.instance.read_request(mq.broker, RequestCode.QUERY_CONSUMER_OFFSET, req.to_fields(),
                                       topic=mq.topic, raw=True)
        if f.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        if f.code != ResponseCode.SUCCESS:
            raise error_for_response(f.code, f.remark, mq.broker)
        return f.fields["offset"]

    def store(self, mq: MessageQueue, offset: int, reset_version: int | None = None) -> bool:
        """Commit; False if the broker refused it because the group was reset since ``reset_version``
        (the caller reloads its offsets)."""
        req = OffsetRequest(group=self.group, topic=mq.topic, queue_id=mq.queue_id, offset=offset,
                            reset_version=reset_version)
        f = self.instance.read_request(mq.broker, RequestCode.UPDATE_CONSUMER_OFFSET, req.to_fields(), topic=mq.topic)
        return not f.fields.get("ignored", False)

    def flush(self) -> None:
        pass


def local_offsets_path(root: str, instance_name: str, group: str) -> str:
    for what, v in (("instance_name", instance_name), ("group", group)):
        if not v or os.sep in v or v in (".", ".."):
            raise ValidationError(f"{what} {v!r} cannot name a file")
    return os.path.join(root, "consumer-offsets", instance_name, f"{group}.json")


class LocalOffsets:
    def __init__(self, path: str) -> None:
        self.path = path
        data = read_json(path, {"offsets": []})
        self.offsets: dict[MessageQueue, int] = {}
        for row in data.get("offsets", []) if isinstance(data, dict) else []:
            try:
                mq = MessageQueue(str(row["topic"]), str(row["broker"]), int(row["queue_id"]))
                self.offsets[mq] = int(row["offset"])
            except (KeyError, TypeError, ValueError):
                continue
        self._dirty = False

    def query(self, mq: MessageQueue) -> int | None:
        return self.offsets.get(mq)

    def store(self, mq: MessageQueue, offset: int, reset_version: int | None = None) -> bool:
        if self.offsets.get(mq) != offset:
            self.offsets[mq] = offset
            self._dirty = True
        return True

    def flush(self) -> None:
        if self._dirty:
            write_json(self.path, {"offsets": [{"topic": q.topic, "broker": q.broker, "queue_id": q.queue_id,
                                                "offset": o} for q, o in sorted(self.offsets.items())]})
            self._dirty = False
