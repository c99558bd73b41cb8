"""A consumer's membership in its group (RocketMQ ``MQClientInstance`` heartbeats + ``RebalanceImpl``).

The member heartbeats to every broker of its subscribed topics (client id = host tag + pid +
instance number), at once on subscribe and then every ``heartbeat_interval_s``; brokers keep the
group's member list (``broker.consumers``) and bump their ``consumers_version`` word when it changes.
A rebalance is due every ``rebalance_interval_s`` (RocketMQ: 20 s) and as soon as any of those words
moves: the member reads the topic's queues from the route and the group's members from one broker
(the first by name that serves the topic, so every member asks the same one), and
``rebalance.allocate`` gives its share. The caller hands queues over: it commits and drops the
queues it lost before it reads the ones it gained from their committed offsets.
"""
from __future__ import annotations

import itertools
import logging
import os
import time

from .. import records as R
from ..errors import HostMQError
from ..message import MessageQueue
from ..protocol.codes import RequestCode
from ..protocol.messages import ClientIdRequest, GroupRequest, HeartbeatRequest
from .rebalance import Strategy, allocate

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 30.0      # RocketMQ heartbeatBrokerInterval
REBALANCE_INTERVAL_S = 20.0      # RocketMQ rebalance service period
_instances = itertools.count(1)


def new_client_id() -> str:
    """``<host tag hex>@<pid>@<n>``: unique per consumer object on this host."""
    return f"{R.host_tag().hex()}@{os.getpid()}@{next(_instances)}"


class GroupMember:
    def __init__(self, instance, group: str, strategy: Strategy = "average", *,
                 heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S,
                 rebalance_interval_s: float = REBALANCE_INTERVAL_S) -> None:
        self.instance = instance
        self.group = group
        self.strategy = strategy
        self.client_id = new_client_id()
        self.heartbeat_interval_s = heartbeat_interval_s
        self.rebalance_interval_s = rebalance_interval_s
        self.topics: list[str] = []
        self.brokers: dict[str, list[str]] = {}    # broker name → addresses heartbeated to
        self.seen_versions: dict[str, int] = {}    # broker → consumers_version at the last rebalance
        self._next_heartbeat = 0.0
        self._next_rebalance = 0.0

    def add_topic(self, topic: str) -> None:
        if topic not in self.topics:
            self.topics.append(topic)
        self._next_heartbeat = self._next_rebalance = 0.0

    # -- heartbeats -----------------------------------------------------------------------------------
    def heartbeat(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next_heartbeat:
            return
        self._next_heartbeat = now + self.heartbeat_interval_s
        brokers = {}
        for topic in self.topics:
            try:
                for mq in self.instance.subscribe_queues(topic, refresh=force):
                    brokers.setdefault(mq.broker, None)
            except HostMQError as e:
                log.info("heartbeat: no route for %s yet: %s", topic, e)
        fields = HeartbeatRequest(client_id=self.client_id, producer_groups=[], consumer_groups=[self.group],
                                  pid=os.getpid()).to_fields()
        for broker in sorted(brokers):
            try:
                addresses = self.instance.broker_addresses(broker)
            except HostMQError as e:
                log.info("heartbeat to %s failed: %s", broker, e)
                continue
            for address in addresses:   # its slaves too: they answer for the group while the master is down
                if len(addresses) > 1 and not self.instance.listening(address):
                    continue
                try:
                    self.instance.broker_request(address, RequestCode.HEART_BEAT, fields, timeout_s=2.0)
                    self.brokers.setdefault(broker, [])
                    if address not in self.brokers[broker]:
                        self.brokers[broker].append(address)
                except HostMQError as e:
                    log.info("heartbeat to %s (%s) failed: %s", broker, address, e)

    def leave(self) -> None:
        """Unregister from every broker (the others rebalance at once)."""
        for broker, addresses in sorted(self.brokers.items()):
            for address in addresses:
                try:
                    self.instance.broker_request(address, RequestCode.UNREGISTER_CLIENT,
                                                 ClientIdRequest(self.client_id).to_fields(), timeout_s=1.0)
                except HostMQError as e:
                    log.debug("unregistering from %s (%s): %s", broker, address, e)
        self.brokers.clear()

    # -- rebalance ------------------------------------------------------------------------------------
    def rebalance_due(self, versions: dict[str, int]) -> bool:
        """``versions``: each broker's current consumers_version word."""
        if time.monotonic() >= self._next_rebalance:
            return True
        return any(self.seen_versions.get(b) != v for b, v in versions.items())

    def members(self, topic: str, queues: list[MessageQueue]) -> list[str]:
        for broker in sorted({q.broker for q in queues}):
            try:
                f = self.instance.read_request(broker, RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                               GroupRequest(self.group).to_fields(), timeout_s=2.0).fields
                return list(f["consumer_ids"])
            except HostMQError as e:
                log.info("consumer list of %s from %s failed: %s", self.group, broker, e)
        return []

    def allocation(self, versions: dict[str, int]) -> dict[str, list[MessageQueue]] | None:
        """Each subscribed topic's queues for this member now; None if nothing could be learned (keep
        what is held)."""
        self._next_rebalance = time.monotonic() + self.rebalance_interval_s
        self.seen_versions = dict(versions)
        out: dict[str, list[MessageQueue]] = {}
        for topic in self.topics:
            try:
                queues = self.instance.subscribe_queues(topic, refresh=True)
            except HostMQError as e:
                log.info("rebalance: no route for %s: %s", topic, e)
                out[topic] = []
                continue
            cids = self.members(topic, queues)
            if not cids:
                return None
            if self.client_id not in cids:         # not registered yet (or expired): say hello again
                self.heartbeat(force=True)
                cids = self.members(topic, queues)
            out[topic] = allocate(self.strategy, self.client_id, queues, cids)
        return out
