"""What page-cache tuning looks at, read from the outside (Linux): page-cache residency of store
files (``mincore``), a process's page faults and RSS, and a broker's dirty bytes.

* ``residency(path)`` maps the file read-only, asks ``mincore`` which pages are in the page cache and
  unmaps it again: nothing is read, so asking changes nothing (faulting pages in would).
* ``process_stats(pid)``: minor / major faults from ``/proc/PID/stat`` (fields 10 and 12) and RSS.
* ``broker_tuning(root, broker, state)``: all of the above for one broker — its processes, the
  residency of its commitlog files and of its consume queues, and the commitlog bytes written but
  not yet flushed.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os

PAGE_BYTES = mmap.PAGESIZE
_PROT_READ, _MAP_SHARED = 0x1, 0x01
_MAP_FAILED = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]


def resident_pages(path: str) -> tuple[int, int]:
    """(pages of ``path`` in the page cache, pages of the file)."""
    size = os.path.getsize(path)
    pages = (size + PAGE_BYTES - 1) // PAGE_BYTES
    if pages == 0:
        return 0, 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap of {path} for mincore failed")
        try:
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
            return sum(b & 1 for b in bytes(vec)), pages
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def residency(path: str) -> float:
    """Percentage of the file's pages in the page cache (0 for an empty file)."""
    got, pages = resident_pages(path)
    return 100.0 * got / pages if pages else 0.0


def process_stats(pid: int) -> dict | None:
    """``{"minor_faults", "major_faults", "rss_bytes"}`` of a live process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        with open(f"/proc/{pid}/statm", "rb") as f:
            statm = f.read().split()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat[stat.rindex(b")") + 2:].split()
    return {"minor_faults": int(fields[7]), "major_faults": int(fields[9]), "rss_bytes": int(statm[1]) * PAGE_BYTES}


def dir_residency(directory: str) -> dict:
    """Residency of every file under ``directory``: per file (relative name → %) and in total."""
    files, got_total, pages_total = {}, 0, 0
    for d, _, names in sorted(os.walk(directory)) if os.path.isdir(directory) else ():
        for n in sorted(names):
            p = os.path.join(d, n)
            try:
                got, pages = resident_pages(p)
            except (OSError, ValueError):
                continue                # deleted meanwhile (retention), or not mappable
            files[os.path.relpath(p, directory)] = round(100.0 * got / pages, 1) if pages else 0.0
            got_total += got
            pages_total += pages
    return {"files": files, "total_pct": round(100.0 * got_total / pages_total, 1) if pages_total else 0.0,
            "resident_bytes": got_total * PAGE_BYTES, "total_bytes": pages_total * PAGE_BYTES}


def flush_histogram_summary(counts: list[int]) -> dict:
    """The flusher's latency histogram (``shm_layouts``: bucket i = [2^(i-1), 2^i) µs) as
    ``{"count", "p50", "p99", "max", "buckets": {"<upper µs": count}}`` (percentiles are bucket bounds)."""
    from .shm_layouts import histogram_percentile_us
    nonzero = [i for i, c in enumerate(counts) if c]
    return {"count": int(sum(counts)), "p50": histogram_percentile_us(counts, 50),
            "p99": histogram_percentile_us(counts, 99), "max": float(1 << nonzero[-1]) if nonzero else float("nan"),
            "buckets": {f"<{1 << i}": int(counts[i]) for i in nonzero}}


def broker_tuning(store_dir: str, state: dict | None) -> dict:
    """One broker's page-cache picture: processes (faults, RSS), residency of commitlog and consume
    queues, dirty commitlog bytes (in the files, not yet flushed) and bytes still in the transient
    store pool (appended, not yet committed to the files)."""
    out: dict = {"commitlog": dir_residency(os.path.join(store_dir, "commitlog")),
                 "consume_queues": dir_residency(os.path.join(store_dir, "consumequeue"))}
    out["consume_queues"].pop("files")          # thousands of small files: the total says enough
    if state:
        write_pos = int(state.get("write_pos", 0))
        committed = min(write_pos, int(state.get("committed_pos", write_pos)))
        out["dirty_bytes"] = max(0, committed - int(state.get("flushed_pos", 0)))
        out["uncommitted_bytes"] = write_pos - committed     # in the transient store pool, not the file
        out["last_flush_latency_us"] = int(state.get("flush_latency_us", 0))
        out["flush_latency_us"] = flush_histogram_summary(state.get("flush_histogram") or [])
        out["flush_count"] = int(state.get("flush_count", 0))
        out["processes"] = {role: process_stats(int(state[f"{role}_pid"]))
                            for role in ("broker", "writer", "dispatcher", "flusher", "scheduler")
                            if int(state.get(f"{role}_pid", 0) or 0) > 0}
    return out
