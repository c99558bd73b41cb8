"""How often a reader takes a consume-queue entry being stored for a readable one, by load order.

One process appends entries as ``ConsumeQueue.put_one`` does (``CQ_ENTRY_STRUCT.pack_into`` into
zeroed slots, a few µs apart like a dispatcher); another follows it, loading the next slot as the
store view does and judging it readable when ``size > 0`` and ``phys + size <= bound``. Every entry
names a record far past the bound, so each one judged readable is a torn load. "phys-first" is one
``>qiq`` unpack (the view before fce7182's trial 456 was explained); "size-first" loads the size,
then the phys offset (the view since).

    python bench/torn_entry.py [--entries 1000000] [--pace-us 4]
"""
from __future__ import annotations

import argparse
import mmap
import multiprocessing as mp
import os
import struct
import tempfile
import time

from hostmq.records import CQ_ENTRY_STRUCT

PHYS, SIZE = struct.Struct(">q"), struct.Struct(">i")
ENTRY_BYTES = CQ_ENTRY_STRUCT.size
BOUND = 1 << 20                          # readable bound; every entry's record starts past it
FIRST_PHYS, RECORD_BYTES = 24_000_000, 274


def append(path: str, entries: int, pace_s: float) -> None:
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), entries * ENTRY_BYTES)
    for j in range(entries):
        CQ_ENTRY_STRUCT.pack_into(mm, j * ENTRY_BYTES, FIRST_PHYS + j * RECORD_BYTES, RECORD_BYTES, 7)
        until = time.perf_counter() + pace_s
        while time.perf_counter() < until:
            pass


def follow(path: str, entries: int, order: str, out) -> None:
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), entries * ENTRY_BYTES, access=mmap.ACCESS_READ)
    torn = loads = j = 0
    deadline = time.monotonic() + 120
    while j < entries and time.monotonic() < deadline:
        pos = j * ENTRY_BYTES
        if order == "phys-first":
            phys, size, _ = CQ_ENTRY_STRUCT.unpack_from(mm, pos)
        else:
            size = SIZE.unpack_from(mm, pos + 8)[0]
            phys = PHYS.unpack_from(mm, pos)[0]
        loads += 1
        torn += size > 0 and phys + size <= BOUND
        j += size > 0
    out.put((order, entries, loads, torn))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--pace-us", type=float, default=4.0)
    args = ap.parse_args()
    for order in ("phys-first", "size-first"):
        fd, path = tempfile.mkstemp(prefix="torn-entry-")
        try:
            os.ftruncate(fd, args.entries * ENTRY_BYTES)
            out = mp.Queue()
            procs = [mp.Process(target=append, args=(path, args.entries, args.pace_us / 1e6)),
                     mp.Process(target=follow, args=(path, args.entries, order, out))]
            for p in procs:
                p.start()
            result = out.get()
            for p in procs:
                p.join()
            print("%-10s  %d entries stored, %d loads, %d entries being stored taken as readable" % result)
        finally:
            os.close(fd)
            os.unlink(path)


if __name__ == "__main__":
    main()
