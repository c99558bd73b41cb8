"""Cutting a slave's commitlog where its master's ends (README "Replication"): the replica found, at
the handshake, that this slave holds records its master does not (it was ahead of a master that lost
a tail, or it is an old master rejoining the slave promoted over it) and left ``store/truncate_to``;
the broker's next run cuts there before recovery — which then drops the consume-queue entries past
the cut — and keeps the records it cut in ``store/cut-FROM-TO.bin``."""
from __future__ import annotations

import logging
import os

from .. import records as R
from ..errors import ConfigError, CorruptRecordError
from ..fsutil import fsync_dir, open_file
from ..jsonfile import read_json
from ..store.mapped_file_queue import MappedFileQueue
from ..store.meta import effective_config
from .replica import TRUNCATE_MARKER
from ..live.runtime import BrokerRuntime

log = logging.getLogger(__name__)


def apply_truncate_marker(rt: BrokerRuntime) -> int | None:
    """A slave's replica left ``store/truncate_to`` (it held bytes its master does not): cut the
    commitlog there now, before recovery. Returns the offset cut at, None if there was nothing to do."""
    path = os.path.join(rt.store_dir, TRUNCATE_MARKER)
    marker = read_json(path, default=None)
    if marker is None:
        return None
    offset = marker.get("offset") if isinstance(marker, dict) else None
    if type(offset) is not int or offset < 0:
        raise ConfigError(f"{path} does not name an offset: {marker!r}")
    cfg = effective_config(rt.store_dir, rt.config.store, record=False)
    mfq = MappedFileQueue(os.path.join(rt.store_dir, "commitlog"), cfg.commitlog_file_bytes)
    try:
        mfq.load()
        kept, end = keep_cut_records(mfq, offset, rt.store_dir)
        mfq.truncate(offset)
        mfq.flush()
    finally:
        mfq.close()
    for p in (path, path + ".bak"):
        if os.path.exists(p):
            os.unlink(p)
    fsync_dir(rt.store_dir)
    log.warning("broker %s: cut the commitlog at %d: its master does not hold the %d bytes of records after it "
                "(up to %d)%s", rt.instance, offset, end - offset, end, f", kept in {kept}" if kept else "")
    return offset


def keep_cut_records(mfq: MappedFileQueue, offset: int, store_dir: str) -> tuple[str | None, int]:
    """Copy the whole records from ``offset`` on (until the first byte that is not one) to
    ``store/cut-FROM-TO.bin`` before a cut: acknowledged messages of an ASYNC_MASTER that never
    reached the slave promoted over it are then still on disk for an operator (``hostmq query``
    can't see them; the bytes are commitlog records, ``records.check_stored_record`` reads them).
    Returns (the file, None if there was nothing, and where the records ended)."""
    phys, name, fd = offset, None, None
    try:
        while True:
            mf = mfq.find(phys)
            if mf is None:
                break
            rel = phys - mf.file_from_offset
            try:
                kind, total = R.check_stored_record(mf.mm, rel, mfq.file_bytes, phys, False)
            except CorruptRecordError:
                break
            if kind != R.RecordKind.MESSAGE:    # an end-of-file blank: the records go on in the next file
                phys = mf.file_end_offset
                continue
            if fd is None:
                name = os.path.join(store_dir, f"cut-{offset}.bin.tmp")
                fd = open_file(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.write(fd, mf.mm[rel:rel + total])
            phys += total
        if fd is None:
            return None, offset
        os.fsync(fd)
    finally:
        if fd is not None:
            os.close(fd)
    final = os.path.join(store_dir, f"cut-{offset}-{phys}.bin")
    os.replace(name, final)
    return final, phys
