"""The NameServer process: the route table behind a zmq ROUTER at ``ROOT/namesrv[-N].sock``.

One process per socket (``flock`` on ``ROOT/namesrv[-N].lock`` is taken before binding, because
libzmq's bind silently takes over an existing socket path). Several NameServers under one root are
independent: brokers register to all of them, clients ask any live one. The process owns its route
table alone (one thread: requests and the expiry scan both run in the server loop) and its KV
config file ``ROOT/namesrv[-N].kv.json`` (written atomically). It never dies from what a client
sends: malformed requests get BAD_REQUEST, bad fields MESSAGE_ILLEGAL, unknown codes
REQUEST_CODE_NOT_SUPPORTED (see ``hostmq.transport``).

Every handler that reads fields declares its request type (``protocol.messages.handles``): the
request is decoded once against the schema the brokers and clients build their requests from, and a
field of the wrong type is answered MESSAGE_ILLEGAL naming it (ValidationError at the client, as it
always was here). What the schema cannot say — topic names, ranges, epochs — the route table checks.
"""
from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from dataclasses import dataclass, field

import orjson

from ..access import control_policy
from ..config import NamesrvConfig
from ..jsonfile import read_json, write_json
from ..errors import FencedError, NoRouteError, StoreLockedError, ValidationError
from ..fsutil import ensure_dir, open_file
from ..sdnotify import Watchdog, sd_notify
from ..protocol.codes import RequestCode
from ..protocol.frames import Frame
from ..protocol.messages import (DeleteTopicInNamesrvRequest, GetRouteInfoRequest, KvConfigRequest,
                                 RegisterBrokerPage, TopicsByClusterRequest, UnregisterBrokerRequest, handles)
from ..root import RootPaths, ipc_address
from ..transport import Reply, Server
from .assembly import PagedRegistrations
from ..protocol.route_data import TopicConfig, check_topic, cluster_info_to_dict
from .routes import RouteTable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NamesrvProcessConfig:
    root: str
    index: int = 0                                   # 0: namesrv.sock, N: namesrv-N.sock
    namesrv: NamesrvConfig = field(default_factory=NamesrvConfig)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _topic_configs(topics_in: dict) -> dict[str, TopicConfig]:
    """A registration's ``topics`` (their types already checked by RegisterBrokerPage) as TopicConfigs;
    ValidationError naming the first bad name or value (what a type cannot say: ranges, names)."""
    topics = {}
    for name, cfg in topics_in.items():
        check_topic("topics", name)
        topics[name] = TopicConfig.from_dict({**cfg, "topic_name": name})
    return topics


class NamesrvService:
    """Request handlers over one RouteTable; ``clock_ms`` is injectable for tests."""

    def __init__(self, config: NamesrvConfig, kv_path: str | None = None, clock_ms=_now_ms) -> None:
        self.config = config
        self.table = RouteTable(config.max_brokers, config.kv_max_chars)
        self.pending = PagedRegistrations(config.register_max_pages, config.register_pending_bytes,
                                          round(config.register_page_timeout_s * 1000))
        self.kv_path = kv_path
        self.clock_ms = clock_ms
        if kv_path:
            self.table.load_kv(read_json(kv_path, {}))

    def handlers(self) -> dict:
        c = RequestCode
        return {
            c.REGISTER_BROKER: self.register_broker, c.UNREGISTER_BROKER: self.unregister_broker,
            c.GET_ROUTEINFO_BY_TOPIC: self.route, c.GET_BROKER_CLUSTER_INFO: self.cluster_info,
            c.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.all_topics, c.GET_TOPICS_BY_CLUSTER: self.topics_by_cluster,
            c.DELETE_TOPIC_IN_NAMESRV: self.delete_topic, c.PUT_KV_CONFIG: self.put_kv,
            c.GET_KV_CONFIG: self.get_kv, c.DELETE_KV_CONFIG: self.delete_kv, c.PING: self.ping,
        }

    # -- brokers ----------------------------------------------------------------------------------
    @handles(RegisterBrokerPage, invalid=ValidationError)
    def register_broker(self, req: RegisterBrokerPage, token=None) -> Reply:
        """REGISTER_BROKER, whole or one page of a paged registration (``assembly``).

        A page answers ``{"complete": false}`` until the last, which applies the whole topic table at
        once; page 0 of a registration whose data version the table already holds for this record
        answers ``{"complete": true, "unchanged": true}`` (the broker sends no more pages).
        """
        ident = (req.cluster, req.broker_name, req.broker_id, req.address)
        ha, version, page, pages = req.ha_address or None, req.data_version, req.page, req.pages
        try:
            self.table.check_epoch(req.broker_name, req.broker_id, req.epoch)       # before any page is kept
        except FencedError as e:
            log.warning("refused a registration from %s: %s", req.address[:200], e)
            raise
        topics = _topic_configs(req.topics)                   # every page is validated when it arrives
        now = self.clock_ms()
        if pages == 1 and page == 0:
            return Reply(fields={**self.table.register_broker(*ident, ha, topics, version, now, req.epoch).to_dict(),
                                 "complete": True})
        if page == 0 and self.table.registration_current(*ident, version):
            self.pending.discard(req.address)
            result = self.table.register_broker(*ident, ha, {}, version, now, req.epoch)    # liveness only
            return Reply(fields={**result.to_dict(), "complete": True, "unchanged": True})
        self.table.keep_alive(*ident, now)                    # its old routes stay while pages come
        parts = self.pending.add(req.address, (*ident[:3], ha, version), req.registration_id,
                                 page, pages, orjson.dumps(req.topics), now)
        if parts is None:
            return Reply(fields={"complete": False, "page": page})
        topics = {}
        for part in parts:
            topics.update(_topic_configs(orjson.loads(part)))
        log.info("broker %s registered %d topics in %d pages", req.broker_name, len(topics), pages)
        return Reply(fields={**self.table.register_broker(*ident, ha, topics, version, now, req.epoch).to_dict(),
                             "complete": True})

    @handles(UnregisterBrokerRequest, invalid=ValidationError)
    def unregister_broker(self, req: UnregisterBrokerRequest, token=None) -> Reply:
        removed = self.table.unregister_broker(req.cluster, req.broker_name, req.broker_id, req.address,
                                               self.clock_ms())
        return Reply(fields={"removed": removed})

    def scan(self) -> list[str]:
        for address in self.pending.expire(self.clock_ms()):
            log.warning("paged registration from %s stopped half-way: dropped (its old routes stay)", address)
        gone = self.table.scan_expired(self.clock_ms(), round(self.config.broker_expiry_s * 1000))
        for address in gone:
            log.warning("broker %s silent for %.0f s: removed from routes", address,
                        self.config.broker_expiry_s)
        return gone

    # -- routes -----------------------------------------------------------------------------------
    @handles(GetRouteInfoRequest, invalid=ValidationError)
    def route(self, req: GetRouteInfoRequest, token=None) -> Reply:
        data = self.table.topic_route(req.topic)
        if data is None:
            raise NoRouteError(f"no route for topic {req.topic!r}")
        return Reply(fields=data.to_dict())

    def cluster_info(self, frame: Frame, token=None) -> Reply:
        return Reply(fields=cluster_info_to_dict(self.table.cluster_info()))

    def all_topics(self, frame: Frame, token=None) -> Reply:
        return Reply(fields={"topics": self.table.all_topics()})

    @handles(TopicsByClusterRequest, invalid=ValidationError)
    def topics_by_cluster(self, req: TopicsByClusterRequest, token=None) -> Reply:
        return Reply(fields={"topics": self.table.topics_by_cluster(req.cluster)})

    @handles(DeleteTopicInNamesrvRequest, invalid=ValidationError)
    def delete_topic(self, req: DeleteTopicInNamesrvRequest, token=None) -> Reply:
        return Reply(fields={"deleted": self.table.delete_topic(req.topic, req.cluster)})

    # -- KV config --------------------------------------------------------------------------------
    @handles(KvConfigRequest, invalid=ValidationError)
    def put_kv(self, req: KvConfigRequest, token=None) -> Reply:
        """PUT_KV_CONFIG; a missing ``value`` (None) is refused by the table (ValidationError)."""
        self.table.put_kv(req.namespace, req.key, req.value)
        self._save_kv()
        return Reply()

    @handles(KvConfigRequest, invalid=ValidationError)
    def get_kv(self, req: KvConfigRequest, token=None) -> Reply:
        return Reply(fields={"value": self.table.get_kv(req.namespace, req.key)})

    @handles(KvConfigRequest, invalid=ValidationError)
    def delete_kv(self, req: KvConfigRequest, token=None) -> Reply:
        removed = self.table.delete_kv(req.namespace, req.key)
        self._save_kv()
        return Reply(fields={"removed": removed})

    def ping(self, frame: Frame, token=None) -> Reply:
        return Reply(fields={"pid": os.getpid()})

    def _save_kv(self) -> None:
        if self.kv_path:
            write_json(self.kv_path, self.table.kv_snapshot())


def _lock(path: str) -> int:
    fd = open_file(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLockedError(path, "another NameServer") from None
    return fd


def run(config: NamesrvProcessConfig, stop: threading.Event) -> int:
    """Serve until ``stop`` is set; returns the exit code."""
    paths = RootPaths.of(config.root)
    ensure_dir(paths.root)
    sock = paths.namesrv_socket(config.index)
    base = sock[:-len(".sock")]
    lock_fd = _lock(base + ".lock")
    try:
        service = NamesrvService(config.namesrv, kv_path=base + ".kv.json")
        server = Server(ipc_address(sock), service.handlers(), name=os.path.basename(base),
                        policy=control_policy(paths.root))        # registration and admin: owners only
        try:
            server.bind()
            server.add_timer(config.namesrv.scan_interval_s, service.scan)
            watchdog = Watchdog.from_env()
            if watchdog.enabled:        # the timer runs on the serving loop: a hung loop stops the pings
                server.add_timer(min(1.0, watchdog.period_s / 4),
                                 lambda: [sd_notify(m) for m in watchdog.due(time.monotonic(), [])])
            log.info("NameServer listening on %s", sock)
            sd_notify(f"READY=1\nSTATUS=serving at {sock}")
            server.run(stop)
            sd_notify("STOPPING=1\nSTATUS=stopping")
        finally:
            server.close()
    finally:
        os.close(lock_fd)
    return 0
