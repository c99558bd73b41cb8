"""Administration (docs/api.md "Administration"; RocketMQ's ``MQAdminExt``): topics, routes, brokers, progress,
message lookup.

Control requests go to the NameServers and brokers; message lookups (``view_message``,
``query_by_key``) read the brokers' store files directly through read-only maps, so they work even
while a broker is down.
"""
from __future__ import annotations

import time

from .. import records as R
from ..errors import ConnectError, HostMQError, MessageNotFoundError, NoRouteError, ValidationError
from ..message import MessageExt, MessageQueue
from ..protocol.route_data import PERM_READ, PERM_WRITE
from ..protocol.codes import RequestCode
from ..protocol.messages import (DeleteTopicInNamesrvRequest, GroupRequest, KvConfigRequest, ResetOffsetRequest,
                                 TopicRequest)
from ..root import ipc_address
from ..store.index import IndexReader
from ..client.broker_view import BrokerView
from ..client.instance import ClientInstance

ROUTE_WAIT_S = 10.0
ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"


class Admin:
    def __init__(self, root=None, timeout_s: float = 3.0) -> None:
        self.instance = ClientInstance(root, timeout_s=timeout_s)
        self.root = self.instance.root

    # -- topics ---------------------------------------------------------------------------------------
    def create_topic(self, topic: str, queues: int = 4, order: bool = False, brokers=None) -> list[MessageQueue]:
        """Create (or update) ``topic`` with ``queues`` queues on ``brokers`` (None: every registered
        broker); returns its route once every one of them serves it."""
        R.validate_topic(topic)
        if not isinstance(queues, int) or isinstance(queues, bool) or not 1 <= queues <= 1024:
            raise ValidationError(f"queues must be an int within 1..1024, got {queues!r}")
        masters = self._masters()
        names = sorted(masters) if brokers is None else [brokers] if isinstance(brokers, str) else list(brokers)
        if not names:
            raise NoRouteError(f"no broker is registered under {self.root}")
        unknown = [b for b in names if b not in masters]
        if unknown:
            raise NoRouteError(f"broker(s) {', '.join(unknown)} not registered under {self.root}")
        fields = TopicRequest.of(topic=topic, read_queues=queues, write_queues=queues, perm=PERM_READ | PERM_WRITE,
                                 order=bool(order)).to_fields()
        for b in names:
            self.instance.broker_request(masters[b], RequestCode.UPDATE_AND_CREATE_TOPIC, fields)
        if order:
            conf = ";".join(f"{b}:{queues}" for b in names)
            self.instance.namesrv_request(RequestCode.PUT_KV_CONFIG,
                                          KvConfigRequest.of(namespace=ORDER_TOPIC_CONFIG, key=topic,
                                                             value=conf).to_fields())
        return self._await_route(topic, set(names), queues)

    def _await_route(self, topic: str, brokers: set[str], queues: int) -> list[MessageQueue]:
        deadline = time.monotonic() + ROUTE_WAIT_S
        while True:
            try:
                qs = self.instance.subscribe_queues(topic, refresh=True)
                have = {b: sum(1 for q in qs if q.broker == b) for b in brokers}
                if all(n == queues for n in have.values()):
                    return qs
            except NoRouteError:
                pass
            if time.monotonic() >= deadline:
                raise NoRouteError(f"topic {topic!r} was created but its route did not reach the NameServers "
                                   f"within {ROUTE_WAIT_S:.0f} s")
            time.sleep(0.02)

    def delete_topic(self, topic: str) -> bool:
        """Delete ``topic`` from every broker serving it and from every NameServer."""
        R.validate_topic(topic)
        deleted = False
        masters = self._masters()
        for b, addr in sorted(masters.items()):
            try:
                deleted |= self.instance.broker_request(addr, RequestCode.DELETE_TOPIC_IN_BROKER,
                                                        TopicRequest.of(topic=topic).to_fields()
                                                        ).fields.get("deleted", False)
            except ConnectError:
                continue
        for sock in self.instance.paths.namesrv_sockets():
            try:
                c = self.instance._namesrv(ipc_address(sock))
                deleted |= c.request(RequestCode.DELETE_TOPIC_IN_NAMESRV,
                                     DeleteTopicInNamesrvRequest.of(topic=topic).to_fields()).fields["deleted"]
            except (ConnectError, HostMQError):
                continue
        self.instance.forget_route(topic)
        return deleted

    def topics(self) -> list[str]:
        return sorted(self.instance.namesrv_request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER).fields["topics"])

    def route(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues, ordered by broker then id (NoRouteError if none)."""
        return self.instance.subscribe_queues(topic, refresh=True)

    def publish_route(self, topic: str) -> list[MessageQueue]:
        """The topic's writable queues."""
        return self.instance.publish_queues(topic, refresh=True)

    # -- brokers --------------------------------------------------------------------------------------
    def _masters(self) -> dict[str, str]:
        info = self.instance.cluster_info()
        return {name: b.master_address for name, b in info["brokers"].items() if b.master_address}

    def brokers(self) -> list[dict]:
        """One row per registered broker: name, id, cluster, address, alive, pids, and positions."""
        info = self.instance.cluster_info()
        rows = []
        for cluster, names in sorted(info["clusters"].items()):
            for name in sorted(names):
                b = info["brokers"][name]
                for bid, addr in sorted(b.addrs.items()):
                    row = {"name": name, "id": bid, "cluster": cluster, "address": addr, "alive": False,
                           "pids": {}, "state": {}}
                    try:
                        rt = self.instance.broker_request(addr, RequestCode.GET_BROKER_RUNTIME_INFO,
                                                          timeout_s=self.instance.timeout_s).fields
                        st = rt["state"]
                        row.update(alive=True, state=st, topics=rt["topics"], queues=rt["queues"],
                                   sessions=rt["sessions"], groups=rt["groups"],
                                   transactions=rt.get("transactions", {}),
                                   role=rt.get("role", "ASYNC_MASTER"), ha_address=rt.get("ha_address", ""),
                                   instance=rt.get("instance", name), epoch=rt.get("epoch", 0),
                                   pids={"broker": rt["pid"], **{p: st[f"{p}_pid"] for p in
                                         ("writer", "dispatcher", "flusher", "scheduler", "ha")
                                         if st.get(f"{p}_pid")}})
                        if bid != 0:        # a slave: how far it has the master's commitlog
                            row.update(replicated_offset=st["write_pos"],
                                       lag_bytes=max(0, st.get("master_end_pos", 0) - st["write_pos"]))
                    except HostMQError as e:
                        row["error"] = str(e)
                    rows.append(row)
        return rows

    def promote(self, name: str, broker_id: int, role: str = "ASYNC_MASTER", force: bool = False,
                timeout_s: float = 120.0) -> dict:
        """Make the slave ``name``.``broker_id`` of this root the master of its group (``hostmq ha
        promote``; ``admin/promotion.py``): refused (PromotionRefusedError) while a master of the
        group runs or when the slave lacks what its master said it held (``force`` accepts that).
        Returns once it runs as the master: ``{"instance", "epoch", "write_pos", "demoted"}``."""
        from .promotion import promote
        return promote(self.root, name, broker_id, role, force, timeout_s, instance_client=self.instance)

    def reset_offset(self, group: str, topic: str, timestamp_ms: int) -> dict[MessageQueue, int]:
        """Backtracking: every queue of ``topic`` continues, for ``group``, from its first message
        stored at or after ``timestamp_ms``; running consumers of the group pick it up at once."""
        R.validate_consumer_group(group)
        R.validate_topic(topic)
        if not isinstance(timestamp_ms, int) or isinstance(timestamp_ms, bool) or timestamp_ms < 0:
            raise ValidationError(f"timestamp_ms must be an int ≥ 0, got {timestamp_ms!r}")
        out: dict[MessageQueue, int] = {}
        for broker in sorted({q.broker for q in self.route(topic)}):
            addr = self.instance.broker_address(broker, topic)
            f = self.instance.broker_request(addr, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
                                             ResetOffsetRequest.of(group=group, topic=topic,
                                                                   timestamp_ms=timestamp_ms).to_fields())
            for qid, off in f.fields["offsets"].items():
                out[MessageQueue(topic, broker, int(qid))] = off
        return out

    def consumer_progress(self, group: str) -> list[dict]:
        """Per queue of the group's topics: broker offset, consumer offset and lag."""
        rows = []
        for name, addr in sorted(self._masters().items()):
            try:
                f = self.instance.broker_request(addr, RequestCode.GET_CONSUME_STATS,
                                                 GroupRequest.of(group=group).to_fields()).fields
            except ConnectError:
                continue
            for r in f["rows"]:
                rows.append({"queue": MessageQueue(r["topic"], name, r["queue_id"]),
                             "broker_offset": r["broker_offset"], "consumer_offset": r["consumer_offset"],
                             "lag": max(0, r["broker_offset"] - r["consumer_offset"])})
        return rows

    # -- messages -------------------------------------------------------------------------------------
    def view_message(self, msg_id: str) -> MessageExt:
        """The message with this id, read from its broker's store (MessageNotFoundError if none)."""
        host, _ = R.decode_msg_id(msg_id)
        for broker in self.instance.paths.brokers():
            view = self._view(broker)
            if view is None:
                continue
            try:
                m = view.reader.view(msg_id)
                if m.msg_id == msg_id.upper():
                    return m
            except MessageNotFoundError:
                continue
            finally:
                view.close()
        raise MessageNotFoundError(f"no message {msg_id} under {self.root}")

    def query_by_key(self, topic: str, key: str, begin_ms: int = 0, end_ms: int | None = None,
                     max_count: int = 64) -> list[MessageExt]:
        """Messages of ``topic`` whose keys (or unique id) include ``key``, stored within the range."""
        R.validate_topic(topic)
        end = (1 << 62) if end_ms is None else end_ms
        found = []
        for broker in self.instance.paths.brokers():
            view = self._view(broker)
            if view is None:
                continue
            index = IndexReader(view.store_dir, view.config.index_slots, view.config.index_entries)
            try:
                for phys in sorted(set(index.query(topic, key, max_count * 2, begin_ms, end))):
                    try:
                        m = view.reader.view(view.reader.commitlog.msg_id(phys))
                    except (MessageNotFoundError, ValidationError):
                        continue
                    if m.topic == topic and (key in m.keys or m.unique_id == key) and \
                            begin_ms <= m.store_timestamp_ms <= end:
                        m.broker = broker
                        found.append(m)
            finally:
                index.close()
                view.close()
        found.sort(key=lambda m: m.store_timestamp_ms)
        return found[-max_count:]

    def _view(self, broker: str) -> BrokerView | None:
        try:
            return BrokerView(self.root, broker, by_id=True)
        except (HostMQError, OSError, ValueError):
            return None

    def close(self) -> None:
        self.instance.close()

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
