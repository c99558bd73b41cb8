"""The C codec's layout is generated from the Python declarations, and its state is per module.

hostmq/include/record_layout.h is written by tools/gen_layout.py from ``records.NATIVE_LAYOUT`` and committed
(pip compiles the codec without running any of hostmq's Python): these tests fail when the committed
file is not what the declarations give now (a field moved in records.py, the header not
regenerated), and show the C codec keeps what ``_bind`` gives it in its module's state (multi-phase
init), not in C globals shared by every module object.
"""
from __future__ import annotations

import copy
import importlib.util
import os
import subprocess
import sys

import pytest

from hostmq import records as R
from hostmq.errors import CorruptRecordError

pytestmark = pytest.mark.timeout(60)

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_native = pytest.mark.skipif(not R.NATIVE, reason="hostmq._codec not built (test_native_codec_is_built fails)")


def test_the_committed_layout_header_is_the_one_records_py_generates():
    with open(os.path.join(TOP, R.CODEC_LAYOUT_HEADER)) as f:
        committed = f.read()
    assert committed == R.codec_layout_header(), "hostmq/include/record_layout.h is stale: run tools/gen_layout.py"


def test_a_moved_field_changes_the_generated_header():
    """The comparison above can fail: any declaration that moves shows in the text."""
    moved = copy.deepcopy(R.NATIVE_LAYOUT)
    moved["FIELD"]["flag"] += 1
    assert R.codec_layout_header(moved) != R.codec_layout_header()
    assert "OFF_FLAG = 17," in R.codec_layout_header(moved)
    bigger = copy.deepcopy(R.NATIVE_LAYOUT)
    bigger["CQ_ENTRY"] = 24
    assert "CQ_ENTRY_BYTES = 24," in R.codec_layout_header(bigger)


def test_every_declared_field_is_in_the_header():
    text = R.codec_layout_header()
    for name, off in R.FIELD.items():
        assert f"OFF_{name.upper()} = {off}, W_{name.upper()} = {R.MSG_HEADER_DTYPE[name].itemsize}," in text
    for name in R.CQ_ENTRY.names:
        assert f"CQ_OFF_{name.upper()} = {R.CQ_ENTRY.fields[name][1]}," in text
    assert f"#define MAGIC_CODE 0x{R.MAGIC_CODE:08X}u" in text


def test_gen_layout_check_passes_on_the_committed_header():
    p = subprocess.run([sys.executable, os.path.join(TOP, "tools", "gen_layout.py"), "--check"],
                       capture_output=True, text=True, timeout=50, cwd=TOP)
    assert p.returncode == 0, p.stderr[-2000:]


@needs_native
def test_the_built_codec_carries_the_whole_declared_layout():
    assert R.NATIVE_CODEC.LAYOUT == R.NATIVE_LAYOUT
    assert set(R.NATIVE_CODEC.LAYOUT["FIELD"]) == set(R.MSG_HEADER_DTYPE.names)


@needs_native
def test_each_module_object_has_its_own_state():
    """Multi-phase init: loading the extension again makes a new module object with a fresh state,
    which nothing has bound yet (its errors are still plain ValueErrors), while the one records.py
    bound keeps raising hostmq's own CorruptRecordError."""
    spec = importlib.util.spec_from_file_location("hostmq._codec", R.NATIVE_CODEC.__file__)
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    assert fresh is not R.NATIVE_CODEC and fresh.LAYOUT == R.NATIVE_LAYOUT
    garbage = b"\0" * 16
    with pytest.raises(ValueError) as fresh_error:
        fresh.check_record(garbage, 0, len(garbage))
    assert not isinstance(fresh_error.value, CorruptRecordError)
    with pytest.raises(CorruptRecordError, match="bad magic"):
        R.NATIVE_CODEC.check_record(garbage, 0, len(garbage))
    # A reference the fresh module was never given is reported, not borrowed from the bound one.
    with pytest.raises(RuntimeError, match="no Python reference bound"):
        fresh.check_record(garbage)
    rec = R.encode_record(b"T", b"x", b"")
    assert R.check_record(rec, 0, len(rec)) == (R.RecordKind.MESSAGE, len(rec))
