"""A master's replication process (``ha``; RocketMQ's HAService / HAConnection): slaves connect over
TCP, say how far they hold the commitlog, and get the rest streamed from the mapped files.

One process per master, spawned by the broker like its other children. It listens on
``broker.ha_listen`` (port 0: any; the bound port goes into the state segment's ``ha_port`` and the
broker registers ``tcp://HOST:PORT`` with the NameServers as its HA address). Per slave connection
(``protocol/ha.py`` for the frames):

0. the master sends a CHALLENGE (its nonce); the slave's HELLO carries its own nonce and its proof of
   the root's replication secret (``ROOT/ha.secret``), the WELCOME the master's proof, and every
   later frame a tag under the link's keys (``protocol/ha_auth.py``): the listener is a TCP port
   anyone on the host can reach, and what it streams is every stored message. Connections that have
   not proven the secret are a pool of their own (``[ha] pending_connections``; a new one drops the
   oldest) with a hard deadline for a complete HELLO (``[ha] handshake_timeout_s``): only proven
   slaves count against ``MAX_SLAVES``. With ``[ha] tls_*`` the link is mutual TLS first;
1. the slave's HELLO says where its log ends and names a few records it holds; the master answers
   WELCOME with where it streams from — and where the slave must cut its log first, when the slave
   holds bytes the master does not (RocketMQ never checks; a slave ahead of its master there
   acknowledges bytes the master never had, and SYNC_MASTER sends below them return at once);
2. DATA frames of at most 32 KiB, never across a file, from the slave's position up to the
   master's readable end (``min(write_pos, committed_pos)``) — read-only from the mapped files,
   nothing on the send path waits for this under ASYNC_MASTER;
3. META frames with the master's topics, consumer offsets and delay offsets (the files the broker
   persists) every 10 s and at once when the topics changed; the slave broker applies them;
4. OFFSETS from a slave, once after its WELCOME: what consumers committed on it while this master
   was down — kept in ``config/slave-offsets.json`` (larger wins), which the broker's control loop
   merges into its own offsets (the larger wins there too);
5. REPORTs from the slave: the commitlog end it stored. An ack beyond what the master has ends the
   connection. The highest ack of a connected slave is published as ``replicated_pos`` (a SYNC_MASTER
   writer answers sends below it; one ack covers every send below it) and the writer is woken.

The writer posts ``ha_wake`` after each batch while a slave is connected (on a SYNC_MASTER, always:
this process confirms how far consumers may read, ``confirmed_pos``); a thread here sleeps on
that futex word and wakes the selector through a pipe, so a new batch is on its way to the slaves
at once. BEAT frames keep an idle connection alive; one silent for ``broker.ha_housekeeping_s`` is
closed (the slave reconnects and says again where it is).
"""
from __future__ import annotations

import logging
import os
import selectors
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field

import orjson

from ..errors import ConfigError, ProtocolError
from ..jsonfile import read_json, write_json
from ..protocol import ha as P
from ..protocol import ha_auth as A
from ..shm.signal import notify_if_waiting
from ..store.commitlog import CommitLog
from .ha_link import link_endpoint, listen_address, parse_tcp, replication_secret, tls_context
from .offsets import OFFSETS_FILE, parse_offset_table, table_dict
from ..live.runtime import BrokerRuntime
from ..live.state import BrokerState, open_doorbell

log = logging.getLogger(__name__)

MAX_SLAVES = 8                      # proven slaves beyond are refused (each costs a buffer and a read)
OUT_BUFFER_BYTES = 256 << 10        # queued per slave before the socket must drain
RECV_BYTES = 64 << 10
LOOP_S = 0.2                        # housekeeping and heartbeat granularity
META_FILES = {"topics": "topics.json", "consumer_offsets": OFFSETS_FILE, "delay_offsets": "delayOffset.json"}
SLAVE_OFFSETS_FILE = "slave-offsets.json"   # offsets consumers committed on slaves (written here, read by the broker)
_BEFORE_AUTH = frozenset((P.HELLO,))        # a peer that has not proven the secret sends a HELLO, no more
_AFTER_AUTH = frozenset((P.REPORT, P.OFFSETS))
TLS_SEND_BYTES = 16 << 10           # one TLS record per send (a retried send repeats the same bytes)


def ha_address(rt: BrokerRuntime, port: int) -> str:
    """A master's replication address as slaves reach it (``tcp://HOST:PORT``), "" without one.
    Listening on every address (``0.0.0.0``): local slaves connect over loopback — a slave on
    another host is given ``--master`` (or the master's ``ha_listen`` names its own address)."""
    if rt.is_slave or not port:
        return ""
    host = parse_tcp(listen_address(rt) or "tcp://127.0.0.1:0")[0]
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"tcp://{'[' + host + ']' if ':' in host else host}:{port}"


@dataclass
class _Slave:
    sock: socket.socket
    peer: str
    reader: P.FrameReader = field(default_factory=lambda: P.FrameReader(_BEFORE_AUTH))
    out: bytearray = field(default_factory=bytearray)
    nonce: bytes = field(default_factory=lambda: os.urandom(A.NONCE_BYTES))
    accepted_s: float = field(default_factory=time.monotonic)
    tls_pending: bool = False           # the TLS handshake is not done yet (no CHALLENGE sent)
    tls_retry: int = 0                  # a TLS send that must be repeated with this many bytes
    sealer: A.Sealer | None = None      # tags what this master sends, once the slave proved the secret
    next_pos: int | None = None         # None until the handshake
    acked: int = 0
    behind_s: float | None = None       # since when it has not acknowledged the master's end (None: it has)
    last_read_s: float = field(default_factory=time.monotonic)
    last_sent_s: float = field(default_factory=time.monotonic)
    meta_sent: bytes = b""              # the last META body sent (sent again only when it changed)


class HAMaster:
    """The replication process's state and loop body (``run_once``), usable without spawning."""

    def __init__(self, rt: BrokerRuntime) -> None:
        cfg = rt.config.broker
        self.rt = rt
        self.heartbeat_s, self.housekeeping_s = cfg.ha_heartbeat_interval_s, cfg.ha_housekeeping_s
        self.meta_interval_s = cfg.ha_meta_interval_s
        self.handshake_s, self.max_pending = rt.config.ha.handshake_timeout_s, rt.config.ha.pending_connections
        self.tls = tls_context(rt, server_side=True)
        self.sync = cfg.role == "SYNC_MASTER"
        self.state = BrokerState.attach(rt.state_name)
        self.file_bytes = self.state.commitlog_file_bytes
        self.secret = replication_secret(rt.paths.ha_secret, create=True)
        self.cl = CommitLog(rt.store_dir, self.file_bytes, writable=False)
        self.cl.mfq.refresh()
        self.doorbell_segment, self.doorbell = open_doorbell(self.state)
        host, port = parse_tcp(listen_address(rt) or "tcp://127.0.0.1:0")
        self.listener = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                             backlog=MAX_SLAVES + self.max_pending)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.sel.register(self._wake_r, selectors.EVENT_READ, None)
        self.slaves: dict[int, _Slave] = {}
        self._meta = b""
        self._meta_read_s = 0.0
        self._topics_seen = -1
        self._stop = threading.Event()
        self._waiter = threading.Thread(target=self._wait_for_writes, name="ha-wake", daemon=True)
        self._waiter.start()
        self.state.set("ha_port", self.port)
        self.state.set("ha_pid", os.getpid())
        self.max_gap_bytes = cfg.ha_max_gap_bytes
        self.sync_timeout_s = cfg.ha_sync_timeout_ms / 1000
        if self.sync:
            # From now on consumers read what this process confirms, and the writer wakes it after every
            # batch. Confirmed twice: a batch published between the first read of the end and the word
            # turning on was readable to consumers that still saw none confirming.
            self._confirm(self.end())
            self._confirm(self.end())

    # -- the readable end of the commitlog ------------------------------------------------------------
    def end(self) -> int:
        return int(self.state.committed_end())

    def record_at(self, phys: int, size: int) -> bytes | None:
        mf = self._file(phys)
        if mf is None:
            return None
        rel = phys - mf.file_from_offset
        return bytes(mf.mm[rel:rel + size]) if rel + size <= self.file_bytes else None

    def _file(self, phys: int):
        mf = self.cl.mfq.find(phys)
        if mf is None:
            self.cl.mfq.refresh()          # the writer made a file since, or retention deleted some
            mf = self.cl.mfq.find(phys)
        return mf

    def _wait_for_writes(self) -> None:
        """Sleep on ``ha_wake``; wake the selector when the writer posts it. The value slept on is the
        one last seen, not re-read after waking the selector: a post between the two would be taken
        as seen, and its batch would wait for the loop's next turn (up to ``LOOP_S``)."""
        word = self.state.ha_wake
        seen = word.arm()
        while not self._stop.is_set():
            word.sleep(seen, 0.5)
            now = word.arm()
            if now != seen:
                seen = now                  # the selector's pump reads the end after this: it has it
                try:
                    os.write(self._wake_w, b"w")
                except BlockingIOError:
                    pass                    # a wake-up is pending already

    # -- the loop -------------------------------------------------------------------------------------
    def run_once(self, timeout_s: float = LOOP_S) -> None:
        for key, events in self.sel.select(timeout_s):
            if key.fileobj is self.listener:
                self._accept()
            elif key.fileobj == self._wake_r:
                try:
                    os.read(self._wake_r, 4096)
                except BlockingIOError:
                    pass
            else:
                s = self.slaves.get(key.fd)
                if s is None:
                    continue
                if s.tls_pending:
                    self._tls_step(s)
                    continue
                if events & selectors.EVENT_READ:
                    self._read(s)
                if events & selectors.EVENT_WRITE and key.fd in self.slaves:
                    self._flush(s)
        now = time.monotonic()
        end = self.end()
        meta = self.metadata(now) if self.slaves else b""
        for s in list(self.slaves.values()):
            if now - s.last_read_s > self.housekeeping_s:
                self._close(s, f"silent for {self.housekeeping_s:.0f} s")
                continue
            if s.next_pos is None and now - s.accepted_s > self.handshake_s:
                self._close(s, f"no complete, proven HELLO within {self.handshake_s:g} s ([ha] handshake_timeout_s)")
                continue
            if meta and s.next_pos is not None and meta != s.meta_sent and len(s.out) < OUT_BUFFER_BYTES:
                s.out += P.encode(P.META, 0, meta, s.sealer)
                s.meta_sent = meta
            self._pump(s, end, now)
        self._publish()
        self.state.set("ha_heartbeat_ms", int(time.time() * 1000))

    def metadata(self, now: float) -> bytes:
        """The master's topics, consumer offsets and delay offsets as one META body — read from the
        files the broker and its scheduler persist, every ``broker.ha_meta_interval_s`` and at once when the
        topic table changed (RocketMQ's slave pulls the same every 10 s)."""
        topics_version = self.state.get("topics_version")
        if now - self._meta_read_s < self.meta_interval_s and topics_version == self._topics_seen and self._meta:
            return self._meta
        self._meta_read_s, self._topics_seen = now, topics_version
        out = {}
        for key, name in META_FILES.items():
            try:
                out[key] = read_json(self.rt.config_file(name), default=None)
            except ConfigError as e:            # a damaged file is the broker's to report; send the rest
                log.warning("ha: %s not sent to the slaves: %s", name, e)
                out[key] = None
        body = orjson.dumps(out)
        if len(body) > P.MAX_META_BYTES:
            log.error("ha: metadata of %d bytes is larger than a META frame (%d); slaves keep the last",
                      len(body), P.MAX_META_BYTES)
            return self._meta
        self._meta = body
        return body

    def _accept(self) -> None:
        try:
            sock, addr = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        peer = f"{addr[0]}:{addr[1]}"
        pending = sorted((s for s in self.slaves.values() if s.next_pos is None), key=lambda s: s.accepted_s)
        if len(pending) >= self.max_pending:       # the oldest has had the longest to prove itself
            self._close(pending[0], f"unauthenticated, and {self.max_pending} such connections are open "
                                    f"([ha] pending_connections): the oldest goes")
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        s = _Slave(sock, peer, tls_pending=self.tls is not None)
        self.slaves[sock.fileno()] = s
        self.sel.register(sock, selectors.EVENT_READ, None)
        if s.tls_pending:
            self._tls_step(s)
        else:
            self._challenge(s)

    def _challenge(self, s: _Slave) -> None:
        s.out += P.encode(P.CHALLENGE, 0, s.nonce)
        self._flush(s)

    def _tls_step(self, s: _Slave) -> None:
        """Advance a connection's TLS handshake (non-blocking); the CHALLENGE follows it."""
        try:
            s.sock.do_handshake()
        except ssl.SSLWantReadError:
            self.sel.modify(s.sock, selectors.EVENT_READ, None)
            return
        except ssl.SSLWantWriteError:
            self.sel.modify(s.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, None)
            return
        except (OSError, ValueError) as e:          # ssl.SSLError is an OSError
            self._close(s, f"TLS handshake failed: {e}")
            return
        s.tls_pending = False
        self._challenge(s)

    def _read(self, s: _Slave) -> None:
        data = bytearray()
        try:
            while True:         # a TLS socket may hold decrypted bytes the selector cannot see
                chunk = s.sock.recv(RECV_BYTES)
                if not chunk:
                    break
                data += chunk
                if self.tls is None or not s.sock.pending() or len(data) >= RECV_BYTES:
                    break
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            if not data:
                return
        except OSError as e:
            self._close(s, f"read failed: {e}")
            return
        if not data:
            self._close(s, "closed by the slave")
            return
        s.last_read_s = time.monotonic()
        s.reader.push(bytes(data))
        try:
            while s.sock.fileno() in self.slaves and (f := s.reader.next()) is not None:
                self._handle(s, f)
        except ProtocolError as e:
            self._close(s, f"protocol error: {e}")

    def _handle(self, s: _Slave, f: P.Frame) -> None:
        if f.kind == P.HELLO:
            self._hello(s, P.Hello.decode(f))
        elif f.kind == P.OFFSETS:
            self._take_offsets(s, f.body)
        else:
            if f.offset > self.end():
                raise ProtocolError(f"an ack of {f.offset} beyond the master's end {self.end()}")
            if f.offset < s.acked:
                raise ProtocolError(f"an ack of {f.offset} below its earlier {s.acked}")
            if f.offset > s.acked:
                s.behind_s = None           # progress: the wait for the rest starts at the next look
            s.acked = f.offset

    def _hello(self, s: _Slave, hello: P.Hello) -> None:
        """Check the slave's proof (nothing is sent to a peer without the secret but the CHALLENGE),
        then answer with this master's proof and where the stream starts; every frame after is tagged."""
        rt = self.rt
        ep = link_endpoint(s.sock, "master", rt)
        if hello.endpoint != ep:
            raise A.FrameAuthError(f"the slave reached {hello.endpoint!r:.80}, this listener is {ep}: a relay in "
                                   f"between (through NAT or a proxy, use [ha] tls_*)")
        if not A.proof_ok(self.secret, hello.auth, A.SLAVE_LABEL, s.nonce, hello.nonce, rt.name, hello.epoch, ep):
            raise A.FrameAuthError("authentication failed (the slave does not hold this root's ha.secret)")
        if hello.epoch > rt.epoch:
            log.error("ha: slave %s follows epoch %d, newer than this master's %d: this master is fenced (another "
                      "instance of %s was promoted; `hostmq status` shows it)", s.peer, hello.epoch, rt.epoch, rt.name)
        if sum(1 for x in self.slaves.values() if x.next_pos is not None) >= MAX_SLAVES:
            raise ProtocolError(f"{MAX_SLAVES} slaves are connected already")
        if hello.file_bytes != self.file_bytes:
            raise ProtocolError(f"the slave's commitlog files are {hello.file_bytes} bytes, the master's "
                                f"{self.file_bytes}: a slave's store must be made with the master's file size")
        keys = A.session_keys(self.secret, s.nonce, hello.nonce, rt.name)
        end = self.end()
        start, cut = P.agreed_start(hello, end, self.cl.min_offset(), self.record_at)
        auth = A.proof(self.secret, A.MASTER_LABEL, s.nonce, hello.nonce, rt.name, rt.epoch, ep)
        s.out += P.Welcome(start, self.file_bytes, end, cut, rt.epoch, self.sync, auth).encode()
        s.sealer = A.Sealer(keys["master"])
        s.reader.accept, s.reader.opener = _AFTER_AUTH, A.Opener(keys["slave"])
        s.next_pos = s.acked = start
        log.info("ha: slave %s (epoch %d) proved the secret; it holds the commitlog up to %d; streaming from %d%s",
                 s.peer, hello.epoch, hello.end, start,
                 f" after it truncates to {cut}" if cut is not None and cut < hello.end else "")

    def _take_offsets(self, s: _Slave, body: bytes) -> None:
        """A slave's consumer offsets, committed there while this master was down: kept (the larger
        wins) where the broker's control loop merges them into its own (``SLAVE_OFFSETS_FILE``)."""
        try:
            got = parse_offset_table(orjson.loads(body))
        except orjson.JSONDecodeError:
            raise ProtocolError("an OFFSETS body that is not JSON") from None
        path = self.rt.config_file(SLAVE_OFFSETS_FILE)
        try:
            kept = parse_offset_table(read_json(path, default=None))
        except ConfigError:         # unreadable: the broker applied what it could; start it again
            kept = {}
        moved = {k: v for k, v in got.items() if v > kept.get(k, -1)}
        if moved:
            write_json(path, {"offset_table": table_dict({**kept, **moved})})
        log.info("ha: slave %s carried back %d consumer offsets committed on it (%d ahead of what it sent "
                 "before)", s.peer, len(got), len(moved))

    def _pump(self, s: _Slave, end: int, now: float) -> None:
        if s.next_pos is not None:
            while len(s.out) < OUT_BUFFER_BYTES and s.next_pos < end:
                mf = self._file(s.next_pos)
                if mf is None:
                    self._close(s, f"the master no longer holds offset {s.next_pos} (retention deleted it)")
                    return
                rel = s.next_pos - mf.file_from_offset
                n = min(end - s.next_pos, self.file_bytes - rel, P.TRANSFER_CHUNK_BYTES)
                s.out += P.encode(P.DATA, s.next_pos, bytes(mf.mm[rel:rel + n]), s.sealer)
                s.next_pos += n
            if not s.out and now - s.last_sent_s >= self.heartbeat_s:
                s.out += P.encode(P.BEAT, end, P.EPOCH.pack(self.rt.epoch), s.sealer)
        if s.out:
            self._flush(s)

    def _flush(self, s: _Slave) -> None:
        if s.tls_pending:
            return
        try:
            if self.tls is None:
                sent = s.sock.send(s.out)
            else:       # a TLS send that wants a retry must repeat the same bytes
                n = s.tls_retry or min(len(s.out), TLS_SEND_BYTES)
                s.tls_retry = n
                sent = s.sock.send(s.out[:n]) if n else 0
                s.tls_retry = 0
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            sent = 0
        except OSError as e:
            self._close(s, f"write failed: {e}")
            return
        if sent:
            del s.out[:sent]
            s.last_sent_s = time.monotonic()
        self.sel.modify(s.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if s.out else 0), None)

    def _close(self, s: _Slave, why: str) -> None:
        log.warning("ha: slave %s disconnected: %s", s.peer, why)
        self.slaves.pop(s.sock.fileno(), None)
        try:
            self.sel.unregister(s.sock)
        except (KeyError, ValueError):
            pass
        s.sock.close()

    def _publish(self) -> None:
        live = [s for s in self.slaves.values() if s.next_pos is not None]
        st = self.state
        st.set("ha_slaves", len(live))
        acked = max((s.acked for s in live), default=0)
        if acked != st.get("replicated_pos"):
            st.set("replicated_pos", acked)
            notify_if_waiting(st.writer_waiting, self.doorbell)     # a SYNC_MASTER writer may answer sends now
        if self.sync:
            end, now = self.end(), time.monotonic()
            in_sync = []
            for s in live:
                if s.acked >= end:
                    s.behind_s = None
                elif s.behind_s is None:
                    s.behind_s = now
                if end - s.acked <= self.max_gap_bytes and (s.behind_s is None or
                                                             now - s.behind_s <= self.sync_timeout_s):
                    in_sync.append(s.acked)
            self._confirm(max(in_sync) if in_sync else end)

    def _confirm(self, pos: int) -> None:
        """A SYNC_MASTER: consumers may read to ``pos`` (``confirmed_pos`` only grows): what an
        in-sync slave — connected, no more than ``broker.ha_max_gap_bytes`` behind, as the writer
        counts one for SEND_OK, and not silent about what it was sent for longer than a send waits for
        it (``broker.ha_sync_timeout_ms``: by then its producers were told FLUSH_SLAVE_TIMEOUT) —
        acknowledged, or the master's end while none is (RocketMQ 5's in-sync set shrinking to the
        master; its ``haMaxTimeSlaveNotCatchup``). Consumers sleeping on ``confirm_wake`` are woken."""
        if pos > self.state.get("confirmed_pos"):
            self._publish_confirmed(pos)

    def _publish_confirmed(self, pos: int) -> None:
        """Set ``confirmed_pos`` (-1: nothing bounds the readers) and wake the consumers sleeping on it."""
        st = self.state
        st.set("confirmed_pos", pos)
        st.bump("confirm_wake")
        st.confirm_wake_word.wake()

    def close(self) -> None:
        self._stop.set()
        self._waiter.join(2)                # it sleeps at most 0.5 s at a time
        for s in list(self.slaves.values()):
            self._close(s, "the master stops")
        self.sel.close()
        self.listener.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        self.state.set("ha_slaves", 0)
        if self.sync:               # nothing confirms any more: consumers read to the end
            self._publish_confirmed(-1)
        self.cl.close()
        self.doorbell_segment.close()
        self.state.close()


def run(rt: BrokerRuntime, stop) -> int:
    """The replication process's entry point (spawned by a master broker)."""
    m = HAMaster(rt)
    log.info("ha: listening for slaves on port %d", m.port)
    try:
        while not stop.is_set():
            m.run_once()
    finally:
        m.close()
    return 0
