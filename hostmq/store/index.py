"""Message key index files: RocketMQ's ``IndexFile`` (the service over them: :mod:`.index_service`).

File format (layouts declared in :mod:`hostmq.records`, big-endian)::

    +0    INDEX_HEADER (40 bytes): begin_ts_ms i64 | end_ts_ms i64 | begin_phys_offset i64 |
          end_phys_offset i64 | hash_slot_count i32 (slots in use) | index_count i32
    +40   slots × INDEX_SLOT i32: number of the newest entry of the slot's chain, 0 = empty
    +...  entries × INDEX_ENTRY (20 bytes): key_hash i32 | phys_offset i64 | time_diff_s i32 | prev_index i32

Entry 0 is never written, so 0 means "none" in a slot or ``prev_index``; ``index_count`` starts at 1
and a file is full when ``index_count >= entries``. Indexed strings are ``topic#uniq_key`` and
``topic#word`` for each space-separated word of KEYS; ``key_hash = abs(String.hashCode)`` (0 if that
overflows), slot ``key_hash % slots``; ``time_diff_s`` counts from ``begin_ts_ms``. Files live in
``STORE/index/``, named by creation time ``yyyyMMddHHmmssSSS`` (local time, as RocketMQ).

Search: newest file first, over files whose time range overlaps the query; in each, from the key's
slot follow ``prev_index`` (always smaller) while entries are no older than the range, keeping those
whose hash matches. Results are newest first and a superset: hashes may collide, and an entry's time
is only known to the second (it may be up to 999 ms before ``begin_ms``), so callers check the message.

Ownership: one process, the dispatcher, writes the index through one ``IndexService`` (its
public methods hold a lock). A batch writes entries, then slots, then the header. Other readers may
map files read-only; a slot naming an entry at or past ``index_count`` is a batch in flight (its entries
are written before its slots) and is followed (``select_phys_offsets``); values outside
``1 .. entries - 1`` and a ``prev_index`` not below its entry's number are empty.

Crash policy: after an abnormal exit recovery calls ``IndexService.truncate`` with the end of the
valid commitlog; whole files holding entries at or beyond it are deleted, and re-dispatch from
``IndexService.max_indexed_phys_offset`` rebuilds them (requests up to the last indexed offset
are skipped, so re-dispatch is idempotent). Files a crash left empty or with an impossible header
are deleted at start-up: the index is derived data. So is a damaged file — of the wrong size while
others have the configured size, or out of order — and, with it, every newer file, so that what is
left ends where re-dispatch rebuilds from (issue 15).
"""
from __future__ import annotations

import datetime as _dt
import logging
import mmap
import os
import re
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..fsutil import FILE_MODE, fsync_dir
from ..records import (INDEX_ENTRY, INDEX_ENTRY_STRUCT, INDEX_HEADER, INDEX_SLOT, IndexHeader,
                       index_file_bytes)
from .index_keys import (_prefix_hash, batch_keys, collect_keys, index_key,  # noqa: F401 (re-exported)
                         index_key_hash, index_key_hashes, prefix_hash)

log = logging.getLogger(__name__)
INDEX_DIR = "index"                     # under the store directory
NO_ENTRY = 0                            # entry number 0 is never written: "none"
INT32_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1
SECOND_MS = 1000                        # unit of time_diff_s: an entry's time is known to the second
SCALAR_BELOW_REQUESTS = 12              # smaller batches go key by key: numpy costs ~100 µs a batch
_NAME_RE = re.compile(r"^\d{17}$")      # yyyyMMddHHmmssSSS
_NAME_SECONDS = "%Y%m%d%H%M%S"
def time_diff_s(store_ts_ms: int, begin_ts_ms: int) -> int:
    """Seconds after ``begin_ts_ms`` clamped to ``0 .. INT32_MAX``; 0 if the file has no begin time."""
    return min(max((store_ts_ms - begin_ts_ms) // SECOND_MS, 0), INT32_MAX) if begin_ts_ms > 0 else 0


def time_diffs_s(store_ts_ms: np.ndarray, begin_ts_ms: int) -> np.ndarray:
    """Vectorised :func:`time_diff_s`."""
    return np.clip((store_ts_ms - begin_ts_ms) // SECOND_MS, 0, INT32_MAX) * (begin_ts_ms > 0)


def index_file_name(now_ms: int) -> str:
    """RocketMQ ``UtilAll.timeMillisToHumanString``: ``yyyyMMddHHmmssSSS`` in local time."""
    seconds = _dt.datetime.fromtimestamp(now_ms // 1000).strftime(_NAME_SECONDS)
    return f"{seconds}{now_ms % 1000:03d}"


def next_index_file_name(now_ms: int, newest_name: str | None) -> str:
    """The name for a file created at ``now_ms``: later than ``newest_name`` even within one ms."""
    name = index_file_name(now_ms)
    if newest_name is None or name > newest_name:
        return name
    t = (_dt.datetime.strptime(newest_name[:14], _NAME_SECONDS)
         + _dt.timedelta(milliseconds=int(newest_name[14:]) + 1))
    return f"{t.strftime(_NAME_SECONDS)}{t.microsecond // 1000:03d}"


def link_batch(slots: np.ndarray, numbers: np.ndarray, slot_values: np.ndarray):
    """Chain new entries ``numbers`` (consecutive, at least one) into their ``slots`` as if put one by
    one: entries sharing a slot link to each other in order, the first to the slot's old value in
    ``slot_values`` if that is a valid smaller number. Returns ``(prev_index, set_slots, set_values,
    slots_taken)``: each entry's link, the slot writes, and how many slots were empty."""
    n = len(slots)
    order = np.argsort(slots, kind="stable")
    sorted_slots = slots[order]
    heads = np.flatnonzero(np.r_[True, sorted_slots[1:] != sorted_slots[:-1]])
    tails = np.r_[heads[1:] - 1, n - 1]
    prev_sorted = np.empty(n, dtype=np.int64)
    prev_sorted[1:] = numbers[order[:-1]]
    old = slot_values[sorted_slots[heads]].astype(np.int64)
    valid = (old > NO_ENTRY) & (old < numbers[order[heads]])
    prev_sorted[heads] = np.where(valid, old, NO_ENTRY)
    prev_index = np.empty(n, dtype=np.int64)
    prev_index[order] = prev_sorted
    return prev_index, sorted_slots[tails], numbers[order[tails]], int(len(heads) - valid.sum())


class IndexFile:
    """One memory-mapped index file (RocketMQ ``IndexFile``)."""

    def __init__(self, path: Path, slots: int, entries: int, mm: mmap.mmap) -> None:
        self.path, self.slots, self.entries, self._mm = path, slots, entries, mm
        self._slot_view = np.frombuffer(mm, dtype=INDEX_SLOT, count=slots, offset=INDEX_HEADER.size)
        self._entries_pos = INDEX_HEADER.size + slots * INDEX_SLOT.itemsize
        self._entry_view = np.frombuffer(mm, dtype=INDEX_ENTRY, count=entries, offset=self._entries_pos)
        self.header = IndexHeader._make(INDEX_HEADER.unpack_from(mm, 0))
        self.dirty = False

    @classmethod
    def create(cls, path: Path, slots: int, entries: int, prev_end_phys_offset: int = 0,
               prev_end_ts_ms: int = 0) -> "IndexFile":
        """Allocate (posix_fallocate) and map a new file; its range starts where the previous ended."""
        size = index_file_bytes(slots, entries)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        try:
            os.posix_fallocate(fd, 0, size)
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        fsync_dir(os.path.dirname(path))
        f = cls(path, slots, entries, mm)
        f._set_header(IndexHeader(prev_end_ts_ms, prev_end_ts_ms, prev_end_phys_offset,
                                  prev_end_phys_offset, 0, 1))
        return f

    @classmethod
    def open(cls, path: Path, slots: int, entries: int, writable: bool = True) -> "IndexFile | None":
        """Map an existing file; None if it is empty or its header is impossible (delete it then).
        ConfigError if its size does not match ``slots`` and ``entries``."""
        size = index_file_bytes(slots, entries)
        with open(path, "r+b" if writable else "rb") as fh:
            actual = os.fstat(fh.fileno()).st_size
            if actual == 0:
                return None
            if actual != size:
                raise ConfigError(f"index file {path} is {actual} bytes, but store.index_slots={slots} "
                                  f"and store.index_entries={entries} make {size}; restore those settings")
            f = cls(path, slots, entries, mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_WRITE if writable
                                                   else mmap.ACCESS_READ))
        h = f.header
        if not (1 <= h.index_count <= entries and 0 <= h.begin_phys_offset <= h.end_phys_offset):
            f.close()
            return None
        if writable:
            f.repair_slots()
        return f

    def repair_slots(self) -> int:
        """Point every hash slot that names an entry past ``index_count`` back at its real chain head.

        An append writes its entries, then the slots, then the header; a process killed before the
        header leaves slots naming entries that do not count. Left so, the slot hides its whole older
        chain (a lookup and the next append both treat it as empty), so every message hashed there
        would be lost to queries for good. The head is recomputed from the entries (the newest one of
        that bucket below ``index_count``). Returns how many slots were repaired."""
        count = self.header.index_count
        slots = self._slot_view
        bad = np.flatnonzero(slots.astype(np.int64) >= count)
        if not len(bad):
            return 0
        buckets = self._entry_view[1:count]["key_hash"].astype(np.int64) % self.slots
        mine = np.isin(buckets, bad)
        heads = np.zeros(self.slots, np.int64)
        np.maximum.at(heads, buckets[mine], np.flatnonzero(mine) + 1)
        slots[bad] = heads[bad]
        self.dirty = True
        log.warning("index file %s: %d hash slots named entries a killed dispatcher never counted; "
                    "repaired from the entries", self.path, len(bad))
        return len(bad)

    def trailing_entries(self, phys_offset: int) -> tuple[int, bool]:
        """``(how many of the newest entries are for phys_offset, whether all of the file's are)``.

        Read backwards a few entries at a time: a message has a handful of entries, and the
        dispatcher asks before every batch — a scan of the whole column (up to 20 M entries) cost
        tens of milliseconds each time."""
        col = self._entry_view["phys_offset"]
        end, count, step = self.header.index_count, 0, 16
        while end > 1:
            lo = max(1, end - step)
            other = np.flatnonzero(col[lo:end] != phys_offset)
            if len(other):
                return count + (end - lo) - 1 - int(other[-1]), False
            count += end - lo
            end, step = lo, step * 4
        return count, True

    def is_write_full(self) -> bool:
        return self.header.index_count >= self.entries

    def put_key(self, key: str, phys_offset: int, store_ts_ms: int) -> bool:
        """Append one entry for ``key`` (RocketMQ ``putKey``); False when the file is full."""
        h = self.header
        if h.index_count >= self.entries:
            return False
        key_hash = index_key_hash(key)
        slot = key_hash % self.slots
        old = int(self._slot_view[slot])
        prev = old if NO_ENTRY < old < h.index_count else NO_ENTRY
        first = h.index_count == 1
        begin_ts_ms = store_ts_ms if first else h.begin_ts_ms
        INDEX_ENTRY_STRUCT.pack_into(self._mm, self._entry_pos(h.index_count), key_hash, phys_offset,
                                     time_diff_s(store_ts_ms, begin_ts_ms), prev)
        self._slot_view[slot] = h.index_count
        self._set_header(IndexHeader(
            begin_ts_ms, store_ts_ms, phys_offset if first else h.begin_phys_offset, phys_offset,
            h.hash_slot_count + (prev == NO_ENTRY), h.index_count + 1))
        return True

    def put_key_hashes(self, key_hashes: np.ndarray, phys_offsets: np.ndarray,
                       store_ts_ms: np.ndarray) -> int:
        """Append entries in order, exactly as repeated :meth:`put_key`; returns how many fit."""
        h = self.header
        n = min(len(key_hashes), self.entries - h.index_count)
        if n <= 0:
            return 0
        key_hashes, phys_offsets, store_ts_ms = key_hashes[:n], phys_offsets[:n], store_ts_ms[:n]
        numbers = np.arange(h.index_count, h.index_count + n, dtype=np.int64)
        prev, set_slots, set_values, taken = link_batch(
            key_hashes.astype(np.int64) % self.slots, numbers, self._slot_view)
        first = h.index_count == 1
        begin_ts_ms = int(store_ts_ms[0]) if first else h.begin_ts_ms
        rows = np.empty(n, dtype=INDEX_ENTRY)
        rows["key_hash"] = key_hashes
        rows["phys_offset"] = phys_offsets
        rows["time_diff_s"] = time_diffs_s(store_ts_ms, begin_ts_ms)
        rows["prev_index"] = prev
        self._entry_view[h.index_count:h.index_count + n] = rows
        self._slot_view[set_slots] = set_values
        self._set_header(IndexHeader(
            begin_ts_ms, int(store_ts_ms[-1]), int(phys_offsets[0]) if first else h.begin_phys_offset,
            int(phys_offsets[-1]), h.hash_slot_count + taken, h.index_count + n))
        return n

    def _set_header(self, header: IndexHeader) -> None:
        self.header = header
        INDEX_HEADER.pack_into(self._mm, 0, *header)
        self.dirty = True

    def _entry_pos(self, number: int) -> int:
        return self._entries_pos + number * INDEX_ENTRY.itemsize

    def is_time_matched(self, begin_ms: int, end_ms: int) -> bool:
        """Whether ``[begin_ms, end_ms]`` overlaps the file's store-time range."""
        return begin_ms <= self.header.end_ts_ms and end_ms >= self.header.begin_ts_ms

    def select_phys_offsets(self, key_hash: int, max_num: int, begin_ms: int = 0,
                            end_ms: int = INT64_MAX) -> list[int]:
        """Phys offsets of entries with ``key_hash`` that may be stored within ``[begin_ms, end_ms]``
        (to the second: see the module docstring), newest first."""
        h = self.header
        out: list[int] = []
        number = int(self._slot_view[key_hash % self.slots])
        # A slot may name an entry at or past the header's count: the writer's batch in flight (or
        # a reader's header older than the slot it reads). The writer wrote that entry before the
        # slot, and its chain leads to the counted ones, so it is followed, not taken for empty —
        # which hid the slot's whole older chain from the query (a scheduler then delivered a
        # delay message a second time). Entries are a superset either way: callers check records.
        if not NO_ENTRY < number < self.entries:
            return out
        while len(out) < max_num:
            hash_read, phys_offset, diff_s, prev = INDEX_ENTRY_STRUCT.unpack_from(
                self._mm, self._entry_pos(number))
            if diff_s < 0:
                break
            ts_ms = h.begin_ts_ms + diff_s * SECOND_MS     # store time rounded down to the second
            if hash_read == key_hash and ts_ms <= end_ms and ts_ms + SECOND_MS > begin_ms:
                out.append(phys_offset)
            if not NO_ENTRY < prev < number or ts_ms + SECOND_MS <= begin_ms:
                break
            number = prev
        return out

    def flush(self) -> None:
        if self.dirty:
            self._mm.flush()
            self.dirty = False

    def close(self) -> None:
        """Unmap (the numpy views go first: they pin the mapping)."""
        del self._slot_view, self._entry_view
        self._mm.close()

    def destroy(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


    def reload_header(self) -> None:
        """A reader's view of a file another process appends to: read the header again."""
        self.header = IndexHeader._make(INDEX_HEADER.unpack_from(self._mm, 0))


class IndexReader:
    """Read-only view of a store's index files, safe while the dispatcher writes them (admin queries
    by key). Entries are a superset to be confirmed against the records, as with IndexService."""

    def __init__(self, store_dir: str, slots: int, entries: int) -> None:
        self.dir = Path(store_dir) / INDEX_DIR
        self.slots, self.entries = slots, entries
        self._files: dict[str, IndexFile] = {}

    def _refresh(self) -> list[IndexFile]:
        try:
            names = sorted(n for n in os.listdir(self.dir) if _NAME_RE.match(n))
        except FileNotFoundError:
            names = []
        for gone in set(self._files) - set(names):
            self._files.pop(gone).close()
        for name in names:
            f = self._files.get(name)
            if f is None:
                try:
                    f = IndexFile.open(self.dir / name, self.slots, self.entries, writable=False)
                except (FileNotFoundError, ConfigError):
                    f = None
                if f is None:
                    continue
                self._files[name] = f
            f.reload_header()
        return [self._files[n] for n in names if n in self._files]

    def query(self, topic: str, key: str, max_num: int = 32, begin_ms: int = 0,
              end_ms: int | None = None) -> list[int]:
        end_ms = INT64_MAX if end_ms is None else end_ms
        key_hash = index_key_hash(index_key(topic, key))
        out: list[int] = []
        for f in reversed(self._refresh()):
            if len(out) >= max_num:
                break
            if f.header.index_count > 1 and f.is_time_matched(begin_ms, end_ms):
                out += f.select_phys_offsets(key_hash, max_num - len(out), begin_ms, end_ms)
        return out

    def explain(self, topic: str, key: str, steps: int = 8) -> str:
        """What each file holds for ``key`` (for a log line when a query missed): its count, the key's
        slot, the first ``steps`` links of the slot's chain, and the entry numbers with the key's hash."""
        key_hash = index_key_hash(index_key(topic, key))
        parts = []
        for f in self._refresh():
            number = int(f._slot_view[key_hash % f.slots])
            chain = []
            while NO_ENTRY < number < f.entries and len(chain) < steps:
                hash_read, phys_offset, _, prev = INDEX_ENTRY_STRUCT.unpack_from(f._mm, f._entry_pos(number))
                chain.append(f"{number}:{phys_offset}" + ("*" if hash_read == key_hash else ""))
                number = prev if NO_ENTRY < prev < number else NO_ENTRY
            hits = (np.flatnonzero(f._entry_view["key_hash"][1:] == key_hash) + 1)[:steps].tolist()
            parts.append(f"{f.path.name}: count {f.header.index_count}, slot {key_hash % f.slots} → "
                         f"{' '.join(chain) or 'empty'}, entries with the hash {hits}")
        return "; ".join(parts) or "no index files"

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
