"""The NameServer's route table, pure: RocketMQ ``RouteInfoManager`` plus its ``KVConfigManager``.

Tables (RocketMQ names in brackets)::

    clusters   cluster      -> {broker name}                          [clusterAddrTable]
    brokers    broker name  -> cluster, {broker id -> address}        [brokerAddrTable]
    live       address      -> BrokerLive(last_update_ms, data_version, ha_address)   [brokerLiveTable]
    topics     topic        -> {broker name -> QueueData}             [topicQueueTable]
    kv         namespace    -> {key -> value}                         [KVConfigManager.configTable]

Invariants kept by every method (RocketMQ keeps only some of them; see "Differences" below):

- an address appears at most once in ``brokers`` (one broker name, one id), and ``live`` has an
  entry for exactly the addresses in ``brokers``;
- a broker name is in exactly one cluster, and every cluster, broker name and topic is non-empty;
- every broker name with queue data is in ``brokers``, so a route always has its broker data.

Contract: no sockets, threads, files or clock reads. Methods that depend on time take ``now_ms``
(any millisecond clock, used consistently by the caller). Nothing is locked: the NameServer process
owns the only instance and calls it from one thread. Bad arguments raise
:class:`~hostmq.errors.ValidationError` naming the field, and then the table is unchanged: every
method validates all of its input before its first change. What clients can make it hold is bounded:
at most ``max_brokers`` registered addresses and ``kv_max_chars`` of KV config (BrokerBusyError past
them, nothing changed). Values returned are copies (or frozen
records), so a caller can never change the table through them.

Ownership and crashes: the table lives only in the NameServer process's memory. After a restart the
routes come back as brokers re-register (every ``register_interval_s``, 30 s); the KV namespace is
lost unless the server saves :meth:`RouteTable.kv_snapshot` and restores it with
:meth:`RouteTable.load_kv` (RocketMQ keeps it in ``kvConfig.json``).

Differences from RocketMQ, and why:

- Topics a master stops sending lose its queue data when its data version changes (RocketMQ 5's
  ``deleteTopicWithBrokerRegistration``, off by default there): with one host and no admin tool
  that deletes topics on every NameServer, stale routes would otherwise outlive the topic forever.
- A registration whose broker name is already in another cluster is refused (ValidationError on
  ``cluster``); RocketMQ files the name under both clusters and serves contradictory cluster info.
- An address re-registered under another broker name or id leaves its old record (RocketMQ does this
  only within one broker name); an id re-registered at a new address drops the old address's live
  entry at once rather than 120 s later.
- ``unregister_broker`` acts only when (cluster, name, id, address) is what the table holds; RocketMQ
  removes whatever address is under the id, so a late unregister of an old address could remove
  the broker that replaced it.
- ``heartbeat`` refreshes only a known address (RocketMQ 5 ``BROKER_HEARTBEAT``); an unknown address
  gets False and must register.
- Order topic config comes with the route (RocketMQ fetches it in ``DefaultRequestProcessor``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from ..config import NamesrvConfig
from ..errors import BrokerBusyError, FencedError
from ..protocol.route_data import (MASTER_ID, PERM_WRITE, BrokerData, BrokerLive, QueueData, RegisterResult,
                         TopicConfig, TopicRouteData, check_int, check_optional_text, check_text,
                         check_topic, cluster_info_from_dict, cluster_info_to_dict, invalid)

DEFAULT_BROKER_EXPIRY_MS = round(NamesrvConfig().broker_expiry_s * 1000)   # 120 s
DEFAULT_MAX_BROKERS = NamesrvConfig().max_brokers
DEFAULT_KV_MAX_CHARS = NamesrvConfig().kv_max_chars
ORDER_TOPIC_CONFIG_NAMESPACE = "ORDER_TOPIC_CONFIG"   # KV namespace of ordered topics' queue layout


@dataclass
class _Broker:
    """One broker name's row of the broker table (mutable, never leaves this module)."""

    cluster: str
    addrs: dict[int, str]

    def data(self, broker_name: str) -> BrokerData:
        return BrokerData(self.cluster, broker_name, self.addrs)


class RouteTable:
    """Clusters, brokers, their liveness, topic routes and KV config of one NameServer."""

    def __init__(self, max_brokers: int = DEFAULT_MAX_BROKERS, kv_max_chars: int = DEFAULT_KV_MAX_CHARS) -> None:
        self._clusters: dict[str, set[str]] = {}
        self._brokers: dict[str, _Broker] = {}
        self._live: dict[str, BrokerLive] = {}
        self._topics: dict[str, dict[str, QueueData]] = {}
        self._kv: dict[str, dict[str, str]] = {}
        self._epochs: dict[tuple[str, int], int] = {}     # (name, id) → the newest epoch registered
        # Bounds on what registrations and KV puts may make the table hold (BrokerBusyError past them).
        self.max_brokers = max_brokers
        self.kv_max_chars = kv_max_chars
        self._kv_chars = 0

    # -----------------------------------------------------------------------------------------
    # Broker registration and liveness
    # -----------------------------------------------------------------------------------------
    def register_broker(self, cluster: str, broker_name: str, broker_id: int, address: str,
                        ha_address: str | None, topics: Mapping[str, TopicConfig], data_version: int,
                        now_ms: int, epoch: int = 0) -> RegisterResult:
        """Add or refresh one broker (RocketMQ ``registerBroker``); brokers call it every 30 s.

        ``topics`` maps each topic name to the broker's TopicConfig for it. For a master
        (``broker_id == 0``) it replaces the broker name's queue data when this (name, id, address)
        record is new or ``data_version`` differs from the one last registered from ``address``:
        every topic sent gets this broker's QueueData, every topic not sent loses it, and topics
        left without queue data disappear. Slaves' topics are ignored (routes follow the master).
        ``address`` moves out of any other record it had (a slave promoted to master keeps its
        address). ``ha_address`` "" or None means the broker runs no HA server.

        ``epoch`` is the broker's role epoch (its group's promotions): one older than the newest this
        table saw for ``(broker_name, broker_id)`` raises FencedError and changes nothing (a master
        that missed a promotion cannot take its name back). The newest epochs outlive the broker's
        registration, not this NameServer.

        Returns, for a slave whose master is registered, the master's address and HA address;
        otherwise an empty RegisterResult.
        """
        queue_datas, ha = self._check_register(cluster, broker_name, broker_id, address, ha_address,
                                               topics, data_version, now_ms)
        self.check_epoch(broker_name, broker_id, epoch)
        prev = self._live.get(address)
        row = self._brokers.get(broker_name)
        is_new = row is None or row.addrs.get(broker_id) != address
        self._release_address(address, keep=(broker_name, broker_id))
        self._put_address(cluster, broker_name, broker_id, address)
        if broker_id == MASTER_ID and (is_new or prev is None or prev.data_version != data_version):
            self._replace_queue_datas(broker_name, queue_datas)
        self._live[address] = BrokerLive(now_ms, data_version, ha)
        self._epochs[(broker_name, broker_id)] = epoch
        self._bound_epochs()
        return self._register_result(broker_name, broker_id)

    def check_epoch(self, broker_name: str, broker_id: int, epoch: int) -> None:
        """FencedError when ``epoch`` is older than the newest registered for this name and id."""
        check_int("epoch", epoch)
        newest = self._epochs.get((broker_name, broker_id), 0)
        if epoch < newest:
            raise FencedError(f"broker {broker_name!r:.80} id {broker_id} registers at epoch {epoch}, but epoch "
                              f"{newest} registered before: refused (an instance that missed a promotion; it "
                              f"must start as a slave)", epoch, newest)

    def newest_epoch(self, broker_name: str, broker_id: int) -> int:
        return self._epochs.get((broker_name, broker_id), 0)

    def _bound_epochs(self) -> None:
        """Epochs of names no longer registered go once there are many (a bound, not a policy)."""
        if len(self._epochs) > 4 * self.max_brokers:
            for key in [k for k in self._epochs if k[0] not in self._brokers]:
                del self._epochs[key]

    def unregister_broker(self, cluster: str, broker_name: str, broker_id: int, address: str,
                          now_ms: int) -> bool:
        """Remove one broker address (RocketMQ ``unregisterBroker``: a broker's graceful stop).

        When its broker name has no address left, the name leaves its cluster and its queue data
        leaves every topic (topics left empty go, as do empty clusters). Acts only when the table
        holds exactly this (cluster, name, id, address); returns whether it did. ``now_ms`` is
        checked but not used: every mutator of the table takes the time, so callers need not know
        which ones depend on it.
        """
        check_text("cluster", cluster)
        check_text("broker_name", broker_name)
        check_int("broker_id", broker_id)
        check_text("address", address, max_chars=None)
        check_int("now_ms", now_ms)
        row = self._brokers.get(broker_name)
        if row is None or row.cluster != cluster or row.addrs.get(broker_id) != address:
            return False
        self._remove_address(address)
        return True

    def heartbeat(self, address: str, now_ms: int) -> bool:
        """Refresh a registered address's liveness without topic data; False if it is unknown."""
        check_text("address", address, max_chars=None)
        check_int("now_ms", now_ms)
        live = self._live.get(address)
        if live is None:
            return False
        self._live[address] = dataclasses.replace(live, last_update_ms=now_ms)
        return True

    def registration_current(self, cluster: str, broker_name: str, broker_id: int, address: str,
                             data_version: int) -> bool:
        """Whether exactly this record is registered with ``data_version``: registering it again with
        that version would change nothing but its liveness (a paged registration can stop at page 0)."""
        row = self._brokers.get(broker_name)
        live = self._live.get(address)
        return (row is not None and row.cluster == cluster and row.addrs.get(broker_id) == address
                and live is not None and live.data_version == data_version)

    def keep_alive(self, cluster: str, broker_name: str, broker_id: int, address: str, now_ms: int) -> bool:
        """Refresh the liveness of exactly this registered record (while its paged registration is
        under way); False, changing nothing, if the table holds no such record."""
        check_int("now_ms", now_ms)
        row = self._brokers.get(broker_name)
        if row is None or row.cluster != cluster or row.addrs.get(broker_id) != address:
            return False
        return self.heartbeat(address, now_ms)

    def scan_expired(self, now_ms: int, expiry_ms: int = DEFAULT_BROKER_EXPIRY_MS) -> list[str]:
        """Remove every address silent for more than ``expiry_ms`` (RocketMQ ``scanNotActiveBroker``).

        An address is expired when ``last_update_ms + expiry_ms < now_ms``; each is removed exactly
        as :meth:`unregister_broker` removes it. Returns the removed addresses, sorted.
        """
        check_int("now_ms", now_ms)
        check_int("expiry_ms", expiry_ms)
        expired = sorted(a for a, live in self._live.items() if live.last_update_ms + expiry_ms < now_ms)
        for address in expired:
            self._remove_address(address)
        return expired

    def broker_alive(self, address: str, now_ms: int, expiry_ms: int = DEFAULT_BROKER_EXPIRY_MS) -> bool:
        """Whether ``address`` is registered and would survive :meth:`scan_expired` at ``now_ms``."""
        check_text("address", address, max_chars=None)
        check_int("now_ms", now_ms)
        check_int("expiry_ms", expiry_ms)
        live = self._live.get(address)
        return live is not None and live.last_update_ms + expiry_ms >= now_ms

    def broker_live(self, address: str) -> BrokerLive | None:
        """The liveness record of a registered address, or None."""
        check_text("address", address, max_chars=None)
        return self._live.get(address)

    # -----------------------------------------------------------------------------------------
    # Queries
    # -----------------------------------------------------------------------------------------
    def topic_route(self, topic: str) -> TopicRouteData | None:
        """Where ``topic`` lives (RocketMQ ``pickupTopicRouteData``), or None if no broker has it.

        Queue datas and broker datas are both sorted by broker name.
        """
        check_text("topic", topic)
        per_broker = self._topics.get(topic)
        if not per_broker:
            return None
        names = sorted(per_broker)
        return TopicRouteData(
            queue_datas=[per_broker[n] for n in names],
            broker_datas=[self._brokers[n].data(n) for n in names],
            order_topic_conf=self._kv.get(ORDER_TOPIC_CONFIG_NAMESPACE, {}).get(topic))

    def all_topics(self) -> list[str]:
        """Every topic with a route, sorted (RocketMQ ``getAllTopicList``)."""
        return sorted(self._topics)

    def topics_by_cluster(self, cluster: str) -> list[str]:
        """Topics with queue data on any broker of ``cluster``, sorted; [] for an unknown cluster."""
        check_text("cluster", cluster)
        names = self._clusters.get(cluster, set())
        return sorted(t for t, per_broker in self._topics.items() if not names.isdisjoint(per_broker))

    def cluster_info(self) -> dict[str, Any]:
        """``{"brokers": {name: BrokerData}, "clusters": {cluster: [names]}, "live": {address: ms}}``.

        Everything sorted by name; ``live`` maps each address to its ``last_update_ms``.
        :func:`~hostmq.protocol.route_data.cluster_info_to_dict` makes it JSON-able.
        """
        return {"brokers": {n: self._brokers[n].data(n) for n in sorted(self._brokers)},
                "clusters": {c: sorted(self._clusters[c]) for c in sorted(self._clusters)},
                "live": {a: self._live[a].last_update_ms for a in sorted(self._live)}}

    # -----------------------------------------------------------------------------------------
    # Admin
    # -----------------------------------------------------------------------------------------
    def delete_topic(self, topic: str, cluster: str | None = None) -> bool:
        """Forget a topic's route (RocketMQ ``deleteTopic``); returns whether anything was removed.

        With ``cluster``, only the queue data of that cluster's brokers goes. A master still holding
        the topic brings it back the next time its data version changes.
        """
        check_text("topic", topic)
        if cluster is not None:
            check_text("cluster", cluster)
        per_broker = self._topics.get(topic)
        if per_broker is None:
            return False
        if cluster is None:
            del self._topics[topic]
            return True
        gone = [n for n in per_broker if n in self._clusters.get(cluster, set())]
        for name in gone:
            del per_broker[name]
        if not per_broker:
            del self._topics[topic]
        return bool(gone)

    def wipe_write_perm(self, broker_name: str) -> int:
        """Clear PERM_WRITE of every topic on ``broker_name`` (RocketMQ ``wipeWritePermOfBroker``).

        Producers then avoid the broker while consumers drain it. Returns how many topics it has.
        """
        return self._map_perm(broker_name, lambda perm: perm & ~PERM_WRITE)

    def add_write_perm(self, broker_name: str) -> int:
        """Set PERM_WRITE again (RocketMQ ``addWritePermOfBroker``); returns how many topics it has."""
        return self._map_perm(broker_name, lambda perm: perm | PERM_WRITE)

    # -----------------------------------------------------------------------------------------
    # KV config (RocketMQ KVConfigManager)
    # -----------------------------------------------------------------------------------------
    def put_kv(self, namespace: str, key: str, value: str) -> None:
        """Set one key; BrokerBusyError (nothing changed) if the KV config would pass ``kv_max_chars``."""
        check_text("namespace", namespace)
        check_text("key", key)
        if not isinstance(value, str):
            raise invalid("value", "must be a string", value)
        old = self._kv.get(namespace, {}).get(key)
        grown = self._kv_chars + len(value) - (len(old) if old is not None else -len(namespace) - len(key))
        if grown > self.kv_max_chars and grown > self._kv_chars:
            raise BrokerBusyError(f"the KV config would hold {grown} characters; namesrv.kv_max_chars is "
                                  f"{self.kv_max_chars} (delete keys first)")
        self._kv.setdefault(namespace, {})[key] = value
        self._kv_chars = grown

    def get_kv(self, namespace: str, key: str) -> str | None:
        check_text("namespace", namespace)
        check_text("key", key)
        return self._kv.get(namespace, {}).get(key)

    def delete_kv(self, namespace: str, key: str) -> bool:
        """Remove one key (an emptied namespace goes too); returns whether it existed."""
        check_text("namespace", namespace)
        check_text("key", key)
        values = self._kv.get(namespace)
        if values is None or key not in values:
            return False
        self._kv_chars -= len(namespace) + len(key) + len(values.pop(key))
        if not values:
            del self._kv[namespace]
        return True

    def kv_namespace(self, namespace: str) -> dict[str, str]:
        """A copy of one namespace's keys and values ({} if unknown), sorted by key."""
        check_text("namespace", namespace)
        return dict(sorted(self._kv.get(namespace, {}).items()))

    def kv_snapshot(self) -> dict[str, dict[str, str]]:
        """A JSON-able deep copy of the whole KV config, for the server to persist."""
        return {ns: dict(sorted(values.items())) for ns, values in sorted(self._kv.items())}

    def load_kv(self, data: Mapping[str, Mapping[str, str]]) -> None:
        """Replace the whole KV config with ``data`` (as :meth:`kv_snapshot` gives), validated first."""
        if not isinstance(data, Mapping):
            raise invalid("kv", "must be an object of namespaces", data)
        loaded: dict[str, dict[str, str]] = {}
        for ns, values in data.items():
            check_text("namespace", ns)
            if not isinstance(values, Mapping):
                raise invalid(f"kv[{ns!r}]", "must be an object of keys", values)
            for key, value in values.items():
                check_text(f"kv[{ns!r}] key", key)
                if not isinstance(value, str):
                    raise invalid(f"kv[{ns!r}][{key!r}]", "must be a string", value)
            if values:
                loaded[ns] = dict(values)
        self._kv = loaded
        self._kv_chars = sum(len(ns) + len(k) + len(v) for ns, values in loaded.items() for k, v in values.items())

    # -----------------------------------------------------------------------------------------
    # Internals: every change below runs only after its caller validated all input
    # -----------------------------------------------------------------------------------------
    def _check_register(self, cluster: Any, broker_name: Any, broker_id: Any, address: Any,
                        ha_address: Any, topics: Any, data_version: Any,
                        now_ms: Any) -> tuple[dict[str, QueueData], str | None]:
        """Validate a registration; returns the queue data it brings (by topic) and its HA address."""
        check_text("cluster", cluster)
        check_text("broker_name", broker_name)
        check_int("broker_id", broker_id)
        check_text("address", address, max_chars=None)
        ha = check_optional_text("ha_address", ha_address)
        check_int("data_version", data_version)
        check_int("now_ms", now_ms)
        if address not in self._live and len(self._live) >= self.max_brokers:
            raise BrokerBusyError(f"the NameServer already has {len(self._live)} broker addresses "
                                  f"(namesrv.max_brokers); {address!r:.120} was not registered")
        row = self._brokers.get(broker_name)
        if row is not None and row.cluster != cluster:
            raise invalid("cluster", f"broker {broker_name!r} is registered in cluster {row.cluster!r}; "
                                     f"unregister it (or let it expire) before moving it", cluster)
        if not isinstance(topics, Mapping):
            raise invalid("topics", "must be a mapping of topic name to TopicConfig", topics)
        out = {}
        for name, config in topics.items():
            check_topic("topics", name)
            if not isinstance(config, TopicConfig):
                raise invalid(f"topics[{name!r}]", "must be a TopicConfig", config)
            if config.topic_name != name:
                raise invalid(f"topics[{name!r}].topic_name", "must equal its key", config.topic_name)
            out[name] = QueueData.of(broker_name, config)
        return out, ha

    def _owner(self, address: str) -> tuple[str, int] | None:
        """The (broker name, id) record holding ``address``, if any."""
        for name, row in self._brokers.items():
            for broker_id, addr in row.addrs.items():
                if addr == address:
                    return name, broker_id
        return None

    def _release_address(self, address: str, keep: tuple[str, int]) -> None:
        """Take ``address`` out of any record other than ``keep`` (before re-adding it there)."""
        owner = self._owner(address)
        if owner is None or owner == keep:
            return
        name, broker_id = owner
        row = self._brokers[name]
        del row.addrs[broker_id]
        if not row.addrs and name != keep[0]:
            self._drop_broker_name(name)

    def _put_address(self, cluster: str, broker_name: str, broker_id: int, address: str) -> None:
        row = self._brokers.setdefault(broker_name, _Broker(cluster, {}))
        self._clusters.setdefault(cluster, set()).add(broker_name)
        old = row.addrs.get(broker_id)
        if old is not None and old != address:
            self._live.pop(old, None)        # that address is in no record any more
        row.addrs[broker_id] = address

    def _replace_queue_datas(self, broker_name: str, queue_datas: dict[str, QueueData]) -> None:
        for topic in [t for t, per_broker in self._topics.items() if broker_name in per_broker]:
            if topic not in queue_datas:
                self._remove_queue_data(topic, broker_name)
        for topic, queue_data in queue_datas.items():
            self._topics.setdefault(topic, {})[broker_name] = queue_data

    def _remove_queue_data(self, topic: str, broker_name: str) -> None:
        per_broker = self._topics[topic]
        del per_broker[broker_name]
        if not per_broker:
            del self._topics[topic]

    def _remove_address(self, address: str) -> None:
        """Forget an address; a broker name left with none goes entirely (RocketMQ onChannelDestroy)."""
        self._live.pop(address, None)
        owner = self._owner(address)
        if owner is None:
            return
        name, broker_id = owner
        row = self._brokers[name]
        del row.addrs[broker_id]
        if not row.addrs:
            self._drop_broker_name(name)

    def _drop_broker_name(self, broker_name: str) -> None:
        row = self._brokers.pop(broker_name)
        for address in row.addrs.values():
            self._live.pop(address, None)
        names = self._clusters[row.cluster]
        names.discard(broker_name)
        if not names:
            del self._clusters[row.cluster]
        for topic in [t for t, per_broker in self._topics.items() if broker_name in per_broker]:
            self._remove_queue_data(topic, broker_name)

    def _register_result(self, broker_name: str, broker_id: int) -> RegisterResult:
        if broker_id == MASTER_ID:
            return RegisterResult()
        master = self._brokers[broker_name].addrs.get(MASTER_ID)
        live = self._live.get(master) if master is not None else None
        if live is None:
            return RegisterResult()
        return RegisterResult(master_address=master, ha_server_address=live.ha_address)

    def _map_perm(self, broker_name: str, change) -> int:
        check_text("broker_name", broker_name)
        count = 0
        for per_broker in self._topics.values():
            queue_data = per_broker.get(broker_name)
            if queue_data is not None:
                per_broker[broker_name] = dataclasses.replace(queue_data, perm=change(queue_data.perm))
                count += 1
        return count


__all__ = [
    "RouteTable", "DEFAULT_BROKER_EXPIRY_MS", "ORDER_TOPIC_CONFIG_NAMESPACE",
    "TopicConfig", "QueueData", "BrokerData", "TopicRouteData", "RegisterResult", "BrokerLive",
    "cluster_info_to_dict", "cluster_info_from_dict",
]
