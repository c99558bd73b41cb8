"""Master ↔ slave replication frames over TCP (pure; RocketMQ's HAConnection / HAClient, with a
handshake RocketMQ lacks).

Every frame, both ways, is a 16-byte big-endian header and a body::

    kind u8 | 3 zero bytes | offset i64 | size u32 | body (size bytes)

master → slave, first
    CHALLENGE offset = 0; body = the master's 32-byte nonce. The listener is reachable by anyone who
            can open a TCP connection, and what it streams is every stored message: both sides prove
            they hold the root's replication secret (``ROOT/ha.secret``, readable by the root's owner
            only; copied to a slave on another host) before anything else (``protocol/ha_auth.py``)
slave → master
    HELLO   offset = the slave's commitlog end; body = orjson ``{"version", "file_bytes", "nonce",
            "epoch", "endpoint", "auth", "checkpoints": [[phys, size, crc32], …]}``: ``nonce`` = the
            slave's 32-byte nonce (hex), ``epoch`` = the newest master epoch it follows, ``endpoint``
            = the master's ``IP:PORT`` as it reached it, ``auth`` = its proof; the checkpoints are a
            few records the slave holds (its last one and the first of each of its last files), so
            the master can tell where their logs agree
    REPORT  offset = the slave's commitlog end (after each batch it stored, and every few seconds);
            no body
    OFFSETS offset = 0; body = orjson ``{"offset_table": {"topic@group": {"qid": offset}}}``: what
            consumers committed on the slave while the master was down (once, after the WELCOME);
            the master takes each where it is ahead of its own
master → slave
    WELCOME offset = where the master streams from; body = orjson ``{"version", "file_bytes",
            "master_end", "truncate_to", "epoch", "sync", "auth"}`` — ``auth`` is the master's proof
            (the slave acts on nothing before it checked it); ``epoch`` the master's, ``sync``
            whether it is a SYNC_MASTER (the slave then remembers what it acknowledged);
            ``truncate_to`` is set when the slave holds bytes the master does not (it was ahead, or
            the master lost a tail in recovery and wrote other records since): the slave cuts its
            log there first — only for a master of a newer epoch than any it followed, and never
            below what it acknowledged to a SYNC_MASTER (``broker/replica.py``)
    DATA    offset = commitlog offset of the body's first byte; body = commitlog bytes (≤ 32 KiB,
            never across a file; may end inside a record)
    BEAT    offset = the master's commitlog end; body = its epoch (i64) (every few seconds when idle)
    META    offset = 0; body = orjson of the master's metadata (topics, consumer offsets, delay
            offsets) — sent when it changed, and periodically

Every frame after the HELLO (slave) and after the WELCOME (master) is followed by a 16-byte tag
(``ha_auth.Sealer``): ``FrameReader`` with an ``opener`` checks it before the frame is returned.

Whatever arrives is input from a possibly wrong peer: ``FrameReader`` checks kinds, sizes and
offsets and raises ProtocolError; the slave checks every record of a DATA body with the record
codec before its writer appends it.
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import orjson

from ..errors import ProtocolError
from . import ha_auth as A

VERSION = 2                                 # 2: mutual proofs, tagged frames, epochs (issue 27)
HEADER = struct.Struct(">B3xqI")
HELLO, REPORT, WELCOME, DATA, BEAT, META, CHALLENGE, OFFSETS = 1, 2, 3, 4, 5, 6, 7, 8
KIND_NAMES = {HELLO: "HELLO", REPORT: "REPORT", WELCOME: "WELCOME", DATA: "DATA", BEAT: "BEAT", META: "META",
              CHALLENGE: "CHALLENGE", OFFSETS: "OFFSETS"}
SLAVE_KINDS = frozenset((HELLO, REPORT, OFFSETS))
MASTER_KINDS = frozenset((WELCOME, DATA, BEAT, META, CHALLENGE))
CHALLENGE_BYTES = 32
TRANSFER_CHUNK_BYTES = 32 << 10             # RocketMQ haTransferBatchSize
MAX_CONTROL_BODY_BYTES = 64 << 10           # HELLO / WELCOME bodies
MAX_META_BYTES = 64 << 20                   # topics and offsets of a large broker
MAX_OFFSETS_BYTES = 16 << 20                # a slave's consumer offsets
MAX_CHECKPOINTS = 64
EPOCH = struct.Struct(">q")                 # a BEAT's body
_LIMITS = {HELLO: MAX_CONTROL_BODY_BYTES, REPORT: 0, WELCOME: MAX_CONTROL_BODY_BYTES,
           DATA: TRANSFER_CHUNK_BYTES, BEAT: EPOCH.size, META: MAX_META_BYTES, CHALLENGE: CHALLENGE_BYTES,
           OFFSETS: MAX_OFFSETS_BYTES}


@dataclass(frozen=True)
class Frame:
    kind: int
    offset: int
    body: bytes = b""


def encode(kind: int, offset: int, body: bytes = b"", sealer: A.Sealer | None = None) -> bytes:
    """One frame; with ``sealer`` (after the handshake) followed by its tag."""
    if kind not in _LIMITS or len(body) > _LIMITS[kind] or offset < 0:
        raise ProtocolError(f"HA frame {kind} at {offset} with {len(body)} bytes is not sendable")
    frame = HEADER.pack(kind, offset, len(body)) + body
    return frame if sealer is None else frame + sealer.tag(frame)


class FrameReader:
    """Cuts a byte stream into frames of the kinds one side may receive. ``accept`` and ``opener``
    may change between frames (the handshake): ``next`` reads one frame at a time under the current
    ones. A frame's header is checked before its body is buffered (at most its kind's limit)."""

    def __init__(self, accept: frozenset[int], opener: A.Opener | None = None) -> None:
        self.accept = accept
        self.opener = opener
        self._buf = bytearray()

    def push(self, data: bytes) -> None:
        self._buf += data

    def next(self) -> Frame | None:
        """The next whole frame, None until one has arrived; ProtocolError for a bad one."""
        if len(self._buf) < HEADER.size:
            return None
        kind, offset, size = HEADER.unpack_from(self._buf, 0)
        if kind not in self.accept:
            raise ProtocolError(f"HA frame of kind {kind} is not expected here")
        if size > _LIMITS[kind] or offset < 0 or self._buf[1:4] != b"\0\0\0":
            raise ProtocolError(f"bad HA {KIND_NAMES[kind]} frame: offset {offset}, {size} bytes")
        end = HEADER.size + size
        tag = A.TAG_BYTES if self.opener is not None else 0
        if len(self._buf) < end + tag:
            return None
        if self.opener is not None:
            self.opener.check(memoryview(self._buf)[:end], self._buf[end:end + tag])
        body = bytes(self._buf[HEADER.size:end])
        del self._buf[:end + tag]
        return Frame(kind, offset, body)

    def feed(self, data: bytes) -> list[Frame]:
        """``push`` and every whole frame now buffered (under the current ``accept`` and ``opener``)."""
        self.push(data)
        out = []
        while (f := self.next()) is not None:
            out.append(f)
        return out

    def finish(self) -> None:
        """The stream ended: a frame cut short is an error, not silence."""
        if self._buf:
            raise ProtocolError(f"the replication stream ended inside a frame ({len(self._buf)} bytes)")

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf)


# -- the handshake (proofs: protocol/ha_auth.py) ---------------------------------------------------
def _nonce(x: object, what: str) -> bytes:
    if not isinstance(x, str) or len(x) != 2 * A.NONCE_BYTES:
        raise ProtocolError(f"{what} nonce must be {A.NONCE_BYTES} bytes in hex")
    try:
        return bytes.fromhex(x)
    except ValueError:
        raise ProtocolError(f"{what} nonce must be {A.NONCE_BYTES} bytes in hex") from None


def _short_str(d: dict, key: str, what: str, top: int = 128) -> str:
    if not isinstance(d[key], str) or len(d[key]) > top:
        raise ProtocolError(f"{what} {key} must be a string of at most {top} characters")
    return d[key]


@dataclass(frozen=True)
class Hello:
    end: int                                    # the slave's commitlog end
    file_bytes: int
    checkpoints: tuple[tuple[int, int, int], ...]   # (phys, size, crc32) of records it holds
    nonce: bytes = bytes(A.NONCE_BYTES)         # the slave's half of the handshake
    epoch: int = 0                              # the newest master epoch the slave follows
    endpoint: str = ""                          # the master's IP:PORT as the slave reached it ("" on TLS)
    auth: str = ""                              # ha_auth.proof(SLAVE_LABEL, …)

    def encode(self) -> bytes:
        return encode(HELLO, self.end, orjson.dumps({
            "version": VERSION, "file_bytes": self.file_bytes, "nonce": self.nonce.hex(), "epoch": self.epoch,
            "endpoint": self.endpoint, "auth": self.auth, "checkpoints": [list(c) for c in self.checkpoints]}))

    @classmethod
    def decode(cls, f: Frame) -> "Hello":
        d = _json(f, ("version", "file_bytes", "checkpoints", "nonce", "epoch", "endpoint", "auth"))
        cps = d["checkpoints"]
        if not isinstance(cps, list) or len(cps) > MAX_CHECKPOINTS or not all(
                isinstance(c, list) and len(c) == 3 and all(_is_uint(x) for x in c) for c in cps):
            raise ProtocolError("HELLO checkpoints must be up to 64 [phys, size, crc32] triples")
        if not _is_uint(d["file_bytes"]) or d["file_bytes"] == 0:
            raise ProtocolError("HELLO file_bytes must be a positive integer")
        if not _is_uint(d["epoch"]):
            raise ProtocolError("HELLO epoch must be a non-negative integer")
        return cls(f.offset, d["file_bytes"], tuple(tuple(c) for c in cps), _nonce(d["nonce"], "HELLO"),
                   d["epoch"], _short_str(d, "endpoint", "HELLO"), _short_str(d, "auth", "HELLO"))


@dataclass(frozen=True)
class Welcome:
    start: int                  # where the stream starts
    file_bytes: int
    master_end: int
    truncate_to: int | None     # the slave cuts its log here first
    epoch: int = 0              # the master's epoch (its promotions)
    sync: bool = False          # a SYNC_MASTER: what the slave acknowledges answers producers
    auth: str = ""              # ha_auth.proof(MASTER_LABEL, …)

    def encode(self) -> bytes:
        return encode(WELCOME, self.start, orjson.dumps({
            "version": VERSION, "file_bytes": self.file_bytes, "master_end": self.master_end,
            "truncate_to": self.truncate_to, "epoch": self.epoch, "sync": self.sync, "auth": self.auth}))

    @classmethod
    def decode(cls, f: Frame) -> "Welcome":
        d = _json(f, ("version", "file_bytes", "master_end", "truncate_to", "epoch", "sync", "auth"))
        t = d["truncate_to"]
        if not _is_uint(d["file_bytes"]) or not _is_uint(d["master_end"]) or not (t is None or _is_uint(t)) \
                or not _is_uint(d["epoch"]) or not isinstance(d["sync"], bool):
            raise ProtocolError("WELCOME fields must be non-negative integers (sync: a boolean)")
        return cls(f.offset, d["file_bytes"], d["master_end"], t, d["epoch"], d["sync"],
                   _short_str(d, "auth", "WELCOME"))


def beat_epoch(f: Frame) -> int:
    """The epoch a BEAT carries."""
    if len(f.body) != EPOCH.size or EPOCH.unpack(f.body)[0] < 0:
        raise ProtocolError("a BEAT carries its master's epoch (8 bytes, ≥ 0)")
    return EPOCH.unpack(f.body)[0]


def _is_uint(x) -> bool:
    return type(x) is int and 0 <= x < (1 << 63)


def _json(f: Frame, keys: tuple[str, ...]) -> dict:
    try:
        d = orjson.loads(f.body)
    except orjson.JSONDecodeError:
        raise ProtocolError(f"HA {KIND_NAMES[f.kind]} body is not JSON") from None
    if not isinstance(d, dict) or not all(k in d for k in keys):
        raise ProtocolError(f"HA {KIND_NAMES[f.kind]} body needs {', '.join(keys)}")
    if d["version"] != VERSION:
        raise ProtocolError(f"HA protocol version {d['version']!r} is not {VERSION}")
    return d


def record_crc(record: bytes | memoryview) -> int:
    return zlib.crc32(record) & 0xFFFFFFFF


def agreed_start(hello: Hello, master_end: int, master_min: int, record_at) -> tuple[int, int | None]:
    """Where to stream from for this slave, and where it must truncate first (None: nowhere).

    ``record_at(phys, size)`` returns the master's bytes of that record, or None if it has none
    there. The slave's log agrees with the master's up to its end when its last record (the
    checkpoint ending at ``hello.end``) is byte-identical on the master — a master only ever cuts
    its tail, so records before an identical one are identical too. Otherwise the highest
    checkpoint the master holds identically is where both agree: the slave truncates after it.
    With no agreement at all the slave starts over (truncates to 0) from the master's oldest file."""
    def same(cp) -> bool:
        phys, size, crc = cp
        if phys + size > master_end or phys < master_min:
            return False
        rec = record_at(phys, size)
        return rec is not None and record_crc(rec) == crc
    if hello.end == 0:
        return max(master_min, 0), None
    last = [cp for cp in hello.checkpoints if cp[0] + cp[1] == hello.end]
    if hello.end <= master_end and last and same(last[0]):
        return hello.end, None
    for cp in sorted(hello.checkpoints, key=lambda c: -c[0]):
        if same(cp):
            return cp[0] + cp[1], cp[0] + cp[1]     # both hold this record alike: keep up to its end
    return master_min, 0
