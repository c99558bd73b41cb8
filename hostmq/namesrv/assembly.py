"""Paged broker registrations, assembled before they touch the route table (pure).

A broker with more topics than fit one control frame (``protocol.frames.MAX_HEADER_BYTES``, 1 MiB —
about 5,000 topics) sends REGISTER_BROKER in pages: ``page`` 0..``pages``-1 of one
``registration_id``, in order, each after the previous one was answered. The NameServer keeps the
pages of each broker address here and applies the whole topic table in one
``RouteTable.register_broker`` call when the last page arrives, so clients see either the broker's
old routes or its new ones, never a part (and a broker whose registration stops half-way keeps its
old routes until it expires).

This differs from RocketMQ's split registration (``enableSplitRegistration``, pages of
``splitRegistrationSize`` topics each applied on arrival): that cannot be combined with dropping the
topics a broker no longer sends (RocketMQ documents the pair as losing routes), which hostmq's route
table does on every data-version change.

Bounds: a registration has at most ``max_pages`` pages; all unfinished registrations together hold at
most ``max_pending_bytes`` (each page's encoded topics, plus ASSEMBLY_OVERHEAD_BYTES and its address
per registration) — a page beyond that is refused with BrokerBusyError; a registration with no new
page for ``timeout_ms`` is dropped. A new page 0 from an address replaces its unfinished registration.

Contract: no clock, sockets or files; the NameServer's loop is the only caller.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import BrokerBusyError, ValidationError

ASSEMBLY_OVERHEAD_BYTES = 1024      # charged per unfinished registration on top of its pages


@dataclass
class _Assembly:
    identity: tuple                 # (cluster, broker name, broker id, ha address, data version)
    registration_id: int
    pages: int
    last_ms: int
    charge: int                     # bytes charged to the budget
    parts: list[bytes] = field(default_factory=list)


class PagedRegistrations:
    """Unfinished paged registrations, by broker address."""

    def __init__(self, max_pages: int, max_pending_bytes: int, timeout_ms: int) -> None:
        self.max_pages = max_pages
        self.max_pending_bytes = max_pending_bytes
        self.timeout_ms = timeout_ms
        self._by_address: dict[str, _Assembly] = {}
        self.pending_bytes = 0

    def __len__(self) -> int:
        return len(self._by_address)

    def add(self, address: str, identity: tuple, registration_id: int, page: int, pages: int, part: bytes,
            now_ms: int) -> list[bytes] | None:
        """Take one page; every page's ``part`` in order once ``page`` was the last, else None.

        ValidationError for a page that does not continue the address's registration (that
        registration is dropped: the broker starts again from page 0); BrokerBusyError when the
        pending-bytes budget is spent.
        """
        if not 2 <= pages <= self.max_pages:
            raise ValidationError(f"pages: a paged registration has 2..{self.max_pages} pages, got {pages}")
        if not 0 <= page < pages:
            raise ValidationError(f"page: must be within 0..{pages - 1}, got {page}")
        self.expire(now_ms)
        if page == 0:
            self.discard(address)
            self._by_address[address] = a = _Assembly(identity, registration_id, pages, now_ms, 0)
            self._charge(a, ASSEMBLY_OVERHEAD_BYTES + len(address.encode("utf-8", "replace")), address)
        else:
            a = self._by_address.get(address)
            if a is None or (a.registration_id, a.identity, a.pages, len(a.parts)) != \
                    (registration_id, identity, pages, page):
                want = "no registration in progress" if a is None else \
                    f"expected page {len(a.parts)} of registration {a.registration_id}"
                self.discard(address)
                raise ValidationError(f"page {page} of registration {registration_id} does not continue "
                                      f"({want}); send the registration again from page 0")
        self._charge(a, len(part), address)
        a.parts.append(part)
        a.last_ms = now_ms
        if len(a.parts) < pages:
            return None
        self.discard(address)
        return a.parts

    def discard(self, address: str) -> None:
        """Forget the address's unfinished registration, if any."""
        a = self._by_address.pop(address, None)
        if a is not None:
            self.pending_bytes -= a.charge

    def expire(self, now_ms: int) -> list[str]:
        """Drop registrations with no page for ``timeout_ms``; their addresses."""
        gone = [addr for addr, a in self._by_address.items() if a.last_ms + self.timeout_ms < now_ms]
        for addr in gone:
            self.discard(addr)
        return gone

    def _charge(self, a: _Assembly, nbytes: int, address: str) -> None:
        if self.pending_bytes + nbytes > self.max_pending_bytes:
            self.discard(address)
            raise BrokerBusyError(f"unfinished paged registrations would hold more than {self.max_pending_bytes} "
                                  f"bytes (namesrv.register_pending_bytes); registration dropped, retry later")
        a.charge += nbytes
        self.pending_bytes += nbytes


__all__ = ["PagedRegistrations", "ASSEMBLY_OVERHEAD_BYTES"]
