"""Authentication of a replication link (pure): the mutual handshake's proofs, the session keys and
the MAC every later frame carries (``protocol/ha.py`` has the frames themselves).

The handshake, both sides holding the root's replication secret ``ROOT/ha.secret``::

    master → slave   CHALLENGE   nonce_m (32 random bytes)
    slave  → master  HELLO       nonce_s, its epoch, the endpoint it reached,
                                 proof(SLAVE_LABEL, nonce_m, nonce_s, name, slave epoch, endpoint)
    master → slave   WELCOME     the master's epoch,
                                 proof(MASTER_LABEL, nonce_m, nonce_s, name, master epoch, endpoint)

``proof`` is HMAC-SHA256 under the secret of a transcript that names the direction, both nonces,
the broker name, the epoch the prover states and the TCP endpoint (``IP:PORT`` of the master's
listener as the slave connected to it and as the master accepted it; "" on a TLS link, where the
certificates bind the channel). Why each part:

* the direction label: a master's proof is never a slave's (no reflection of one side's answer);
* both nonces: neither side can replay a proof from an earlier connection — each side picked one;
* the name and the epoch: a proof for one broker name or epoch is no proof for another (a fenced
  master cannot reuse a newer one's);
* the endpoint: a relay that passes the challenge of a real master to a real slave is refused at
  the handshake — the slave reached the relay's address, not the master's listener.

After the handshake each direction has its own key (``session_keys``: HKDF-SHA256 with both nonces
as salt, RFC 5869) and every frame is followed by a 16-byte tag, HMAC-SHA256 of the direction's
frame sequence number (0, 1, …; never sent) and the frame: a frame changed, cut, dropped, replayed,
reordered or reflected back to its sender fails its tag and the link is closed (``FrameAuthError``).
Nothing here encrypts: without TLS (``[ha] tls_*``), what crosses the link can be read.
"""
from __future__ import annotations

import hashlib
import hmac
import struct

from ..errors import ProtocolError

NONCE_BYTES = 32
TAG_BYTES = 16                      # HMAC-SHA256 truncated to 128 bits (RFC 2104 §5)
SLAVE_LABEL = b"hostmq-ha v2 slave->master"
MASTER_LABEL = b"hostmq-ha v2 master->slave"
_TRANSCRIPT = struct.Struct(">32s32sqHH")    # nonce_m | nonce_s | epoch | len(name) | len(endpoint)
_SEQ = struct.Struct(">Q")
assert _TRANSCRIPT.size == 76 and _SEQ.size == 8
_KEY_INFO = {"master": b"hostmq-ha v2 key master->slave", "slave": b"hostmq-ha v2 key slave->master"}


class FrameAuthError(ProtocolError):
    """A replication frame or handshake proof failed its MAC: a wrong secret, a forged, replayed,
    reordered, reflected or damaged frame, or a relay. The link is closed."""


def proof(secret: bytes, label: bytes, nonce_m: bytes, nonce_s: bytes, name: str, epoch: int,
          endpoint: str) -> str:
    """One side's proof that it holds ``secret`` (hex HMAC-SHA256 of the transcript)."""
    n, e = name.encode(), endpoint.encode()
    if len(nonce_m) != NONCE_BYTES or len(nonce_s) != NONCE_BYTES:
        raise ProtocolError(f"replication nonces are {NONCE_BYTES} bytes")
    if not 0 <= epoch < (1 << 63) or len(n) > 0xFFFF or len(e) > 0xFFFF:
        raise ProtocolError("a replication proof's epoch, name or endpoint is out of range")
    msg = label + _TRANSCRIPT.pack(nonce_m, nonce_s, epoch, len(n), len(e)) + n + e
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def proof_ok(secret: bytes, token: object, *args) -> bool:
    """Whether ``token`` is ``proof(secret, *args)`` (constant-time compare)."""
    return isinstance(token, str) and hmac.compare_digest(proof(secret, *args), token)


def session_keys(secret: bytes, nonce_m: bytes, nonce_s: bytes, name: str) -> dict[str, bytes]:
    """The link's keys by sender (``{"master": k, "slave": k}``): HKDF-SHA256 (RFC 5869) of the
    secret, salted with both nonces, one expansion per direction."""
    prk = hmac.new(nonce_m + nonce_s, secret, hashlib.sha256).digest()
    return {side: hmac.new(prk, info + b"|" + name.encode() + b"\x01", hashlib.sha256).digest()
            for side, info in _KEY_INFO.items()}


class Sealer:
    """The sending half of a direction: appends each frame's tag and counts frames."""

    def __init__(self, key: bytes) -> None:
        self._mac = hmac.new(key, digestmod=hashlib.sha256)
        self.seq = 0

    def tag(self, frame: bytes | bytearray | memoryview) -> bytes:
        m = self._mac.copy()
        m.update(_SEQ.pack(self.seq))
        m.update(frame)
        self.seq += 1
        return m.digest()[:TAG_BYTES]


class Opener:
    """The receiving half: checks each frame's tag against the next sequence number."""

    def __init__(self, key: bytes) -> None:
        self._sealer = Sealer(key)

    @property
    def seq(self) -> int:
        return self._sealer.seq

    def check(self, frame: bytes | bytearray | memoryview, tag: bytes | bytearray | memoryview) -> None:
        seq = self._sealer.seq
        if not hmac.compare_digest(self._sealer.tag(frame), bytes(tag)):
            raise FrameAuthError(f"replication frame {seq} fails its MAC (forged, replayed, reordered, "
                                 f"reflected or damaged on the way)")
