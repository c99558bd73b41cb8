"""Attacks on replication links (issue 27), as a hostile local process without the root's secret
performs them: each is a small server or client that runs in a thread and reports what it got.
``tests/e2e/test_ha_trust.py`` drives them against a real master and slave; they are written to
become ``hostmq faults`` kinds (each has ``start()``, ``stop() -> report`` and no test imports).

* ``ForgedMaster``: binds a master's replication address while the master is down and answers a
  slave's HELLO with ``WELCOME truncate_to=0`` and DATA of forged records that pass every structural
  check — before issue 27 the slave cut its whole log and stored them.
* ``Relay``: listens where a slave dials and passes bytes between it and the real master (a man in
  the middle); it watches the frames it passes and can inject one mid-stream (``inject``: a forged
  DATA to the slave, a REPORT of everything the master streamed, or a replay of a frame it passed) — before issue 27
  the relayed slave authenticated and a forged REPORT made a SYNC_MASTER answer SEND_OK for bytes
  no slave held.
* ``SlotSquatter``: holds many connections to the master's port, each trickling a HELLO one byte
  at a time — before issue 27 they held all 8 slave slots and the real slave could not connect.
"""
from __future__ import annotations

import errno
import os
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

from .. import records as R
from ..protocol import ha as P
from ..protocol import ha_auth as A

POLL_S = 0.05


def parse_tcp(address: str) -> tuple[str, int]:
    host, _, port = address[len("tcp://"):].rpartition(":")
    return host.strip("[]"), int(port)


def forged_records(start: int, count: int = 5, topic: bytes = b"forged") -> bytes:
    """Records that pass the stored-record checks at ``start`` (CRC, sizes, their own offsets)."""
    out, pos = bytearray(), start
    for i in range(count):
        rec = R.py_encode_record(topic, b"forged message %d" % i, b"", queue_offset=i, phys_offset=pos,
                                 store_ts_ms=int(time.time() * 1000))
        out += rec
        pos += len(rec)
    return bytes(out)


def bind_when_free(address: str, within_s: float = 30.0) -> socket.socket:
    """A listener at ``address`` once the crashed owner's sockets are gone: a SIGKILLed process group
    releases its ports only as the kernel tears each member down, so EADDRINUSE is retried until
    ``within_s`` has passed."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return socket.create_server(parse_tcp(address), reuse_port=False)
        except OSError as e:
            if e.errno != errno.EADDRINUSE or time.monotonic() >= deadline:
                raise
        time.sleep(POLL_S)


class _Thread:
    """A daemon loop with a stop flag (``_step`` runs until ``stop``)."""

    def start(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self._step()

    def _join(self) -> None:
        self._stop.set()
        self._thread.join(10)


@dataclass
class ForgedMasterReport:
    connections: int = 0            # slaves that connected
    hellos: int = 0                 # HELLOs received (the slave's proof, useless without the secret)
    welcomes_sent: int = 0          # forged WELCOMEs sent
    data_bytes_sent: int = 0        # forged records sent after a WELCOME
    reports_after_welcome: int = 0  # bytes the slave sent after the forged WELCOME (it acted on it)


class ForgedMaster(_Thread):
    """Answers slaves at ``address`` (``tcp://HOST:PORT``) as the master they expect, without the secret."""

    def __init__(self, address: str, truncate_to: int = 0, epoch: int = 1 << 20) -> None:
        self.listener = bind_when_free(address)
        self.listener.settimeout(POLL_S)
        self.truncate_to, self.epoch = truncate_to, epoch
        self.report = ForgedMasterReport()

    def _step(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except (socket.timeout, OSError):
            return
        with sock:
            self.report.connections += 1
            self._serve(sock)

    def _serve(self, sock: socket.socket) -> None:
        sock.settimeout(5.0)
        try:
            sock.sendall(P.encode(P.CHALLENGE, 0, os.urandom(A.NONCE_BYTES)))
            reader = P.FrameReader(P.SLAVE_KINDS)
            while (f := reader.next()) is None:
                data = sock.recv(65536)
                if not data:
                    return
                reader.push(data)
            self.report.hellos += 1
            records = forged_records(self.truncate_to)
            sock.sendall(P.Welcome(self.truncate_to, P.Hello.decode(f).file_bytes, self.truncate_to + len(records),
                                   self.truncate_to, self.epoch, True, "0" * 64).encode())
            self.report.welcomes_sent += 1
            sock.sendall(P.encode(P.DATA, self.truncate_to, records))
            self.report.data_bytes_sent += len(records)
            sock.settimeout(2.0)
            while data := sock.recv(65536):          # anything the slave sends now, it sent having acted
                self.report.reports_after_welcome += len(data)
        except (OSError, ValueError):
            return

    def stop(self) -> ForgedMasterReport:
        self._join()
        self.listener.close()
        return self.report


@dataclass
class RelayReport:
    connections: int = 0                # slaves that connected to the relay
    frames: dict = field(default_factory=lambda: {"to_master": 0, "to_slave": 0})
    welcomes_passed: int = 0            # the master accepted a relayed slave (before issue 27: every one)
    injected: int = 0                   # frames the relay injected


class _Direction:
    """Frames passing one way, cut where the tags begin (after the HELLO / the WELCOME)."""

    def __init__(self, handshake_kind: int) -> None:
        self.buf = bytearray()
        self.handshake_kind = handshake_kind
        self.tagged = False
        self.frames: list[bytes] = []   # whole frames seen (with their tags)

    def feed(self, data: bytes) -> list[int]:
        self.buf += data
        kinds = []
        while len(self.buf) >= P.HEADER.size:
            kind, _, size = P.HEADER.unpack_from(self.buf, 0)
            n = P.HEADER.size + size + (A.TAG_BYTES if self.tagged else 0)
            if len(self.buf) < n or size > P.MAX_META_BYTES:
                break
            self.frames.append(bytes(self.buf[:n]))
            del self.buf[:n]
            kinds.append(kind)
            if kind == self.handshake_kind:
                self.tagged = True
        return kinds


class Relay(_Thread):
    """A man in the middle: listens at ``listen`` (``tcp://HOST:PORT``) and passes each connection's
    bytes to and from ``master``. ``inject``: None, ``"data"`` (a forged DATA frame to the slave once
    the stream runs), ``"report"`` (a REPORT of a far offset to the master), ``"replay"`` (the last
    frame the slave sent, again)."""

    def __init__(self, listen: str, master: str, inject: str | None = None) -> None:
        if inject not in (None, "data", "report", "replay"):
            raise ValueError(f"inject must be None, 'data', 'report' or 'replay', got {inject!r}")
        self.listener = socket.create_server(parse_tcp(listen))
        self.listener.setblocking(False)
        self.master, self.inject = master, inject
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ, None)
        self.report = RelayReport()
        self.master_end = 0                 # the end of the last DATA passed to the slave
        self._pairs: dict[socket.socket, tuple[socket.socket, str, _Direction]] = {}

    def _step(self) -> None:
        for key, _ in self.sel.select(POLL_S):
            if key.fileobj is self.listener:
                self._accept()
            elif key.fileobj in self._pairs:
                self._pass(key.fileobj)

    def _accept(self) -> None:
        try:
            slave, _ = self.listener.accept()
            master = socket.create_connection(parse_tcp(self.master), timeout=5.0)
        except OSError:
            return
        self.report.connections += 1
        to_master, to_slave = _Direction(P.HELLO), _Direction(P.WELCOME)
        self._pairs[slave] = (master, "to_master", to_master)
        self._pairs[master] = (slave, "to_slave", to_slave)
        for s in (slave, master):
            s.setblocking(True)
            self.sel.register(s, selectors.EVENT_READ, None)

    def _pass(self, src: socket.socket) -> None:
        dst, way, seen = self._pairs[src]
        try:
            data = src.recv(65536)
            if data:
                dst.sendall(data)
        except OSError:
            data = b""
        if not data:
            self._drop(src)
            return
        kinds = seen.feed(data)
        self.report.frames[way] += len(kinds)
        if P.WELCOME in kinds and way == "to_slave":
            self.report.welcomes_passed += 1
        for f in seen.frames[len(seen.frames) - len(kinds):]:
            kind, offset, size = P.HEADER.unpack_from(f, 0)
            if way == "to_slave" and kind == P.DATA:
                self.master_end = max(self.master_end, offset + size)
        if self.inject and seen.tagged and len(seen.frames) >= 3 and not self.report.injected:
            self._inject(src, dst, way, seen)

    def _inject(self, src, dst, way: str, seen: _Direction) -> None:
        if self.inject == "data" and way == "to_slave":
            frame = P.encode(P.DATA, 0, forged_records(0)) + os.urandom(A.TAG_BYTES)
            target = dst
        elif self.inject in ("report", "replay") and way == "to_master":
            # The attack: "REPORT offset=end" — an ack of everything the master streamed.
            frame = seen.frames[-1] if self.inject == "replay" else \
                P.encode(P.REPORT, self.master_end) + os.urandom(A.TAG_BYTES)
            target = dst
        else:
            return
        try:
            target.sendall(frame)
            self.report.injected += 1
        except OSError:
            pass

    def _drop(self, s: socket.socket) -> None:
        other = self._pairs.pop(s, (None,))[0]
        for x in (s, other):
            if x is not None:
                self._pairs.pop(x, None)
                try:
                    self.sel.unregister(x)
                except (KeyError, ValueError):
                    pass
                x.close()

    def stop(self) -> RelayReport:
        self._join()
        for s in list(self._pairs):
            self._drop(s)
        self.sel.close()
        self.listener.close()
        return self.report


@dataclass
class SquatReport:
    opened: int = 0                 # connections opened
    refused: int = 0                # connections that could not be opened
    longest_held_s: float = 0.0     # the longest any stayed open
    closed_by_master: int = 0       # connections the master closed


class SlotSquatter(_Thread):
    """Keeps ``connections`` open to ``master``, each sending its HELLO one byte per ``trickle_s``;
    a connection the master closes is opened again at once."""

    def __init__(self, master: str, connections: int = 16, trickle_s: float = 0.5) -> None:
        self.master, self.count, self.trickle_s = master, connections, trickle_s
        nonce = os.urandom(A.NONCE_BYTES)
        self.hello = P.Hello(0, 1 << 30, (), nonce, 0, "", "0" * 64).encode()
        self.report = SquatReport()
        self._socks: list[tuple[socket.socket, float, int]] = []      # (socket, opened at, bytes sent)

    def _step(self) -> None:
        now = time.monotonic()
        while len(self._socks) < self.count:
            try:
                s = socket.create_connection(parse_tcp(self.master), timeout=2.0)
            except OSError:
                self.report.refused += 1
                break
            s.setblocking(False)
            self._socks.append((s, now, 0))
            self.report.opened += 1
        kept = []
        for s, opened, sent in self._socks:
            if self._closed(s):
                self.report.closed_by_master += 1
                self.report.longest_held_s = max(self.report.longest_held_s, now - opened)
                s.close()
                continue
            try:
                s.send(self.hello[sent:sent + 1])
                sent = min(sent + 1, len(self.hello) - 1)       # never the last byte: never complete
            except OSError:
                pass
            kept.append((s, opened, sent))
        self._socks = kept
        self._stop.wait(self.trickle_s)

    @staticmethod
    def _closed(s: socket.socket) -> bool:
        try:
            while True:
                if s.recv(65536) == b"":
                    return True
        except BlockingIOError:
            return False
        except OSError:
            return True

    def stop(self) -> SquatReport:
        self._join()
        now = time.monotonic()
        for s, opened, _ in self._socks:
            self.report.longest_held_s = max(self.report.longest_held_s, now - opened)
            s.close()
        self._socks = []
        return self.report
