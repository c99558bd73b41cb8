"""MappedFile and MappedFileQueue: naming, lookup by offset (RocketMQ MappedFileQueueTest), growth,
truncation, deletion by age, flushing."""
from __future__ import annotations

import os

import pytest

from hostmq.errors import ConfigError

from hostmq.store.mapped_file import PAGE_BYTES, MappedFile, file_name, offset_of
from hostmq.store.mapped_file_queue import MappedFileQueue

pytestmark = pytest.mark.timeout(120)

FILE_BYTES = 4096


def fill_queue(directory, n_files: int, first: int = 0) -> MappedFileQueue:
    """A queue of ``n_files`` full files whose every byte says which file it is in."""
    q = MappedFileQueue(str(directory), FILE_BYTES)
    for i in range(n_files):
        mf = q.last_for_write(first)
        assert mf.file_from_offset == first + i * FILE_BYTES
        mf.append(bytes([i + 1]) * FILE_BYTES)
    return q


def test_file_name_is_twenty_digits_and_round_trips():
    assert file_name(0) == "0" * 20
    assert file_name(1 << 30) == f"{1 << 30:020d}"
    assert offset_of("/x/y/" + file_name(123456789)) == 123456789
    for bad in ("123", "a" * 20, "0" * 19 + "x", "0" * 21):
        with pytest.raises(ValueError):
            offset_of(bad)


def test_files_are_named_by_start_offset(tmp_path):
    q = fill_queue(tmp_path / "q", 3)
    assert sorted(os.listdir(tmp_path / "q")) == [file_name(i * FILE_BYTES) for i in range(3)]
    assert all(os.path.getsize(mf.path) == FILE_BYTES for mf in q.files)
    q.close()


@pytest.mark.parametrize("first", [0, 5 * FILE_BYTES])
def test_find_by_offset(tmp_path, first):
    q = fill_queue(tmp_path / "q", 5, first)
    end = first + 5 * FILE_BYTES
    cases = {
        first: 0, first + 1: 0, first + FILE_BYTES - 1: 0,                    # first file
        first + FILE_BYTES: 1, first + 2 * FILE_BYTES + 17: 2,               # middle
        end - FILE_BYTES: 4, end - 1: 4,                                      # last
    }
    for offset, idx in cases.items():
        mf = q.find(offset)
        assert mf is not None and mf.file_from_offset == first + idx * FILE_BYTES, offset
        assert mf.mm[offset - mf.file_from_offset] == idx + 1
    for offset in (end, end + 1, end + 10 * FILE_BYTES) + ((first - 1, 0) if first else ()):
        assert q.find(offset) is None, offset
    assert q.min_offset() == first
    assert q.max_offset() == end
    q.close()


def test_find_with_a_hole_after_deleting_a_middle_file(tmp_path):
    fill_queue(tmp_path / "q", 5).close()
    os.unlink(tmp_path / "q" / file_name(2 * FILE_BYTES))
    q = MappedFileQueue(str(tmp_path / "q"), FILE_BYTES)
    q.load()
    assert [mf.file_from_offset for mf in q.files] == [0, FILE_BYTES, 3 * FILE_BYTES, 4 * FILE_BYTES]
    for offset, idx in {0: 0, FILE_BYTES + 5: 1, 3 * FILE_BYTES: 3, 3 * FILE_BYTES + 99: 3,
                        5 * FILE_BYTES - 1: 4}.items():
        mf = q.find(offset)
        assert mf is not None and mf.file_from_offset == idx * FILE_BYTES, offset
        assert mf.mm[offset - mf.file_from_offset] == idx + 1
    for offset in (2 * FILE_BYTES, 2 * FILE_BYTES + 100, 3 * FILE_BYTES - 1, 5 * FILE_BYTES, -1):
        assert q.find(offset) is None, offset
    q.close()


def test_find_after_deleting_the_first_files(tmp_path):
    q = fill_queue(tmp_path / "q", 4)
    gone = q.delete_first(2)
    assert [os.path.basename(p) for p in gone] == [file_name(0), file_name(FILE_BYTES)]
    assert sorted(os.listdir(tmp_path / "q")) == [file_name(2 * FILE_BYTES), file_name(3 * FILE_BYTES)]
    assert q.min_offset() == 2 * FILE_BYTES
    assert q.find(0) is None and q.find(2 * FILE_BYTES - 1) is None
    assert q.find(2 * FILE_BYTES).mm[0] == 3
    assert q.find(4 * FILE_BYTES - 1).mm[FILE_BYTES - 1] == 4
    q.close()


def test_delete_first_never_deletes_the_last_file(tmp_path):
    q = fill_queue(tmp_path / "q", 3)
    assert len(q.delete_first(10)) == 2
    assert [mf.file_from_offset for mf in q.files] == [2 * FILE_BYTES]
    assert q.delete_first(1) == []
    assert os.listdir(tmp_path / "q") == [file_name(2 * FILE_BYTES)]
    q.close()


def test_last_for_write_rolls_only_when_full(tmp_path):
    q = MappedFileQueue(str(tmp_path / "q"), FILE_BYTES)
    mf = q.last_for_write()
    mf.append(b"a" * (FILE_BYTES - 1))
    assert q.last_for_write() is mf
    mf.append(b"b")
    nxt = q.last_for_write()
    assert nxt is not mf and nxt.file_from_offset == FILE_BYTES
    assert q.max_offset() == FILE_BYTES
    nxt.append(b"c" * 10)
    assert q.max_offset() == FILE_BYTES + 10
    q.close()


def test_load_maps_files_in_order_and_reads_them_back(tmp_path):
    fill_queue(tmp_path / "q", 3).close()
    q = MappedFileQueue(str(tmp_path / "q"), FILE_BYTES)
    q.load()
    assert [mf.file_from_offset for mf in q.files] == [0, FILE_BYTES, 2 * FILE_BYTES]
    assert [bytes(mf.mm[:2]) for mf in q.files] == [b"\x01\x01", b"\x02\x02", b"\x03\x03"]
    q.close()


def test_load_ignores_foreign_names_and_drops_a_short_last_file(tmp_path):
    fill_queue(tmp_path / "q", 2).close()
    (tmp_path / "q" / "README").write_text("not a store file")
    with open(tmp_path / "q" / file_name(2 * FILE_BYTES), "wb") as f:
        f.write(b"\0" * 100)      # a crash while creating the file
    q = MappedFileQueue(str(tmp_path / "q"), FILE_BYTES)
    q.load()
    assert [mf.file_from_offset for mf in q.files] == [0, FILE_BYTES]
    assert not os.path.exists(tmp_path / "q" / file_name(2 * FILE_BYTES))
    q.close()


def test_load_never_deletes_a_last_file_larger_than_the_file_size(tmp_path):
    """It may hold data written with another file size: refuse, with the file's name, change nothing."""
    fill_queue(tmp_path / "q", 2).close()
    with open(tmp_path / "q" / file_name(2 * FILE_BYTES), "wb") as f:
        f.write(b"\1" * (FILE_BYTES + 100))
    q = MappedFileQueue(str(tmp_path / "q"), FILE_BYTES)
    with pytest.raises(ConfigError, match=file_name(2 * FILE_BYTES)):
        q.load()
    q.close()
    assert os.path.getsize(tmp_path / "q" / file_name(2 * FILE_BYTES)) == FILE_BYTES + 100
    reader = MappedFileQueue(str(tmp_path / "q"), FILE_BYTES, writable=False)
    reader.load()                   # a reader stops before it (the writer may be creating it)
    assert [mf.file_from_offset for mf in reader.files] == [0, FILE_BYTES]
    reader.close()


def test_load_refuses_a_wrong_size_file_in_the_middle(tmp_path):
    fill_queue(tmp_path / "q", 3).close()
    os.truncate(tmp_path / "q" / file_name(FILE_BYTES), 100)
    q = MappedFileQueue(str(tmp_path / "q"), FILE_BYTES)
    with pytest.raises(ValueError):
        q.load()
    q.close()


def test_truncate_zeroes_the_tail_and_deletes_later_files(tmp_path):
    q = fill_queue(tmp_path / "q", 4)
    cut = FILE_BYTES + 1000
    q.truncate(cut)
    assert [mf.file_from_offset for mf in q.files] == [0, FILE_BYTES]
    assert sorted(os.listdir(tmp_path / "q")) == [file_name(0), file_name(FILE_BYTES)]
    assert q.max_offset() == cut
    second = q.files[1]
    assert bytes(second.mm[:1000]) == b"\x02" * 1000
    assert bytes(second.mm[1000:]) == b"\0" * (FILE_BYTES - 1000)
    assert bytes(q.files[0].mm[:]) == b"\x01" * FILE_BYTES
    # The next append continues exactly at the cut.
    assert q.last_for_write() is second and second.append(b"z") == 1000
    q.close()


def test_truncate_at_a_file_boundary_and_to_zero_keeps_the_first_file(tmp_path):
    q = fill_queue(tmp_path / "q", 3)
    q.truncate(2 * FILE_BYTES)
    assert [mf.file_from_offset for mf in q.files] == [0, FILE_BYTES]
    assert q.max_offset() == 2 * FILE_BYTES
    q.truncate(0)
    assert [mf.file_from_offset for mf in q.files] == [0]
    assert q.max_offset() == 0 and bytes(q.files[0].mm[:]) == b"\0" * FILE_BYTES
    q.close()


def test_delete_expired_by_time_uses_the_file_age(tmp_path):
    q = fill_queue(tmp_path / "q", 4)
    now_ms = 2_000_000_000_000
    hour_ms = 3_600_000
    ages_h = [80, 75, 10, 90]          # the last file is oldest of all and still never deleted
    for mf, age in zip(q.files, ages_h):
        t = (now_ms - age * hour_ms) / 1000
        os.utime(mf.path, (t, t))
    gone = q.delete_expired_by_time(72 * hour_ms, now_ms)
    assert [os.path.basename(p) for p in gone] == [file_name(0), file_name(FILE_BYTES)]
    assert [mf.file_from_offset for mf in q.files] == [2 * FILE_BYTES, 3 * FILE_BYTES]
    assert q.delete_expired_by_time(72 * hour_ms, now_ms) == []           # a young file blocks
    assert len(q.delete_expired_by_time(72 * hour_ms, now_ms, force=True)) == 1
    assert [mf.file_from_offset for mf in q.files] == [3 * FILE_BYTES]
    q.close()


def test_delete_expired_by_time_respects_max_files(tmp_path):
    q = fill_queue(tmp_path / "q", 5)
    gone = q.delete_expired_by_time(0, 10 ** 13, force=True, max_files=2)
    assert len(gone) == 2 and q.min_offset() == 2 * FILE_BYTES
    q.close()


def test_flush_moves_the_flushed_offset(tmp_path):
    q = MappedFileQueue(str(tmp_path / "q"), 8 * PAGE_BYTES)
    mf = q.last_for_write()
    assert q.flush() == 0
    mf.append(b"a" * (PAGE_BYTES + 10))
    assert mf.dirty_pages() == 1
    # Only one page dirty: a flush that needs 2 waits, one that needs 0 flushes.
    assert q.flush(least_pages=2) == 0
    assert q.flushed_offset() == 0
    assert q.flush(least_pages=0) == PAGE_BYTES + 10
    assert mf.flushed_pos == PAGE_BYTES + 10 and mf.dirty_pages() == 0
    mf.append(b"b" * (3 * PAGE_BYTES))
    assert q.flush(least_pages=3) == 4 * PAGE_BYTES + 10
    q.close()


def test_mapped_file_rejects_a_wrong_size_and_creates_full_size(tmp_path):
    path = tmp_path / file_name(0)
    mf = MappedFile(str(path), FILE_BYTES, create=True)
    assert os.path.getsize(path) == FILE_BYTES and mf.wrote_pos == 0 and not mf.is_full()
    assert mf.append(b"abc") == 0 and mf.append(b"de") == 3
    assert mf.wrote_pos == 5 and bytes(mf.mm[:5]) == b"abcde"
    mf.zero_from(2)
    assert bytes(mf.mm[:5]) == b"ab\0\0\0"
    mf.close()
    with pytest.raises(ValueError):
        MappedFile(str(path), 2 * FILE_BYTES)
    reopened = MappedFile(str(path), FILE_BYTES, writable=False)
    assert bytes(reopened.mm[:2]) == b"ab"
    reopened.close()
