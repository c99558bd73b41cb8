"""The transient store pool (RocketMQ ``TransientStorePool``, ``transientStorePoolEnable``).

``count`` buffers of one commitlog file each, pre-faulted and ``mlock``ed. With the pool on, the
commitlog's appender writes records into the buffer of the file being written instead of its
mapping, and a *commit step* copies what was appended to the file with ``pwrite`` (RocketMQ's
``FileChannel.write``), at least every ``commit_interval_ms`` and whenever ``commit_least_pages``
pages are waiting; the flusher then makes the file durable. Writes never fault on the file's pages
and never contend with readers of the page cache; the price is that readers (dispatcher, consumers)
see a record only after its commit.

Buffer of a file: number ``(file_from_offset // file_bytes) % count`` — deterministic, so a
restarted broker writer finds the bytes its killed predecessor appended but had not committed
(``salvage``). The appender commits a file completely before it starts the next one, so a buffer is
never reused while it holds uncommitted bytes, and one buffer is enough; RocketMQ keeps five
because its commit thread may trail the appender by several files.

Where the buffers live: in the broker, shared-memory segments (``pool.<n>``) created by the broker
process and unlinked at its stop, so what the writer appended survives the writer
(docs/internals.md, shared-memory rules: a killed writer loses no acknowledged message). The
embedded ``MessageStore`` uses anonymous memory.
A killed *broker* (its whole process group) leaves the buffers and its state segment in /dev/shm:
the next start commits what was published from them before recovering
(``broker.pool_salvage.salvage_pool``). Only an OS crash loses what was appended but not committed —
at most ``commit_interval_ms`` of acknowledged ASYNC_FLUSH sends, as in RocketMQ; the pool is ignored
under SYNC_FLUSH (RocketMQ ``isTransientStorePoolEnable``).
"""
from __future__ import annotations

import logging
import mmap

import numpy as np

from ..shm.segment import Segment
from .mapped_file import lock_region, populate_region

log = logging.getLogger(__name__)
POOL_KIND = "pool"
POOL_VERSION = 1


class TransientStorePool:
    """Write buffers of ``file_bytes`` each: anonymous, or the payloads of shared-memory segments."""

    def __init__(self, file_bytes: int, count: int = 1, *, segment_names: list[str] | None = None,
                 lock: bool = True) -> None:
        if count < 1:
            raise ValueError("a transient store pool needs at least one buffer")
        self.file_bytes = file_bytes
        self._segments: list[Segment] = []
        self._anon: list[mmap.mmap] = []
        self.buffers: list[memoryview] = []
        self.arrays: list[np.ndarray] = []
        self.locked = 0
        try:
            if segment_names:
                for name in segment_names:
                    seg = Segment.attach(name, POOL_KIND, POOL_VERSION)
                    self._segments.append(seg)
                    self.buffers.append(seg.buf[:file_bytes])
                    self.arrays.append(seg.u8[:file_bytes])
            else:
                for _ in range(count):
                    mm = mmap.mmap(-1, file_bytes)
                    self._anon.append(mm)
                    self.buffers.append(memoryview(mm))
                    self.arrays.append(np.frombuffer(mm, dtype=np.uint8))
            for i, u8 in enumerate(self.arrays):
                # mlock faults every page in; if refused, populate them anyway (no fault on append).
                if lock and lock_region(u8, f"transient store pool buffer {i}"):
                    self.locked += 1
                else:
                    populate_region(u8)     # older kernels: the first append faults the pages in
        except BaseException:
            self.close()
            raise

    @property
    def count(self) -> int:
        return len(self.buffers)

    def buffer_for(self, file_from_offset: int) -> tuple[memoryview, np.ndarray]:
        i = (file_from_offset // self.file_bytes) % len(self.buffers)
        return self.buffers[i], self.arrays[i]

    def close(self) -> None:
        self.buffers, self.arrays = [], []
        for seg in self._segments:
            seg.close()
        for mm in self._anon:
            try:
                mm.close()
            except BufferError:
                pass        # a view still alive; unmapped when it is collected
        self._segments, self._anon = [], []

    # -- the broker's side: the segments live as long as the broker ----------------------------------
    @staticmethod
    def create_segments(names: list[str], file_bytes: int) -> list[Segment]:
        """Create the pool's segments (the broker process owns them; the writer attaches)."""
        made: list[Segment] = []
        try:
            for name in names:
                made.append(Segment.create(name, file_bytes, POOL_KIND, POOL_VERSION))
        except BaseException:
            for seg in made:
                seg.close()
                seg.unlink()
            raise
        return made


def salvage(pool: TransientStorePool, mfq, committed_phys: int, write_phys: int) -> int:
    """After the appender died: copy ``[committed_phys, write_phys)`` — appended and published, not
    committed — from the pool buffer of the file holding it into that file; returns the end of what
    the files now hold. The range lies in one file (a file is committed wholly before the next
    starts); if it does not, nothing is copied and the end is cut back to ``committed_phys``."""
    if write_phys <= committed_phys:
        return write_phys
    mf = mfq.find(write_phys - 1)
    if mf is None or committed_phys < mf.file_from_offset:
        log.error("cannot salvage [%d, %d) from the transient store pool: no single file holds it; "
                  "cut back to %d", committed_phys, write_phys, committed_phys)
        return committed_phys
    buf, _ = pool.buffer_for(mf.file_from_offset)
    a, b = committed_phys - mf.file_from_offset, write_phys - mf.file_from_offset
    mf.mm[a:b] = buf[a:b]
    log.info("committed %d bytes a killed writer had left in the transient store pool", b - a)
    return write_phys
