"""A slave's writer (RocketMQ's HAClient): the one appender of a slave's commitlog, fed by its master.

A slave broker (id ≥ 1, ``broker.role = SLAVE``) runs this in place of the writer: producers never
send to a slave. It connects to the master's replication listener (``broker.ha_master``, else the HA
address the NameServers gave the broker at registration, ``master.json`` in the slave's directory),
says how far its log goes (HELLO, with a few records it holds), and appends what the master streams
— byte for byte: records keep the master's offsets, store times and ids, so the slave's commitlog is
identical to the master's up to its end, and its own dispatcher builds its consume queues and index
from it.

Every DATA byte is input from the network: records are cut out of the stream only whole, each is
checked with the stored-record codec (CRC, sizes, its PHYSICALOFFSET is where it lands, it fits its
file) before it is appended, and a stream that does not continue the log ends the connection. After
each batch the new end is published (``write_pos``), the dispatcher woken and the end REPORTed to
the master (one ack covers everything below it: SYNC_MASTER). A master that says the slave must cut
its log first (the slave holds bytes the master lost) gets a marker file ``store/truncate_to`` and an
exit with ``EXIT_TRUNCATE``: the broker starts again in the same process, which cuts the log there
before recovery (which then drops the consume-queue entries past it).
"""
from __future__ import annotations

import logging
import os
import socket
import time

import orjson

from .. import records as R
from ..errors import (ConfigError, ConnectError, CorruptRecordError, FencedError, HostMQError, ProtocolError,
                      ValidationError)
from ..jsonfile import read_json, write_json
from ..protocol import ha as P
from ..protocol import ha_auth as A
from ..shm.signal import notify_if_waiting
from ..store.commitlog import CommitLog
from .ha_link import link_endpoint, parse_tcp, replication_secret, tls_context
from .replica_mark import ReplicaMark
from .offsets import OFFSETS_FILE, SLAVE_COMMITS, parse_offset_table, table_dict
from ..live.runtime import BrokerRuntime
from ..live.state import BrokerState

log = logging.getLogger(__name__)

_W = R.STATE_WORD
W_WRITE_POS, W_COMMITTED_POS, W_HEARTBEAT = _W["write_pos"], _W["committed_pos"], _W["writer_heartbeat_ms"]
EXIT_TRUNCATE = 3                   # the broker must restart to cut its log (store/truncate_to)
TRUNCATE_MARKER = "truncate_to"
META_FILE = "master-meta.json"      # the master's topics and offsets, as its last META said
META_KEYS = ("topics", "consumer_offsets", "delay_offsets")
MASTER_FILE = "master.json"         # the master's HA address as the NameServers gave it (broker/supervisor.py)
CONNECT_TIMEOUT_S = 5.0
RETRY_S = 1.0
FENCED_RETRY_S = 5.0                # a refused master (older epoch, refused cut) is asked again this rarely
ADDRESS_POLL_S = 0.1                # how often master.json is looked for before the first registration answer
TORN_TAIL_BYTES = 8 << 20          # what one append may have left past the end (a receive and a record)
CHECKPOINT_FILES = 8                # HELLO names the first record of this many last files (and the last record)
CHECKPOINT_STEP_BYTES = 64 << 10    # … and a record per this many bytes of its walk to the last record
CHECKPOINT_WALKED = 48              # … the last this many of those (8 + 48 + 3 ≤ protocol.ha.MAX_CHECKPOINTS)
_HEADER = R.SIZE_MAGIC              # TOTALSIZE, MAGICCODE
STREAM_KINDS = frozenset((P.DATA, P.BEAT, P.META))   # what a master sends after its WELCOME


class MustTruncate(Exception):
    def __init__(self, offset: int) -> None:
        super().__init__(offset)
        self.offset = offset


class Replica:
    """The slave writer's state and loop body, usable without spawning."""

    def __init__(self, rt: BrokerRuntime) -> None:
        self.rt = rt
        cfg = rt.config
        self.heartbeat_s, self.housekeeping_s = cfg.broker.ha_heartbeat_interval_s, cfg.broker.ha_housekeeping_s
        self.state = BrokerState.attach(rt.state_name)
        self.file_bytes = self.state.commitlog_file_bytes
        # A record longer than this slave accepts is refused before it is buffered (a master with
        # larger limits than its slave stops replication, and says why, rather than fill memory).
        self.max_record_bytes = R.record_size(cfg.store.max_message_bytes, R.MAX_TOPIC_CHARS,
                                              cfg.store.max_properties_bytes)
        self.cl = CommitLog(rt.store_dir, self.file_bytes, store_host=self.state.store_host,
                            warm=cfg.store.warm_mapped_file, advice=cfg.store.commitlog_advice)
        self.cl.mfq.load()
        self.end = int(self.state.w[W_WRITE_POS])
        self.cl.continue_at(self.end, TORN_TAIL_BYTES)
        self.pending = bytearray()          # received bytes after ``end`` that do not make a whole record yet
        self.skip_to = 0                    # after a blank record: the rest of its file is not data
        self.sock: socket.socket | None = None
        self.reader = P.FrameReader(STREAM_KINDS)
        self.sealer: A.Sealer | None = None         # tags this slave's frames after the handshake
        self.sync_master = False                    # the master said it is a SYNC_MASTER
        self.last_read_s = self.last_report_s = 0.0
        self.state.set("replica_connected", 0)     # a killed predecessor may have left it set
        # What the master held survives a restart of this slave (a promotion compares it).
        self.mark = ReplicaMark(rt.store_dir)
        if self.mark.sync_acked > self.end:         # cut with [ha] accept_cut, or lost on disk
            log.warning("replica: this slave acknowledged up to %d to a SYNC_MASTER, its log ends at %d",
                        self.mark.sync_acked, self.end)
            self.mark.sync_acked = self.end
        self.state.set("master_end_pos", max(self.state.get("master_end_pos"), self.mark.master_end_pos))
        self.state.set("writer_pid", os.getpid())

    # -- connecting -----------------------------------------------------------------------------------
    def master_address(self) -> str | None:
        if self.rt.config.broker.ha_master:
            return self.rt.config.broker.ha_master
        d = read_json(os.path.join(self.rt.broker_dir, MASTER_FILE), default=None)
        return d.get("ha_address") if isinstance(d, dict) and d.get("ha_address") else None

    def checkpoints(self) -> tuple[tuple[int, int, int], ...]:
        """Where this log can be compared (the master keeps it up to the highest one it holds alike):
        the first record of each of the last files; the records the walk to the last record passes,
        one per ``CHECKPOINT_STEP_BYTES`` (a slave that was ahead — an old master rejoining — is cut
        near where the logs part, not at its last file's first record); the record at the end this
        slave acknowledged to a SYNC_MASTER (``sync_acked``: what that master held, so a newer master
        that holds it too is not asked to cut below it); and the last record."""
        out = []
        files = self.cl.mfq.files
        for mf in files[-CHECKPOINT_FILES:]:
            cp = self._checkpoint(mf.file_from_offset)
            if cp is not None:
                out.append(cp)
        acked = self._checkpoint(self.mark.sync_acked) if self.mark.sync_acked else None
        if acked is not None:
            out.append(acked)
        if files:       # the last record: walk the last file (records have no back links) — from
            phys, last = files[-1].file_from_offset, None    # the last one appended, if it still is
            known = self.mark.last_record()
            if known is not None and phys <= known[0] < self.end and self._checkpoint(known[0]) == known:
                last, phys = known, known[0] + known[1]
                out.append(known)
            passed, step_end = [], phys + CHECKPOINT_STEP_BYTES
            while phys < self.end:
                cp = self._checkpoint(phys)
                if cp is None:
                    break
                if phys >= step_end:
                    passed.append(cp)
                    step_end = phys + CHECKPOINT_STEP_BYTES
                last, phys = cp, phys + cp[1]
            out += passed[-CHECKPOINT_WALKED:]
            if last is not None and last[0] + last[1] == self.end:
                out.append(last)
        return tuple(sorted(dict.fromkeys(out)))[-P.MAX_CHECKPOINTS:]

    def _checkpoint(self, phys: int) -> tuple[int, int, int] | None:
        mf = self.cl.mfq.find(phys)
        if mf is None or phys >= self.end:
            return None
        rel = phys - mf.file_from_offset
        try:
            kind, total = R.check_stored_record(mf.mm, rel, self.file_bytes, phys, False)
        except CorruptRecordError:
            return None
        if kind != R.RecordKind.MESSAGE or phys + total > self.end:
            return None
        return phys, total, P.record_crc(mf.mm[rel:rel + total])

    def connect(self, address: str) -> None:
        # Before connecting: the walk to the last record may take seconds, and the master gives an
        # unauthenticated connection [ha] handshake_timeout_s for its whole HELLO.
        checkpoints = self.checkpoints()
        sock = socket.create_connection(parse_tcp(address), timeout=CONNECT_TIMEOUT_S)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            tls = tls_context(self.rt, server_side=False)
            if tls is not None:
                sock = tls.wrap_socket(sock)        # mutual: both certificates checked against [ha] tls_ca
            reader, w = self._handshake(sock, address, checkpoints)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        sock.setblocking(True)
        self.sock, self.reader = sock, reader
        self.state.set("replica_connected", 1)
        self.pending.clear()
        self.skip_to = 0
        self.last_read_s = self.last_report_s = time.monotonic()
        log.info("replica: replicating from %s from offset %d (the master is at %d, epoch %d%s)", address, self.end,
                 w.master_end, w.epoch, ", over TLS" if tls is not None else "")
        while (f := reader.next()) is not None:     # DATA that came with the WELCOME
            self._handle(f)

    def _handshake(self, sock: socket.socket, address: str,
                   checkpoints: tuple[tuple[int, int, int], ...]) -> tuple[P.FrameReader, P.Welcome]:
        """CHALLENGE, HELLO, WELCOME — and nothing of the master's is acted on before its proof is
        checked. Returns the reader (now checking tags) and the WELCOME; raises MustTruncate."""
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        ep = link_endpoint(sock, "slave", self.rt)
        reader = P.FrameReader(frozenset((P.CHALLENGE,)))
        challenge = _next_frame(sock, reader, deadline, address).body
        secret = replication_secret(self.rt.paths.ha_secret, create=False)
        if secret is None:
            raise ConnectError(f"no replication secret at {self.rt.paths.ha_secret}: copy the master root's "
                               f"ha.secret there")
        nonce, fence, name = os.urandom(A.NONCE_BYTES), self.fence(), self.rt.name
        sock.sendall(P.Hello(self.end, self.file_bytes, checkpoints, nonce, fence, ep,
                             A.proof(secret, A.SLAVE_LABEL, challenge, nonce, name, fence, ep)).encode())
        reader.accept = frozenset((P.WELCOME,))
        w = P.Welcome.decode(_next_frame(sock, reader, deadline, address))
        if not A.proof_ok(secret, w.auth, A.MASTER_LABEL, challenge, nonce, name, w.epoch, ep):
            raise A.FrameAuthError(f"the master at {address} did not prove this root's ha.secret: its WELCOME is "
                                   f"ignored (a forged master, or a relay)")
        keys = A.session_keys(secret, challenge, nonce, name)
        reader.accept, reader.opener = STREAM_KINDS, A.Opener(keys["master"])
        self.sealer = A.Sealer(keys["slave"])
        self._follow(w, address)
        self._master_end(w.master_end, exact=True)
        if w.start != self.end:
            raise ProtocolError(f"the master streams from {w.start}, this log ends at {self.end} "
                                f"(a slave starts empty or from a copy of the master's store)")
        self._carry_back_offsets(sock)
        return reader, w

    def fence(self) -> int:
        """The oldest master epoch this slave follows: the newest it followed, or its own role's."""
        return max(self.mark.seen_epoch, self.rt.epoch)

    def _follow(self, w: P.Welcome, address: str) -> None:
        """Fencing by epoch (``follow_decision``), once the master proved the secret."""
        cut = follow_decision(w.epoch, w.truncate_to, self.end, self.mark.seen_epoch, self.mark.sync_acked,
                              self.rt.epoch, self.rt.config.ha.accept_cut, address)
        if cut is not None:
            raise MustTruncate(cut)
        self.mark.seen_epoch = w.epoch
        self.sync_master = w.sync

    def _carry_back_offsets(self, sock: socket.socket) -> None:
        """Send the master what consumers committed here while it was down (``slave_commits`` of this
        broker's offsets file, which its control loop writes); the master takes each where it is
        ahead, and its next META tells this broker which ones it has."""
        try:
            data = read_json(self.rt.config_file(OFFSETS_FILE), default=None)
        except ConfigError as e:
            log.warning("replica: the offsets committed here are not carried back: %s", e)
            return
        commits = parse_offset_table(data, SLAVE_COMMITS)
        if commits:
            body = orjson.dumps({"offset_table": table_dict(commits)})
            if len(body) > P.MAX_OFFSETS_BYTES:
                log.warning("replica: %d offsets committed here are too many to carry back", len(commits))
                return
            sock.sendall(P.encode(P.OFFSETS, 0, body, self.sealer))
            log.info("replica: carried %d consumer offsets committed here back to the master", len(commits))

    def disconnect(self, why: str) -> None:
        if self.sock is not None:
            log.warning("replica: connection to the master ended: %s", why)
            self.state.set("replica_connected", 0)
            self.sock.close()
            self.sock = None

    # -- receiving --------------------------------------------------------------------------------------
    def receive(self, timeout_s: float) -> int:
        """Read what the master sent within ``timeout_s``; returns bytes appended."""
        self.sock.settimeout(timeout_s)
        try:
            data = self.sock.recv(1 << 20)
        except socket.timeout:
            data = None
        now = time.monotonic()
        if data == b"":
            raise ConnectError("the master closed the connection")
        before = self.end
        if data:
            self.last_read_s = now
            for f in self.reader.feed(data):
                self._handle(f)
        elif now - self.last_read_s > self.housekeeping_s:
            raise ConnectError(f"the master was silent for {self.housekeeping_s:.0f} s")
        if self.end != before or now - self.last_report_s >= self.heartbeat_s:
            if self.sync_master and self.end > self.mark.sync_acked:
                self.mark.sync_acked = self.end     # before the ack: a SYNC_MASTER may answer SEND_OK on it
            self.sock.sendall(P.encode(P.REPORT, self.end, b"", self.sealer))
            self.last_report_s = now
        return self.end - before

    def _handle(self, f: P.Frame) -> None:
        if f.kind == P.DATA:
            expected = self.end + len(self.pending)
            if f.offset != expected:
                raise ProtocolError(f"DATA at {f.offset}, expected {expected}")
            self.pending += f.body
            self._append_whole_records()
            self._master_end(f.offset + len(f.body))
        elif f.kind == P.BEAT:
            epoch = P.beat_epoch(f)
            if epoch != self.mark.seen_epoch:
                raise FencedError(f"a BEAT of epoch {epoch} from a master that proved epoch {self.mark.seen_epoch}",
                                  epoch, self.mark.seen_epoch)
            self._master_end(f.offset, exact=True)
        elif f.kind == P.META:
            self._store_meta(f.body)

    def _master_end(self, pos: int, exact: bool = False) -> None:
        """What the master holds: as it says (``exact``: WELCOME, BEAT), or at least past a DATA."""
        if not exact:
            pos = max(self.state.get("master_end_pos"), pos)
        self.state.set("master_end_pos", pos)
        self.mark.master_end_pos = pos

    def _store_meta(self, body: bytes) -> None:
        """The master's topics and offsets, kept for this slave's broker (its control loop is the
        owner of topics.json and the offsets: it applies ``master-meta.json`` when it changes)."""
        try:
            meta = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise ProtocolError("a META body that is not JSON") from None
        if not isinstance(meta, dict) or not all(isinstance(meta.get(k), (dict, type(None))) for k in META_KEYS):
            raise ProtocolError("a META body that is not {topics, consumer_offsets, delay_offsets}")
        write_json(os.path.join(self.rt.config_dir, META_FILE), {k: meta.get(k) for k in META_KEYS})

    def _append_whole_records(self) -> None:
        """Cut whole records out of ``pending``, check and append them; keep an incomplete tail."""
        buf, base = self.pending, self.end          # buf[0] is at commitlog offset ``base``
        rel = seg = 0                               # consumed / start of checked records not yet appended
        last = last_size = 0                        # the last message record in ``buf`` (size 0: none)
        while True:
            phys = base + rel
            if self.skip_to:                        # the rest of a padded file: zeros, never read
                rel += min(self.skip_to - phys, len(buf) - rel)
                seg = rel
                if base + rel < self.skip_to:
                    break
                self.skip_to = 0
                continue
            if len(buf) - rel < _HEADER.size:
                break
            total, magic = _HEADER.unpack_from(buf, rel)
            in_file = phys % self.file_bytes
            if magic == R.BLANK_MAGIC_CODE:
                if total != self.file_bytes - in_file:
                    raise ProtocolError(f"an end-of-file blank at {phys} of {total} bytes does not end its file")
                self._append(base + seg, buf[seg:rel])
                self.skip_to = self.cl.pad_stored(phys)
                seg = rel
                continue
            if total <= 0 or in_file + total + R.MIN_BLANK_BYTES > self.file_bytes:
                raise ProtocolError(f"a record at {phys} of {total} bytes cannot be in a commitlog file")
            if total > self.max_record_bytes:
                raise ProtocolError(f"a record at {phys} of {total} bytes is larger than this slave accepts "
                                    f"({self.max_record_bytes}: give it the master's store.max_message_bytes)")
            if len(buf) - rel < total:
                break                               # the rest of it comes in the next DATA frame
            try:
                kind, size = R.check_stored_record(buf, rel, rel + total, phys, True)
            except CorruptRecordError as e:
                raise ProtocolError(f"a broken record from the master at {phys}: {e}") from None
            if kind != R.RecordKind.MESSAGE or size != total:
                raise ProtocolError(f"a record at {phys} is not a message")
            last, last_size = rel, total
            rel += total
        self._append(base + seg, buf[seg:rel])
        if last_size:
            self.mark.set_last_record(base + last, last_size, P.record_crc(buf[last:last + last_size]))
        del buf[:rel]
        self.end = base + rel
        self._publish()

    def _append(self, phys: int, records: bytearray) -> None:
        if len(records):
            try:
                self.cl.append_stored(phys, records)
            except ValidationError as e:
                raise ProtocolError(str(e)) from None

    def _publish(self) -> None:
        """The log's end for readers: past a padded file's rest already (the blank says it is complete)."""
        end = max(self.end, self.cl.max_offset())
        w = self.state.w
        if w[W_WRITE_POS] != end:
            w[W_WRITE_POS] = end
            w[W_COMMITTED_POS] = end
            notify_if_waiting(self.state.dispatcher_waiting, self.state.dispatch_wake)

    def heartbeat(self) -> None:
        self.state.w[W_HEARTBEAT] = int(time.time() * 1000)

    def close(self) -> None:
        self.disconnect("the slave stops")
        self.mark.close()
        self.cl.close()
        self.state.close()


def _next_frame(sock: socket.socket, reader: P.FrameReader, deadline: float, address: str) -> P.Frame:
    """Read until the next whole frame arrived (the handshake), or fail."""
    while (f := reader.next()) is None:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        data = sock.recv(65536)
        if not data:
            raise ConnectError(f"the master at {address} closed the connection during the handshake")
        reader.push(data)
    return f


def follow_decision(epoch: int, truncate_to: int | None, end: int, seen_epoch: int, sync_acked: int,
                    own_epoch: int, accept_cut: bool, address: str = "the master") -> int | None:
    """Whether a slave follows a (proven) master of ``epoch`` that asks to cut at ``truncate_to``:
    None (follow from its end), the offset to cut at, or FencedError. A master older than the
    newest epoch the slave followed (``seen_epoch``) or its own role's (``own_epoch``) is refused; a
    cut is taken only from a strictly newer epoch than ``seen_epoch`` and never below ``sync_acked``
    (what the slave acknowledged to a SYNC_MASTER) — unless the operator set ``accept_cut``."""
    fence = max(seen_epoch, own_epoch)
    if epoch < fence:
        raise FencedError(f"the master at {address} is of epoch {epoch}, older than epoch {fence} that this "
                          f"slave follows: refused (an old master that missed a promotion)", epoch, fence)
    if truncate_to is None or truncate_to >= end:
        return None
    why = (f"its epoch {epoch} is not newer than epoch {seen_epoch}, which this slave followed already"
           if epoch <= seen_epoch else f"this slave acknowledged up to {sync_acked} to a SYNC_MASTER"
           if truncate_to < sync_acked else "")
    if why and not accept_cut:
        raise FencedError(f"the master at {address} asks to cut this log at {truncate_to} (it ends at {end}: "
                          f"{end - truncate_to} bytes): refused, {why}; check what would be lost, then set "
                          f"[ha] accept_cut = true to allow it", epoch, seen_epoch)
    if why:
        log.warning("replica: cutting %d bytes although %s ([ha] accept_cut is set)", end - truncate_to, why)
    return truncate_to


def write_truncate_marker(store_dir: str, offset: int) -> None:
    write_json(os.path.join(store_dir, TRUNCATE_MARKER), {"offset": offset})


def run(rt: BrokerRuntime, stop) -> int:
    """The slave writer's entry point (spawned by a slave broker in place of the writer)."""
    r = Replica(rt)
    log.info("replica ready: the log ends at %d", r.end)
    try:
        while not stop.is_set():
            r.heartbeat()
            if r.sock is None:
                address = r.master_address()
                if address is None:
                    stop.wait(ADDRESS_POLL_S)       # not registered yet: the NameServers tell us soon
                    continue
                try:
                    r.connect(address)
                except MustTruncate as t:
                    log.error("replica: this slave holds bytes its master does not (it was ahead, or the master "
                              "lost a tail in recovery): the log is cut at %d at the next start (it ends at %d)",
                              t.offset, r.end)
                    write_truncate_marker(rt.store_dir, t.offset)
                    return EXIT_TRUNCATE
                except FencedError as e:
                    log.error("replica: %s", e)
                    stop.wait(FENCED_RETRY_S)
                except (OSError, HostMQError) as e:
                    log.warning("replica: cannot replicate from %s: %s; retrying", address, e)
                    stop.wait(RETRY_S)
                continue
            try:
                r.receive(0.2)
            except (OSError, HostMQError) as e:
                r.disconnect(str(e))
                stop.wait(RETRY_S)
    finally:
        r.close()
    return 0
