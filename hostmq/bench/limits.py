"""Raw limits of this machine, measured in the same run as the sweep, and its description.

* mmap append bandwidth: sequential 1 MiB copies into a fresh mapped file (page faults included,
  as a cold commitlog file sees them) and into the same file once its pages exist (a warmed file);
* fsync latency: 4 KiB ``pwrite`` + ``fdatasync`` at the end of a file, as a group commit does.
Both on the filesystem of the bench root, which is where the store lives.
"""
from __future__ import annotations

import mmap
import os
import platform
import time

import numpy as np
import psutil

CHUNK_BYTES = 1 << 20


def mmap_append_mb_s(directory: str, total_bytes: int) -> dict:
    path = os.path.join(directory, "mmap-limit.bin")
    chunk = b"m" * CHUNK_BYTES
    out = {}
    try:
        with open(path, "wb") as f:
            f.truncate(total_bytes)
        fd = os.open(path, os.O_RDWR)
        try:
            mm = mmap.mmap(fd, total_bytes)
            for label in ("cold", "warm"):
                t0 = time.perf_counter()
                for pos in range(0, total_bytes, CHUNK_BYTES):
                    mm[pos:pos + CHUNK_BYTES] = chunk
                out[f"mmap append MB/s ({label})"] = total_bytes / (time.perf_counter() - t0) / 1e6
            mm.close()
        finally:
            os.close(fd)
    finally:
        os.unlink(path)
    return out


def fsync_latency_us(directory: str, count: int) -> dict:
    path = os.path.join(directory, "fsync-limit.bin")
    block = b"f" * 4096
    lat = np.empty(count, np.float64)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        for i in range(count):
            t0 = time.perf_counter()
            os.pwrite(fd, block, i * 4096)
            os.fdatasync(fd)
            lat[i] = (time.perf_counter() - t0) * 1e6
    finally:
        os.close(fd)
        os.unlink(path)
    return {"fsync 4 KiB p50 µs": float(np.percentile(lat, 50)), "fsync 4 KiB p99 µs": float(np.percentile(lat, 99))}


def measure(directory: str, quick: bool) -> dict:
    out = mmap_append_mb_s(directory, (64 if quick else 512) << 20)
    out.update(fsync_latency_us(directory, 50 if quick else 500))
    return out


def machine(directory: str) -> dict:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    fs = max((p for p in psutil.disk_partitions(all=True) if directory.startswith(p.mountpoint)),
             key=lambda p: len(p.mountpoint), default=None)
    return {"kernel": platform.release(), "python": platform.python_version(), "cpu": cpu,
            "cores": os.cpu_count(), "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "filesystem": f"{fs.fstype} on {fs.device} ({fs.mountpoint})" if fs else "?"}
