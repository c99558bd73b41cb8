"""DONTNEED for commitlog files behind the slowest consumer (``store.madvise_dontneed_consumed``).

Every ``consumed_check_interval_s`` the broker's control loop finds the commitlog offset that every
consumer group has read past — the minimum, over each group's committed offset in each queue that
still has messages after it, of the commitlog offset of that message — and publishes it as
``consumed_below_pos`` in the broker state. Each process that maps commitlog files (writer,
dispatcher, the control loop's reader, consumers' views) gives ``MADV_DONTNEED`` to the files that end
before it, dropping its page-table entries; the control loop then asks the kernel to drop those
files' pages from the page cache (``POSIX_FADV_DONTNEED``, which skips pages still mapped somewhere,
so a page goes once the last mapper let go — at the latest one interval later). The newest file is
never dropped, and a group that reads again (backtracking) simply faults the pages back in.
"""
from __future__ import annotations

import os

from ..store.mapped_file import file_name


def slowest_phys(group_offsets: dict[str, dict[tuple[str, int], int]], position, end_phys: int) -> int | None:
    """The commitlog offset every group has read past. ``position(topic, queue_id, offset)`` is the
    commitlog offset of the message at a queue offset, or None if the queue has nothing from that
    offset on (caught up); ``end_phys`` is where the log ends. None if no group has an offset:
    nothing is known to be consumed."""
    lowest = None
    for offsets in group_offsets.values():
        for (topic, queue_id), offset in offsets.items():
            p = position(topic, queue_id, offset)
            p = end_phys if p is None else p
            lowest = p if lowest is None else min(lowest, p)
    return lowest


def evict_before(commitlog_dir: str, file_starts: list[int], file_bytes: int, phys: int) -> list[str]:
    """``POSIX_FADV_DONTNEED`` on the commitlog files ending at or before ``phys`` (not the newest)."""
    done = []
    for start in sorted(file_starts)[:-1]:
        if start + file_bytes > phys:
            break
        path = os.path.join(commitlog_dir, file_name(start))
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue                    # deleted by retention meanwhile
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        done.append(file_name(start))
    return done


def publish_and_drop(reader, group_offsets: dict[str, dict[tuple[str, int], int]], state) -> None:
    """One check (the broker's timer): publish ``consumed_below_pos`` in ``state`` and drop the
    commitlog files before it from ``reader``'s maps and from the page cache."""
    reader.refresh()

    def position(topic: str, queue_id: int, offset: int) -> int | None:
        cq = reader.queues.get((topic, queue_id))
        if cq is None or offset >= reader.max_offset(topic, queue_id):
            return None
        if offset < cq.min_offset():
            return reader.commitlog.min_offset()
        e = cq.entry(offset)
        return e[0] if e is not None else reader.commitlog.min_offset()

    below = slowest_phys(group_offsets, position, reader.readable_end)
    if below is None or below <= 0:
        return
    state.set("consumed_below_pos", below)
    mfq = reader.commitlog.mfq
    mfq.drop_below(below)
    evict_before(mfq.directory, [mf.file_from_offset for mf in mfq.files], mfq.file_bytes, below)
