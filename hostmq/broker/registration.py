"""The broker's link to every NameServer under its root (RocketMQ ``BrokerOuterAPI``).

Registration is asynchronous (a dead or slow NameServer never stalls the control loop); the set of
NameServers is re-read from the root each time, so a NameServer started later is registered with at
the next round, and one that went away is skipped.
"""
from __future__ import annotations

import logging

from ..errors import ConnectError, HostMQError
from ..client.remoting import RemotingClient
from ..protocol.codes import RequestCode
from ..root import ipc_address
from .runtime import BrokerRuntime

log = logging.getLogger(__name__)

REGISTER_TIMEOUT_S = 3.0


class NamesrvLink:
    def __init__(self, rt: BrokerRuntime) -> None:
        self.rt = rt
        self.clients: dict[str, RemotingClient] = {}
        self.registered: set[str] = set()     # NameServers that accepted our last registration

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
                "broker_id": self.rt.broker_id, "address": self.rt.address}

    def register(self, topics: dict, data_version: int) -> None:
        """Send REGISTER_BROKER to every NameServer (answers are handled on the clients' threads)."""
        fields = {**self._identity(), "ha_address": "", "topics": topics, "data_version": data_version}
        for c in self._live_clients():
            try:
                fut = c.request_async(RequestCode.REGISTER_BROKER, fields)
            except HostMQError as e:
                log.warning("register with %s: %s", c.address, e)
                continue
            fut.add_done_callback(lambda f, addr=c.address: self._registered(addr, f))

    def _registered(self, address: str, fut) -> None:
        e = fut.exception()
        if e is None:
            self.registered.add(address)
        else:
            self.registered.discard(address)
            log.warning("registration with %s failed: %s", address, e)

    def unregister(self) -> None:
        """UNREGISTER_BROKER to every NameServer, waiting briefly for each (graceful stop)."""
        fields = {**self._identity()}
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
