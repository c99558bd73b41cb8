"""Route records: what brokers register and what clients fetch (RocketMQ ``common/protocol/route``).

Every record is a frozen dataclass that validates itself on construction, so a bad value can never be
represented: a wrong type or an out-of-range value raises :class:`~hostmq.errors.ValidationError`
whose message starts with the field's name (a nested path such as ``queue_datas[1].perm`` when the
record came from :meth:`from_dict` of a containing record).

``to_dict()`` gives a JSON-able dict (str keys only, ints within signed 64 bits, so orjson encodes it
without options) whose keys are the field names; ``from_dict()`` accepts exactly that shape: unknown
keys, missing required keys and wrong types raise ``ValidationError``. Fields with a default may be
left out. ``BrokerData.addrs`` travels as ``{"0": address, "1": address}``.

Nothing here touches a clock, a socket or a file.
"""
from __future__ import annotations

import dataclasses
from dataclasses import MISSING, dataclass, field
from typing import Any, Callable, Mapping, TypeVar

from ..errors import ValidationError
from ..records import validate_topic

# RocketMQ PermName bits of a topic on one broker.
PERM_PRIORITY = 8
PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1
PERM_MAX = PERM_PRIORITY | PERM_READ | PERM_WRITE | PERM_INHERIT

MASTER_ID = 0                   # broker id of a master; slaves have ids > 0 (RocketMQ MixAll.MASTER_ID)
MIN_QUEUES = 1                  # fewest read / write queues a topic may have on one broker
MAX_QUEUES = 1024               # most read / write queues a topic may have on one broker
MAX_NAME_CHARS = 255            # longest cluster / broker name, KV namespace or key
INT64_MAX = (1 << 63) - 1       # ids, versions and times must fit a signed 64-bit int (Java long, orjson)

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------
# Field checks, shared with routes.py; each returns the value or raises ValidationError naming the field
# ---------------------------------------------------------------------------------------------
def invalid(name: str, why: str, value: Any) -> ValidationError:
    """A ValidationError whose message names the field, says why, and shows the value."""
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return ValidationError(f"{name}: {why}, got {shown}")


def check_text(name: str, value: Any, max_chars: int | None = MAX_NAME_CHARS) -> str:
    """A non-empty str of at most ``max_chars`` characters (no limit when None)."""
    if not isinstance(value, str) or not value:
        raise invalid(name, "must be a non-empty string", value)
    if max_chars is not None and len(value) > max_chars:
        raise invalid(name, f"must be at most {max_chars} characters", value)
    return value


def check_int(name: str, value: Any, lo: int = 0, hi: int = INT64_MAX) -> int:
    """An int (never a bool) within ``lo..hi``."""
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise invalid(name, f"must be an int within {lo}..{hi}", value)
    return value


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise invalid(name, "must be a bool", value)
    return value


def check_topic(name: str, value: Any) -> str:
    """A topic name by RocketMQ's rules (``records.validate_topic``)."""
    try:
        validate_topic(value)
    except ValidationError as e:
        raise ValidationError(f"{name}: {e}") from None
    return value


def check_optional_text(name: str, value: Any) -> str | None:
    """None, or a non-empty str; the empty string means "none" and is returned as None."""
    if value is None or value == "":
        return None
    return check_text(name, value, max_chars=None)


def nested(path: str, build: Callable[..., T], *args: Any) -> T:
    """Call ``build(*args)``; a ValidationError from it gets ``path.`` in front of its field name."""
    try:
        return build(*args)
    except ValidationError as e:
        raise ValidationError(f"{path}.{e}") from None


def _kwargs(cls: type, data: Any) -> dict[str, Any]:
    """The keyword arguments of ``cls`` found in ``data``: a mapping with no unknown or missing keys."""
    if not isinstance(data, Mapping):
        raise invalid(cls.__name__, "must be an object (a dict)", data)
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in data if k not in known]
    if unknown:
        raise ValidationError(f"{unknown[0]!s}: unknown field of {cls.__name__}; "
                              f"known: {', '.join(known)}")
    for fname, f in known.items():
        if fname not in data and f.default is MISSING and f.default_factory is MISSING:
            raise ValidationError(f"{fname}: missing from {cls.__name__}")
    return dict(data)


def _list(name: str, value: Any, kind: type) -> list:
    if not isinstance(value, (list, tuple)):
        raise invalid(name, "must be a list", value)
    for i, item in enumerate(value):
        if not isinstance(item, kind):
            raise invalid(f"{name}[{i}]", f"must be a {kind.__name__}", item)
    return list(value)


# ---------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TopicConfig:
    """One topic as a broker holds it (RocketMQ ``TopicConfig``); brokers send these when registering."""

    topic_name: str
    read_queues: int = 4            # queues consumers read (RocketMQ readQueueNums)
    write_queues: int = 4           # queues producers write (RocketMQ writeQueueNums)
    perm: int = PERM_READ | PERM_WRITE
    order: bool = False             # ordered topic: a producer keeps one key on one queue

    def __post_init__(self) -> None:
        check_topic("topic_name", self.topic_name)
        check_int("read_queues", self.read_queues, MIN_QUEUES, MAX_QUEUES)
        check_int("write_queues", self.write_queues, MIN_QUEUES, MAX_QUEUES)
        check_int("perm", self.perm, 0, PERM_MAX)
        check_bool("order", self.order)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "TopicConfig":
        return cls(**_kwargs(cls, data))


@dataclass(frozen=True)
class QueueData:
    """A topic's queues on one broker name, as the NameServer serves them (RocketMQ ``QueueData``)."""

    broker_name: str
    read_queues: int
    write_queues: int
    perm: int
    order: bool = False

    def __post_init__(self) -> None:
        check_text("broker_name", self.broker_name)
        check_int("read_queues", self.read_queues, MIN_QUEUES, MAX_QUEUES)
        check_int("write_queues", self.write_queues, MIN_QUEUES, MAX_QUEUES)
        check_int("perm", self.perm, 0, PERM_MAX)
        check_bool("order", self.order)

    @classmethod
    def of(cls, broker_name: str, topic: TopicConfig) -> "QueueData":
        """The queue data a broker's topic config gives (RocketMQ ``createAndUpdateQueueData``)."""
        return cls(broker_name, topic.read_queues, topic.write_queues, topic.perm, topic.order)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "QueueData":
        return cls(**_kwargs(cls, data))


@dataclass(frozen=True)
class BrokerData:
    """A broker name's cluster and addresses by broker id (0 = master) (RocketMQ ``BrokerData``).

    ``addrs`` is copied (sorted by id) on construction, so a caller's dict never aliases the record.
    """

    cluster: str
    broker_name: str
    addrs: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_text("cluster", self.cluster)
        check_text("broker_name", self.broker_name)
        if not isinstance(self.addrs, Mapping):
            raise invalid("addrs", "must be a mapping of broker id to address", self.addrs)
        for broker_id, address in self.addrs.items():
            check_int(f"addrs[{broker_id!r}]", broker_id)
            check_text(f"addrs[{broker_id!r}]", address, max_chars=None)
        object.__setattr__(self, "addrs", dict(sorted(self.addrs.items())))

    @property
    def master_address(self) -> str | None:
        return self.addrs.get(MASTER_ID)

    def to_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "broker_name": self.broker_name,
                "addrs": {str(i): a for i, a in self.addrs.items()}}

    @classmethod
    def from_dict(cls, data: Any) -> "BrokerData":
        kwargs = _kwargs(cls, data)
        addrs = kwargs.get("addrs", {})
        if not isinstance(addrs, Mapping):
            raise invalid("addrs", "must be a mapping of broker id to address", addrs)
        kwargs["addrs"] = {_broker_id_key(k): v for k, v in addrs.items()}
        return cls(**kwargs)


def _broker_id_key(key: Any) -> int:
    """A broker id from a JSON object key: decimal digits (an int is accepted too)."""
    if isinstance(key, str) and key.isascii() and key.isdigit():
        key = int(key)
    return check_int(f"addrs[{key!r}]", key)


@dataclass(frozen=True)
class TopicRouteData:
    """Where a topic lives (RocketMQ ``TopicRouteData``), as ``RouteTable.topic_route`` returns it.

    ``queue_datas`` are sorted by broker name; ``broker_datas`` hold every broker name that has queue
    data for the topic. ``order_topic_conf`` is the topic's entry in the ``ORDER_TOPIC_CONFIG`` KV
    namespace (RocketMQ ``orderTopicConf``, e.g. ``"broker-a:4;broker-b:4"``), or None.
    """

    queue_datas: list[QueueData]
    broker_datas: list[BrokerData]
    order_topic_conf: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "queue_datas", _list("queue_datas", self.queue_datas, QueueData))
        object.__setattr__(self, "broker_datas", _list("broker_datas", self.broker_datas, BrokerData))
        if self.order_topic_conf is not None and not isinstance(self.order_topic_conf, str):
            raise invalid("order_topic_conf", "must be a string or None", self.order_topic_conf)

    def to_dict(self) -> dict[str, Any]:
        return {"queue_datas": [q.to_dict() for q in self.queue_datas],
                "broker_datas": [b.to_dict() for b in self.broker_datas],
                "order_topic_conf": self.order_topic_conf}

    @classmethod
    def from_dict(cls, data: Any) -> "TopicRouteData":
        kwargs = _kwargs(cls, data)
        for name, kind in (("queue_datas", QueueData), ("broker_datas", BrokerData)):
            items = kwargs[name]
            if not isinstance(items, list):
                raise invalid(name, "must be a list", items)
            kwargs[name] = [nested(f"{name}[{i}]", kind.from_dict, d) for i, d in enumerate(items)]
        return cls(**kwargs)


@dataclass(frozen=True)
class RegisterResult:
    """What a registering broker learns (RocketMQ ``RegisterBrokerResult``).

    For a slave whose master is registered: the master's address and HA address; otherwise None.
    """

    master_address: str | None = None
    ha_server_address: str | None = None

    def __post_init__(self) -> None:
        for name in ("master_address", "ha_server_address"):
            value = getattr(self, name)
            if value is not None:
                check_text(name, value, max_chars=None)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "RegisterResult":
        return cls(**_kwargs(cls, data))


@dataclass(frozen=True)
class BrokerLive:
    """Liveness of one broker address (RocketMQ ``BrokerLiveInfo`` without the channel)."""

    last_update_ms: int             # now_ms of the last registration or heartbeat
    data_version: int               # version of the topic config last registered from this address
    ha_address: str | None          # where slaves replicate from (HA server), None if it has none


# ---------------------------------------------------------------------------------------------
# Cluster info (the dict RouteTable.cluster_info returns) on the wire
# ---------------------------------------------------------------------------------------------
def cluster_info_to_dict(info: Mapping[str, Any]) -> dict[str, Any]:
    """``RouteTable.cluster_info()`` as a JSON-able dict (BrokerData values become dicts)."""
    return {"brokers": {name: b.to_dict() for name, b in info["brokers"].items()},
            "clusters": {c: list(names) for c, names in info["clusters"].items()},
            "live": dict(info["live"])}


def cluster_info_from_dict(data: Any) -> dict[str, Any]:
    """The inverse of :func:`cluster_info_to_dict`, validated."""
    if not isinstance(data, Mapping) or set(data) != {"brokers", "clusters", "live"}:
        raise invalid("cluster_info", "must be an object with keys brokers, clusters, live", data)
    brokers, clusters, live = data["brokers"], data["clusters"], data["live"]
    for name, value in (("brokers", brokers), ("clusters", clusters), ("live", live)):
        if not isinstance(value, Mapping):
            raise invalid(name, "must be an object", value)
    out_brokers = {check_text("brokers", k): nested(f"brokers[{k!r}]", BrokerData.from_dict, v)
                   for k, v in brokers.items()}
    out_clusters = {}
    for c, names in clusters.items():
        check_text("clusters", c)
        out_clusters[c] = [check_text(f"clusters[{c!r}]", n) for n in _list(f"clusters[{c!r}]", names, str)]
    out_live = {check_text("live", a, max_chars=None): check_int(f"live[{a!r}]", ms)
                for a, ms in live.items()}
    return {"brokers": out_brokers, "clusters": out_clusters, "live": out_live}


__all__ = [
    "PERM_PRIORITY", "PERM_READ", "PERM_WRITE", "PERM_INHERIT", "MASTER_ID", "MIN_QUEUES", "MAX_QUEUES",
    "TopicConfig", "QueueData", "BrokerData", "TopicRouteData", "RegisterResult", "BrokerLive",
    "cluster_info_to_dict", "cluster_info_from_dict",
]
