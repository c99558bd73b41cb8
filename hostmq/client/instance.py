"""One client process's view of a root: NameServers, broker connections and topic routes (RocketMQ's
``MQClientInstance``), shared by the producers, consumers and admin of that process.

NameServers are found by listing the root (``namesrv.sock``, ``namesrv-N.sock``); a request goes to
the last one that answered, then to the others in turn — any live NameServer will do. Routes are
cached and refreshed when older than ``route_max_age_s`` (RocketMQ: every 30 s) or on demand after a
send failed. Thread-safe.
"""
from __future__ import annotations

import threading
import time

from ..errors import ConnectError, HostMQError, NoRouteError, SendTimeout
from ..message import MessageQueue
from ..protocol.route_data import PERM_READ, PERM_WRITE, BrokerData, TopicRouteData, cluster_info_from_dict
from ..protocol.codes import RequestCode
from ..protocol.frames import Frame
from ..protocol.messages import GetRouteInfoRequest
from ..root import RootPaths, ipc_address
from ..remoting import RemotingClient, listening

ROUTE_MAX_AGE_S = 30.0


class ClientInstance:
    def __init__(self, root=None, timeout_s: float = 3.0, route_max_age_s: float = ROUTE_MAX_AGE_S) -> None:
        self.paths = RootPaths.of(root).require()
        self.root = self.paths.root
        self.timeout_s = timeout_s
        self.route_max_age_s = route_max_age_s
        self._lock = threading.Lock()
        self._namesrvs: dict[str, RemotingClient] = {}
        self._preferred: str | None = None
        self._brokers: dict[str, RemotingClient] = {}
        self._routes: dict[str, tuple[float, TopicRouteData]] = {}
        self._queue_lists: dict[tuple[str, int], tuple[float, list[MessageQueue]]] = {}
        self.closed = False

    # -- NameServers ----------------------------------------------------------------------------------
    def namesrv_request(self, code: int, fields: dict | None = None, timeout_s: float | None = None) -> Frame:
        """The answer of the first live NameServer; NoRouteError and other answers pass through."""
        addrs = [ipc_address(s) for s in self.paths.namesrv_sockets()]
        if self._preferred in addrs:
            addrs.remove(self._preferred)
            addrs.insert(0, self._preferred)
        last: Exception | None = None
        for addr in addrs:
            try:
                client = self._namesrv(addr)
                frame = client.request(code, fields, timeout_s=timeout_s or self.timeout_s)
            except (ConnectError, SendTimeout) as e:
                last = e
                self._drop(self._namesrvs, addr)
                continue
            self._preferred = addr
            return frame
        raise ConnectError(f"no NameServer is running under {self.root}" + (f" ({last})" if last else ""))

    def _namesrv(self, addr: str) -> RemotingClient:
        with self._lock:
            c = self._namesrvs.get(addr)
            if c is None or c.closed:
                c = self._namesrvs[addr] = RemotingClient(addr, timeout_s=self.timeout_s)
            return c

    @staticmethod
    def _drop(table: dict, addr: str) -> None:
        c = table.pop(addr, None)
        if c is not None:
            c.close()

    # -- routes ---------------------------------------------------------------------------------------
    def route(self, topic: str, refresh: bool = False) -> TopicRouteData:
        """The topic's route (cached); NoRouteError if no broker serves it."""
        now = time.monotonic()
        cached = self._routes.get(topic)
        if cached is not None and not refresh and now - cached[0] < self.route_max_age_s:
            return cached[1]
        data = TopicRouteData.from_dict(self.namesrv_request(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                             GetRouteInfoRequest.of(topic=topic).to_fields()).fields)
        self._routes[topic] = (now, data)
        return data

    def forget_route(self, topic: str) -> None:
        self._routes.pop(topic, None)
        for key in [k for k in self._queue_lists if k[0] == topic]:
            self._queue_lists.pop(key, None)

    def publish_queues(self, topic: str, refresh: bool = False) -> list[MessageQueue]:
        """Writable queues of the topic on brokers that have a master, ordered by broker then id."""
        return self._queues(topic, refresh, PERM_WRITE, "write_queues")

    def cached_publish_queues(self, topic: str) -> list[MessageQueue] | None:
        """``publish_queues(topic)`` if this instance holds them fresh, else None (nothing asked)."""
        cached = self._queue_lists.get((topic, PERM_WRITE))
        if cached is not None and time.monotonic() - cached[0] < self.route_max_age_s:
            return cached[1]
        return None

    def subscribe_queues(self, topic: str, refresh: bool = False) -> list[MessageQueue]:
        """Readable queues of the topic, ordered by broker then id."""
        return self._queues(topic, refresh, PERM_READ, "read_queues")

    def _queues(self, topic: str, refresh: bool, perm: int, count: str) -> list[MessageQueue]:
        key = (topic, perm)
        cached = self._queue_lists.get(key)
        if cached is not None and not refresh and time.monotonic() - cached[0] < self.route_max_age_s:
            return cached[1]
        queues = self._build_queues(topic, refresh, perm, count)
        self._queue_lists[key] = (time.monotonic(), queues)
        return queues

    def _build_queues(self, topic: str, refresh: bool, perm: int, count: str) -> list[MessageQueue]:
        route = self.route(topic, refresh)
        # Producers write to masters; consumers also read a broker name whose master is gone from
        # its slaves (RocketMQ findBrokerAddressInSubscribe), so its queues stay theirs meanwhile.
        served = {b.broker_name for b in route.broker_datas if (b.master_address if perm == PERM_WRITE else b.addrs)}
        out = [MessageQueue(topic, q.broker_name, i) for q in route.queue_datas
               if q.perm & perm and q.broker_name in served for i in range(getattr(q, count))]
        if not out:
            raise NoRouteError(f"topic {topic!r} has no {'writable' if perm == PERM_WRITE else 'readable'} queue")
        return sorted(out)

    def broker_address(self, broker: str, topic: str | None = None) -> str:
        """The master address of a broker name (from a topic's route, else the cluster info)."""
        return self._broker_data(broker, topic, lambda b: b.master_address).master_address

    def broker_addresses(self, broker: str, topic: str | None = None) -> list[str]:
        """Every registered address of a broker name, the master's first, then its slaves' by id."""
        return list(self._broker_data(broker, topic, lambda b: b.addrs).addrs.values())   # sorted by id

    def _broker_data(self, broker: str, topic: str | None, usable) -> BrokerData:
        """The broker name's record for which ``usable`` holds: from the topic's route, else the
        cluster info; NoRouteError if neither has one."""
        if topic is not None:
            for b in self.route(topic).broker_datas:
                if b.broker_name == broker and usable(b):
                    return b
        b = self.cluster_info()["brokers"].get(broker)
        if b is None or not usable(b):
            raise NoRouteError(f"broker {broker!r} is not registered with any NameServer")
        return b

    def read_request(self, broker: str, code: int, fields: dict | None = None, topic: str | None = None,
                     timeout_s: float | None = None, raw: bool = False) -> Frame:
        """A consumer's request to a broker name (offsets, members): its master, or while the master
        is down (not registered, or its socket refuses) its first slave that answers. A master that
        is alive but slow is waited for, never passed over: its slave may hold older offsets."""
        addrs = self.broker_addresses(broker, topic)
        last: Exception | None = None
        for i, addr in enumerate(addrs):
            if i < len(addrs) - 1 and not self.listening(addr):
                continue
            try:
                return self.broker_request(addr, code, fields, timeout_s, raw)
            except ConnectError as e:
                last = e
        raise last if last is not None else ConnectError(f"no broker of {broker!r} is listening")

    def listening(self, address: str) -> bool:
        """Whether a broker listens at ``address`` (a connect probe); if not, its cached connection
        is dropped — requests over a killed server's connection would only time out."""
        if listening(address):
            return True
        self._drop(self._brokers, address)
        return False

    def cluster_info(self) -> dict:
        return cluster_info_from_dict(self.namesrv_request(RequestCode.GET_BROKER_CLUSTER_INFO).fields)

    # -- brokers --------------------------------------------------------------------------------------
    def broker(self, address: str) -> RemotingClient:
        with self._lock:
            c = self._brokers.get(address)
            if c is None or c.closed:
                c = self._brokers[address] = RemotingClient(address, timeout_s=self.timeout_s)
            return c

    def broker_request(self, address: str, code: int, fields: dict | None = None,
                       timeout_s: float | None = None, raw: bool = False) -> Frame:
        try:
            c = self.broker(address)
            if raw:
                return c.request_raw(code, fields, timeout_s=timeout_s)
            return c.request(code, fields, timeout_s=timeout_s)
        except ConnectError:
            self._drop(self._brokers, address)
            raise

    def close(self) -> None:
        with self._lock:
            self.closed = True
            clients = list(self._namesrvs.values()) + list(self._brokers.values())
            self._namesrvs.clear()
            self._brokers.clear()
        for c in clients:
            c.close()


__all__ = ["ClientInstance", "HostMQError"]
