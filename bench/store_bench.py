#!/usr/bin/env python3
"""Embedded-store throughput benchmark: hostmq's MessageStore beside raw mmap / numpy limits.

Per target directory (/dev/shm, a disk dir) and body size (100 B, 1 KiB), in one process: raw limits
(mmap slice-assign per record, numpy copy per 100 records, writing fresh pages), then put, append_encoded,
put_batch, dispatch (index on / off), get_batch and get. A phase runs until it has done --messages and
--seconds, or 1.5 x --seconds at most. Timings are printed and written to CSV, never asserted.

    python bench/store_bench.py [--quick] [--disk-dir DIR] [--messages N] [--csv PATH]
"""
from __future__ import annotations

import argparse
import csv
import mmap
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402

from hostmq import records as R  # noqa: E402
from hostmq.message import Message  # noqa: E402
from hostmq.store.encode import encode_message  # noqa: E402
from hostmq.store.message_store import MessageStore  # noqa: E402

TOPIC = "BenchTopic"
QUEUES = 8
BATCH = 100
PAGE = 4096
RAW_MAP_BYTES = 64 << 20      # warm mapping the raw loops write round and round
HEX = np.frombuffer(b"0123456789ABCDEF", np.uint8)

# phase key -> (label, raw phase it is compared with, the target in msgs/s)
PHASES = {
    "raw_one": ("raw (a): mmap slice-assign, 1 rec/op", None, None),
    "raw_batch": ("raw (b): numpy copy, 100 recs/op", None, None),
    "raw_fresh": ("raw (c): fresh pages", None, None),
    "put": ("put, one at a time", "raw_one", 500_000),
    "append_encoded": ("batched append (pre-encoded), cold files", "raw_batch", 5_000_000),
    "append_encoded_warm": ("batched append (pre-encoded), warm file", "raw_batch", 5_000_000),
    "put_batch": ("put_batch of 100 (encodes each)", "raw_batch", None),
    "dispatch": ("dispatch (index on)", None, 1_000_000),
    "dispatch_noindex": ("dispatch (index off)", None, 1_000_000),
    "get_batch": ("batched read: get_batch(4096)", None, 20_000_000),
    "get_batch_bodies": ("batched read + len(body) each", None, None),
    "get": ("get(32): one MessageExt per msg", None, 2_000_000),
}


# -- timing helpers ------------------------------------------------------------------------------
def run_for(step, n_min: int, opts) -> tuple[int, float]:
    """Call ``step()`` (returns messages done) until ``n_min`` are done and ``opts.seconds`` passed,
    or 1.5 x ``opts.seconds`` passed, or a step does nothing (the phase ran out of room)."""
    n, t0, cap = 0, time.perf_counter(), 1.5 * opts.seconds
    while True:
        k = step()
        dt = time.perf_counter() - t0
        if k == 0:
            return n, dt
        n += k
        if dt >= cap or (n >= n_min and dt >= opts.seconds):
            return n, dt


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


# -- machine and directories ---------------------------------------------------------------------
def mount_of(path: str) -> tuple[str, str, str]:
    """(mount point, fs type, device) holding ``path``, from /proc/mounts."""
    path, best = os.path.realpath(path), ("", "?", "?")
    with open("/proc/mounts") as f:
        for line in f:
            dev, mnt, typ = line.split()[:3]
            mnt = mnt.replace("\\040", " ")
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[0]):
                best = (mnt, typ, dev)
    return best


def machine() -> str:
    cpu, ram = "?", 0
    with open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    with open("/proc/meminfo") as f:
        ram = next(int(ln.split()[1]) for ln in f if ln.startswith("MemTotal"))
    return (f"nproc={os.cpu_count()} (usable {len(os.sched_getaffinity(0))}); cpu={cpu}; "
            f"ram={ram / 2**20:.1f} GiB; kernel={platform.release()}; "
            f"python={platform.python_version()}; numpy={np.__version__}")


def hostmq_version() -> str:
    """The commit of the code measured, and whether the work tree differs from it."""
    git = ["git", "-C", REPO]
    try:
        head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
        dirty = subprocess.run(git + ["status", "--porcelain", "hostmq"], capture_output=True, text=True).stdout
    except OSError:
        return "hostmq: unknown version"
    return f"hostmq: commit {head.strip() or '?'}{' + uncommitted changes in hostmq/' if dirty else ''}"


def default_disk_dir() -> str:
    return "/tmp" if mount_of("/tmp")[1] != "tmpfs" else os.path.dirname(REPO)


# -- building records ----------------------------------------------------------------------------
def encoded_batches(store: MessageStore, body: bytes, n: int):
    """``n`` (rounded up to whole batches) distinct pre-encoded records, like the producer makes:
    one template record copied with numpy, then queue id and unique-id counter patched per record.
    Returns (template record, list of batch memoryviews, starts, sizes); batch k is for queue k % 8."""
    rec = encode_message(Message(TOPIC, body, tags="a"), TOPIC.encode(), 0,
                         max_body_bytes=store.config.max_message_bytes,
                         max_props_bytes=store.config.max_properties_bytes,
                         born_host=store.commitlog.store_host, uniq_key="0" * 32)
    size, nb = len(rec), -(-n // BATCH)
    arr = np.tile(np.frombuffer(rec, np.uint8), nb * BATCH).reshape(nb * BATCH, size)
    qid = (np.arange(nb * BATCH) // BATCH % QUEUES).astype(">i4")
    qat = R.FIELD["queue_id"]
    arr[:, qat:qat + 4] = qid.view(np.uint8).reshape(-1, 4)
    upos = rec.rindex(R.PROP_UNIQ_KEY.encode() + b"\x01") + len(R.PROP_UNIQ_KEY) + 1
    arr[:, upos:upos + 16] = np.frombuffer(R.new_unique_id()[:16].encode(), np.uint8)
    shifts = np.arange(60, -1, -4, dtype=np.uint64)
    for lo in range(0, nb * BATCH, 1 << 16):      # unique-id counters as 16 hex digits
        c = np.arange(lo, min(lo + (1 << 16), nb * BATCH), dtype=np.uint64)
        arr[lo:lo + len(c), upos + 16:upos + 32] = HEX[(c[:, None] >> shifts) & np.uint64(15)]
    mv = memoryview(arr.reshape(-1))
    batches = [mv[k * BATCH * size:(k + 1) * BATCH * size] for k in range(nb)]
    return rec, batches, np.arange(BATCH, dtype=np.int64) * size, np.full(BATCH, size, np.int64)


# -- raw limits ----------------------------------------------------------------------------------
def scratch_map(directory: str, nbytes: int) -> mmap.mmap:
    """A fallocated, mapped scratch file, already unlinked (freed with the map); pages untouched."""
    path = os.path.join(directory, "raw.map")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, nbytes)
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)
        os.unlink(path)


def raw_copy(directory: str, src, recs_per_op: int, n: int, opts, use_numpy: bool):
    """(a) ``mm[p:p+len] = rec`` one record per op, or (b) ``u8[p:p+len] = blob_array`` per batch,
    round and round a warm 64 MiB mapping."""
    mm = scratch_map(directory, RAW_MAP_BYTES)
    u8 = np.frombuffer(mm, np.uint8)
    u8[:] = 0                                       # fault every page in: the map is warm
    dst, src = (u8, np.frombuffer(src, np.uint8)) if use_numpy else (mm, src)
    size, ops, pos = len(src), max(10_000 // recs_per_op, 100), [0]
    fit = RAW_MAP_BYTES // size

    def step():
        p = pos[0] if pos[0] + ops <= fit else 0
        for off in range(p * size, (p + ops) * size, size):
            dst[off:off + size] = src
        pos[0] = p + ops
        return ops * recs_per_op
    return run_for(step, n, opts)


def raw_fresh(directory: str, opts) -> tuple[int, float]:
    """(c) Write a freshly fallocated, never-touched mapped file front to back: (bytes, seconds)."""
    nbytes, src = opts.fresh_mb << 20, np.full(1 << 20, 0x5A, np.uint8)
    u8 = np.frombuffer(scratch_map(directory, nbytes), np.uint8)
    t0 = time.perf_counter()
    for off in range(0, nbytes, len(src)):
        u8[off:off + len(src)] = src
    return nbytes, time.perf_counter() - t0


# -- hostmq phases ---------------------------------------------------------------------------------
def phase_put(store, body: bytes, n: int, opts) -> tuple[int, float]:
    """``store.put`` one message at a time, queues round-robin."""
    msgs, put = [Message(TOPIC, body, tags="a") for _ in range(1000)], store.put

    def step():
        for i, m in enumerate(msgs):
            put(m, i % QUEUES)
        return len(msgs)
    return run_for(step, n, opts)


def phase_append_encoded(store, batches, starts, sizes, n: int, opts,
                         stop_at: int | None = None) -> tuple[int, float]:
    """``store.append_encoded`` of pre-encoded batches of 100 (the writer's path)."""
    append, k = store.append_encoded, [0]

    def step():
        if stop_at is not None and (k[0] + 10) * BATCH > stop_at:
            return 0
        for b in range(k[0], k[0] + 10):
            b %= len(batches)                       # batch b was encoded for queue b % 8
            append(TOPIC, b % QUEUES, batches[b], starts, sizes)
        k[0] += 10
        return 10 * BATCH
    return run_for(step, n, opts)


def warm_append(path: str, cfg: dict, batches, starts, sizes, n: int, opts) -> tuple[int, float]:
    """``append_encoded`` into a commitlog file created and pre-faulted before timing, stopping
    before it fills: what the writer sees once files are pre-allocated ahead of need (issue 7)."""
    with MessageStore(path, dict(cfg, warm_mapped_file=True, message_index_enable=False)) as store:
        store.append_encoded(TOPIC, 0, batches[0], starts, sizes)    # creates and warms the file
        fit = (store.config.commitlog_file_bytes // int(sizes.sum()) - 2) * BATCH
        return phase_append_encoded(store, batches, starts, sizes, min(n, fit), opts, stop_at=fit)


def phase_put_batch(store, body: bytes, n: int, opts) -> tuple[int, float]:
    """``store.put_batch`` of 100 Message objects (encodes each one)."""
    msgs, k = [Message(TOPIC, body, tags="a") for _ in range(BATCH)], [0]

    def step():
        store.put_batch(msgs, k[0] % QUEUES)
        k[0] += 1
        return BATCH
    return run_for(step, n, opts)


def walk_queues(fetch, total: int, opts) -> tuple[int, float]:
    """Read the queues one after the other to their ends (and again, until the phase is over);
    ``fetch(queue, offset)`` returns (messages read, next offset)."""
    cur = [0, 0]                                    # queue, offset

    def step():
        n, nxt = fetch(cur[0], cur[1])
        cur[:] = [cur[0], nxt] if n else [(cur[0] + 1) % QUEUES, 0]
        return n
    return run_for(step, total, opts)


def phase_get_batch(store, total: int, opts, bodies: bool) -> tuple[int, float]:
    def fetch(q, off):
        b = store.get_batch(TOPIC, q, off, 4096)
        b.queue_offsets
        if bodies:
            sum(len(x) for x in b.bodies)
        return len(b), b.next_offset
    return walk_queues(fetch, total, opts)


def phase_get(store, total: int, opts) -> tuple[int, float]:
    def fetch(q, off):
        g = store.get(TOPIC, q, off, 32)
        for m in g.messages:
            m.body
            m.queue_offset
        return len(g.messages), g.next_offset
    return walk_queues(fetch, total, opts)


# -- one (directory, body size) run ------------------------------------------------------------------
def run_one(where: str, base: str, body_bytes: int, file_mb: int, opts) -> list[dict]:
    n = max(opts.messages // max(1, body_bytes // 256), 10_000)   # 1 KiB: a quarter
    body, ctx = os.urandom(body_bytes), f"{where} {body_bytes} B"
    print(f"{ctx}: up to {n:,} msgs per phase, commitlog files of {file_mb} MiB", file=sys.stderr)
    res: dict[str, tuple[int, float, int]] = {}     # phase -> (messages, seconds, bytes per message)

    def record(key, result, nbytes=None):
        res[key] = (result[0], result[1], nbytes or len(rec))
        print(f"  [{ctx}] {PHASES[key][0]}: {result[0]:,} msgs in {result[1]:.2f} s = "
              f"{result[0] / result[1]:,.0f}/s", file=sys.stderr, flush=True)

    cfg = {"commitlog_file_bytes": file_mb << 20, "warm_mapped_file": opts.warm}
    d = tempfile.mkdtemp(prefix="hostmq-bench-", dir=base)
    try:
        with MessageStore(os.path.join(d, "store"), cfg) as store:
            rec, batches, starts, sizes = encoded_batches(store, body, n)
            record("raw_one", raw_copy(d, rec, 1, n, opts, use_numpy=False))
            record("raw_batch", raw_copy(d, batches[0], BATCH, n, opts, use_numpy=True))
            nbytes, dt = raw_fresh(d, opts)
            record("raw_fresh", (nbytes // len(rec), dt))
            record("put", phase_put(store, body, n, opts))
            record("append_encoded", phase_append_encoded(store, batches, starts, sizes, n, opts))
            record("put_batch", phase_put_batch(store, body, n, opts))
            total = sum(res[k][0] for k in ("put", "append_encoded", "put_batch"))
            record("dispatch", timed(store.dispatch))
            record("get_batch", phase_get_batch(store, total, opts, bodies=False))
            record("get_batch_bodies", phase_get_batch(store, total, opts, bodies=True))
            record("get", phase_get(store, total, opts))
        shutil.rmtree(os.path.join(d, "store"))
        record("append_encoded_warm", warm_append(os.path.join(d, "warm"), cfg, batches, starts, sizes,
                                                   n, opts))
        shutil.rmtree(os.path.join(d, "warm"))
        # As many records again, into a store without the index, to show what the index costs.
        with MessageStore(os.path.join(d, "noindex"), dict(cfg, message_index_enable=False)) as s2:
            for b in range(-(-total // BATCH)):
                b %= len(batches)
                s2.append_encoded(TOPIC, b % QUEUES, batches[b], starts, sizes)
            record("dispatch_noindex", timed(s2.dispatch))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return make_rows(where, body_bytes, res)


def make_rows(where: str, body_bytes: int, raw: dict) -> list[dict]:
    out = []
    for key, (label, vs, target) in PHASES.items():
        n, dt, nbytes = raw[key]
        rate = n / dt
        if key == "raw_fresh":
            label = f"{label} ({dt / (n * nbytes / PAGE) * 1e6:.2f} us/4KiB page)"
        ref = raw[vs][0] / raw[vs][1] if vs else None
        out.append({"target_dir": where, "body_bytes": body_bytes, "phase": label, "key": key,
                    "messages": n, "seconds": round(dt, 4), "record_bytes": nbytes,
                    "msgs_per_s": round(rate), "mb_per_s": round(rate * nbytes / 1e6, 1),
                    "vs_raw": round(rate / ref, 4) if ref else "",
                    "target": target or "",
                    "met": ("met" if rate >= target else "MISSED") if target else ""})
    return out


# -- output --------------------------------------------------------------------------------------------
COLS = [("target dir", 18, "target_dir"), ("body bytes", 10, "body_bytes"), ("phase", 42, "phase"),
        ("msgs/s", 11, "msgs_per_s"), ("MB/s", 8, "mb_per_s"), ("vs raw", 6, "vs_raw"),
        ("target", 7, "target"), ("met", 6, "met")]
FMT = {"msgs_per_s": "{:,}".format, "vs_raw": "{:.1%}".format, "target": lambda v: f">={v / 1e6:g}M"}


def cell(key: str, v) -> str:
    return "-" if v == "" else FMT.get(key, str)(v)


def print_table(rows: list[dict], header: list[str]) -> None:
    def line(values):   # text columns left-aligned, numbers right-aligned
        return "  ".join(f"{v:<{w}}" if i < 3 else f"{v:>{w}}" for i, (v, (_, w, _)) in
                         enumerate(zip(values, COLS)))

    title = line(name for name, _, _ in COLS)
    print("\n".join(header + [title, "-" * len(title)]))
    for i, r in enumerate(rows):
        if i and r["key"] == "raw_one":      # a blank line between (directory, body size) runs
            print()
        print(line(cell(k, r[k]) for _, _, k in COLS))


def write_csv(path: str, rows: list[dict], header: list[str]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        for h in header:
            f.write(f"# {h}\n")
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--disk-dir", help="dir on a disk fs (default /tmp unless tmpfs, else the repo's parent)")
    p.add_argument("--shm-dir", default="/dev/shm")
    p.add_argument("--targets", default="shm,disk", help="comma list of: shm, disk")
    p.add_argument("--sizes", default="100,1024", help="comma list of body sizes in bytes")
    p.add_argument("--messages", type=int, help="messages per phase at 100 B (1 KiB: a quarter); "
                   "default 1000000, --quick 100000")
    p.add_argument("--seconds", type=float, help="least seconds per phase (default 1, --quick 0.1)")
    p.add_argument("--file-mb", type=int, help="commitlog file MiB (default 256 on shm, 1024 on disk)")
    p.add_argument("--fresh-mb", type=int, help="MiB written for the fresh-page figure (default 256)")
    p.add_argument("--warm", action="store_true", help="store config warm_mapped_file=True")
    p.add_argument("--quick", action="store_true", help="small run (under ~30 s)")
    p.add_argument("--csv", default=os.path.join(REPO, "bench", "out", "store_bench.csv"))
    opts = p.parse_args(argv)
    opts.messages = opts.messages or (100_000 if opts.quick else 1_000_000)
    opts.seconds = opts.seconds or (0.1 if opts.quick else 1.0)
    opts.fresh_mb = opts.fresh_mb or (64 if opts.quick else 256)

    dirs = {"shm": (opts.shm_dir, opts.file_mb or 256),
            "disk": (opts.disk_dir or default_disk_dir(), opts.file_mb or 1024)}
    header = [f"machine: {machine()}", hostmq_version(), f"command: {shlex.join(sys.orig_argv)}"]
    for name in opts.targets.split(","):
        mnt, typ, dev = mount_of(dirs[name][0])
        warn = "  <-- WARNING: tmpfs, not a disk" if name == "disk" and typ == "tmpfs" else ""
        header.append(f"{name}: {dirs[name][0]} is on {typ} ({dev} mounted at {mnt}){warn}")
    print("\n".join(header), file=sys.stderr, flush=True)

    rows, t0 = [], time.perf_counter()
    for name in opts.targets.split(","):
        base, file_mb = dirs[name]
        for body_bytes in map(int, opts.sizes.split(",")):
            rows += run_one(f"{base} ({mount_of(base)[1]})", base, body_bytes, file_mb, opts)
    header.append(f"total run time {time.perf_counter() - t0:.0f} s; a phase runs until {opts.messages:,} msgs "
                  f"(1 KiB: a quarter) and {opts.seconds:g} s, or {1.5 * opts.seconds:g} s at most")
    print_table(rows, header)
    write_csv(opts.csv, rows, header)
    print(f"\nCSV written to {opts.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
