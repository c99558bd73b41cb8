"""The broker's link to every NameServer under its root (RocketMQ ``BrokerOuterAPI``).

Registration is asynchronous (a dead or slow NameServer never stalls the control loop); the set of
NameServers is re-read from the root each time, so a NameServer started later is registered with at
the next round, and one that went away is skipped.

A topic table that does not fit one control frame (``broker.register_page_topics`` topics, or
PAGE_BYTES of encoded topics) goes in pages (``namesrv.assembly``): page 0, and each next page once
the previous one was answered, all with one ``registration_id``. The NameServer applies the whole
table when the last page arrives, or answers page 0 with ``unchanged`` when it already holds this
data version — then nothing more is sent, so a broker with 100,000 topics sends one page per round
unless its topics changed. A registration under way for a NameServer is never restarted; one with
the latest data version follows as soon as it completes, so a stream of topic changes cannot starve
it. Pages are computed once per data version.
"""
from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import dataclass

import orjson

from ..errors import ConnectError, HostMQError
from ..remoting import RemotingClient
from ..protocol.codes import RequestCode
from ..protocol.frames import MAX_HEADER_BYTES
from ..protocol.messages import RegisterBrokerPage, RegisterBrokerRequest, UnregisterBrokerRequest
from ..root import ipc_address
from ..live.runtime import BrokerRuntime

log = logging.getLogger(__name__)

REGISTER_TIMEOUT_S = 3.0
PAGE_BYTES = MAX_HEADER_BYTES // 2      # encoded topics per page: the frame keeps room for the rest
_ENTRY_OVERHEAD_BYTES = 8               # ':' ',' and the braces around an entry, generously


def paginate(topics: dict[str, dict], max_topics: int, max_bytes: int = PAGE_BYTES) -> list[dict[str, dict]]:
    """Split a registration's topic table into pages of at most ``max_topics`` topics and about
    ``max_bytes`` of JSON each (a single larger topic gets a page of its own); [{}] for no topics."""
    pages: list[dict[str, dict]] = [{}]
    size = 0
    for name, cfg in topics.items():
        n = len(orjson.dumps(name)) + len(orjson.dumps(cfg)) + _ENTRY_OVERHEAD_BYTES
        if pages[-1] and (len(pages[-1]) >= max_topics or size + n > max_bytes):
            pages.append({})
            size = 0
        pages[-1][name] = cfg
        size += n
    return pages


@dataclass
class _Round:
    """One registration under way with one NameServer."""

    client: RemotingClient
    registration_id: int
    data_version: int
    pages: list[dict]
    fields: dict
    page: int = 0


class NamesrvLink:
    def __init__(self, rt: BrokerRuntime) -> None:
        self.rt = rt
        self.clients: dict[str, RemotingClient] = {}
        self.registered: set[str] = set()     # NameServers that accepted our last registration
        self._lock = threading.Lock()         # rounds are advanced on the clients' I/O threads
        self._rounds: dict[str, _Round] = {}
        self._ids = itertools.count(1)
        self._pages: tuple[int, list[dict]] | None = None         # (data version, its pages)
        self._latest: tuple[int, list[dict], dict] = (-1, [{}], {})   # what the next round sends
        self.master_ha_address = ""           # a slave: its master's HA address, as a NameServer answered

    def _live_clients(self) -> list[RemotingClient]:
        out = []
        for sock in self.rt.paths.namesrv_sockets():
            addr = ipc_address(sock)
            c = self.clients.get(addr)
            if c is None or c.closed:
                try:
                    c = self.clients[addr] = RemotingClient(addr, timeout_s=REGISTER_TIMEOUT_S)
                except ConnectError:
                    self.clients.pop(addr, None)
                    continue
            out.append(c)
        return out

    def _identity(self) -> dict:
        return {"cluster": self.rt.config.broker.cluster_name, "broker_name": self.rt.name,
                "broker_id": self.rt.registered_id, "address": self.rt.address}

    def _registration(self) -> dict:
        # The epoch fences a registration: a NameServer refuses one older than it saw (FencedError).
        return {**self._identity(), "epoch": self.rt.epoch}

    def _paged(self, topics: dict, data_version: int) -> list[dict]:
        # The topic table changes only with its data version (topics.TopicTable._changed).
        if self._pages is None or self._pages[0] != data_version:
            self._pages = (data_version, paginate(topics, self.rt.config.broker.register_page_topics))
        return self._pages[1]

    def register(self, topics: dict, data_version: int, ha_address: str = "") -> None:
        """Send REGISTER_BROKER to every NameServer (answers are handled on the clients' threads).
        ``ha_address``: a master's replication listener (``tcp://HOST:PORT``), "" for none."""
        pages = self._paged(topics, data_version)
        with self._lock:
            self._latest = (data_version, pages, {**self._registration(), "ha_address": ha_address,
                                                  "data_version": data_version})
        for c in self._live_clients():
            self._start(c)

    def _start(self, c: RemotingClient) -> None:
        """A round with the latest topic table, unless one is under way there (it is followed by one
        with the latest table as soon as it completes, so a stream of topic changes never starves
        the registration of a large table)."""
        with self._lock:
            running = self._rounds.get(c.address)
            if running is not None and running.client is c:
                return
            version, pages, base = self._latest
            r = self._rounds[c.address] = _Round(c, next(self._ids), version, pages, base)
        self._send(r)

    def _send(self, r: _Round) -> None:
        # The NameServer's schema (protocol.messages), built here: a page only when there are several.
        try:
            if len(r.pages) > 1:
                req: RegisterBrokerRequest = RegisterBrokerPage(
                    **r.fields, topics=r.pages[r.page], page=r.page, pages=len(r.pages),
                    registration_id=r.registration_id)
            else:
                req = RegisterBrokerRequest(**r.fields, topics=r.pages[0])
            fut = r.client.request_async(RequestCode.REGISTER_BROKER, req.to_fields())
        except HostMQError as e:
            self._finish(r, e)
            return
        fut.add_done_callback(lambda f, r=r: self._answered(r, f))

    def _answered(self, r: _Round, fut) -> None:
        e = fut.exception()
        if e is not None:
            self._finish(r, e)
            return
        fields = fut.result().fields
        complete = fields.get("complete", True)
        if self.rt.is_slave and isinstance(fields.get("ha_server_address"), str) and \
                fields["ha_server_address"].startswith("tcp://"):
            self.master_ha_address = fields["ha_server_address"]
        with self._lock:
            if self._rounds.get(r.client.address) is not r:
                return                  # the client was replaced: its rounds are over
            r.page += 1
        if complete:
            self._finish(r, None)
        elif r.page < len(r.pages):
            self._send(r)
        else:
            self._finish(r, HostMQError("the NameServer did not complete the registration at its last page"))

    def _finish(self, r: _Round, error: BaseException | None) -> None:
        address = r.client.address
        with self._lock:
            if self._rounds.get(address) is r:
                del self._rounds[address]
            if error is None:
                self.registered.add(address)
            else:
                self.registered.discard(address)
            newer = error is None and self._latest[0] != r.data_version and not r.client.closed
        if error is not None:       # the next register() (every register_interval_s) tries again
            log.warning("registration with %s failed at page %d of %d: %s", address, r.page + 1, len(r.pages),
                        error)
        elif newer:
            self._start(r.client)

    def unregister(self) -> None:
        """UNREGISTER_BROKER to every NameServer, waiting briefly for each (graceful stop)."""
        fields = UnregisterBrokerRequest(**self._identity()).to_fields()
        futures = []
        for c in self._live_clients():
            try:
                futures.append((c.address, c.request_async(RequestCode.UNREGISTER_BROKER, fields, timeout_s=2.0)))
            except HostMQError:
                continue
        for addr, f in futures:
            try:
                f.result(3.0)
            except Exception as e:      # a NameServer that is gone simply expires us later
                log.info("unregister from %s: %s", addr, e)

    def close(self) -> None:
        for c in self.clients.values():
            c.close()
        self.clients.clear()
