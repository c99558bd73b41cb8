"""What a slave remembers of its replication across restarts: ``store/replica.pos``
(``records.REPLICA_MARK``), mapped by the replica (the slave's writer), its only writer.

* ``master_end_pos``: the master's commitlog end as last heard. The state segment's word of the
  same name starts from it, so a slave restarted while its master is down still knows what the
  master held, and ``hostmq ha promote`` can refuse a slave that lacks some of it.
* the last record the replica appended (offset, size, CRC32): the handshake names the log's last
  record (``Replica.checkpoints``), and records have no back links — without a known record near the
  end it walks the whole last file (a 1 GiB file of small records: seconds per connection).
* ``seen_epoch`` (version ≥ 1): the newest epoch of a master this slave followed (-1: none). A master
  of an older epoch is refused, and a cut of the log is taken only from a strictly newer one
  (issue 27: fencing).
* ``sync_acked`` (version ≥ 1): the highest end this slave reported to a SYNC_MASTER — what that
  master may have answered SEND_OK for. The slave never cuts below it without the operator's
  ``[ha] accept_cut``.

Layout ``records.REPLICA_MARK`` in a 4 KiB file, ``version`` = ``records.REPLICA_MARK_VERSION``; a
version-0 file (the first four words only) is upgraded in place with no epoch seen and nothing
acknowledged. The hints are plain memory stores (no fsync); ``seen_epoch`` and ``sync_acked`` are
written before the act they guard (the REPORT, following a master) and survive a killed process;
``seen_epoch`` is also msync'ed when it changes (rare), every value is checked against the log.
"""
from __future__ import annotations

import mmap
import os

import numpy as np

from .. import records as R
from ..errors import ConfigError
from ..fsutil import open_file


class ReplicaMark:
    def __init__(self, store_dir: str) -> None:
        path = os.path.join(store_dir, R.REPLICA_MARK_FILE)
        fd = open_file(path, os.O_RDWR | os.O_CREAT)
        try:
            if os.fstat(fd).st_size < R.REPLICA_MARK_FILE_BYTES:
                os.ftruncate(fd, R.REPLICA_MARK_FILE_BYTES)
            self._mm = mmap.mmap(fd, R.REPLICA_MARK_FILE_BYTES)
        finally:
            os.close(fd)
        self._w = np.frombuffer(self._mm, dtype=R.REPLICA_MARK, count=1)
        version = int(self._w["version"][0])
        if version == 0:                # written before epochs: nothing seen, nothing acknowledged
            self._w["seen_epoch"], self._w["sync_acked"] = -1, 0
            self._w["version"] = R.REPLICA_MARK_VERSION
        elif version != R.REPLICA_MARK_VERSION:
            raise ConfigError(f"{path} is of version {version}; this hostmq reads version "
                              f"{R.REPLICA_MARK_VERSION} (a newer hostmq wrote it)")

    @property
    def seen_epoch(self) -> int:
        return max(-1, int(self._w["seen_epoch"][0]))

    @seen_epoch.setter
    def seen_epoch(self, value: int) -> None:
        if value != self.seen_epoch:
            self._w["seen_epoch"] = value
            self._mm.flush()

    @property
    def sync_acked(self) -> int:
        return max(0, int(self._w["sync_acked"][0]))

    @sync_acked.setter
    def sync_acked(self, value: int) -> None:
        self._w["sync_acked"] = value

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
