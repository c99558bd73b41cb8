"""The commitlog's next queue offset of every queue (``CommitLog.topic_queue_table``), in a form the
writer's native step reads and updates without the GIL (hostmq/ingress/_step.c).

A :class:`QueueTable` is a mapping ``(topic, queue id) -> next queue offset`` like the plain dict it
replaces, so every Python path (``CommitLog.append_record``, ``append_batch``, the message store's
rollback) keeps using ``get`` / ``[]`` / ``pop``. The queues of the topics named by :meth:`set_topics`
(the writer's writable topics and their writable queue counts) live in pinned numpy arrays, one
slot per topic; every other key lives in a dict beside them:

* ``names``: ``uint8[slots, 256]`` — byte 0 the topic's length, then its UTF-8 bytes;
* ``table``: ``int64[slots, 4]`` — writable queues, index of queue 0 in ``offsets``, ``crc32`` of the
  name (the queue wake word's hash, ``records.queue_wake_word``), unused;
* ``offsets``: ``int64[...]`` — the next queue offset of each queue, -1 for a key not in the mapping.
"""
from __future__ import annotations

import zlib
from collections.abc import MutableMapping
from typing import Iterator

import numpy as np

TOPIC_SLOT_BYTES = 256
TABLE_WORDS = 4
_ABSENT = -1


class QueueTable(MutableMapping):
    """``(topic, queue id) -> next queue offset`` (see the module docstring)."""

    def __init__(self, items=()) -> None:
        self._other: dict[tuple[str, int], int] = {}
        self._slot: dict[str, int] = {}
        self.queues: dict[bytes, int] | None = None     # what set_topics was given (identity checked)
        self.scratch: bytearray | None = None           # the native step's private copy of a batch
        self.names = np.zeros((0, TOPIC_SLOT_BYTES), np.uint8)
        self.table = np.zeros((0, TABLE_WORDS), np.int64)
        self.offsets = np.zeros(0, np.int64)
        self.pins = (memoryview(self.names.reshape(-1)), memoryview(self.table.reshape(-1)),
                     memoryview(self.offsets), 0)
        self._count: list[int] = []
        self._base: list[int] = []
        self.update(dict(items))

    def set_topics(self, queues: dict[bytes, int]) -> None:
        """Give each topic of ``queues`` (name bytes -> writable queues) a slot; keys move between
        the arrays and the dict, the mapping stays the same."""
        everything = dict(self.items())
        topics = [(t, max(0, int(n))) for t, n in queues.items() if 0 < len(t) < TOPIC_SLOT_BYTES]
        names = np.zeros((len(topics), TOPIC_SLOT_BYTES), np.uint8)
        table = np.zeros((len(topics), TABLE_WORDS), np.int64)
        slot, count, base, at = {}, [], [], 0
        for i, (t, n) in enumerate(topics):
            names[i, 0] = len(t)
            names[i, 1:1 + len(t)] = np.frombuffer(t, np.uint8)
            table[i] = (n, at, zlib.crc32(t), 0)
            slot[t.decode("utf-8", "surrogateescape")] = i
            count.append(n)
            base.append(at)
            at += n
        self.names, self.table = names, table
        self.offsets = np.full(at, _ABSENT, np.int64)
        # what the native step is handed: flat views, cheaper to pin per call than the arrays
        self.pins = (memoryview(names.reshape(-1)), memoryview(table.reshape(-1)), memoryview(self.offsets),
                     len(topics))
        self._slot, self._count, self._base, self._other = slot, count, base, {}
        self.queues = queues
        self.update(everything)

    def _index(self, key) -> int:
        """Index of ``key`` in ``offsets``, or -1 when it lives in the dict."""
        s = self._slot.get(key[0])
        if s is None:
            return -1
        q = key[1]
        return self._base[s] + q if 0 <= q < self._count[s] else -1

    def get(self, key, default=None):
        i = self._index(key)
        if i < 0:
            return self._other.get(key, default)
        v = int(self.offsets[i])
        return default if v == _ABSENT else v

    def __getitem__(self, key) -> int:
        i = self._index(key)
        if i < 0:
            return self._other[key]
        v = int(self.offsets[i])
        if v == _ABSENT:
            raise KeyError(key)
        return v

    def __setitem__(self, key, value: int) -> None:
        i = self._index(key)
        if i < 0:
            self._other[key] = value
        else:
            self.offsets[i] = value

    def __delitem__(self, key) -> None:
        i = self._index(key)
        if i < 0:
            del self._other[key]
        elif self.offsets[i] == _ABSENT:
            raise KeyError(key)
        else:
            self.offsets[i] = _ABSENT

    def __iter__(self) -> Iterator[tuple[str, int]]:
        yield from list(self._other)
        for topic, s in list(self._slot.items()):
            base = self._base[s]
            for q in range(self._count[s]):
                if self.offsets[base + q] != _ABSENT:
                    yield (topic, q)

    def __len__(self) -> int:
        return len(self._other) + int(np.count_nonzero(self.offsets != _ABSENT))

    def __repr__(self) -> str:
        return f"QueueTable({dict(self.items())!r})"


__all__ = ["QueueTable", "TABLE_WORDS", "TOPIC_SLOT_BYTES"]
