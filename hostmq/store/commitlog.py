"""The commitlog: every message of a broker, appended in arrival order (RocketMQ CommitLog).

Files of ``commitlog_file_bytes`` under ``store/commitlog/`` named by their first physical offset.
A record never spans two files, nor does a batch: when the next record or batch (plus an 8-byte
minimum blank) does not fit, the rest of the file becomes one blank record and it goes to the next
file (created *before* the blank is written, so a full disk changes nothing: ``rollback``).

Ownership: one appender (the writer process, or the embedded ``MessageStore``). It assigns each
record its queue offset from ``topic_queue_table`` and its physical offset, and makes store
timestamps non-decreasing so a time search over a queue is an exact binary search even if the wall
clock steps back. Readers may see any prefix of the log; on a crash, ``recover`` scans from a
point known to be good, stops at the first torn / garbage / zero record and truncates there.

A record becomes valid only once it is complete: every append writes everything but TOTALSIZE and
MAGICCODE, fills in the fields the appender owns (QUEUEID, QUEUEOFFSET, PHYSICALOFFSET,
STORETIMESTAMP, STOREHOST), and stores TOTALSIZE + MAGICCODE last (``_seal``). Bytes past the end of
the log are zero (new files are fallocated, recovery and a writer restart zero the tail), so a
process killed at any moment of an append leaves a record whose magic is 0, which recovery cuts. A
batch seals its first record last: until then the whole batch is unreachable (a scan stops at its
first record), so a kill never keeps part of a batch the producer was not told about and will resend.
Recovery also rejects a record whose PHYSICALOFFSET is not its position
(``records.check_stored_record``), and the dispatcher re-checks everything it reads.
"""
from __future__ import annotations

import logging
import os
import struct
import time
import zlib
from typing import Iterator, NamedTuple

import numpy as np

from .. import records as R
from ..errors import CorruptRecordError, ValidationError
from ..fsutil import ensure_dir
from .dispatch import SCHEDULE_TOPIC, DispatchRequest, scan_records  # noqa: F401 (SCHEDULE_TOPIC re-exported)
from .mapped_file_queue import MappedFileQueue
from .recovery import restore_short_files

log = logging.getLogger(__name__)
_HDR = R.MSG_HEADER
_BLANK_MAGIC = R.BLANK_MAGIC_CODE
_MAGIC = R.MAGIC_CODE
_PROPS_LEN = R.PROPS_LEN
_TOPIC_LEN = R.TOPIC_LEN
_crc32 = zlib.crc32
# Whole-record formats by (body, topic, properties) length: one pack_into per message when the
# sizes repeat, as they usually do. Bounded: a workload of ever-new sizes just uses two writes.
_RECORD_STRUCTS: dict[tuple[int, int, int], struct.Struct] = {}
_RECORD_STRUCTS_MAX = 256


def _remember_struct(blen: int, tl: int, plen: int) -> None:
    if len(_RECORD_STRUCTS) < _RECORD_STRUCTS_MAX:
        _RECORD_STRUCTS[(blen, tl, plen)] = struct.Struct(f"{R.MSG_HEADER.format}{blen}sB{tl}sH{plen}s")


_SIZE_MAGIC = R.SIZE_MAGIC                     # TOTALSIZE, MAGICCODE: written last (see the docstring)
_SEAL_BYTES = _SIZE_MAGIC.size
_SLICE_MAX_BYTES = 16 * 1024
_PATCH_QID = struct.Struct(">i")
_PATCH_OFFSETS = struct.Struct(">qq")           # QUEUEOFFSET, PHYSICALOFFSET (adjacent)
_PATCH_STORE = struct.Struct(">q8s")            # STORETIMESTAMP, STOREHOST (adjacent)
_QID_AT, _QOFF_AT, _STORE_TS_AT = R.FIELD["queue_id"], R.FIELD["queue_offset"], R.FIELD["store_ts_ms"]
R.layout_check(R.FIELD["phys_offset"] == _QOFF_AT + 8 and R.FIELD["store_host"] == _STORE_TS_AT + 8,
               "PHYSICALOFFSET follows QUEUEOFFSET and STOREHOST follows STORETIMESTAMP (the patches)")
_FIXED_BYTES = R.record_size(0, 0, 0)   # header + TOPICLENGTH + PROPERTIESLENGTH
_HDR_BYTES = _HDR.size
_MIN_BLANK = R.MIN_BLANK_BYTES


class AppendResult(NamedTuple):
    phys_offset: int
    size: int
    queue_offset: int
    store_ts_ms: int


class BatchAppendResult(NamedTuple):
    queue_offset: int            # queue offset of the first record
    phys_offsets: np.ndarray     # int64, one per record
    sizes: np.ndarray            # int64, one per record
    store_ts_ms: int


class CommitLog:
    def __init__(self, store_dir: str, file_bytes: int, *, store_host: bytes | None = None,
                 warm: bool = False, delay_levels_ms: tuple[int, ...] = (), writable: bool = True,
                 advice: tuple[str, str] = ("NORMAL", "NORMAL"), preallocate_at: float | None = None,
                 lock_head: bool = False, pool=None) -> None:
        self.directory = os.path.join(store_dir, "commitlog")
        if writable:    # readers (consumers in other processes) tell a store by this directory
            ensure_dir(self.directory)
            restore_short_files(self.directory, file_bytes)
        self.mfq = MappedFileQueue(self.directory, file_bytes, warm=warm, writable=writable, advice=advice)
        self.mfq.preallocate_at = preallocate_at if writable else None
        self.mfq.lock_head = lock_head and writable
        # the write position past which the next file is made ahead (never when off)
        self._prealloc_pos = int(preallocate_at * file_bytes) if preallocate_at and writable else file_bytes + 1
        self.file_bytes = file_bytes
        self.store_host = store_host or R.host_bytes()
        self.host_hex = self.store_host.hex().upper()
        self.topic_queue_table: dict[tuple[str, int], int] = {}
        self.last_store_ts_ms = 0
        self.delay_levels_ms = delay_levels_ms
        self._cur = None      # the file being appended to (None: ask the file queue)
        self._tail_cache: dict[bytes, tuple] = {}
        self.scan_error: tuple[int, str] | None = None     # see scan
        self.skipped_records = 0                            # records scan left out (invalid topic)
        # Transient store pool (``transient_pool``): appends go to its buffers; ``commit`` moves them
        # to the files and calls ``on_commit(committed phys offset)``.
        self.pool = pool if writable else None
        self.on_commit = None

    # -- offsets ----------------------------------------------------------------------------------
    def min_offset(self) -> int:
        return self.mfq.min_offset()

    def max_offset(self) -> int:
        """End of what was appended (with a pool: possibly not committed to the file yet)."""
        return self.mfq.max_offset()

    def committed_offset(self) -> int:
        """End of what is in the files (what readers may read)."""
        mf = self._cur if self._cur is not None else self.mfq.last()
        return mf.file_from_offset + mf.committed_pos if mf is not None else 0

    def uncommitted_bytes(self) -> int:
        mf = self._cur
        return mf.wrote_pos - mf.committed_pos if mf is not None else 0

    def commit(self, least_pages: int = 0) -> int:
        """The commit step: copy appended bytes from the pool buffer to the file if at least
        ``least_pages`` pages wait (0: all of them); returns the committed offset."""
        mf = self._cur
        if mf is None or mf.wbuf is None:
            return self.committed_offset()
        before = mf.committed_pos
        pos = mf.commit(least_pages)
        if pos != before and self.on_commit is not None:
            self.on_commit(mf.file_from_offset + pos)
        return mf.file_from_offset + pos

    def msg_id(self, phys_offset: int) -> str:
        return f"{self.host_hex}{phys_offset:016X}"

    def _store_ts(self, now_ms: int | None) -> int:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        if now < self.last_store_ts_ms:
            now = self.last_store_ts_ms
        self.last_store_ts_ms = now
        return now

    def _room_for(self, total: int):
        """The file and position where a record of ``total`` bytes goes (padding and rolling)."""
        if total + R.MIN_BLANK_BYTES > self.file_bytes:
            raise ValidationError(f"record of {total} bytes does not fit a commitlog file of "
                                  f"{self.file_bytes} bytes")
        mf = self.mfq.last_for_write()
        pos = mf.wrote_pos
        if pos + total + R.MIN_BLANK_BYTES > self.file_bytes:
            # The next file first: if the disk is full (ENOSPC) this raises with nothing changed.
            nxt = self.mfq.create(mf.file_end_offset)
            self._pad(mf)
            mf, pos = nxt, nxt.wrote_pos
        if self.pool is not None and mf.wbuf is None:
            mf.use_buffer(*self.pool.buffer_for(mf.file_from_offset))
        self._cur = mf
        return mf, pos

    def _pad(self, mf) -> None:
        rest = self.file_bytes - mf.wrote_pos
        R.BLANK.pack_into(mf.wmm, mf.wrote_pos, rest, _BLANK_MAGIC)
        if mf.wbuf is not None:
            # Commit the file completely before the next one starts (its buffer may be this one);
            # the bytes after the blank record are never read, so only its header is copied.
            mf.commit(end=mf.wrote_pos + R.BLANK.size)
            mf.committed_pos = self.file_bytes
            mf.wrote_pos = self.file_bytes
            mf.release_buffer()
            if self.on_commit is not None:
                self.on_commit(mf.file_end_offset)
            return
        mf.wrote_pos = self.file_bytes

    # -- appending --------------------------------------------------------------------------------
    def append(self, topic: str, topic_b: bytes, queue_id: int, body: bytes, props_b: bytes, *,
               flag: int = 0, sys_flag: int = 0, born_ts_ms: int = 0, born_host: bytes | None = None,
               reconsume_times: int = 0, prepared_tx_offset: int = 0, crc: int | None = None,
               now_ms: int | None = None) -> AppendResult:
        """Append one message; returns where it went. The one-message hot path: keep it lean."""
        blen = len(body)
        total = _FIXED_BYTES + blen + len(topic_b) + len(props_b)
        mf = self._cur
        pos = mf.wrote_pos if mf is not None else self.file_bytes
        if pos + total + _MIN_BLANK > self.file_bytes:      # room for the end-of-file blank
            mf, pos = self._room_for(total)
        key = (topic, queue_id)
        qoff = self.topic_queue_table.get(key, 0)
        phys = mf.file_from_offset + pos
        if now_ms is None or now_ms < self.last_store_ts_ms:
            now_ms = self._store_ts(now_ms)
        ts = self.last_store_ts_ms = now_ms
        host = self.store_host
        crc = _crc32(body) & 0x7FFFFFFF if crc is None else crc
        tl, plen = len(topic_b), len(props_b)
        whole = _RECORD_STRUCTS.get((blen, tl, plen))
        mm = mf.wmm
        if whole is not None:      # the whole record in one pack (sizes seen before), unsealed
            whole.pack_into(mm, pos, 0, 0, crc, queue_id, flag, qoff, phys, sys_flag,
                            born_ts_ms or ts, born_host or host, ts, host, reconsume_times,
                            prepared_tx_offset, blen, body, tl, topic_b, plen, props_b)
        else:
            _HDR.pack_into(mm, pos, 0, 0, crc, queue_id, flag, qoff, phys, sys_flag,
                           born_ts_ms or ts, born_host or host, ts, host, reconsume_times,
                           prepared_tx_offset, blen)
            mm[pos + _HDR_BYTES:pos + total] = body + _TOPIC_LEN.pack(tl) + topic_b + _PROPS_LEN.pack(plen) + props_b
            _remember_struct(blen, tl, plen)
        _SIZE_MAGIC.pack_into(mm, pos, total, _MAGIC)          # the seal: now the record is valid
        mf.wrote_pos = pos + total
        if mf.wrote_pos >= self._prealloc_pos:
            self.mfq.preallocate_next(mf.wrote_pos)
        mf.store_ts_ms = ts
        self.topic_queue_table[key] = qoff + 1
        return AppendResult(phys, total, qoff, ts)

    def append_record(self, topic: str, queue_id: int, record, size: int,
                      now_ms: int | None = None) -> AppendResult:
        """Append one pre-encoded (validated) record, patching QUEUEID, QUEUEOFFSET, PHYSICALOFFSET,
        STORETIMESTAMP and STOREHOST — the writer's path for single-message frames.

        ``record`` is read, never written (bytes, a bytearray or any buffer); its TOTALSIZE and
        MAGICCODE are not copied: ``size`` and the magic seal the record once the rest is in place.
        """
        mf = self._cur
        pos = mf.wrote_pos if mf is not None else self.file_bytes
        if pos + size + 8 > self.file_bytes:        # 8 = R.MIN_BLANK_BYTES
            mf, pos = self._room_for(size)
        key = (topic, queue_id)
        qoff = self.topic_queue_table.get(key, 0)
        phys = mf.file_from_offset + pos
        ts = self._store_ts(now_ms)
        mm = mf.wmm
        # (a slice of a small record costs less than a memoryview of it; a large one is not copied twice)
        mm[pos + _SEAL_BYTES:pos + size] = record[_SEAL_BYTES:size] if size <= _SLICE_MAX_BYTES else \
            memoryview(record)[_SEAL_BYTES:size]
        _PATCH_QID.pack_into(mm, pos + _QID_AT, queue_id)
        _PATCH_OFFSETS.pack_into(mm, pos + _QOFF_AT, qoff, phys)
        _PATCH_STORE.pack_into(mm, pos + _STORE_TS_AT, ts, self.store_host)
        _SIZE_MAGIC.pack_into(mm, pos, size, _MAGIC)           # the seal: now the record is valid
        mf.wrote_pos = pos + size
        if mf.wrote_pos >= self._prealloc_pos:
            self.mfq.preallocate_next(mf.wrote_pos)
        mf.store_ts_ms = ts
        self.topic_queue_table[key] = qoff + 1
        return AppendResult(phys, size, qoff, ts)

    def append_batch(self, topic: str, queue_id: int, blob, starts: np.ndarray,
                     sizes: np.ndarray | None = None, now_ms: int | None = None,
                     patch_host: bool = False) -> BatchAppendResult:
        """Append pre-encoded records of one queue (``records.encode_batch``), patched with numpy.

        A batch is never split across files (RocketMQ's batch append): if it does not fit what is
        left of the current file, the file is padded and the batch starts the next one — so the
        position of every record is the first one's plus the sizes before it (message ids of a batch
        are computed that way), and ValidationError if it is larger than a file. One copy; QUEUEID,
        QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP of all records in one vectorised scatter; the
        first record's TOTALSIZE and MAGICCODE written last (see the module docstring): a kill before
        that leaves none of the batch. ``blob`` is read, never written.
        """
        n = len(starts)
        if sizes is None:
            sizes = R.batch_record_sizes(blob, starts)
        nbytes = int(sizes.sum())
        if int(starts[0]) != 0 or int(starts[-1] + sizes[-1]) != nbytes or len(blob) != nbytes:
            blob = b"".join(bytes(memoryview(blob)[int(a):int(a + b)]) for a, b in zip(starts, sizes))
            starts = np.concatenate(([0], np.cumsum(sizes[:-1]))).astype(np.int64)
        if nbytes + R.MIN_BLANK_BYTES > self.file_bytes:
            raise ValidationError(f"batch of {nbytes} bytes does not fit a commitlog file of {self.file_bytes} "
                                  f"bytes; send it in smaller batches")
        key = (topic, queue_id)
        q0 = self.topic_queue_table.get(key, 0)
        ts = self._store_ts(now_ms)
        mf = self._cur
        if mf is None or mf.wrote_pos + nbytes + R.MIN_BLANK_BYTES > self.file_bytes:
            mf, _ = self._room_for(nbytes)
        pos = mf.wrote_pos
        mm = mf.wmm
        mm[pos + _SEAL_BYTES:pos + nbytes] = memoryview(blob)[_SEAL_BYTES:nbytes]
        rel = starts + pos
        phys = rel + mf.file_from_offset
        R.patch_batch(mf.wu8, rel, q0, phys, ts, queue_id, self.store_host if patch_host else None)
        _SIZE_MAGIC.pack_into(mm, pos, int(sizes[0]), _MAGIC)         # the seal of the whole batch
        mf.wrote_pos = pos + nbytes
        if mf.wrote_pos >= self._prealloc_pos:
            self.mfq.preallocate_next(mf.wrote_pos)
        mf.store_ts_ms = ts
        self.topic_queue_table[key] = q0 + n
        return BatchAppendResult(q0, phys, sizes, ts)

    def continue_at(self, write_pos: int, torn_bytes: int) -> None:
        """An appender starting up where the published end is ``write_pos``: files after the one
        holding it are deleted, ``torn_bytes`` after it zeroed (what a killed appender may have left
        of an unpublished batch), and appends continue there."""
        mfq = self.mfq
        for mf in list(mfq.files):
            if mf.file_from_offset > write_pos or (mf.file_from_offset == write_pos and mf is not mfq.files[0]):
                mfq.files.remove(mf)
                mf.destroy()
        mf = mfq.find(write_pos) or (mfq.files[-1] if mfq.files else None)
        if mf is None:
            return
        pos = write_pos - mf.file_from_offset
        end = min(mf.file_bytes, pos + torn_bytes)
        if 0 <= pos < end:
            mf.zero_range(pos, end)
        mf.set_positions(max(0, min(pos, mf.file_bytes)))
        for other in mfq.files:
            if other is not mf:
                other.set_positions(other.file_bytes)
        self._cur = None

    def append_stored(self, phys: int, blob) -> None:
        """A slave's append (``broker/replica.py``): whole records exactly as its master stored them
        at ``phys`` — checked by the caller, all in the file holding ``phys``, nothing patched. The
        first record's TOTALSIZE and MAGICCODE are copied last: a kill midway leaves none of them."""
        n = len(blob)
        mf = self._continuing(phys, n, "replicated records")
        if self.pool is not None and mf.wbuf is None:
            mf.use_buffer(*self.pool.buffer_for(mf.file_from_offset))
        pos = mf.wrote_pos
        view = memoryview(blob)
        mf.wmm[pos + _SEAL_BYTES:pos + n] = view[_SEAL_BYTES:n]
        mf.wmm[pos:pos + _SEAL_BYTES] = view[:_SEAL_BYTES]
        mf.wrote_pos = pos + n
        self._cur = mf
        if mf.wrote_pos >= self._prealloc_pos:
            self.mfq.preallocate_next(mf.wrote_pos)

    def pad_stored(self, phys: int) -> int:
        """A slave's end of file: the master padded its file at ``phys`` with a blank record; do the
        same and go on in the next file. Returns where the next record goes."""
        mf = self._continuing(phys, 0, "a replicated end of file")
        self.mfq.create(mf.file_end_offset)
        self._pad(mf)
        self._cur = None
        return mf.file_end_offset

    def _continuing(self, phys: int, n: int, what: str):
        """The file a slave's ``n`` bytes at ``phys`` go to — ValidationError unless they continue the
        log exactly there and fit the file."""
        mf = self.mfq.find(phys) or self.mfq.last_for_write(phys)
        if mf.file_from_offset + mf.wrote_pos != phys or mf.wrote_pos + n > self.file_bytes:
            raise ValidationError(f"{what} at {phys} (+{n}) do not continue the commitlog at "
                                  f"{mf.file_from_offset + mf.wrote_pos}")
        return mf

    def rollback(self, phys: int) -> None:
        """Forget everything appended at and after ``phys`` (a record boundary not yet published):
        an append that failed midway (ENOSPC creating the next file after part of a batch was
        copied). Files made since are deleted, the rest of the file holding ``phys`` is zeroed (a
        blank record included) and appends continue there."""
        mf = self.mfq.find(phys) or self.mfq.last()
        if mf is None:
            return
        for later in self.mfq.files[self.mfq.files.index(mf) + 1:]:
            self.mfq.files.remove(later)
            later.destroy()
        rel = phys - mf.file_from_offset
        end = mf.file_bytes if mf.wrote_pos >= mf.file_bytes else mf.wrote_pos
        if rel < end:
            mf.wu8[rel:end] = 0
        mf.wrote_pos = rel          # (with a pool buffer, commits never pass an unpublished frame)
        self._cur = mf

    # -- reading ----------------------------------------------------------------------------------
    def read(self, phys_offset: int, size: int) -> memoryview | None:
        """A view of ``size`` bytes at ``phys_offset`` (inside one file), or None if not stored."""
        mf = self.mfq.find(phys_offset)
        if mf is None:
            return None
        pos = phys_offset - mf.file_from_offset
        if pos + size > mf.committed_pos:
            return None
        return memoryview(mf.mm)[pos:pos + size]

    def record_at(self, phys_offset: int, verify_crc: bool = True) -> bytes:
        """The checked record bytes at ``phys_offset``; CorruptRecordError if none is there."""
        mf = self.mfq.find(phys_offset)
        if mf is None:
            raise CorruptRecordError(self.directory, phys_offset, "no commitlog file holds this offset")
        pos = phys_offset - mf.file_from_offset
        try:
            kind, total = R.check_stored_record(mf.mm, pos, mf.committed_pos, phys_offset, verify_crc)
        except CorruptRecordError as e:
            raise CorruptRecordError(mf.path, phys_offset, e.why) from None
        if kind != R.RecordKind.MESSAGE:
            raise CorruptRecordError(mf.path, phys_offset, "blank record, not a message")
        return mf.mm[pos:pos + total]

    def record_size_at(self, phys_offset: int) -> int:
        """TOTALSIZE of the record at ``phys_offset`` (0 if no file holds it)."""
        mf = self.mfq.find(phys_offset)
        if mf is None:
            return 0
        return R.BLANK.unpack_from(mf.mm, phys_offset - mf.file_from_offset)[0]     # (TOTALSIZE, magic)

    def store_ts_at(self, phys_offset: int) -> int:
        mf = self.mfq.find(phys_offset)
        pos = phys_offset - mf.file_from_offset
        return struct.unpack_from(">q", mf.mm, pos + R.FIELD["store_ts_ms"])[0]

    # -- scanning (dispatch and recovery) ---------------------------------------------------------
    def scan(self, from_phys: int, limit_phys: int, max_records: int = 4096
             ) -> tuple[list[DispatchRequest], int]:
        """Records from ``from_phys`` up to ``limit_phys`` as requests, and the next offset; every
        record re-checked (``dispatch.scan_records``: ``scan_error``, ``skipped_records``)."""
        return scan_records(self, from_phys, limit_phys, max_records)

    def records_between(self, from_phys: int, limit_phys: int, chunk: int = 8192) -> Iterator[DispatchRequest]:
        """Every record from the boundary ``from_phys`` up to ``limit_phys`` (:meth:`scan` in chunks,
        stopping where it finds no more)."""
        phys = from_phys
        while phys < limit_phys:
            reqs, nxt = self.scan(phys, limit_phys, chunk)
            yield from reqs
            if nxt <= phys:
                return
            phys = nxt

    def recover(self, start_phys: int, check_crc: bool, known_last_ts_ms: int = 0, progress=None) -> int:
        """Find the end of valid data scanning from the record boundary ``start_phys``; truncate
        everything after it; return it. ``progress(phys)`` is called after each file."""
        phys, last_ts = self.valid_end(start_phys, check_crc, progress)
        self.mfq.truncate(phys)
        self._cur = None
        self.last_store_ts_ms = max(last_ts, known_last_ts_ms)
        return phys

    def valid_end(self, start_phys: int, check_crc: bool, progress=None) -> tuple[int, int]:
        """``(end of valid data, store time of the last valid message)`` scanning from the record
        boundary ``start_phys``; reads only.

        Stops at the first record that is torn, garbage, zero-filled or fails its CRC. A blank record
        moves to the next file (or ends the log if there is none); a hole in the file list ends it.
        """
        files = self.mfq.files
        if not files:
            return 0, 0
        mf = self.mfq.find(start_phys)
        phys = start_phys if mf is not None else files[0].file_from_offset
        idx = files.index(mf) if mf is not None else 0
        last_ts = 0
        while idx < len(files):
            mf = files[idx]
            rel, ts = _scan_valid(mf.mm, phys - mf.file_from_offset, self.file_bytes, check_crc,
                                  mf.file_from_offset)
            last_ts = max(last_ts, ts)
            phys = mf.file_from_offset + rel
            if progress is not None:
                progress(phys)
            if rel < self.file_bytes:
                break
            idx += 1
            if idx < len(files) and files[idx].file_from_offset != phys:
                break
        return phys, last_ts

    def flush(self, least_pages: int = 0) -> int:
        return self.mfq.flush(least_pages)

    def close(self) -> None:
        self.commit()
        self._cur = None
        self.mfq.close()


def _scan_valid(mm, rel: int, file_bytes: int, check_crc: bool, file_from: int = 0) -> tuple[int, int]:
    """Walk valid records from ``rel`` in the file starting at ``file_from``; returns (end of valid
    data, store time of the last message).

    A blank record means "the file is complete": the end returned is then ``file_bytes``. A record
    must say where it is (``records.check_stored_record``): one whose PHYSICALOFFSET is not its
    position was never completely written, and ends the valid data.
    """
    last_ts = 0
    ts_at = R.FIELD["store_ts_ms"]
    while rel < file_bytes:
        try:
            kind, total = R.check_stored_record(mm, rel, file_bytes, file_from + rel, check_crc)
        except CorruptRecordError:
            return rel, last_ts
        if kind == R.RecordKind.BLANK:
            return file_bytes, last_ts
        last_ts = struct.unpack_from(">q", mm, rel + ts_at)[0]
        rel += total
    return rel, last_ts
