"""What the dispatcher learns about one committed record (RocketMQ ``DispatchRequest``).

Built by ``commitlog.CommitLog.scan`` from the record bytes; consumed by the consume queues and the
index. A plain tuple so that a batch of thousands costs little.
"""
from __future__ import annotations

from typing import NamedTuple


class DispatchRequest(NamedTuple):
    topic: str
    queue_id: int
    phys_offset: int        # commitlog byte offset of the record
    size: int               # TOTALSIZE of the record
    tag_hash: int           # consume-queue tag code (tag hash, or due time for delay messages)
    store_ts_ms: int
    queue_offset: int
    keys: str               # KEYS property as stored ("k1 k2"), "" if none
    uniq_key: str           # UNIQ_KEY property, "" if none
    sys_flag: int
