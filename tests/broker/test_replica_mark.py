"""``store/replica.pos`` (``broker/replica_mark.py``): a slave's replica keeps what its master held and
the last record it appended across restarts; the handshake's walk to the log's last record starts
there when the mark still matches the log, and from the last file's start when it does not. The
replica is driven without spawning, on a real store and a real state segment."""
from __future__ import annotations

import contextlib
import os
from types import SimpleNamespace

import pytest

from hostmq import Message
from hostmq.broker.replica import Replica
from hostmq.broker.replica_mark import ReplicaMark
from hostmq.live.runtime import BrokerRuntime
from hostmq.live.state import BrokerState
from hostmq.config import Config
from hostmq.protocol import ha as P
from hostmq.store import MessageStore

pytestmark = pytest.mark.timeout(60)
FILE_BYTES = 1 << 20
CFG = Config().with_overrides({"broker": {"role": "SLAVE"}, "store": {"commitlog_file_bytes": FILE_BYTES}})


def _fill(store_dir: str, n: int) -> tuple[int, int]:
    """``n`` records in a store; (where the last one starts, where the log ends)."""
    with MessageStore(store_dir, config={"commitlog_file_bytes": FILE_BYTES}) as s:
        rs = [s.put(Message("marked", b"%05d" % i + b"." * 95)) for i in range(n)]
        return rs[-1].phys_offset, s.commitlog.max_offset()


@contextlib.contextmanager
def _replica(rt: BrokerRuntime, end: int):
    st = BrokerState.create(rt.state_name, store_host=b"\0" * 8, commitlog_file_bytes=FILE_BYTES,
                            consume_queue_file_entries=1000, index_slots=101, index_entries=400, sync_flush=False,
                            start_pos=end, last_store_ts_ms=0, slave=True, registered_id=1)
    r = None
    try:
        r = Replica(rt)
        yield r
    finally:
        if r is not None:
            r.close()
        st.close()
        st.unlink()


def _counting_walk(r: Replica) -> list[int]:
    """The offsets the handshake's walk looks at (``Replica._checkpoint`` calls)."""
    seen, real = [], r._checkpoint

    def counted(phys):
        seen.append(phys)
        return real(phys)
    r._checkpoint = counted
    return seen


def test_the_walk_to_the_last_record_starts_at_the_mark_when_it_still_matches(tmp_path):
    rt = BrokerRuntime(str(tmp_path), "broker-a", 1, CFG)
    last, end = _fill(rt.store_dir, 3000)
    with _replica(rt, end) as r:
        seen = _counting_walk(r)
        walked = r.checkpoints()
        assert walked[-1][0] == last and walked[-1][0] + walked[-1][1] == end
        assert len(seen) > 3000                     # no mark yet: the whole file
        rec = walked[-1]
        back = next(c for c in reversed(seen) if c < last - 50 * rec[1])     # a record 50 back
        r.mark.set_last_record(*r._checkpoint(back))
        seen.clear()
        from_mark = r.checkpoints()
        assert from_mark[-1] == walked[-1] and len(seen) < 60       # the same last record, 50 steps
        assert set(from_mark) <= set(walked) | {r.mark.last_record()}
        for stale in ((back, rec[1], rec[2] ^ 1), (back + 1, rec[1], rec[2]), (end + 100, 10, 0)):
            r.mark.set_last_record(*stale)          # torn, not a record start, past the end: walk it all
            seen.clear()
            assert r.checkpoints() == walked and len(seen) > 3000


def test_appended_records_move_the_mark_and_what_the_master_held_survives_a_restart(tmp_path):
    master_dir = str(tmp_path / "master")
    last, end = _fill(master_dir, 500)
    with open(f"{master_dir}/commitlog/{0:020d}", "rb") as f:
        log = f.read(end)
    rt = BrokerRuntime(str(tmp_path / "root"), "broker-a", 1, CFG)
    with _replica(rt, 0) as r:
        r.pending += log[:len(log) - 7]             # a record cut short stays pending
        r._append_whole_records()
        assert r.end < end and r.mark.last_record()[0] + r.mark.last_record()[1] == r.end
        r.pending += log[len(log) - 7:]
        r._append_whole_records()
        assert r.end == end and r.mark.last_record() == (last, end - last, P.record_crc(log[last:]))
        r._master_end(end + 4096, exact=True)       # a BEAT: the master holds more than we do
    with _replica(rt, end) as r:                    # restarted while the master is down
        assert r.state.get("master_end_pos") == end + 4096
        assert r.checkpoints()[-1] == r.mark.last_record()
    mark = ReplicaMark(rt.store_dir)
    try:
        assert mark.master_end_pos == end + 4096
    finally:
        mark.close()


def test_a_version_0_mark_is_upgraded_and_the_fence_survives_a_restart(tmp_path):
    """replica.pos written before epochs (the first four words only) reads as: no epoch seen, nothing
    acknowledged; the epoch and the SYNC ack then persist, and a newer format is refused."""
    import numpy as np

    from hostmq import records as R
    from hostmq.errors import ConfigError
    path = tmp_path / R.REPLICA_MARK_FILE
    old = np.zeros(1, dtype=np.dtype([("master_end_pos", "i8"), ("last_phys", "i8"), ("last_size", "i8"),
                                      ("last_crc", "i8")]))
    old["master_end_pos"] = 12345
    path.write_bytes(old.tobytes() + bytes(R.REPLICA_MARK_FILE_BYTES - old.nbytes))
    mark = ReplicaMark(str(tmp_path))
    try:
        assert (mark.master_end_pos, mark.seen_epoch, mark.sync_acked) == (12345, -1, 0)
        mark.seen_epoch, mark.sync_acked = 3, 4096
    finally:
        mark.close()
    mark = ReplicaMark(str(tmp_path))
    try:
        assert (mark.master_end_pos, mark.seen_epoch, mark.sync_acked) == (12345, 3, 4096)
        mark._w["version"] = R.REPLICA_MARK_VERSION + 1
    finally:
        mark.close()
    with pytest.raises(ConfigError, match="version"):
        ReplicaMark(str(tmp_path))


def test_an_old_master_rejoining_is_cut_where_the_logs_part_not_below_what_it_acknowledged(tmp_path):
    """Fault replay of master:promote (seed 485, trial 8): an old master restarted with 547 bytes the
    promoted slave never got, and had acknowledged up to 5438142 to a SYNC_MASTER earlier; its HELLO
    named only its last record and its files' first records, so the new master agreed at the last
    file's first record and asked for a cut of 338,674 bytes — below what it had acknowledged, which
    the slave rightly refuses, and it could never rejoin. The HELLO now also names the record at
    ``sync_acked`` and a record per 64 KiB of the walk: the cut lands where the logs part."""
    master_dir = str(tmp_path / "master")
    _, master_end = _fill(master_dir, 3000)
    with open(f"{master_dir}/commitlog/{0:020d}", "rb") as f:
        log = f.read(master_end)
    rt = BrokerRuntime(str(tmp_path / "root"), "broker-a", 1, CFG)
    sizes = []                                      # record ends, from the records' own sizes
    phys = 0
    while phys < master_end:
        size = int.from_bytes(log[phys:phys + 4], "big")
        phys += size
        sizes.append(phys)
    parted = sizes[1999]                            # both hold records 0..1999 alike
    os.makedirs(f"{rt.store_dir}/commitlog", exist_ok=True)
    with open(f"{rt.store_dir}/commitlog/{0:020d}", "wb") as f:
        f.write(log[:parted])
        f.truncate(FILE_BYTES)
    with MessageStore(rt.store_dir, config={"commitlog_file_bytes": FILE_BYTES}) as s:
        for i in range(800):                        # its own tail, never replicated
            s.put(Message("marked", b"own-%05d" % i + b"-" * 91))
        end = s.commitlog.max_offset()
    acked = sizes[1500]

    def record_at(phys: int, size: int):
        return log[phys:phys + size] if phys + size <= master_end else None

    with _replica(rt, end) as r:
        r.mark.sync_acked = acked
        cps = r.checkpoints()
        assert len(cps) <= P.MAX_CHECKPOINTS and cps == tuple(sorted(cps))
        start, cut = P.agreed_start(SimpleNamespace(end=end, checkpoints=cps), master_end, 0, record_at)
        assert cut is not None and acked < cut == start <= parted
        assert parted - cut <= (64 << 10) + 4096    # within one step of where the logs part
        r.mark.sync_acked = 0                       # without the acked record: the walk's samples
        start, cut = P.agreed_start(SimpleNamespace(end=end, checkpoints=r.checkpoints()), master_end, 0,
                                    record_at)
        assert acked < cut <= parted
