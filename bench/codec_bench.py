#!/usr/bin/env python3
"""Per-call cost of the V1 record codec: hostmq/_codec.c beside its Python reference.

For encode_record, check_record, single_record, record_fields and java_string_hash (and the
consume-queue entries), on a record with a 100-byte and a 16 KiB body, the best of ``--repeat`` timings
of ``--number`` calls each; prints ns per call, native and Python, and their ratio. Timings are
printed, never asserted.

    python bench/codec_bench.py [--number N] [--repeat R]
"""
from __future__ import annotations

import argparse
import os
import sys
import timeit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402

from hostmq import records as R  # noqa: E402
from hostmq import record_check as V  # noqa: E402

TOPIC = b"BenchTopic"
PROPS = b"TAGS\x01tagA\x02KEYS\x01k1 k2\x02UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x017F0000010001000000000000000000AB\x02"
HOST = b"\x7f\x00\x00\x01\x00\x00\x30\x39"


def cases(body_bytes: int) -> list[tuple[str, object, object, tuple, dict]]:
    """(name, native, reference, args, kwargs) of each measured call."""
    body = bytes(range(256)) * (body_bytes // 256) + b"x" * (body_bytes % 256)
    kw = dict(queue_id=3, flag=0, sys_flag=0, born_ts_ms=1_700_000_000_000, born_host=HOST, store_host=HOST)
    rec = R.py_encode_record(TOPIC, body, PROPS, **kw)
    C = R.NATIVE_CODEC
    size = f"{body_bytes} B" if body_bytes < 1024 else f"{body_bytes // 1024} KiB"
    return [
        (f"encode_record ({size})", C.encode_record, R.py_encode_record, (TOPIC, body, PROPS), kw),
        (f"check_record ({size}, CRC)", C.check_record, R.py_check_record, (rec, 0, len(rec)), {}),
        (f"check_record ({size}, no CRC)", C.check_record, R.py_check_record, (rec, 0, len(rec), False), {}),
        (f"single_record ({size})", C.single_record, V.py_single_record, (rec, 4 << 20, 32767), {}),
        (f"record_fields ({size})", C.record_fields, R.py_record_fields, (rec, 0), {}),
    ]


def other_cases() -> list[tuple[str, object, object, tuple, dict]]:
    C = R.NATIVE_CODEC
    n = 100
    cols = (np.arange(n, dtype=np.int64) * 200, np.full(n, 200, np.int64), np.arange(n, dtype=np.int64))
    return [
        ("java_string_hash (8 chars)", C.java_string_hash, R.py_java_string_hash, ("TagA_001",), {}),
        ("java_string_hash (40 chars)", C.java_string_hash, R.py_java_string_hash, ("K" * 40,), {}),
        ("java_string_hash (12, non-ASCII)", C.java_string_hash, R.py_java_string_hash, ("Ünïcødé-ключ",), {}),
        ("cq_entry", C.cq_entry, R.py_cq_entry, (123_456, 200, -5), {}),
        ("cq_entries (100, numpy)", C.cq_entries, R.py_cq_entries, cols, {}),
    ]


def per_call_ns(f, args: tuple, kwargs: dict, number: int, repeat: int) -> float:
    call = (lambda: f(*args, **kwargs)) if kwargs else (lambda: f(*args))
    return min(timeit.repeat(call, number=number, repeat=repeat)) / number * 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--number", type=int, default=20_000, help="calls per timing (default 20000)")
    ap.add_argument("--repeat", type=int, default=5, help="timings per call, the best is kept (default 5)")
    a = ap.parse_args(argv)
    if not R.NATIVE:
        print("hostmq._codec is not built (records.NATIVE is False): nothing to compare", file=sys.stderr)
        return 1
    rows = []
    for name, native, ref, args, kwargs in cases(100) + cases(16 * 1024) + other_cases():
        assert native(*args, **kwargs) == ref(*args, **kwargs), name
        number = a.number if "KiB" not in name else max(1, a.number // 10)
        c_ns = per_call_ns(native, args, kwargs, number, a.repeat)
        py_ns = per_call_ns(ref, args, kwargs, number, a.repeat)
        rows.append((name, c_ns, py_ns))
    print(f"{'call':<34} {'native ns':>10} {'Python ns':>10} {'Python/native':>14}")
    for name, c_ns, py_ns in rows:
        print(f"{name:<34} {c_ns:>10,.0f} {py_ns:>10,.0f} {py_ns / c_ns:>13.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
