"""The index service: every index file of a store, written by the dispatcher (RocketMQ
``IndexService``). File format, search and crash policy: :mod:`hostmq.store.index`."""
from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..config import StoreConfig
from ..errors import ConfigError, ValidationError
from ..fsutil import ensure_dir, fsync_dir
from ..records import index_file_bytes
from .dispatch import DispatchRequest
from .index import _NAME_RE, INDEX_DIR, INT64_MAX, SCALAR_BELOW_REQUESTS, IndexFile, next_index_file_name
from .index_keys import batch_keys, collect_keys, index_key, index_key_hash

log = logging.getLogger(__name__)


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class IndexService:
    """All index files of a store (RocketMQ ``IndexService``); see the module docstring."""

    def __init__(self, store_dir: str, config: StoreConfig,
                 clock_ms: Callable[[], int] = _wall_clock_ms) -> None:
        if config.index_entries < 2:
            raise ConfigError("store.index_entries must be ≥ 2 (entry 0 of an index file is never used)")
        self.dir = Path(store_dir) / INDEX_DIR
        self.slots, self.entries = config.index_slots, config.index_entries
        self.enabled = config.message_index_enable
        self._clock_ms = clock_ms
        self._lock = threading.Lock()
        self._files: list[IndexFile] = []
        self.dropped_files = 0          # damaged files deleted at open: what they held is re-indexed
        try:
            names = sorted(n for n in os.listdir(self.dir) if _NAME_RE.match(n))
        except FileNotFoundError:
            names = []
        size = index_file_bytes(self.slots, self.entries)
        sized = [n for n in names if (self.dir / n).stat().st_size == size]
        for i, name in enumerate(names):
            if not self._load(self.dir / name, bool(sized)):
                self._drop_damaged(names[i:])
                break

    def _load(self, path: Path, sizes_known: bool) -> bool:
        """Map one file; False if it is damaged (files after it cannot be trusted either). A file
        of another size is a ConfigError unless some file has the configured size (then it is damage)."""
        try:
            f = IndexFile.open(path, self.slots, self.entries)
        except FileNotFoundError:
            return True
        except ConfigError:
            if not sizes_known:
                raise
            return False
        if f is not None and self._files and f.header.end_phys_offset < self._last_indexed()[0]:
            f.close()           # ends before its predecessor: not written by this service in order
            return False
        if f is None:           # empty (a crash while creating it) or an impossible header
            return False
        self._files.append(f)
        return True

    def _drop_damaged(self, names: list[str]) -> None:
        """Delete a damaged file and every newer one: the index is derived data, and re-dispatch from
        :meth:`max_indexed_phys_offset` (the end of what is left) rebuilds them."""
        if len(names) > 1 or (self.dir / names[0]).stat().st_size:
            log.error("index file %s is damaged; it and the %d newer files are deleted and rebuilt",
                      names[0], len(names) - 1)
        for n in names:
            (self.dir / n).unlink(missing_ok=True)
        self.dropped_files += len(names)

    def build_index(self, reqs: Sequence[DispatchRequest]) -> int:
        """Index each request's unique id and keys, in order; returns the entries added. Prepared and
        rolled-back transaction messages are skipped, and so are entries already indexed (see
        :meth:`_resume`): re-dispatch after recovery is harmless."""
        if not self.enabled or not reqs:
            return 0
        with self._lock:
            last, done = self._resume()
            batch = batch_keys(reqs, last, False) if len(reqs) >= SCALAR_BELOW_REQUESTS else None
            if batch is None:
                keys, phys_offsets, store_ts_ms = collect_keys(reqs, last, False)
                first = _skip_done(np.asarray(phys_offsets, dtype=np.int64), last, done)
                for key, phys_offset, ts_ms in zip(keys[first:], phys_offsets[first:], store_ts_ms[first:]):
                    self._writable_file().put_key(key, phys_offset, ts_ms)   # never full: see there
                return len(keys) - first
            hashes, phys_offsets, store_ts_ms = batch
            first = _skip_done(phys_offsets, last, done)
            return self._put_entries(hashes[first:], phys_offsets[first:], store_ts_ms[first:])

    def build_index_hashes(self, key_hashes: np.ndarray, phys_offsets: np.ndarray,
                           store_ts_ms: np.ndarray) -> int:
        """Like :meth:`build_index` for entries already chosen and hashed (``index_key_hashes``),
        in entry order with phys offsets not decreasing; entries already indexed are skipped."""
        if not self.enabled or not len(key_hashes):
            return 0
        phys_offsets = np.asarray(phys_offsets, dtype=np.int64)
        if (phys_offsets[1:] < phys_offsets[:-1]).any():
            raise ValidationError("index entries must come in commitlog order (phys offsets not decreasing)")
        with self._lock:
            first = _skip_done(phys_offsets, *self._resume())
            return self._put_entries(np.asarray(key_hashes, dtype=np.int32)[first:], phys_offsets[first:],
                                     np.asarray(store_ts_ms, dtype=np.int64)[first:])

    def _put_entries(self, key_hashes: np.ndarray, phys_offsets: np.ndarray, store_ts_ms: np.ndarray) -> int:
        done = 0
        while done < len(key_hashes):
            done += self._writable_file().put_key_hashes(
                key_hashes[done:], phys_offsets[done:], store_ts_ms[done:])
        return done

    def _last_indexed(self) -> tuple[int, bool]:
        """``(end_phys_offset of the newest file, whether anything was indexed up to it)``."""
        if not self._files:
            return 0, False
        newest = self._files[-1]
        return newest.header.end_phys_offset, newest.header.index_count > 1 or len(self._files) > 1

    def _resume(self) -> tuple[int, int]:
        """``(phys offset of the last message indexed, how many of its entries are in)``. A message's
        entries (its unique id, then each key) may have gone in only partly — a dispatcher killed
        between two, or a batch that filled a file — so re-dispatch skips exactly those, not the
        whole message: its other keys would be lost from the index for good."""
        last, any_indexed = self._last_indexed()
        if not any_indexed:
            return last, 0
        done = 0
        for f in reversed(self._files):
            same, whole = f.trailing_entries(last)
            done += same
            if not whole:
                break
        return last, done

    def _writable_file(self) -> IndexFile:
        """The newest file, or a new one if it is full (RocketMQ ``getAndCreateLastIndexFile``)."""
        if self._files and not self._files[-1].is_write_full():
            return self._files[-1]
        newest = self._files[-1] if self._files else None
        ensure_dir(str(self.dir))
        name = next_index_file_name(self._clock_ms(), newest.path.name if newest else None)
        f = IndexFile.create(self.dir / name, self.slots, self.entries,
                             newest.header.end_phys_offset if newest else 0,
                             newest.header.end_ts_ms if newest else 0)
        self._files.append(f)
        return f

    def query(self, topic: str, key: str, max_num: int = 32, begin_ms: int = 0,
              end_ms: int | None = None) -> list[int]:
        """Phys offsets of messages indexed under ``key`` of ``topic`` that may be stored within
        ``[begin_ms, end_ms]``, newest first, at most ``max_num``: a superset, to be confirmed."""
        end_ms = INT64_MAX if end_ms is None else end_ms
        key_hash = index_key_hash(index_key(topic, key))
        out: list[int] = []
        with self._lock:
            for f in reversed(self._files):
                if len(out) >= max_num:
                    break
                if f.header.index_count > 1 and f.is_time_matched(begin_ms, end_ms):
                    out += f.select_phys_offsets(key_hash, max_num - len(out), begin_ms, end_ms)
                if f.header.index_count > 1 and f.header.begin_ts_ms < begin_ms:
                    break       # older files hold older entries only
        return out

    def max_indexed_phys_offset(self) -> int:
        """Phys offset of the last indexed message (end of the newest file), 0 if none."""
        with self._lock:
            return self._last_indexed()[0]

    def files(self) -> list[str]:
        with self._lock:
            return [str(f.path) for f in self._files]

    def truncate(self, max_phys_offset: int) -> int:
        """Delete the files indexing anything at or beyond ``max_phys_offset`` (the end of the valid
        commitlog); returns how many. Re-dispatch from :meth:`max_indexed_phys_offset` rebuilds them."""
        with self._lock:
            return self._delete([f for f in self._files if f.header.end_phys_offset >= max_phys_offset])

    def delete_expired(self, min_phys_offset: int) -> int:
        """Delete the oldest files (never the newest) whose entries all precede ``min_phys_offset``."""
        with self._lock:
            doomed = []
            for f in self._files[:-1]:
                if f.header.end_phys_offset >= min_phys_offset:
                    break
                doomed.append(f)
            return self._delete(doomed)

    def _delete(self, doomed: list[IndexFile]) -> int:
        for f in doomed:
            self._files.remove(f)
            f.destroy()
        if doomed:
            fsync_dir(str(self.dir))
        return len(doomed)

    def flush(self) -> None:
        """msync the files written since the last flush."""
        with self._lock:
            for f in self._files:
                f.flush()

    def close(self) -> None:
        """Flush and unmap every file; the service is empty afterwards."""
        with self._lock:
            for f in self._files:
                f.flush()
                f.close()
            self._files = []


def _skip_done(phys_offsets: np.ndarray, last: int, done: int) -> int:
    """Index of the first entry still to add: past every entry of a message before ``last``, and past
    the first ``done`` entries of the message at ``last`` (entries come in commitlog order, and a
    message's in one fixed order)."""
    lo = int(np.searchsorted(phys_offsets, last, "left"))
    hi = int(np.searchsorted(phys_offsets, last, "right"))
    return lo + min(done, hi - lo)
