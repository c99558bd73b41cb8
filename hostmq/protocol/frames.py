"""Control-path frames: pure encode/decode of one request or response (no I/O, no zmq).

A control message is a list of byte strings (zmq frames)::

    frame 0      one orjson object, at most MAX_HEADER_BYTES (1 MiB) in a request and
                 MAX_RESPONSE_HEADER_BYTES (64 MiB) in a response (a client trusts its servers; a
                 list of 100,000 topics is about 10 MiB):
                 {"v": 1, "code": 11, "id": 42, "resp": false, "remark": "", "f": {...}}
    frame 1..n   raw binary bodies (message bytes, batches), never interpreted here

Keys of frame 0 — all six are required, unknown extra keys are ignored (forward compatibility):

    ======== ====== =============================================================================
    key      type   meaning
    ======== ====== =============================================================================
    v        int    protocol version; only PROTOCOL_VERSION (1) is accepted
    code     int    RequestCode of a request, ResponseCode of a response; 0 ≤ code < 2**31
    id       int    request id chosen by the client (0 < id < 2**63); a response repeats it;
                    0 in a response means "the request's id could not be read"
    resp     bool   false for a request, true for a response
    remark   str    human-readable detail of a response (error text); "" for requests
    f        object the request's or response's named fields (any JSON values, string keys)
    ======== ====== =============================================================================

JSON rules are orjson's: keys must be strings, integers fit in 64 bits, no NaN/Infinity, strings are
valid UTF-8 (no lone surrogates), tuples become lists. Anything malformed raises
:class:`~hostmq.errors.ProtocolError` (never another exception type), both when encoding (so a
sender learns at once) and when decoding (so a receiver can answer BAD_REQUEST). Nothing is pickled.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import orjson

from ..errors import ProtocolError

PROTOCOL_VERSION = 1
MAX_HEADER_BYTES = 1 << 20          # frame 0 of a request larger than this is refused unparsed
MAX_RESPONSE_HEADER_BYTES = 64 << 20     # ... of a response (only clients decode responses)
# Every frame of a request is at most this big. No request carries body frames today (message data
# travels through shared memory, and a broker registers its topics in pages of frame 0), so every
# legitimate request fits; servers set it as libzmq's ZMQ_MAXMSGSIZE (hostmq.transport), which drops
# the connection of a peer that sends a larger frame before buffering it.
MAX_REQUEST_FRAME_BYTES = MAX_HEADER_BYTES
MAX_REQUEST_FRAMES = 64             # frames of one request (frame 0 + bodies); more is BAD_REQUEST
MAX_CODE = (1 << 31) - 1
MAX_REQUEST_ID = (1 << 63) - 1

_KEYS = ("v", "code", "id", "resp", "remark", "f")


@dataclass(frozen=True)
class Frame:
    """One decoded request or response."""

    code: int
    request_id: int
    fields: dict
    bodies: tuple[bytes, ...]
    response: bool
    remark: str = ""


def encode_request(code: int, request_id: int, fields: dict | None = None,
                   bodies: Sequence[bytes] = ()) -> list[bytes]:
    """Frames of a request; ProtocolError if any part cannot be encoded or a server would refuse it
    (more than MAX_REQUEST_FRAMES frames, a frame over MAX_REQUEST_FRAME_BYTES)."""
    frames = _encode(code, request_id, fields, bodies, False, "")
    if len(frames) > MAX_REQUEST_FRAMES:
        raise ProtocolError(f"a request has at most {MAX_REQUEST_FRAMES} frames, this one {len(frames)}")
    for i, f in enumerate(frames[1:], 1):
        if len(f) > MAX_REQUEST_FRAME_BYTES:
            raise ProtocolError(f"frame {i} is {len(f)} bytes; a request frame is at most "
                                f"{MAX_REQUEST_FRAME_BYTES} (servers drop the connection of a larger one)")
    return frames


def encode_response(code: int, request_id: int, fields: dict | None = None, bodies: Sequence[bytes] = (),
                    remark: str = "") -> list[bytes]:
    """Frames of a response; ProtocolError if any part cannot be encoded."""
    return _encode(code, request_id, fields, bodies, True, remark)


def decode(frames: Sequence[bytes], max_header_bytes: int = MAX_HEADER_BYTES) -> Frame:
    """The Frame carried by ``frames``; ProtocolError(why) on anything malformed (a frame 0 over
    ``max_header_bytes`` included: servers keep the request limit, clients pass the response one)."""
    if isinstance(frames, (bytes, bytearray, memoryview, str)) or not isinstance(frames, Sequence):
        raise ProtocolError(f"expected a sequence of frames, got {type(frames).__name__}")
    if len(frames) == 0:
        raise ProtocolError("message has no frames")
    header = _parse_header(frames[0], max_header_bytes)
    _check_header(header)
    return Frame(code=header["code"], request_id=header["id"], fields=header["f"],
                 bodies=tuple(_body(b, i) for i, b in enumerate(frames[1:], 1)),
                 response=header["resp"], remark=header["remark"])


def peek_request_id(frame0: Any) -> int:
    """Best-effort request id of a possibly malformed frame 0 (0 if it cannot be read); never raises.

    Lets a server address a BAD_REQUEST answer to the request it refuses, e.g. one of a newer version.
    """
    try:
        if len(frame0) > MAX_HEADER_BYTES:
            return 0
        header = orjson.loads(frame0)
        rid = header["id"]
    except Exception:       # anything unreadable simply has no id
        return 0
    return rid if type(rid) is int and 0 < rid <= MAX_REQUEST_ID else 0


def _encode(code: Any, request_id: Any, fields: Any, bodies: Any, response: bool, remark: Any) -> list[bytes]:
    header = {"v": PROTOCOL_VERSION, "code": code, "id": request_id, "resp": response, "remark": remark,
              "f": {} if fields is None else fields}
    _check_header(header)
    try:
        frame0 = orjson.dumps(header)
    except TypeError as e:                  # orjson.JSONEncodeError is a TypeError
        raise ProtocolError(f"frame 0 is not JSON-encodable: {e}") from None
    limit = MAX_RESPONSE_HEADER_BYTES if response else MAX_HEADER_BYTES
    if len(frame0) > limit:
        raise ProtocolError(f"frame 0 is {len(frame0)} bytes; the limit is {limit} "
                            f"(send large data as body frames)")
    if isinstance(bodies, (bytes, bytearray, memoryview, str)):
        raise ProtocolError("bodies must be a sequence of byte strings, not a single one")
    return [frame0, *(_body(b, i) for i, b in enumerate(bodies, 1))]


def _parse_header(frame0: Any, max_header_bytes: int = MAX_HEADER_BYTES) -> dict:
    if not isinstance(frame0, (bytes, bytearray, memoryview)):
        frame0 = _buffer(frame0, 0)
    if len(frame0) > max_header_bytes:
        raise ProtocolError(f"frame 0 is {len(frame0)} bytes; the limit is {max_header_bytes}")
    try:
        header = orjson.loads(frame0)
    except orjson.JSONDecodeError as e:
        raise ProtocolError(f"frame 0 is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"frame 0 must be a JSON object, got {type(header).__name__}")
    return header


def _check_header(h: dict) -> None:
    missing = [k for k in _KEYS if k not in h]
    if missing:
        raise ProtocolError(f"frame 0 lacks key(s) {', '.join(missing)}")
    if not _is_int(h["v"]):
        raise ProtocolError(f"frame 0 'v' must be an integer, got {h['v']!r:.40}")
    if h["v"] != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {h['v']} is not supported (this side speaks {PROTOCOL_VERSION})")
    if not (_is_int(h["code"]) and 0 <= h["code"] <= MAX_CODE):
        raise ProtocolError(f"frame 0 'code' must be an integer in 0..{MAX_CODE}, got {h['code']!r:.40}")
    if not (_is_int(h["id"]) and 0 <= h["id"] <= MAX_REQUEST_ID):
        raise ProtocolError(f"frame 0 'id' must be an integer in 0..{MAX_REQUEST_ID}, got {h['id']!r:.40}")
    if not isinstance(h["resp"], bool):
        raise ProtocolError(f"frame 0 'resp' must be a boolean, got {h['resp']!r:.40}")
    if not isinstance(h["remark"], str):
        raise ProtocolError(f"frame 0 'remark' must be a string, got {h['remark']!r:.40}")
    if not isinstance(h["f"], dict):
        raise ProtocolError(f"frame 0 'f' must be an object, got {type(h['f']).__name__}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _body(b: Any, index: int) -> bytes:
    return b if isinstance(b, bytes) else bytes(_buffer(b, index))


def _buffer(b: Any, index: int) -> memoryview:
    """Any object with the buffer protocol (bytearray, memoryview, zmq.Frame) as a memoryview."""
    if isinstance(b, str):
        raise ProtocolError(f"frame {index} must be bytes, got str")
    try:
        return memoryview(b).cast("B")
    except TypeError:
        raise ProtocolError(f"frame {index} must be bytes, got {type(b).__name__}") from None
