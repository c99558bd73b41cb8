"""Hostile control messages for the frame fuzzer (``frame_fuzz``): pure generation from a seeded
``random.Random``, no I/O.

Three kinds of case, each a list of zmq frames a DEALER sends:

* ``raw``    — random multipart messages: random bytes, empty frames, many frames, now and then one
  frame over the request limit (the server must drop that connection, nothing else);
* ``json``   — frame 0 is JSON-like text that a strict parser must refuse or a header check must
  catch: integers past 64 bits, NaN / Infinity, nesting thousands deep, wrong header types, versions;
* ``frame``  — a structurally valid request: a code from ``RequestCode`` (or a random one) and fields
  named like the protocol's own (every field of every ``protocol.messages`` dataclass, plus the
  NameServer's), with values of the declared type at its edges or of a wrong type, long strings,
  deep nesting, names that exist (topics, groups, other clients' ids, the broker's address).

Field names and types come from ``protocol.messages`` and ``RequestCode``, never from a handler
table, so handlers can come and go without touching the fuzzer.
"""
from __future__ import annotations

import dataclasses
import json
import random
import types
import typing
from dataclasses import dataclass, field

import orjson

from ..protocol import messages
from ..protocol.codes import RequestCode
from ..protocol.frames import MAX_REQUEST_FRAME_BYTES, PROTOCOL_VERSION

# Fields the NameServer reads without a dataclass (namesrv.server), and paged registration's.
EXTRA_FIELDS: dict[str, typing.Any] = {"page": int, "pages": int, "registration_id": int, "value": str,
                                       "cluster": str, "address": str}
EDGE_INTS = (0, 1, -1, 2, 3, 31, 32, 4096, 4097, 2**31 - 1, 2**31, -2**31, 2**32, 2**53 + 1, 2**63 - 1, -2**63)


@dataclass(frozen=True)
class Raw:
    """JSON text put into frame 0 as it is (a token orjson would refuse to produce)."""

    text: str


@dataclass
class Known:
    """Names that exist in the cluster under fuzz, so cases reach past the first lookups."""

    topics: list[str] = field(default_factory=lambda: ["fuzz"])
    groups: list[str] = field(default_factory=lambda: ["victim"])
    client_ids: list[str] = field(default_factory=list)
    msg_ids: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    brokers: list[str] = field(default_factory=lambda: ["broker-a"])

    def strings(self) -> list[str]:
        return self.topics + self.groups + self.client_ids + self.msg_ids + self.addresses + self.brokers


@dataclass(frozen=True)
class Case:
    kind: str                    # raw | json | frame
    frames: list[bytes]
    code: int | None = None

    def describe(self) -> str:
        head = self.frames[0][:120] if self.frames else b""
        size = sum(len(f) for f in self.frames)
        return f"{self.kind} code={self.code} frames={len(self.frames)} bytes={size} {head!r}"


def field_types() -> dict[str, typing.Any]:
    """Every field name of the protocol's message dataclasses with its declared type."""
    out = dict(EXTRA_FIELDS)
    for obj in vars(messages).values():
        if isinstance(obj, type) and dataclasses.is_dataclass(obj) and issubclass(obj, messages.ControlMessage):
            out.update(typing.get_type_hints(obj))
    return out


FIELD_TYPES = field_types()
FIELD_NAMES = sorted(FIELD_TYPES)


def make_case(rng: random.Random, known: Known) -> Case:
    r = rng.random()
    if r < 0.15:
        return raw_case(rng)
    if r < 0.30:
        return json_case(rng, known)
    return frame_case(rng, known)


# --- raw multipart -----------------------------------------------------------------------------------------

def raw_case(rng: random.Random) -> Case:
    r = rng.random()
    if r < 0.01:                                # over the limit: costs the sender its connection
        return Case("raw", [b"\x00" * (MAX_REQUEST_FRAME_BYTES + 1 + rng.randrange(1 << 20))])
    if r < 0.05:                                # many frames
        return Case("raw", [rng.randbytes(rng.randrange(8)) for _ in range(rng.randrange(60, 200))])
    n = rng.randrange(1, 5)
    return Case("raw", [rng.randbytes(rng.choice((0, 1, 7, 64, 1000, 70_000))) for _ in range(n)])


# --- malformed JSON headers ---------------------------------------------------------------------------------

def json_case(rng: random.Random, known: Known) -> Case:
    header = base_header(rng)
    r = rng.random()
    if r < 0.25:
        header[rng.choice(list(header))] = hostile_value(rng, known, 0)
    elif r < 0.5:
        header["f"] = {rng.choice(FIELD_NAMES): Raw(rng.choice(("NaN", "Infinity", "-Infinity", "1e400",
                                                                  str(2**64 + rng.randrange(1 << 30)),
                                                                  "-" + str(2**80))))}
    elif r < 0.75:
        depth = rng.choice((100, 255, 256, 1000, 1025, 5000))
        header["f"] = {rng.choice(FIELD_NAMES): Raw("[" * depth + "]" * depth)}
    else:
        del header[rng.choice(list(header))]
    text = dump(header)
    if rng.random() < 0.2:                       # torn or trailing junk
        text = text[:rng.randrange(len(text) + 1)] if rng.random() < 0.5 else text + rng.randbytes(3)
    return Case("json", [text], header.get("code") if isinstance(header.get("code"), int) else None)


# --- structurally valid requests ----------------------------------------------------------------------------

def frame_case(rng: random.Random, known: Known) -> Case:
    code = rng.choice(list(RequestCode)) if rng.random() < 0.95 else rng.choice((0, 1, 999, 2**31 - 1))
    header = base_header(rng, code)
    if rng.random() < 0.5:
        # Every field the protocol knows, well typed, a few made hostile: whatever the handler of
        # ``code`` reads is there, so the case gets past "lacks field" into the handler itself.
        fields = {name: plausible(rng, FIELD_TYPES[name], name, known) for name in FIELD_NAMES}
        for name in rng.sample(FIELD_NAMES, rng.randrange(0, 4)):
            fields[name] = hostile_value(rng, known, 0)
    else:
        fields = {name: plausible(rng, FIELD_TYPES[name], name, known) if rng.random() < 0.6
                  else hostile_value(rng, known, 0) for name in rng.sample(FIELD_NAMES, rng.randrange(0, 9))}
    header["f"] = fields
    bodies = [rng.randbytes(rng.randrange(64)) for _ in range(rng.choice((0, 0, 0, 1, 3)))]
    return Case("frame", [dump(header), *bodies], int(code))


def base_header(rng: random.Random, code: int | None = None) -> dict:
    return {"v": PROTOCOL_VERSION, "code": int(rng.choice(list(RequestCode)) if code is None else code),
            "id": rng.randrange(1, 2**63), "resp": False, "remark": "", "f": {}}


def plausible(rng: random.Random, tp, name: str, known: Known):
    """A value of the declared type ``tp``, mostly at its edges."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return plausible(rng, rng.choice(args), name, known)
    if tp is type(None):
        return None
    if tp is bool:
        return rng.random() < 0.5
    if tp is int:
        return rng.choice(EDGE_INTS) if rng.random() < 0.6 else rng.randrange(-5, 50)
    if tp is float:
        return rng.choice((0.0, -1.0, 1e300, 0.5))
    if tp is str:
        return known_string(rng, name, known)
    if origin is list or tp is list:
        item = args[0] if args else dict
        return [plausible(rng, item, name, known) for _ in range(rng.choice((0, 1, 2, 20)))]
    if origin is dict or tp is dict or typing.is_typeddict(tp):
        return plausible_dict(rng, tp, name, known)
    return hostile_value(rng, known, 0)


def plausible_dict(rng: random.Random, tp, name: str, known: Known) -> dict:
    if typing.is_typeddict(tp):
        return {k: plausible(rng, t, k, known) for k, t in typing.get_type_hints(tp).items()}
    args = typing.get_args(tp)
    if name == "queues" or not args:
        return {"topic": rng.choice(known.topics), "queue_id": rng.choice(EDGE_INTS)}
    return {known_string(rng, "topic", known): plausible(rng, args[1], name, known)
            for _ in range(rng.choice((0, 1, 3, 100)))}


def known_string(rng: random.Random, name: str, known: Known) -> str:
    r = rng.random()
    if r < 0.5:
        pool = {"topic": known.topics, "group": known.groups, "client_id": known.client_ids,
                "msg_id": known.msg_ids, "address": known.addresses, "broker_name": known.brokers}.get(name)
        return rng.choice(pool or known.strings() or ["x"])
    if r < 0.9:
        return rng.choice(known.strings() or ["x"])
    return hostile_string(rng, valid_utf8=True)


def hostile_string(rng: random.Random, valid_utf8: bool = False) -> str:
    """An odd string; a lone surrogate (which no JSON parser should accept) unless ``valid_utf8``."""
    if not valid_utf8 and rng.random() < 0.05:
        return "\ud800"
    return rng.choice((
        "", " ", "*", "a || b", "x" * rng.choice((127, 128, 255, 256, 70_000)), "../../PWNED", "%RETRY%g",
        "%DLQ%g", "RMQ_SYS_TRANS_HALF_TOPIC", "SCHEDULE_TOPIC_XXXX", "\x00\x01\x02", "é\u2028\U0001F600",
        "a = 'x' AND " * 50 + "b = 1", "(" * 300 + "a = 1" + ")" * 300, "ipc:///etc/passwd",
        "/hostmq.x.ring.1", "-1", "NaN", "0" * 40, "TBW102"))


def hostile_value(rng: random.Random, known: Known, depth: int):
    """A wrong-typed, extreme or nested value; nesting stays within a few thousand nodes."""
    r = rng.random()
    if r < 0.25:
        return rng.choice(EDGE_INTS + (True, False, None, 0.5, -0.0, 1e308))
    if r < 0.5:
        return hostile_string(rng) if rng.random() < 0.7 else rng.choice(known.strings() or ["x"])
    if r < 0.6:
        return Raw(rng.choice(("NaN", "1e999", str(2**64), str(-2**64 - 1))))
    if depth >= 3:
        return None
    if r < 0.65 and depth == 0:                 # long and flat
        return [rng.choice(EDGE_INTS) for _ in range(rng.choice((1000, 5000)))]
    if r < 0.8:
        return [hostile_value(rng, known, depth + 1) for _ in range(rng.choice((0, 1, 3, 8)))]
    return {rng.choice(FIELD_NAMES + [""]): hostile_value(rng, known, depth + 1) for _ in range(rng.randrange(4))}


def dump(value) -> bytes:
    """JSON of ``value`` where a :class:`Raw` is copied as it is and integers may pass 64 bits."""
    try:
        return orjson.dumps(value)          # fast, and refuses exactly what needs the slow path
    except TypeError:
        return _dump(value).encode("utf-8", "surrogatepass")


def _dump(value) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{_dump(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_dump(v) for v in value) + "]"
    if value is True or value is False or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    return json.dumps(value)


__all__ = ["Case", "Known", "Raw", "make_case", "FIELD_NAMES", "FIELD_TYPES", "dump"]
