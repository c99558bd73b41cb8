"""The broker's requests about clients (RocketMQ's ``ClientManageProcessor`` and consumer-group
handlers): heartbeats, unregistering, queue locks for orderly consumers, send-backs of failed
messages, group membership — a part of :class:`~hostmq.broker.service.BrokerService` kept apart.

Every client is untrusted (issue 27): a client id, a group or a pid in a request is a claim, so what
a request may create or touch is decided by the peer's uid as the kernel reports it
(``token.peer``): members are counted against ``quotas.MemberLedger``'s caps and may act only for the
client ids their uid named first; requests from an owner of the root are neither counted nor refused.
"""
from __future__ import annotations

import logging
import time

from .. import records as R
from ..errors import ValidationError
from ..protocol.route_data import TopicConfig
from ..protocol.messages import (ClientIdRequest, GroupRequest, HeartbeatRequest, LockRequest, SendBackRequest,
                                 handles)
from ..transport import Reply
from ..semantics.retry import retry_topic, send_back_target
from ..live.state import pid_alive

log = logging.getLogger(__name__)

CLIENT_EXPIRY_S = 120.0          # a client silent this long is dropped (RocketMQ channelExpiredTimeout)


class ClientHandlers:
    """Mixed into BrokerService, whose ``consumers``, ``locks``, ``members``, ``topics``, ``commits``,
    ``rt``, ``state``, ``server`` and ``delay_levels`` these handlers use."""

    def check_clients(self) -> None:
        """Drop consumers that stopped heartbeating or died (timer)."""
        before = set(self.consumers.clients)
        self._consumers_changed(self.consumers.expire(time.monotonic(), CLIENT_EXPIRY_S, pid_alive))
        gone = before - set(self.consumers.clients)
        self.members.forget_clients(gone)
        for cid in gone:                                        # a dead member's queues are free at once
            self.locks.release_client(cid)

    def member_uid(self, token) -> int | None:
        """The uid a request counts against; None for an owner's (or one made inside the broker)."""
        policy = self.server.policy if self.server is not None else None
        peer = getattr(token, "peer", None)
        if token is None or policy is None or policy.is_owner(peer):
            return None
        return peer.uid if peer is not None else -1

    def _new_groups(self, groups) -> list[str]:
        return [g for g in dict.fromkeys(groups)
                if retry_topic(g) not in self.topics.topics and g not in self.members.member_groups]

    @handles(HeartbeatRequest)
    def heartbeat(self, req: HeartbeatRequest, token=None) -> Reply:
        since = self.commits.changes
        uid = self.member_uid(token)
        if uid is not None:
            for group in req.consumer_groups:
                R.validate_topic(retry_topic(group))            # a member's group must make a valid topic name
        self.members.admit_heartbeat(uid, req.client_id, len(req.consumer_groups) + len(req.producer_groups),
                                     self._new_groups(req.consumer_groups) if uid is not None else [])
        for group in req.consumer_groups if not self.rt.is_slave else ():    # members subscribe to their
            self._ensure_topic(retry_topic(group))              # retry topic (RocketMQ); a slave's come from its master
        self._consumers_changed(self.consumers.heartbeat(req.client_id, req.pid, req.producer_groups,
                                                         req.consumer_groups, time.monotonic()))
        return self.commits.reply_when_committed(
            token, Reply(fields={"consumers_version": int(self.state.get("consumers_version"))}), since)

    @handles(ClientIdRequest, invalid=ValidationError)
    def unregister_client(self, req: ClientIdRequest, token=None) -> Reply:
        cid = req.client_id
        self.members.check_client(self.member_uid(token), cid)
        existed = cid in self.consumers.clients
        self._consumers_changed(self.consumers.unregister(cid))
        self.members.forget_clients([cid])
        self.locks.release_client(cid)
        return Reply(fields={"removed": existed})

    @handles(LockRequest)
    def lock_queues(self, req: LockRequest, token=None) -> Reply:
        self.members.check_client(self.member_uid(token), req.client_id)
        held = self.locks.lock(req.group, req.client_id, _queue_rows(req.queues), time.monotonic())
        return Reply(fields={"locked": [{"topic": t, "queue_id": q} for t, q in held]})

    @handles(LockRequest)
    def unlock_queues(self, req: LockRequest, token=None) -> Reply:
        self.members.check_client(self.member_uid(token), req.client_id)
        self.locks.unlock(req.group, req.client_id, _queue_rows(req.queues))
        return Reply()

    @handles(SendBackRequest)
    def send_back(self, req: SendBackRequest, token=None) -> Reply:
        """CONSUMER_SEND_MSG_BACK: where a message its listener failed goes (retry or DLQ topic,
        created here); the consumer stores it there through its ring."""
        since = self.commits.changes
        R.validate_consumer_group(req.group)
        if req.reconsume_times < 0 or req.max_reconsume_times < 0:
            raise ValidationError("send back needs reconsume_times ≥ 0 and max_reconsume_times ≥ 0")
        topic, level = send_back_target(req.group, req.reconsume_times, req.max_reconsume_times, req.delay_level)
        uid = self.member_uid(token)
        if uid is not None:
            R.validate_topic(topic)
            self.members.admit_groups(uid, self._new_groups([req.group]))
        self._ensure_topic(topic)
        return self.commits.reply_when_committed(token, Reply(fields={
            "topic": topic, "queue_id": 0, "delay_level": level, "delay_levels": self.delay_levels}), since)

    def _ensure_topic(self, topic: str) -> None:
        if topic not in self.topics.topics:
            self.topics.put(TopicConfig(topic, 1, 1))
            log.info("created %s", topic)
            self._topics_changed()

    @handles(GroupRequest, invalid=ValidationError)
    def consumer_list(self, req: GroupRequest, token=None) -> Reply:
        if not req.group:
            raise ValidationError("group must be a non-empty string")
        return Reply(fields={"consumer_ids": self.consumers.members(req.group),
                             "consumers_version": int(self.state.get("consumers_version"))})

    def _consumers_changed(self, groups: set[str]) -> None:
        if groups:
            log.info("consumer groups changed: %s", ", ".join(sorted(groups)))
            self.state.bump("consumers_version")        # members watch this word and rebalance


def _queue_rows(rows: list[dict]) -> list[tuple[str, int]]:
    out = []
    for r in rows:
        topic, qid = r.get("topic"), r.get("queue_id")
        if not isinstance(topic, str) or not isinstance(qid, int) or isinstance(qid, bool) or qid < 0:
            raise ValidationError(f"queue rows need a topic and a queue_id ≥ 0, got {r!r}")
        out.append((topic, qid))
    return out
