"""Warm-up switch: a pre-faulted mapped file takes (almost) no page faults on its first writes."""
from __future__ import annotations

import os

import pytest

from hostmq.observe import process_stats
from hostmq.store.mapped_file import PAGE_BYTES, MappedFile

pytestmark = pytest.mark.timeout(60)


def first_write_faults(path: str, warm: bool, file_bytes: int = 8 << 20) -> int:
    mf = MappedFile(path, file_bytes, create=True, warm=warm)
    try:
        page = b"x" * PAGE_BYTES
        before = process_stats(os.getpid())["minor_faults"]
        for pos in range(0, file_bytes, PAGE_BYTES):
            mf.write_at(pos, page)
        return process_stats(os.getpid())["minor_faults"] - before
    finally:
        mf.close()


def test_warm_up_moves_the_faults_out_of_the_first_writes(tmp_path):
    pages = (8 << 20) // PAGE_BYTES
    cold = first_write_faults(str(tmp_path / ("0" * 20)), warm=False)
    warm = first_write_faults(str(tmp_path / ("0" * 12 + "08388608")), warm=True)
    assert cold >= pages // 2, f"cold file: only {cold} faults for {pages} fresh pages"
    assert warm <= pages // 20, f"warmed file: {warm} faults for {pages} pages"
