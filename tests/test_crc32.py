"""The body CRC the native modules compute (hostmq/include/crc32_fast.h: slicing-by-8 below 512
bytes, zlib above) is zlib.crc32's, on every length across the switch and at every alignment, and
for random data; the records' BODYCRC is that value & 0x7FFFFFFF (records.body_crc)."""
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
        for off in range(8):
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
