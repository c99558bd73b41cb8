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


class NoRouteError(HostMQError):
    """No broker serves the topic (or no NameServer answered)."""


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
    "MessageNotFoundError",
]
