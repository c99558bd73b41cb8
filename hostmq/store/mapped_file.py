"""One fixed-size memory-mapped store file named by the offset of its first byte (20 digits).

Positions (bytes from the file start):
  * ``wrote_pos``     — end of what the appender has written;
  * ``committed_pos`` — end of what has reached the file (equals wrote_pos unless a transient store
    pool buffers writes, see issue 7);
  * ``flushed_pos``   — end of what has been msync'ed to disk.

Ownership: exactly one process writes a given file (the commitlog writer, or the dispatcher for
consume-queue and index files); others map it read-only and may see any prefix of a write. On a
crash the positions are lost and recovery finds the real end by scanning (see ``recovery``).
"""
from __future__ import annotations

import ctypes
import logging
import ctypes.util
import mmap
import resource
import os

import numpy as np

from ..fsutil import FILE_MODE, fsync_dir

log = logging.getLogger(__name__)
PAGE_BYTES = mmap.PAGESIZE
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.mlock.argtypes = _libc.munlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_mlock_warned = False
MADV_POPULATE_WRITE = 23  # Linux 5.14+; not exported by the mmap module
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
FALLOC_FL_KEEP_SIZE, FALLOC_FL_ZERO_RANGE = 0x01, 0x10


def file_name(start_offset: int) -> str:
    return f"{start_offset:020d}"


def offset_of(name: str) -> int:
    """Start offset encoded in a store file name; ValueError if the name is not 20 digits."""
    base = os.path.basename(name)
    if len(base) != 20 or not base.isdigit():
        raise ValueError(f"not a store file name: {name!r}")
    return int(base)


class MappedFile:
    """A store file of ``file_bytes`` mapped into memory."""

    def __init__(self, path: str, file_bytes: int, *, create: bool = False, writable: bool = True,
                 warm: bool = False, from_offset: int | None = None) -> None:
        self.path = path
        self.file_bytes = file_bytes
        self.file_from_offset = offset_of(path) if from_offset is None else from_offset
        self.writable = writable
        flags = os.O_RDWR if writable else os.O_RDONLY
        if create:
            flags |= os.O_CREAT
        fd = os.open(path, flags | os.O_CLOEXEC, FILE_MODE)
        try:
            size = os.fstat(fd).st_size
            if create and size < file_bytes:
                # Reserve the blocks now: ENOSPC here, never a SIGBUS on a later write. A file we could
                # not reserve is removed again: a short file must never look like a store file.
                try:
                    os.posix_fallocate(fd, 0, file_bytes)
                except OSError:
                    if size == 0:
                        os.unlink(path)
                    raise
                fsync_dir(os.path.dirname(path))        # the new name survives a crash
            elif size != file_bytes:
                raise ValueError(f"{path} is {size} bytes, expected {file_bytes}")
            access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
            self.mm = mmap.mmap(fd, file_bytes, access=access)
        finally:
            os.close(fd)
        # A uint8 view for vectorised reads and writes; shares the mapping, no copy.
        self.u8 = np.frombuffer(self.mm, dtype=np.uint8)
        self._views: dict = {}
        self.wrote_pos = 0
        self._committed_pos = 0
        self.flushed_pos = 0
        # Where appends go: the map, or a transient store pool buffer (``use_buffer``) that
        # ``commit`` copies to the file.
        self.wbuf: memoryview | None = None
        self.wmm = self.mm
        self.wu8 = self.u8
        self._wfd = -1
        self.locked = False     # mlocked by lock()
        self.dropped = False    # MADV_DONTNEED given because every consumer has read past it
        self.store_ts_ms = 0  # store time of the last message appended (commitlog only)
        if warm and writable:
            self.warm()

    # -- positions --------------------------------------------------------------------------------
    @property
    def file_end_offset(self) -> int:
        return self.file_from_offset + self.file_bytes

    @property
    def committed_pos(self) -> int:
        return self.wrote_pos if self.wbuf is None else self._committed_pos

    @committed_pos.setter
    def committed_pos(self, pos: int) -> None:
        self._committed_pos = pos

    def is_full(self) -> bool:
        return self.wrote_pos >= self.file_bytes

    def set_positions(self, pos: int) -> None:
        """After recovery: everything up to ``pos`` is valid, written and durable."""
        self.wrote_pos = self.committed_pos = self.flushed_pos = pos

    # -- writing ----------------------------------------------------------------------------------
    def write_at(self, pos: int, data) -> None:
        self.mm[pos:pos + len(data)] = data

    def append(self, data) -> int:
        """Append at wrote_pos; returns the position written at."""
        pos = self.wrote_pos
        self.mm[pos:pos + len(data)] = data
        self.wrote_pos = self.committed_pos = pos + len(data)
        return pos

    # -- transient store pool -----------------------------------------------------------------------
    def use_buffer(self, buf: memoryview, u8: np.ndarray) -> None:
        """Append into ``buf`` (a pool buffer of ``file_bytes``) from now on; what is in the file
        stays committed. ``commit`` moves appended bytes to the file."""
        self._committed_pos = self.wrote_pos
        self._wfd = os.open(self.path, os.O_WRONLY)
        self.wbuf, self.wmm, self.wu8 = buf, buf, u8

    def commit(self, least_pages: int = 0, end: int | None = None) -> int:
        """Copy the appended bytes ``[committed_pos, end or wrote_pos)`` from the buffer to the file
        with ``pwrite`` if at least ``least_pages`` pages are waiting; returns committed_pos."""
        if self.wbuf is None:
            return self.wrote_pos
        start = self._committed_pos
        end = self.wrote_pos if end is None else end
        if end <= start or (least_pages > 0 and end // PAGE_BYTES - start // PAGE_BYTES < least_pages):
            return start
        pos = start
        while pos < end:
            pos += os.pwrite(self._wfd, self.wbuf[pos:end], pos)
        self._committed_pos = end
        return end

    def release_buffer(self) -> None:
        """Commit everything, then append to the map again (the buffer goes back to the pool)."""
        if self.wbuf is None:
            return
        self.commit()
        os.close(self._wfd)
        self._wfd = -1
        self.wbuf, self.wmm, self.wu8 = None, self.mm, self.u8

    def zero_from(self, pos: int) -> None:
        """Zero the file from ``pos`` to its end (drops a torn or garbage tail for good)."""
        if pos < self.file_bytes:
            self.zero_range(pos, self.file_bytes)

    def zero_range(self, pos: int, end: int) -> None:
        """Zero ``[pos, end)`` without pulling the range into the page cache: the first partial page
        through the map, whole pages with ``FALLOC_FL_ZERO_RANGE`` (they read as zeros; every
        process's mapping of them is dropped). Writing zeros through the map instead would dirty up to
        a whole file of pages (a writer restart zeroes the torn-tail window)."""
        end = min(end, self.file_bytes)
        page_end = min(end, -(-pos // PAGE_BYTES) * PAGE_BYTES)
        if pos < page_end:
            self.u8[pos:page_end] = 0
        if page_end >= end:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        try:
            # ZERO_RANGE keeps the blocks allocated (no ENOSPC, no SIGBUS later: a punched hole would
            # need blocks again, and a full disk could not give them back).
            if _libc.fallocate(fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, page_end, end - page_end) != 0:
                self.u8[page_end:end] = 0                          # tmpfs and others: through the map
        finally:
            os.close(fd)

    def flush(self, least_pages: int = 0) -> int:
        """msync the dirty range if at least ``least_pages`` pages are dirty; returns flushed_pos."""
        end = self.committed_pos
        if end <= self.flushed_pos:
            return self.flushed_pos
        if least_pages > 0 and (end // PAGE_BYTES - self.flushed_pos // PAGE_BYTES) < least_pages:
            return self.flushed_pos
        start = (self.flushed_pos // PAGE_BYTES) * PAGE_BYTES
        self.mm.flush(start, end - start)
        self.flushed_pos = end
        return end

    def dirty_pages(self) -> int:
        return self.committed_pos // PAGE_BYTES - self.flushed_pos // PAGE_BYTES

    # -- page cache ---------------------------------------------------------------------------------
    def warm(self) -> None:
        """Pre-fault every page so the hot path never takes a fresh-page fault (docs/internals.md fact 18)."""
        try:
            self.mm.madvise(MADV_POPULATE_WRITE)
        except OSError:
            # Older kernels: touch one byte per page (writing zero keeps the content unchanged).
            self.u8[::PAGE_BYTES] = self.u8[::PAGE_BYTES]

    def warm_without_gil(self) -> None:
        """``warm`` for a background thread: the kernel populates the pages while the GIL is free
        (ctypes releases it; ``mmap.madvise`` does not), so the thread that appends keeps running."""
        if not populate_region(self.u8):
            self.warm()

    def lock(self) -> bool:
        """``mlock`` the whole file (its pages stay in RAM while mapped); see ``lock_region``."""
        if not self.writable or self.u8 is None:
            return False
        self.locked = lock_region(self.u8, self.path)
        return self.locked

    def unlock(self) -> None:
        if self.locked:
            _libc.munlock(ctypes.c_void_p(self.u8.ctypes.data), ctypes.c_size_t(self.file_bytes))
            self.locked = False

    def madvise(self, advice: int) -> bool:
        try:
            self.mm.madvise(advice)
            return True
        except OSError:
            return False

    def view(self, dtype: np.dtype) -> np.ndarray:
        """The whole file as an array of fixed-size entries (cached; released by ``close``)."""
        v = self._views.get(dtype)
        if v is None:
            v = self._views[dtype] = np.frombuffer(self.mm, dtype=dtype,
                                                   count=self.file_bytes // dtype.itemsize)
        return v

    def read_be(self, positions: np.ndarray, width: int, step: int | None = None) -> np.ndarray:
        """Big-endian signed ints of ``width`` (4 or 8) bytes at many unaligned positions at once.

        With ``step`` (the positions are ``positions[0] + step * i``) this is a zero-copy strided
        view; otherwise one fancy index over ``width`` alignment views (no copy of the file).
        """
        dtype = np.dtype(f">i{width}")
        if step is not None and len(positions):
            return np.ndarray(shape=(len(positions),), dtype=dtype, buffer=self.mm,
                              offset=int(positions[0]), strides=(step,))
        key = ("be", width)
        v = self._views.get(key)
        if v is None:
            v = self._views[key] = np.ndarray(shape=(width, self.file_bytes // width - 1), dtype=dtype,
                                              buffer=self.mm, offset=0, strides=(1, width))
        return v[positions % width, positions // width]

    def rows(self, starts: np.ndarray, length: int, step: int | None = None) -> np.ndarray:
        """``length`` bytes at each start as an (n, length) uint8 array (a strided view with ``step``)."""
        if step is not None and len(starts):
            return np.lib.stride_tricks.as_strided(self.u8[int(starts[0]):], shape=(len(starts), length),
                                                   strides=(step, 1), writeable=False)
        return self.u8[starts[:, None] + np.arange(length)]


    # -- life -------------------------------------------------------------------------------------
    def close(self) -> None:
        """Unmap. If a caller still holds a view into the map, it stays mapped until that view dies."""
        self.release_buffer()
        self.wmm = self.wu8 = None
        self.u8 = None
        self._views = {}
        if self.mm is not None and not self.mm.closed:
            try:
                self.mm.close()
            except BufferError:
                pass  # exported memoryviews (zero-copy reads) keep it alive; GC unmaps later
        self.mm = None

    def destroy(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return
        fsync_dir(os.path.dirname(self.path))           # a crash must not bring the file back

    def __repr__(self) -> str:
        return (f"MappedFile({os.path.basename(self.path)}, wrote={self.wrote_pos}, "
                f"flushed={self.flushed_pos})")


def populate_region(u8: np.ndarray) -> bool:
    """Fault in every page behind ``u8`` for writing (``MADV_POPULATE_WRITE`` through ctypes, which
    releases the GIL); False if the kernel cannot."""
    return _libc.madvise(ctypes.c_void_p(u8.ctypes.data), ctypes.c_size_t(u8.nbytes), MADV_POPULATE_WRITE) == 0


def lock_region(u8: np.ndarray, what: str) -> bool:
    """``mlock`` the memory behind ``u8``. Refused (RLIMIT_MEMLOCK, no CAP_IPC_LOCK): one warning per
    process saying how to allow it, False, and nothing else changes — locking is an optimisation,
    never a condition (docs/internals.md fact 10)."""
    global _mlock_warned
    if _libc.mlock(ctypes.c_void_p(u8.ctypes.data), ctypes.c_size_t(u8.nbytes)) == 0:
        return True
    err = ctypes.get_errno()
    if not _mlock_warned:
        _mlock_warned = True
        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        log.warning("mlock of %s (%d bytes) refused: %s; RLIMIT_MEMLOCK is %s. Running without locked "
                    "pages; allow it with LimitMEMLOCK=infinity (systemd) or ulimit -l unlimited",
                    what, u8.nbytes, os.strerror(err), "unlimited" if soft < 0 else f"{soft} bytes")
    return False


def arithmetic_step(positions: np.ndarray) -> int | None:
    """``d`` if ``positions[i] == positions[0] + d * i`` for all i (d > 0), else None."""
    n = len(positions)
    if n == 0:
        return None
    if n == 1:
        return 1
    d = int(positions[1] - positions[0])
    if d <= 0 or int(positions[-1] - positions[0]) != d * (n - 1) or not (np.diff(positions) == d).all():
        return None
    return d
