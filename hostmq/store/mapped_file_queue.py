"""A directory of equal-size mapped files forming one contiguous log (RocketMQ MappedFileQueue).

File ``N`` starts at offset ``first + N * file_bytes``; finding the file of an offset is arithmetic,
with a binary search over the start offsets as fallback when a file is missing in the middle.
The process that owns the log (commitlog: writer; consume queue: dispatcher) is the only one that
creates, truncates or deletes its files.
"""
from __future__ import annotations

import bisect
import mmap
import os
import threading
import time

from ..errors import ConfigError
from ..fsutil import ensure_dir, fsync_dir
from .mapped_file import MappedFile, file_name, offset_of

PREALLOC_SUFFIX = ".prealloc"          # a next file being made ahead of need


class MappedFileQueue:
    def __init__(self, directory: str, file_bytes: int, *, warm: bool = False,
                 writable: bool = True, advice: tuple[str, str] = ("NORMAL", "NORMAL")) -> None:
        self.directory = directory
        self.file_bytes = file_bytes
        self.warm = warm
        self.writable = writable
        self.advice = advice            # madvise of the newest file, and of the older ones
        self.preallocate_at: float | None = None    # see preallocate_next
        self.lock_head = False          # mlock the newest file (writable queues), unlock when it turns cold
        self._next: tuple[int, threading.Thread, list] | None = None
        self._advised: dict[int, str] = {}
        self.files: list[MappedFile] = []

    def _advise(self) -> None:
        """Give each mapped file its kind's advice: the newest (head) one, the older (cold) ones.
        Only changes are applied (a file turns cold when the next one is created)."""
        last = len(self.files) - 1
        if self.lock_head and self.writable:
            for i, mf in enumerate(self.files):
                if i == last and not mf.locked:
                    mf.lock()
                elif i != last:
                    mf.unlock()
        if self.advice == ("NORMAL", "NORMAL") and not self._advised:
            return
        head, cold = self.advice
        for i, mf in enumerate(self.files):
            want = head if i == last else cold
            if self._advised.get(mf.file_from_offset) != want:
                mf.madvise(getattr(mmap, f"MADV_{want}"))
                self._advised[mf.file_from_offset] = want

    def drop_below(self, phys: int) -> int:
        """``MADV_DONTNEED`` on each file that ends at or before ``phys`` (never the newest), once:
        this process's page-table entries for it go, so the page cache can evict its pages once no
        process maps them (``broker.consumed``). Returns the files dropped now."""
        n = 0
        for mf in self.files[:-1]:
            if mf.file_end_offset > phys:
                break
            if not mf.dropped:
                mf.dropped = mf.madvise(mmap.MADV_DONTNEED)
                n += mf.dropped
        return n

    # -- loading ----------------------------------------------------------------------------------
    def load(self) -> None:
        """Map the existing files in offset order, all positions at their end (recovery sets them).

        A last file *shorter* than ``file_bytes`` is what a crash while creating it leaves (nothing is
        written into a file before it has its full size), and is removed by a writer. Any other file
        of the wrong size or with a misaligned name is never deleted — it may hold data written with
        another file size (the store's own size is in ``store.json``): a writer refuses to open the
        store (ConfigError naming the file), a reader stops before it.
        """
        self.files = []
        if not os.path.isdir(self.directory):
            return
        names = []
        for n in os.listdir(self.directory):
            try:
                names.append((offset_of(n), n))
            except ValueError:
                continue
        names.sort()
        if self.writable:               # left by a crash before the roll: holds nothing
            for n in os.listdir(self.directory):
                if n.endswith(PREALLOC_SUFFIX):
                    os.unlink(os.path.join(self.directory, n))
        for i, (start, n) in enumerate(names):
            path = os.path.join(self.directory, n)
            size = os.path.getsize(path)
            if size != self.file_bytes or start % self.file_bytes:
                if i == len(names) - 1 and size < self.file_bytes and start % self.file_bytes == 0:
                    if self.writable:   # a crash while creating it: it holds nothing
                        os.unlink(path)
                        fsync_dir(self.directory)
                    break
                if not self.writable and i == len(names) - 1:
                    break               # a reader: the writer may be creating it right now
                raise ConfigError(f"{path} is {size} bytes and starts at {start}, which does not fit "
                                  f"files of {self.file_bytes} bytes; the store was written with another "
                                  f"file size (see store.json) — nothing was changed")
            mf = MappedFile(path, self.file_bytes, writable=self.writable)
            mf.set_positions(self.file_bytes)
            self.files.append(mf)
        self._advise()

    def refresh(self) -> None:
        """Reader side: map files the writer created since, forget files cleanup deleted."""
        if self.writable:
            raise ValueError("refresh() is for read-only file queues")
        names = []
        if os.path.isdir(self.directory):
            for n in os.listdir(self.directory):
                try:
                    names.append(offset_of(n))
                except ValueError:
                    continue
        present = set(names)
        while self.files and self.files[0].file_from_offset not in present:
            self.files.pop(0).close()
        nxt = self.files[-1].file_end_offset if self.files else (min(names) if names else 0)
        while nxt in present:
            path = os.path.join(self.directory, file_name(nxt))
            try:
                if os.path.getsize(path) != self.file_bytes:
                    break
                mf = MappedFile(path, self.file_bytes, writable=False)
            except (FileNotFoundError, ValueError):
                break
            mf.set_positions(self.file_bytes)
            self.files.append(mf)
            nxt = mf.file_end_offset
        self._advise()

    # -- lookup -----------------------------------------------------------------------------------
    def first(self) -> MappedFile | None:
        return self.files[0] if self.files else None

    def last(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    def find(self, offset: int) -> MappedFile | None:
        """The file holding ``offset``, or None."""
        files = self.files
        if not files:
            return None
        i = (offset - files[0].file_from_offset) // self.file_bytes
        if 0 <= i < len(files) and files[i].file_from_offset <= offset < files[i].file_end_offset:
            return files[i]
        starts = [f.file_from_offset for f in files]   # a hole in the file list: search
        j = bisect.bisect_right(starts, offset) - 1
        if j >= 0 and offset < files[j].file_end_offset:
            return files[j]
        return None

    def min_offset(self) -> int:
        return self.files[0].file_from_offset if self.files else 0

    def max_offset(self) -> int:
        """End of what has been written (next append position)."""
        last = self.last()
        return last.file_from_offset + last.wrote_pos if last else 0

    def flushed_offset(self) -> int:
        last = self.last()
        return last.file_from_offset + last.flushed_pos if last else 0

    # -- growth -----------------------------------------------------------------------------------
    def last_for_write(self, start_offset: int = 0) -> MappedFile:
        """The file to append to, creating the next one when the last is full (or none exists)."""
        last = self.last()
        if last is not None and not last.is_full():
            return last
        start = last.file_end_offset if last is not None else start_offset - start_offset % self.file_bytes
        return self.create(start)

    def create(self, start: int) -> MappedFile:
        ensure_dir(self.directory)
        path = os.path.join(self.directory, file_name(start))
        mf = self._take_preallocated(start)
        if mf is not None:
            os.rename(mf.path, path)        # the mapping stays valid; readers see it only now
            fsync_dir(self.directory)
            mf.path = path
        else:
            mf = MappedFile(path, self.file_bytes, create=True, warm=self.warm)
        self.files.append(mf)
        self._advise()
        return mf

    # -- pre-allocation (RocketMQ AllocateMappedFileService) ----------------------------------------
    def preallocate_next(self, wrote_pos: int) -> None:
        """Once the last file is ``preallocate_at`` full, create the next one in a background thread:
        blocks reserved (``posix_fallocate``) and, with ``warm``, every page faulted in — so rolling
        costs a rename, not a file creation and a page fault per page on the hot path. The file
        carries a temporary name until then: readers, recovery and cleanup never see it."""
        if self.preallocate_at is None or self._next is not None or wrote_pos < self.preallocate_at * self.file_bytes:
            return
        last = self.last()
        if last is None:
            return
        start = last.file_end_offset
        out: list = []
        t = threading.Thread(target=self._preallocate, args=(start, out), name="hostmq-preallocate", daemon=True)
        self._next = (start, t, out)
        t.start()

    def _preallocate(self, start: int, out: list) -> None:
        try:
            mf = MappedFile(os.path.join(self.directory, file_name(start) + PREALLOC_SUFFIX), self.file_bytes,
                            create=True, from_offset=start)
            if self.warm:
                mf.warm_without_gil()
            out.append(mf)
        except OSError as e:              # ENOSPC and the like: the roll will create it (and report)
            out.append(e)

    def _take_preallocated(self, start: int) -> MappedFile | None:
        if self._next is None:
            return None
        at, t, out = self._next
        self._next = None
        t.join()
        mf = out[0] if out and isinstance(out[0], MappedFile) else None
        if mf is not None and at != start:
            mf.destroy()
            return None
        return mf

    def drop_preallocated(self) -> None:
        mf = self._take_preallocated(-1)
        if mf is not None:
            mf.destroy()

    # -- shrinking --------------------------------------------------------------------------------
    def truncate(self, offset: int) -> None:
        """Drop everything at or after ``offset``: later files are deleted, the tail is zeroed."""
        keep = []
        for i, mf in enumerate(self.files):
            if mf.file_from_offset >= offset and i > 0:
                mf.destroy()
                continue
            if mf.file_end_offset > offset:
                # The first file stays (emptied) so the log keeps its start offset.
                pos = max(0, offset - mf.file_from_offset)
                mf.zero_from(pos)
                mf.set_positions(pos)
            keep.append(mf)
        self.files = keep

    def delete_first(self, count: int = 1) -> list[str]:
        """Delete the oldest ``count`` files (never the last one)."""
        gone = []
        while count > 0 and len(self.files) > 1:
            mf = self.files.pop(0)
            gone.append(mf.path)
            mf.destroy()
            count -= 1
        return gone

    def delete_expired_by_time(self, reserved_ms: float, now_ms: float | None = None,
                               force: bool = False, max_files: int = 10) -> list[str]:
        """Delete files not modified for ``reserved_ms`` (all old files when ``force``); never the last."""
        now_ms = time.time() * 1000 if now_ms is None else now_ms
        gone = []
        while len(self.files) > 1 and len(gone) < max_files:
            mf = self.files[0]
            age_ms = now_ms - os.path.getmtime(mf.path) * 1000
            if not force and age_ms < reserved_ms:
                break
            gone.extend(self.delete_first(1))
        return gone

    def flush(self, least_pages: int = 0) -> int:
        """Flush every file with unflushed data; returns the flushed offset of the log."""
        for mf in self.files:
            if mf.committed_pos > mf.flushed_pos:
                mf.flush(least_pages if mf is self.files[-1] else 0)
        return self.flushed_offset()

    def close(self) -> None:
        self.drop_preallocated()
        for mf in self.files:
            mf.close()
        self.files = []

    def destroy(self) -> None:
        for mf in self.files:
            mf.destroy()
        self.files = []
        try:
            os.rmdir(self.directory)
        except OSError:
            pass
