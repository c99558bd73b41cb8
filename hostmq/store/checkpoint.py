"""``store/checkpoint``: how far the store is known to be durable (RocketMQ StoreCheckpoint).

One 4 KiB file holding ``records.CHECKPOINT`` (timestamps, flushed and dispatched physical offsets
and a CRC). Written in place with ``pwrite`` + ``fsync`` by the one process that flushes; a torn
write fails the CRC and is treated as "no checkpoint" (recovery then scans from the commitlog start).
"""
from __future__ import annotations

import os

from .. import records as R
from ..fsutil import open_file
from ..errors import CorruptRecordError

EMPTY = R.Checkpoint(0, 0, 0, 0, 0, 0, 0, 0)


class StoreCheckpoint:
    def __init__(self, path: str) -> None:
        self.path = path
        self.value = EMPTY
        self.valid = False

    def load(self) -> R.Checkpoint:
        """Read the file; a missing or corrupt one gives EMPTY and ``valid = False``."""
        try:
            with open(self.path, "rb") as f:
                self.value = R.decode_checkpoint(f.read(R.CHECKPOINT.size))
            self.valid = True
        except (OSError, CorruptRecordError):
            self.value, self.valid = EMPTY, False
        return self.value

    def update(self, **fields: int) -> None:
        self.value = self.value._replace(**fields)

    def flush(self) -> None:
        data = R.encode_checkpoint(self.value).ljust(R.CHECKPOINT_FILE_BYTES, b"\0")
        fd = open_file(self.path)
        try:
            os.pwrite(fd, data, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.valid = True
