"""Typed request/response bodies of the control path (the ``f`` object of frame 0).

Each message is a frozen dataclass whose field types are its schema: constructing one — directly or
with ``from_fields(frame.fields)`` — checks every value against the annotations and raises
:class:`~hostmq.errors.ProtocolError` naming the first bad field (``topics['orders'].perm must be
int, got '6'``). ``to_fields()`` gives the JSON-able dict to pass as ``fields=`` to
:func:`~hostmq.protocol.frames.encode_request`. Wire keys are the Python field names.

Checked types: ``str``, ``int`` (``bool`` is not an int here), ``bool``, ``float`` (an int is
accepted), ``X | None``, ``list[X]``, ``dict[str, X]``, a bare ``dict`` (any JSON object), and
``TypedDict`` classes (required keys checked, unknown keys kept as they are). Unknown top-level keys
in ``fields`` are ignored, so a newer peer may add fields without breaking an older one.

One schema at both ends: a client builds its request as one of these and sends ``to_fields()``; a
server's handler is declared with :func:`handles`, so the request is decoded once, before the handler
runs, and the handler receives the typed request — no handler reads ``frame.fields`` by hand.

Pure: no I/O.
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, TypedDict, Union

from ..errors import ProtocolError, ValidationError

_Self = typing.TypeVar("_Self", bound="ControlMessage")


class ControlMessage:
    """Base of every message dataclass: schema checking and the fields dict mapping."""

    def __post_init__(self) -> None:
        for name, tp in _hints(type(self)).items():
            _check(getattr(self, name), tp, name)

    @classmethod
    def from_fields(cls: type[_Self], fields: Any) -> _Self:
        """Build from a frame's ``fields``; ProtocolError naming the missing or mistyped field."""
        if not isinstance(fields, dict):
            raise ProtocolError(f"{cls.__name__} fields must be an object, got {type(fields).__name__}")
        kwargs = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name in fields:
                kwargs[f.name] = fields[f.name]
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ProtocolError(f"{cls.__name__} lacks field {f.name!r}")
        return cls(**kwargs)

    @classmethod
    def of(cls: type[_Self], **values: Any) -> _Self:
        """Build from a caller's arguments (a client's side): a value of the wrong type is the caller's
        bad argument, so ValidationError naming it (what a NameServer answers for it), not ProtocolError."""
        try:
            return cls(**values)
        except ProtocolError as e:
            raise ValidationError(e.why) from None

    def to_fields(self) -> dict:
        """The JSON-able dict of this message (values are shared, not copied)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]


# --- NameServer ⇄ broker ------------------------------------------------------------------------------

class _TopicQueues(TypedDict):
    read_queues: int
    write_queues: int


class TopicConfigData(_TopicQueues, total=False):
    """One topic as a broker registers it (RocketMQ ``TopicConfig``). ``perm`` and ``order`` may be
    left out (RocketMQ's defaults, 6 and false, as ``route_data.TopicConfig`` has them); the queue
    counts may not."""

    perm: int            # RocketMQ PermName bits: 4 = read, 2 = write, 1 = inherit
    order: bool


@dataclass(frozen=True)
class RegisterBrokerRequest(ControlMessage):
    """REGISTER_BROKER: a broker announces itself and every topic it serves (sent every 30 s)."""

    cluster: str
    broker_name: str
    broker_id: int                         # 0 = master, > 0 = slave
    address: str                           # control socket, e.g. ipc://ROOT/brokers/NAME/broker.sock
    ha_address: str                        # where a slave connects for replication ("" if none)
    topics: dict[str, TopicConfigData]     # topic → its config
    data_version: int                      # bumped whenever ``topics`` changes
    epoch: int = 0                         # the broker's role epoch; one older than the NameServer saw is refused


@dataclass(frozen=True)
class RegisterBrokerPage(RegisterBrokerRequest):
    """REGISTER_BROKER as the NameServer reads it: a whole registration is page 0 of 1; a broker whose
    topics do not fit one frame sends ``pages`` pages of one ``registration_id``, each with a part of
    ``topics`` (``namesrv/assembly.py``)."""

    page: int = 0
    pages: int = 1
    registration_id: int = 0


@dataclass(frozen=True)
class UnregisterBrokerRequest(ControlMessage):
    """UNREGISTER_BROKER: a broker leaves (graceful stop). The NameServer acts only when it holds
    exactly this record, ``address`` included (brokers always send it; the NameServer refuses an empty
    one with ValidationError, as it refused a missing one before the field had a type here)."""

    cluster: str
    broker_name: str
    broker_id: int
    address: str = ""


# --- clients ⇄ NameServer -----------------------------------------------------------------------------

@dataclass(frozen=True)
class GetRouteInfoRequest(ControlMessage):
    """GET_ROUTEINFO_BY_TOPIC."""

    topic: str


@dataclass(frozen=True)
class TopicsByClusterRequest(ControlMessage):
    """GET_TOPICS_BY_CLUSTER."""

    cluster: str


@dataclass(frozen=True)
class DeleteTopicInNamesrvRequest(ControlMessage):
    """DELETE_TOPIC_IN_NAMESRV: forget a topic's route, or (``cluster``) only that cluster's part."""

    topic: str
    cluster: str | None = None


@dataclass(frozen=True)
class KvConfigRequest(ControlMessage):
    """PUT_KV_CONFIG / GET_KV_CONFIG / DELETE_KV_CONFIG (``value`` only for PUT)."""

    namespace: str
    key: str
    value: str | None = None


# --- clients ⇄ broker ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class TopicRequest(ControlMessage):
    """UPDATE_AND_CREATE_TOPIC (all fields) / DELETE_TOPIC_IN_BROKER and AUTO_CREATE_TOPIC (topic only)."""

    topic: str
    read_queues: int = 4
    write_queues: int = 4
    perm: int = 6
    order: bool = False


@dataclass(frozen=True)
class QueueRequest(ControlMessage):
    """GET_MAX_OFFSET / GET_MIN_OFFSET / SEARCH_OFFSET_BY_TIMESTAMP (``timestamp_ms``)."""

    topic: str
    queue_id: int
    timestamp_ms: int = 0


@dataclass(frozen=True)
class PullRequest(ControlMessage):
    """PULL_MESSAGE. ``local``: the client reads the store files itself and wants positions only;
    otherwise the records come back as body frames. ``suspend_ms`` > 0 holds a pull that finds
    nothing until a message arrives (long polling)."""

    topic: str
    queue_id: int
    offset: int
    max_count: int = 32
    expression: str = "*"
    suspend_ms: int = 0
    local: bool = True


@dataclass(frozen=True)
class OffsetRequest(ControlMessage):
    """QUERY_CONSUMER_OFFSET (no ``offset``) / UPDATE_CONSUMER_OFFSET."""

    group: str
    topic: str
    queue_id: int
    offset: int = -1
    reset_version: int | None = None    # UPDATE: the broker's offsets_reset_version the client has seen


@dataclass(frozen=True)
class LockRequest(ControlMessage):
    """LOCK_BATCH_MQ / UNLOCK_BATCH_MQ: an orderly member locks (renews) or unlocks its queues on
    this broker; ``queues`` rows are ``{"topic": str, "queue_id": int}``."""

    group: str
    client_id: str
    queues: list[dict]


@dataclass(frozen=True)
class SendBackRequest(ControlMessage):
    """CONSUMER_SEND_MSG_BACK: a consumer's listener failed a message consumed ``reconsume_times``
    times before; the broker answers where it goes (RocketMQ ConsumerSendMsgBackRequestHeader)."""

    group: str
    reconsume_times: int
    max_reconsume_times: int = 16
    delay_level: int = 0


@dataclass(frozen=True)
class EndTransactionRequest(ControlMessage):
    """END_TRANSACTION: a producer of ``group`` ended the local transaction of the half message at
    ``queue_offset`` of the half queue (``phys_offset`` in the commitlog); ``state`` is COMMIT,
    ROLLBACK or UNKNOWN (RocketMQ EndTransactionRequestHeader)."""

    group: str
    queue_offset: int
    phys_offset: int
    state: str
    from_check: bool = False


@dataclass(frozen=True)
class CheckTransactionRequest(ControlMessage):
    """CHECK_TRANSACTION_STATE: a transaction producer of ``group`` asks for half messages the broker
    wants checked (at most ``max_count``)."""

    group: str
    max_count: int = 32


@dataclass(frozen=True)
class ResetOffsetRequest(ControlMessage):
    """INVOKE_BROKER_TO_RESET_OFFSET: move ``group``'s offsets of ``topic`` to the first message stored
    at or after ``timestamp_ms`` (RocketMQ resetOffsetByTimestamp)."""

    group: str
    topic: str
    timestamp_ms: int


@dataclass(frozen=True)
class ViewMessageRequest(ControlMessage):
    """VIEW_MESSAGE_BY_ID."""

    msg_id: str


@dataclass(frozen=True)
class GroupRequest(ControlMessage):
    """GET_CONSUMER_LIST_BY_GROUP / GET_CONSUME_STATS: about one consumer group."""

    group: str


@dataclass(frozen=True)
class ClientIdRequest(ControlMessage):
    """UNREGISTER_CLIENT: a client leaves every group it joined on this broker."""

    client_id: str


@dataclass(frozen=True)
class HeartbeatRequest(ControlMessage):
    """HEART_BEAT: a client announces itself and its groups."""

    client_id: str
    producer_groups: list[str]
    consumer_groups: list[str]
    pid: int = 0                # the client's process (same host): the broker drops it when it is gone


@dataclass(frozen=True)
class PromoteRequest(ControlMessage):
    """PROMOTE_BROKER: a slave becomes its group's master in ``role`` (ASYNC_MASTER or SYNC_MASTER), at
    an epoch above ``epoch`` (the newest the operator's side knows of); ``force`` accepts losing what
    the slave lacks (``broker/promotion.py``)."""

    role: str = "ASYNC_MASTER"
    force: bool = False
    epoch: int = 0


# --- the server's side: one decode step per handler ----------------------------------------------------

_Handler = Callable[..., Any]


def handles(request_type: type[ControlMessage], *,
            invalid: Callable[[str], Exception] | None = None) -> Callable[[_Handler], _Handler]:
    """Declare the request type of a control handler method ``fn(self, request, token=None)``.

    The decorated method is what ``transport.Server``'s handler table holds and what tests call:
    ``method(frame, token=None)``. It decodes ``frame.fields`` once with ``request_type.from_fields``
    and calls ``fn`` with the typed request, so a handler never sees an unchecked field. A decode
    failure is a ProtocolError (BAD_REQUEST at the client), or ``invalid(why)`` where a server has
    always answered bad fields with another error — the NameServer's MESSAGE_ILLEGAL, which clients
    raise as ValidationError — so what a client receives does not depend on where a check sits.
    ``method.request_type`` names the schema (for tests and tools that list what a server reads).
    """
    def declare(fn: _Handler) -> _Handler:
        @functools.wraps(fn)
        def handler(self: Any, frame: Any, token: Any = None) -> Any:
            try:
                request = request_type.from_fields(frame.fields)
            except ProtocolError as e:
                if invalid is None:
                    raise
                raise invalid(e.why) from None
            return fn(self, request, token)

        handler.request_type = request_type          # type: ignore[attr-defined]
        return handler
    return declare


# --- schema checking -----------------------------------------------------------------------------------

@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _check(value: Any, tp: Any, path: str) -> None:
    """Raise ProtocolError naming ``path`` if ``value`` does not have type ``tp``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return
    if origin in (Union, types.UnionType):
        if not any(_matches(value, a, path) for a in args):
            _bad(path, " or ".join(_type_name(a) for a in args), value)
    elif typing.is_typeddict(tp):
        _check_typeddict(value, tp, path)
    elif origin is list or tp is list:
        if not isinstance(value, list):
            _bad(path, "list", value)
        item_tp = args[0] if args else Any
        for i, item in enumerate(value):
            _check(item, item_tp, f"{path}[{i}]")
    elif origin is dict or tp is dict:
        if not isinstance(value, dict):
            _bad(path, "object", value)
        item_tp = args[1] if args else Any
        for k, item in value.items():
            if not isinstance(k, str):
                _bad(f"{path} key", "str", k)
            _check(item, item_tp, f"{path}[{k!r}]")
    elif not _scalar_ok(value, tp):
        _bad(path, _type_name(tp), value)


def _matches(value: Any, tp: Any, path: str) -> bool:
    try:
        _check(value, tp, path)
    except ProtocolError:
        return False
    return True


def _check_typeddict(value: Any, tp: Any, path: str) -> None:
    if not isinstance(value, dict):
        _bad(path, "object", value)
    hints = _hints(tp)
    for key in hints:
        if key in tp.__required_keys__ and key not in value:
            raise ProtocolError(f"field {path} lacks key {key!r}")
    for key, key_tp in hints.items():
        if key in value:
            _check(value[key], key_tp, f"{path}.{key}")


def _scalar_ok(value: Any, tp: Any) -> bool:
    if tp is type(None) or tp is None:
        return value is None
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp in (str, bool):
        return isinstance(value, tp)
    raise TypeError(f"messages.py cannot check values of type {tp!r}")   # a bug in a schema, not in input


def _type_name(tp: Any) -> str:
    if tp is type(None) or tp is None:
        return "null"
    return getattr(tp, "__name__", None) or str(tp)


def _bad(path: str, expected: str, value: Any) -> typing.NoReturn:
    raise ProtocolError(f"field {path} must be {expected}, got {type(value).__name__} {value!r:.60}")
