"""Open record buffers per key with a view per record — the spec of ``store._encode.Gather`` — and
a frame's results in one call — the spec of ``store._encode.send_results`` — and a sync send's
result — the spec of ``store._encode.send_result``.

``client.async_sends`` keeps a producer's open async frames in a ``Gather`` (C) or, where the module
is not built, a :class:`PyGather`: per topic, the frame being filled (an object with a ``buf``
bytearray and a ``sizes`` list), the frame that must go out now (``due``: full, or nothing in
flight) and how many taken frames are not answered (``inflight``). Every call is atomic for the
producer's threads (a lock here, the GIL there). ``Gather.add(msg)`` does in one call what
``encode_messages([msg], …)`` for queue 0 and no broker, then :meth:`PyGather.put`, do;
tests/client/test_async_gather.py compares the two.
"""
from __future__ import annotations

import threading


class PyGather:
    """The spec of ``store._encode.Gather`` (and what serves where it is not built): a producer's open
    frames per topic and the count of its frames in flight, each call atomic (a lock here; the GIL
    there). ``add`` takes nothing here — the caller encodes and ``put``s every message."""

    def __init__(self, frame_type, view_type, uid_source, host, tags_name, uniq_name, max_messages: int,
                 max_bytes: int, compress_over: int, max_body: int, max_props: int) -> None:
        self.open: dict[str, AsyncFrame] = {}
        self.topics: dict[str, bytes] = {}
        self.due: AsyncFrame | None = None
        self.inflight = 0
        self.view_type = view_type
        self.max_messages, self.max_bytes = max_messages, max_bytes
        self._lock = threading.Lock()

    def add(self, msg) -> None:
        return None

    def put(self, topic: str, frame: AsyncFrame, record: bytes) -> SendFuture | None:
        with self._lock:
            if self.open.get(topic) is not frame:
                return None
            view = self.view_type(frame, len(frame.sizes))
            frame.buf += record
            frame.sizes.append(len(record))
            if len(frame.sizes) >= self.max_messages or len(frame.buf) >= self.max_bytes or self.inflight <= 0:
                self.due = frame
            return view

    def take(self, topic: str) -> AsyncFrame | None:
        with self._lock:
            fr = self.open.pop(topic, None)
            if fr is not None:
                if self.due is fr:
                    self.due = None
                self.inflight += 1
            return fr

    def take_due(self) -> AsyncFrame | None:
        with self._lock:
            fr, self.due = self.due, None
        return self.take(fr.topic) if fr is not None and self.open.get(fr.topic) is fr else None

    def take_all(self) -> list[AsyncFrame]:
        with self._lock:
            frames = list(self.open.values())
            self.open.clear()
            self.due = None
            self.inflight += len(frames)
            return frames

    def answered(self) -> None:
        with self._lock:
            if self.inflight > 0:
                self.inflight -= 1


def py_send_results(result_type, status, ids: list[str], queue, first_offset: int) -> list:
    """The SendResults of a frame's messages: the ``i``-th with its own id and ``first_offset + i``."""
    return [result_type(status, mid, queue, first_offset + i) for i, mid in enumerate(ids)]


def py_send_result(result_type, status, host_hex: str, phys: int, queue, queue_offset: int):
    """A sync send's SendResult from its completion: the message id is the broker's host and the
    record's commitlog offset (16 upper-case hex digits)."""
    return result_type(status, f"{host_hex}{phys:016X}", queue, queue_offset)
