"""After the whole broker was killed with a transient store pool: commit what its writer had appended
to the pool and published (acknowledged) but not yet committed to the file (the broker's supervisor
calls :func:`salvage_pool` at start, under the broker lock, before the stale segments it reads are
reclaimed). The writer's own restart salvages the same way (``store.transient_pool.salvage``)."""
from __future__ import annotations

import logging
import os

from ..errors import SegmentError
from ..live.runtime import BrokerRuntime
from ..live.state import BrokerState
from ..shm.segment import SHM_DIR
from ..store.mapped_file_queue import MappedFileQueue
from ..store.transient_pool import TransientStorePool, salvage

log = logging.getLogger("hostmq.broker.supervisor")


def salvage_pool(rt: BrokerRuntime) -> int:
    """After the whole broker was killed: commit what its writer had appended to the transient store
    pool and published (acknowledged) but not yet committed to the file. The pool's segments and the
    dead broker's state segment outlive the processes in /dev/shm; the state says the range
    ``[committed_pos, write_pos)``. Returns the bytes salvaged. The caller holds the broker lock."""
    try:
        old = BrokerState.attach(rt.state_name, readonly=True)
    except SegmentError as e:       # a clean stop, a first start — or someone unlinked a killed broker's state
        log.info("broker %s: no pool to salvage: no state segment of a previous run (%s)", rt.name, e)
        return 0
    pool = mfq = None
    try:
        committed, write = old.get("committed_pos"), old.get("write_pos")
        names = []
        while write > committed and _segment_exists(rt.shm("pool", len(names))):
            names.append(rt.shm("pool", len(names)))
        if write <= committed:
            log.debug("broker %s: no pool to salvage: its previous run had committed all it wrote (%d)",
                     rt.name, committed)
            return 0
        if not names:
            log.error("broker %s: the previous run wrote [%d, %d) and did not commit it, and its transient "
                      "store pool segments are gone", rt.name, committed, write)
            return 0
        if old.owner_alive():
            log.error("broker %s: the previous run wrote [%d, %d) and did not commit it, and its process "
                      "(pid %d) still runs: nothing salvaged", rt.name, committed, write, old.segment.info().owner_pid)
            return 0
        pool = TransientStorePool(old.commitlog_file_bytes, len(names), segment_names=names, lock=False)
        mfq = MappedFileQueue(os.path.join(rt.store_dir, "commitlog"), old.commitlog_file_bytes)
        mfq.load()
        end = salvage(pool, mfq, committed, write)
        mfq.flush()
        if end > committed:
            log.warning("broker %s: committed %d acknowledged bytes the killed broker had left in its "
                        "transient store pool", rt.name, end - committed)
        return end - committed
    finally:
        if mfq is not None:
            mfq.close()
        if pool is not None:
            pool.close()
        old.close()


def _segment_exists(name: str) -> bool:
    return os.path.exists(os.path.join(SHM_DIR, name.lstrip("/")))
