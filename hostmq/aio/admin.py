"""The asyncio administration client (docs/api.md "Administration"): every method of the sync
``hostmq.Admin``, awaited. Each runs on the client's one worker thread (``_bridge.Worker``) — control
requests and store reads block, and one thread per client (never one per call) keeps the loop free
and the calls in order."""
from __future__ import annotations

from typing import Any, Iterable

from ..admin.admin import Admin as _SyncAdmin
from ..message import MessageExt, MessageQueue
from ._bridge import Worker


class Admin:
    """``async with Admin(root) as a: await a.create_topic("orders", queues=4)``."""

    def __init__(self, root: Any = None, timeout_s: float = 3.0) -> None:
        self._sync = _SyncAdmin(root, timeout_s=timeout_s)
        self.root = self._sync.root
        self._worker = Worker("hostmq-aio-admin")
        self.closed = False

    @property
    def sync(self) -> _SyncAdmin:
        return self._sync

    async def create_topic(self, topic: str, queues: int = 4, order: bool = False,
                           brokers: str | Iterable[str] | None = None) -> list[MessageQueue]:
        """Create (or update) ``topic`` on ``brokers`` (None: every broker); its route once served."""
        return await self._worker.call(self._sync.create_topic, topic, queues, order, brokers)

    async def delete_topic(self, topic: str) -> bool:
        return await self._worker.call(self._sync.delete_topic, topic)

    async def topics(self) -> list[str]:
        return await self._worker.call(self._sync.topics)

    async def route(self, topic: str) -> list[MessageQueue]:
        return await self._worker.call(self._sync.route, topic)

    async def publish_route(self, topic: str) -> list[MessageQueue]:
        return await self._worker.call(self._sync.publish_route, topic)

    async def brokers(self) -> list[dict]:
        return await self._worker.call(self._sync.brokers)

    async def promote(self, name: str, broker_id: int, role: str = "ASYNC_MASTER", force: bool = False,
                      timeout_s: float = 120.0) -> dict:
        return await self._worker.call(self._sync.promote, name, broker_id, role, force, timeout_s)

    async def reset_offset(self, group: str, topic: str, timestamp_ms: int) -> dict[MessageQueue, int]:
        return await self._worker.call(self._sync.reset_offset, group, topic, timestamp_ms)

    async def consumer_progress(self, group: str) -> list[dict]:
        return await self._worker.call(self._sync.consumer_progress, group)

    async def view_message(self, msg_id: str) -> MessageExt:
        return await self._worker.call(self._sync.view_message, msg_id)

    async def query_by_key(self, topic: str, key: str, begin_ms: int = 0, end_ms: int | None = None,
                           max_count: int = 64) -> list[MessageExt]:
        return await self._worker.call(self._sync.query_by_key, topic, key, begin_ms, end_ms, max_count)

    async def close(self) -> None:
        """Close the connections and join the worker thread."""
        if self.closed:
            return
        self.closed = True
        try:
            await self._worker.call(self._sync.close)
        finally:
            self._worker.shutdown()

    aclose = close

    async def __aenter__(self) -> "Admin":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
