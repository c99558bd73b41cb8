"""One exception tree for hostmq.

Expected outcomes are values (``GetResult.status``, ``AppendResult.status``); faults are exceptions,
and every one derives from :class:`HostMQError` and carries the data a user needs to act on it.
"""
from __future__ import annotations


class HostMQError(Exception):
    """Base of every error hostmq raises on purpose."""


class ValidationError(HostMQError, ValueError):
    """Bad topic, body, properties or argument; nothing was stored."""


class ConfigError(HostMQError, ValueError):
    """A configuration key or value is unknown or out of range."""


class IdleStrategyError(ConfigError):
    """An idle strategy (``"backoff:50"``, a config key, a client's ``idle=``) is not one hostmq knows."""


class NoRouteError(HostMQError):
    """No broker serves the topic (or no NameServer answered)."""


class NotMasterError(NoRouteError):
    """A request that only a master serves reached a slave (NO_PERMISSION): topics, resets, send-backs
    and transactions go to the master of the broker name."""


class PromotionRefusedError(HostMQError):
    """``hostmq ha promote`` refused: the instance is not a slave, it has not stored everything its
    master said it holds (``--force`` accepts that loss), or its master still runs."""


class RoleLockTimeoutError(HostMQError, TimeoutError):
    """A role decision of a broker name (a starting instance reading its role, ``hostmq ha promote``
    or ``demote``) waited its whole timeout for the name's role lock (``live/role_lock.py``);
    ``holder_pid`` is the process the kernel says holds it (0: it could not tell)."""

    def __init__(self, name: str, path: str, holder_pid: int, holder: str, timeout_s: float) -> None:
        self.name, self.path, self.holder_pid, self.holder = name, path, holder_pid, holder
        who = f"pid {holder_pid} ({holder})" if holder_pid else "another process"
        super().__init__(f"the role lock of broker {name} ({path}) is held by {who}; waited {timeout_s:.1f} s "
                         f"(a stopped process holding it: resume or kill it)")


class FencedError(HostMQError):
    """An epoch older than the newest one known for a broker name: a master a slave already left
    behind, or a registration of a fenced instance. Refused; ``hostmq status`` shows the newer one."""

    def __init__(self, message: str, epoch: int = -1, newest: int = -1) -> None:
        super().__init__(message)
        self.epoch = epoch
        self.newest = newest


class BrokerBusyError(HostMQError):
    """Back-pressure: ring full past the send timeout, or the disk is too full to accept writes."""


class SendTimeout(HostMQError, TimeoutError):
    """A send was not acknowledged within its timeout (the message may still be stored)."""


class ConnectError(HostMQError, ConnectionError):
    """The root is missing, unreadable, or nothing listens on its sockets."""


class FilterSyntaxError(HostMQError, ValueError):
    """A tag or SQL92 filter expression could not be parsed."""


class StoreLockedError(HostMQError):
    """The store directory is already open in another process (its ``lock`` file is held)."""

    def __init__(self, path: str, holder: str = "") -> None:
        self.path = path
        self.holder = holder
        extra = f" (held by {holder})" if holder else ""
        super().__init__(f"store {path} is already open in another process{extra}")


class StoreFullError(BrokerBusyError):
    """The disk holding the store passed the refuse-writes ratio; nothing was stored."""


class CorruptRecordError(HostMQError):
    """Bytes at ``phys_offset`` of ``path`` are not a valid record (torn write, garbage, bad CRC)."""

    def __init__(self, path: str, phys_offset: int, why: str) -> None:
        self.path = path
        self.phys_offset = phys_offset
        self.why = why
        super().__init__(f"corrupt record in {path or '<buffer>'} at offset {phys_offset}: {why}")


class MessageNotFoundError(HostMQError, LookupError):
    """A message id names no stored message (bad id, or the file was deleted by retention)."""


__all__ = [
    "HostMQError", "ValidationError", "ConfigError", "NoRouteError", "BrokerBusyError", "SendTimeout",
    "ConnectError", "FilterSyntaxError", "StoreLockedError", "StoreFullError", "CorruptRecordError",
    "MessageNotFoundError", "NotMasterError", "PromotionRefusedError", "RoleLockTimeoutError",
]


class ProtocolError(HostMQError, ValueError):
    """A control frame or its fields are malformed (bad JSON, missing key, wrong type, wrong version)."""

    def __init__(self, why: str) -> None:
        self.why = why
        super().__init__(why)


class RemoteError(HostMQError):
    """The peer answered a control request with an error ``code`` that maps to no narrower error."""

    def __init__(self, code: int, remark: str, address: str = "") -> None:
        self.code = code
        self.remark = remark
        self.address = address
        where = f" from {address}" if address else ""
        super().__init__(f"request failed with response code {code}{where}: {remark or '(no remark)'}")


__all__ += ["ProtocolError", "RemoteError"]


class SegmentError(HostMQError):
    """A shared-memory segment or semaphore ``name`` cannot be used: foreign, wrong kind or layout
    version, unreadable header, or it could not be created (``why`` says which)."""

    def __init__(self, name: str, why: str) -> None:
        self.name = name
        self.why = why
        super().__init__(f"shared memory {name}: {why}")


class SegmentNotFoundError(SegmentError, LookupError):
    """No shared-memory segment (or semaphore) of that name exists (its owner may have gone)."""


class SegmentExistsError(SegmentError):
    """A segment or semaphore of that name already exists; creation refused (O_EXCL)."""


class RingCorruptError(HostMQError):
    """A ring's cursors or a frame header at cursor ``pos`` are impossible; the reader should drop the
    ring (a producer that wrote garbage, or memory someone else scribbled on)."""

    def __init__(self, name: str, pos: int, why: str) -> None:
        self.name = name
        self.pos = pos
        self.why = why
        super().__init__(f"ring {name} corrupt at position {pos}: {why}")


__all__ += ["SegmentError", "SegmentNotFoundError", "SegmentExistsError", "RingCorruptError"]


class DataLossError(HostMQError):
    """Offsets a reader asked for were deleted by retention before it read them (Spark's
    ``failOnDataLoss``)."""


__all__ += ["DataLossError"]


# -- fault harness (issue 15) --
class FaultHarnessError(HostMQError):
    """The fault-injection harness could not run (a worker or server did not start, a root that is
    not fresh, bad options); what it found in the system under test is reported, never raised."""


__all__ += ["FaultHarnessError"]


# -- message properties (issue 31) --
class ReservedPropertyError(ValidationError):
    """A message's user properties use names the system sets itself (RocketMQ's
    ``MessageConst.STRING_HASH_SET``, plus the ones hostmq writes); ``names`` lists them, sorted.
    Nothing was stored."""

    def __init__(self, names) -> None:
        self.names = tuple(sorted(names))
        super().__init__(f"properties {', '.join(map(repr, self.names))} are used by the system; "
                         "choose other names (tags, keys and delay_level have their own arguments)")


__all__ += ["ReservedPropertyError"]


# -- control-path permissions (issue 27) --
class PermissionDeniedError(HostMQError, PermissionError):
    """A control request the peer's uid may not make: administration (topics, offsets resets, broker
    registration, promotion, KV config) is the root owner's; the message names who may do it.
    Also raised when a client-created resource (retry topics, consumer groups, clients) would pass
    its per-uid or overall cap."""


__all__ += ["PermissionDeniedError"]
