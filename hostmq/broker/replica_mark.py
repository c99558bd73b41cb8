"""What a slave remembers of its replication across restarts: ``store/replica.pos``
(``records.REPLICA_MARK``), mapped by the replica (the slave's writer), its only writer.

* ``master_end_pos``: the master's commitlog end as last heard. The state segment's word of the
  same name starts from it, so a slave restarted while its master is down still knows what the
  master held, and ``hostmq ha promote`` can refuse a slave that lacks some of it.
* the last record the replica appended (offset, size, CRC32): the handshake names the log's last
  record (``Replica.checkpoints``), and records have no back links — without a known record near the
  end it walks the whole last file (a 1 GiB file of small records: seconds per connection).

Stores are plain memory stores (no fsync); every value is a hint, checked against the log before use.
"""
from __future__ import annotations

import mmap
import os

import numpy as np

from .. import records as R
from ..fsutil import open_file


class ReplicaMark:
    def __init__(self, store_dir: str) -> None:
        fd = open_file(os.path.join(store_dir, R.REPLICA_MARK_FILE), os.O_RDWR | os.O_CREAT)
        try:
            if os.fstat(fd).st_size < R.REPLICA_MARK_FILE_BYTES:
                os.ftruncate(fd, R.REPLICA_MARK_FILE_BYTES)
            self._mm = mmap.mmap(fd, R.REPLICA_MARK_FILE_BYTES)
        finally:
            os.close(fd)
        self._w = np.frombuffer(self._mm, dtype=R.REPLICA_MARK, count=1)

    @property
    def master_end_pos(self) -> int:
        return max(0, int(self._w["master_end_pos"][0]))

    @master_end_pos.setter
    def master_end_pos(self, value: int) -> None:
        self._w["master_end_pos"] = value

    def last_record(self) -> tuple[int, int, int] | None:
        """(offset, size, CRC32) of the last record appended, None when never set (or torn)."""
        w = self._w[0]
        phys, size, crc = int(w["last_phys"]), int(w["last_size"]), int(w["last_crc"])
        return (phys, size, crc) if phys >= 0 and size > 0 and 0 <= crc <= 0xFFFFFFFF else None

    def set_last_record(self, phys: int, size: int, crc: int) -> None:
        # A reader after a kill between these stores finds a triple no record matches: it walks.
        w = self._w
        w["last_phys"], w["last_size"], w["last_crc"] = phys, size, crc

    def close(self) -> None:
        del self._w
        self._mm.close()
