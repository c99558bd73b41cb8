"""The session socket's messages: how a producer hands its ingress ring to a broker (pure).

``ROOT/brokers/NAME/session.sock`` is a ``SOCK_SEQPACKET`` Unix socket (``broker.session_server``).
One connection is one producer session, and lives exactly as long as it::

    client → broker   {"op": "open", "version": 1, "label": "ring.<pid>-<n>"}   + SCM_RIGHTS [ring memfd]
    broker → client   {"ok": true, "slot": …, "generation": …, …}               + SCM_RIGHTS [doorbell memfd]
                  or  {"ok": false, "error": "busy" | "invalid" | "stopping", "message": "…"}
    client → broker   {"op": "close"}   (optional: the connection closing ends the session just the same)

Why a Unix socket beside the zmq control socket: it passes descriptors (the ring is a sealed memfd
only its creator and the broker hold, so no third process can register, close or truncate it) and
the kernel names the peer (``SO_PEERCRED``) — the broker never trusts a pid a client reports. And
when a client dies the kernel closes its end, so the broker learns it at once.

Every message is one orjson object of at most :data:`MAX_MESSAGE_BYTES`; decoding raises
:class:`~hostmq.errors.ProtocolError` for anything else.
"""
from __future__ import annotations

from dataclasses import dataclass

import orjson

from ..errors import ProtocolError

VERSION = 1
MAX_MESSAGE_BYTES = 4096
MAX_LABEL_CHARS = 32
ERRORS = ("busy", "invalid", "stopping")


@dataclass(frozen=True)
class OpenSession:
    """A producer asks for a session; its ring memfd travels with the message."""

    label: str

    def encode(self) -> bytes:
        return orjson.dumps({"op": "open", "version": VERSION, "label": self.label})


@dataclass(frozen=True)
class CloseSession:
    def encode(self) -> bytes:
        return orjson.dumps({"op": "close"})


def decode_request(data: bytes) -> OpenSession | CloseSession:
    """A client's message; ProtocolError if it is not one we know, well formed."""
    obj = _object(data)
    op = obj.get("op")
    if op == "close":
        return CloseSession()
    if op != "open":
        raise ProtocolError(f"unknown session operation {op!r:.40}")
    if obj.get("version") != VERSION:
        raise ProtocolError(f"session protocol version {obj.get('version')!r:.20}, this broker speaks {VERSION}")
    label = obj.get("label")
    if not isinstance(label, str) or not 0 < len(label) <= MAX_LABEL_CHARS or not label.isascii() \
            or not label.isprintable():
        raise ProtocolError(f"label must be 1..{MAX_LABEL_CHARS} printable ASCII characters")
    return OpenSession(label)


def encode_reply(fields: dict) -> bytes:
    return orjson.dumps({"ok": True, **fields})


def encode_refusal(error: str, message: str) -> bytes:
    if error not in ERRORS:
        raise ValueError(f"unknown refusal {error!r}")
    return orjson.dumps({"ok": False, "error": error, "message": message[:1000]})


def decode_reply(data: bytes) -> dict:
    """The broker's answer as a dict (``ok`` says which kind); ProtocolError if malformed."""
    obj = _object(data)
    if obj.get("ok") is True:
        return obj
    if obj.get("ok") is False and obj.get("error") in ERRORS and isinstance(obj.get("message"), str):
        return obj
    raise ProtocolError("malformed session reply")


def _object(data: bytes) -> dict:
    if not isinstance(data, (bytes, bytearray)) or not 0 < len(data) <= MAX_MESSAGE_BYTES:
        raise ProtocolError(f"session message of {len(data) if isinstance(data, (bytes, bytearray)) else '?'} "
                            f"bytes (1..{MAX_MESSAGE_BYTES})")
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise ProtocolError(f"session message is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("session message is not a JSON object")
    return obj
