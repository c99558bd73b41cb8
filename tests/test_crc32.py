"""The body CRC the native modules compute (hostmq/include/crc32_fast.h: folded with PCLMULQDQ from 64
bytes where the CPU has it, else slicing-by-8 below 512 bytes and zlib above) is zlib.crc32's, on
every length across the switches and at every alignment, and for random data; the records' BODYCRC
is that value & 0x7FFFFFFF (records.body_crc)."""
from __future__ import annotations

import os
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hostmq.store import encode as E

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(E.NATIVE is None, reason="hostmq/store/_encode.c is not built")]


def test_every_length_and_alignment_gives_zlibs_crc():
    data = os.urandom(1200)
    for n in range(0, 1100):
        for off in range(16):
            chunk = memoryview(data)[off:off + n]
            assert E.NATIVE.crc32(chunk) == zlib.crc32(chunk), (n, off)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=4096))
def test_random_data_gives_zlibs_crc(data):
    assert E.NATIVE.crc32(data) == zlib.crc32(data)
    assert E.NATIVE.crc32(bytearray(data)) == zlib.crc32(data)


def test_uniform_bytes_that_slice_badly_still_agree():
    for b in (b"\x00", b"\xff", b"\x80", b"\x01"):
        for n in (7, 8, 9, 63, 64, 65, 511, 512, 513):
            assert E.NATIVE.crc32(b * n) == zlib.crc32(b * n)


def test_the_folded_crc_serves_where_the_cpu_has_pclmulqdq():
    """On an x86-64 CPU with PCLMULQDQ and SSE4.1 the tests above ran the folded path (else they ran
    the table's and zlib's, which they check the same way)."""
    import platform
    flags = set()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    has = platform.machine() == "x86_64" and {"pclmulqdq", "sse4_1"} <= flags
    assert E.NATIVE.CRC32_FOLDED == int(has)


@pytest.mark.parametrize("n", [64, 65, 79, 80, 96, 127, 128, 129, 4096, 65536 + 7, (1 << 20) + 13])
def test_long_and_block_edge_lengths_give_zlibs_crc(n):
    data = os.urandom(n + 16)
    for off in (0, 1, 15):
        assert E.NATIVE.crc32(memoryview(data)[off:off + n]) == zlib.crc32(memoryview(data)[off:off + n])
