"""hostmq for asyncio: ``Producer``, ``PullConsumer``, ``PushConsumer`` and ``Admin`` with the sync
clients' guarantees, for code that runs on an event loop (docs/aio.md).

No call takes a thread of its own and nothing polls on a timer: each client waits on the same
wake-up words as the sync clients — the ingress ring's completion futex, the dispatchers' futex
words — through at most one helper thread per client that sleeps on them and wakes the loop through
its self-pipe. Every await can be cancelled, every client is an async context manager, and
``close()`` (alias ``aclose()``) leaves no thread, socket or shared-memory segment behind.
"""
from __future__ import annotations

from .admin import Admin
from .producer import Producer
from .pull_consumer import PullConsumer
from .push_consumer import PushConsumer

__all__ = ["Producer", "PullConsumer", "PushConsumer", "Admin"]
