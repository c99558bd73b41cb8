"""The broker's control requests (RocketMQ's processors), served from the broker process's one loop.

Producer sessions are ``session_server.py`` (a Unix socket of their own), transactions
``transaction_check.py``. Here: topics (``topics.json``; auto-creation on a producer's first send),
consumer offsets (``consumerOffset.json``), pulls with long polling (held until the dispatcher's
``dispatch_seq`` moves), offsets by time, message view by id, and the runtime info ``hostmq status``
prints.

Every handler that reads fields declares its request type (``protocol.messages.handles``): the
request is decoded once before the handler runs, so a handler receives a typed request, and a field of
the wrong type gets BAD_REQUEST naming it (MESSAGE_ILLEGAL for the group and client requests, as
before) and changes nothing. What a type cannot say (ranges, names) the handler checks.

Long polling (``long_poll.HeldPulls``): held pulls are capped per client connection and in all
(``broker.max_held_pulls_per_client`` / ``max_held_pulls``; BrokerBusyError past them) and indexed by
queue, and :meth:`BrokerService.check_held` does a bounded amount of work per call: when the
dispatcher's ``dispatch_seq`` moved it refreshes the queues that have held pulls, at most
HELD_QUEUES_PER_CHECK per call (round-robin), and answers the pulls whose offset the queue's max
offset passed; expired holds are answered earliest first. A reply to a non-local pull carries at most
``store.max_transfer_bytes`` of records (at least one record; RocketMQ
``maxTransferBytesOnMessageInMemory``), so every reply this module builds is bounded.

Group members (issue 27): administration codes never reach these handlers from a non-owner
(``transport.Server``'s policy); what members' heartbeats, send-backs, offset commits and first sends
create is counted per uid and in all (``quotas.MemberLedger``; PermissionDeniedError past a cap), and
a client id belongs to the uid that first named it. Topic changes are written (``topics.json``), told
to the writer and registered at most once per 50 ms however many change (``topic_commits``: group
commit; a request that changed topics is answered after the write), not once per topic.
"""
from __future__ import annotations

import logging
import os
import time
from collections import deque

from .. import records as R
from ..errors import HostMQError, MessageNotFoundError, NoRouteError, NotMasterError, ValidationError
from ..jsonfile import write_json
from ..protocol.route_data import TopicConfig
from ..protocol.codes import RequestCode, ResponseCode, code_name, response_code_for
from ..protocol.frames import Frame
from ..protocol.messages import (CheckTransactionRequest, EndTransactionRequest, GroupRequest, OffsetRequest,
                                 PullRequest, QueueRequest, ResetOffsetRequest, TopicRequest, ViewMessageRequest,
                                 handles)
from ..store.commitlog import SCHEDULE_TOPIC
from ..store.message_store import delay_levels_ms
from ..store.reader import GetStatus
from ..store.readonly import StoreReader
from ..transport import DEFER, Reply, ReplyToken, Server
from .offsets import OFFSETS_FILE, OffsetTable
from ..live.runtime import BrokerRuntime
from . import consumed
from .consumers import ConsumerTable
from .long_poll import HeldPull, HeldPulls
from .queue_locks import QueueLocks
from .quotas import MemberLedger
from .client_handlers import ClientHandlers
from ..semantics.retry import retry_topic
from ..live.state import W_DISPATCH_SEQ, BrokerState
from .topic_commits import TopicCommits
from ..semantics.system_topics import is_system_topic
from .topics import TopicTable
from ..semantics.transaction import HALF_TOPIC, OP_TOPIC
from .transaction_check import TransactionCheck

log = logging.getLogger(__name__)

MAX_PULL_COUNT = 4096
# What changes a broker's store or topics on request: a slave refuses it (NO_PERMISSION).
MASTER_ONLY = (RequestCode.UPDATE_AND_CREATE_TOPIC, RequestCode.DELETE_TOPIC_IN_BROKER, RequestCode.AUTO_CREATE_TOPIC,
               RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, RequestCode.CONSUMER_SEND_MSG_BACK,
               RequestCode.END_TRANSACTION, RequestCode.CHECK_TRANSACTION_STATE)
MAX_EXPRESSION_CHARS = 16 << 10  # a pull's filter expression (kept while the pull is held)
HELD_QUEUES_PER_CHECK = 512      # queues with held pulls refreshed per check_held call
HELD_ANSWERS_PER_CHECK = 1024    # held pulls answered per check_held call

_PULL_CODES = {
    GetStatus.FOUND: ResponseCode.SUCCESS,
    GetStatus.NO_MATCHED_MESSAGE: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetStatus.MESSAGE_WAS_REMOVING: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetStatus.NO_MESSAGE_IN_QUEUE: ResponseCode.PULL_NOT_FOUND,
    GetStatus.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
    GetStatus.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
    GetStatus.OFFSET_OVERFLOW_BADLY: ResponseCode.PULL_OFFSET_MOVED,
}


class BrokerService(ClientHandlers):
    """Handlers over the broker's tables; ``on_topics_changed`` re-registers with the NameServers."""

    def __init__(self, rt: BrokerRuntime, state: BrokerState, on_topics_changed=lambda: None, doorbell=None) -> None:
        self.rt = rt
        self.state = state
        self.doorbell = doorbell            # FutexWord: wakes the writer (it reloads topics)
        self.topics = TopicTable(rt.config_file("topics.json"), autosave=False)     # commit_topics writes it
        self.delay_levels = len(delay_levels_ms(rt.config.broker.message_delay_level))
        # The schedule topic holds delay messages, one queue per level (RocketMQ creates it at start).
        self.topics.put(TopicConfig(SCHEDULE_TOPIC, self.delay_levels, self.delay_levels))
        for topic in (HALF_TOPIC, OP_TOPIC):            # transactions: half and op messages, one queue each
            self.topics.put(TopicConfig(topic, 1, 1))
        self.topics.flush()
        self.commits = TopicCommits(self.topics, self._publish_topics)
        b = rt.config.broker
        self.members = MemberLedger(b, f"broker {rt.instance}", f"the owner of {rt.root}")
        self.transactions = TransactionCheck(rt.config_file("transaction.json"), b.transaction_timeout_s,
                                             b.transaction_check_max, b.transaction_resolve_lease_s)
        self.offsets = OffsetTable(rt.config_file(OFFSETS_FILE), slave=rt.is_slave)
        self.reader = StoreReader(rt.store_dir, rt.config.store, broker=rt.name, limit_phys=state.readable_pos) \
            if os.path.isdir(os.path.join(rt.store_dir, "commitlog")) else None
        self.on_topics_changed = on_topics_changed
        self.server: Server | None = None
        self.held = HeldPulls(b.max_held_pulls_per_client, b.max_held_pulls)
        self._held_seq = -1
        self._held_round: deque = deque()       # queues still to refresh since dispatch_seq last moved
        self._held_again = False                # dispatch_seq moved again during the current round
        self.consumers = ConsumerTable()
        self.locks = QueueLocks()

    def handlers(self) -> dict:
        c = RequestCode
        handlers = {
            c.PING: self.ping, c.UPDATE_AND_CREATE_TOPIC: self.create_topic,
            c.DELETE_TOPIC_IN_BROKER: self.delete_topic, c.AUTO_CREATE_TOPIC: self.auto_create_topic,
            c.GET_ALL_TOPIC_CONFIG: self.all_topics, c.PULL_MESSAGE: self.pull,
            c.QUERY_CONSUMER_OFFSET: self.query_offset, c.UPDATE_CONSUMER_OFFSET: self.update_offset,
            c.GET_MAX_OFFSET: self.max_offset, c.GET_MIN_OFFSET: self.min_offset,
            c.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset, c.VIEW_MESSAGE_BY_ID: self.view_message,
            c.HEART_BEAT: self.heartbeat, c.UNREGISTER_CLIENT: self.unregister_client,
            c.GET_BROKER_RUNTIME_INFO: self.runtime_info, c.GET_CONSUME_STATS: self.consume_stats,
            c.GET_CONSUMER_LIST_BY_GROUP: self.consumer_list, c.CONSUMER_SEND_MSG_BACK: self.send_back,
            c.LOCK_BATCH_MQ: self.lock_queues, c.UNLOCK_BATCH_MQ: self.unlock_queues, c.INVOKE_BROKER_TO_RESET_OFFSET: self.reset_offset,
            c.END_TRANSACTION: self.end_transaction, c.CHECK_TRANSACTION_STATE: self.transaction_checks,
        }
        if self.rt.is_slave:        # a slave's store and topics are its master's copy: nothing else writes them
            for code in MASTER_ONLY:
                handlers[code] = self.refuse_on_slave
        return handlers

    def refuse_on_slave(self, frame: Frame, token=None) -> Reply:
        raise NotMasterError(f"broker {self.rt.instance} is a slave: {code_name(frame.code)} goes to the master "
                             f"of {self.rt.name}")

    def ping(self, frame: Frame, token=None) -> Reply:
        return Reply(fields={"pid": os.getpid(), "broker": self.rt.name,
                             "state": int(self.state.get("broker_state"))})

    # -- sessions (session_server.py) ---------------------------------------------------------------
    def _check_running(self) -> None:
        if self.state.get("broker_state") == R.BROKER_STOPPING:
            raise NoRouteError(f"broker {self.rt.name} is shutting down")

    def session_fields(self) -> dict:
        """What every producer session's reply carries besides its slot (``session_server``)."""
        st = self.state
        return {"state_name": st.name, "state_generation": st.generation, "store_host": st.store_host.hex(),
                "sync_flush": st.sync_flush, "max_message_bytes": self.rt.config.store.max_message_bytes,
                "max_batch_bytes": st.commitlog_file_bytes - R.MIN_BLANK_BYTES,     # a batch never spans files
                "max_properties_bytes": self.rt.config.store.max_properties_bytes,
                "delay_levels": self.delay_levels,
                "transaction_timeout_s": self.rt.config.broker.transaction_timeout_s}

    # -- topics ---------------------------------------------------------------------------------------
    @handles(TopicRequest)
    def create_topic(self, req: TopicRequest, token=None) -> Reply:
        config = TopicConfig(req.topic, req.read_queues, req.write_queues, req.perm, req.order)
        since = self.commits.changes
        if self.topics.put(config):
            self._topics_changed()
        return self.commits.reply_when_committed(token, Reply(fields={"topic": req.topic, "created": True}), since)

    @handles(TopicRequest)
    def auto_create_topic(self, req: TopicRequest, token=None) -> Reply:
        R.validate_topic(req.topic)
        self._check_running()
        since = self.commits.changes
        t = self.topics.get(req.topic)
        if t is None:
            b = self.rt.config.broker
            if not is_system_topic(req.topic) and b.auto_create_topic:     # else auto_create refuses it
                self.members.admit_auto_topic(self.member_uid(token))
            t = self.topics.auto_create(req.topic, b.default_topic_queues, b.auto_create_topic)
            log.info("auto-created topic %s with %d queues", req.topic, t.write_queues)
            self._topics_changed()
        return self.commits.reply_when_committed(token, Reply(fields={
            "topic": req.topic, "write_queues": t.write_queues, "read_queues": t.read_queues}), since)

    @handles(TopicRequest)
    def delete_topic(self, req: TopicRequest, token=None) -> Reply:
        since = self.commits.changes
        deleted = self.topics.delete(req.topic)
        if deleted:
            self.offsets.delete_topic(req.topic)
            self._topics_changed()
        return self.commits.reply_when_committed(token, Reply(fields={"deleted": deleted}), since)

    def all_topics(self, frame: Frame, token=None) -> Reply:
        return Reply(fields={"topics": self.topics.registration(), "data_version": self.topics.data_version})

    def apply_master_meta(self, meta: dict) -> None:
        """A slave: its master's topics (taken as they are: routes name the slave's queues the same),
        consumer offsets (``OffsetTable.follow_master``) and delay offsets (kept for a promotion: a slave runs no
        scheduler) from the replica's ``master-meta.json``."""
        topics, offsets, delay = meta.get("topics"), meta.get("consumer_offsets"), meta.get("delay_offsets")
        if isinstance(topics, dict):
            try:
                if self.topics.replace(topics):
                    self._topics_changed()
            except ValidationError as e:
                log.warning("slave: the master's topic table was not taken: %s", e)
        if isinstance(offsets, dict) and self.offsets.follow_master(offsets):
            self.offsets.persist()
        if isinstance(delay, dict):
            write_json(self.rt.config_file("delayOffset.json"), delay)
        self.commit_topics()                # a timer's change: no request batch follows

    def apply_slave_offsets(self, data: dict) -> None:
        """A master: offsets consumers committed on a slave while this master was down (its
        replication process keeps them in ``slave-offsets.json``); each is taken where it is ahead."""
        moved = self.offsets.merge_larger(data)
        if moved:
            self.offsets.persist()
            log.info("broker %s: took %d consumer offsets committed on a slave while it was down",
                     self.rt.name, moved)

    def attach(self, server: Server) -> None:
        """Serve on ``server``: held pulls and topic commits answer through it."""
        self.server = server
        self.commits.attach(server)

    def _topics_changed(self) -> None:
        self.commits.changed()

    def commit_topics(self) -> None:
        """Write topic changes now (a change made outside a request, e.g. the master's table)."""
        self.commits.commit(force=True)

    def _publish_topics(self) -> None:
        """After ``topics.json`` was written: the writer reloads it, the NameServers get it."""
        self.state.bump("topics_version")
        if self.doorbell is not None:
            self.doorbell.post()            # the writer reloads its topic table at once
        self.on_topics_changed()

    # -- reading --------------------------------------------------------------------------------------
    def _reader(self) -> StoreReader:
        if self.reader is None:
            if not os.path.isdir(os.path.join(self.rt.store_dir, "commitlog")):
                raise MessageNotFoundError(f"broker {self.rt.name} has stored nothing yet")
            self.reader = StoreReader(self.rt.store_dir, self.rt.config.store, broker=self.rt.name,
                                      limit_phys=self.state.readable_pos)
        return self.reader

    def check_consumed(self) -> None:
        """``store.madvise_dontneed_consumed`` (timer): publish how far every group has read and drop
        the commitlog files before it from the page cache (``consumed``)."""
        reader = self._reader_or_none()
        if reader is not None:
            consumed.publish_and_drop(reader, {g: self.offsets.group_offsets(g) for g in self.offsets.groups()},
                                      self.state)

    def _reader_or_none(self) -> StoreReader | None:
        try:
            return self._reader()
        except MessageNotFoundError:
            return None

    @handles(PullRequest)
    def pull(self, req: PullRequest, token: ReplyToken | None = None):
        if not 1 <= req.max_count <= MAX_PULL_COUNT or req.queue_id < 0 or req.offset < 0:
            raise ValidationError(f"pull needs 1 ≤ max_count ≤ {MAX_PULL_COUNT}, queue_id ≥ 0, offset ≥ 0")
        if len(req.expression) > MAX_EXPRESSION_CHARS:
            raise ValidationError(f"a pull's expression has at most {MAX_EXPRESSION_CHARS} characters")
        reply = self._read(req)
        if reply.code != ResponseCode.PULL_NOT_FOUND or req.suspend_ms <= 0 or token is None:
            return reply
        hold_s = min(req.suspend_ms / 1000, self.rt.config.broker.long_polling_s)
        self.held.hold(HeldPull(token.identity, (req.topic, req.queue_id), req.offset,
                                time.monotonic() + hold_s, token, req))     # BrokerBusyError at a cap
        return DEFER

    def _read_queue(self, topic: str, queue_id: int) -> None:
        """NoRouteError / ValidationError unless this broker has ``topic`` with queue ``queue_id``."""
        cfg = self.topics.get(topic)
        if cfg is None:
            raise NoRouteError(f"topic {topic!r} does not exist on broker {self.rt.name}")
        if queue_id >= max(cfg.read_queues, cfg.write_queues):
            raise ValidationError(f"topic {topic!r} has no queue {queue_id} on broker {self.rt.name}")

    def _read(self, req: PullRequest) -> Reply:
        self._read_queue(req.topic, req.queue_id)
        try:
            reader = self._reader()
        except MessageNotFoundError:
            return Reply(ResponseCode.PULL_NOT_FOUND, fields={"status": GetStatus.NO_MESSAGE_IN_QUEUE.value,
                                                              "next_offset": 0, "min_offset": 0, "max_offset": 0})
        reader.refresh_queue(req.topic, req.queue_id)
        # At most store.max_transfer_bytes of records (at least one), so a body reply stays bounded.
        g = reader.get(req.topic, req.queue_id, req.offset, req.max_count, req.expression)
        fields = {"status": g.status.value, "next_offset": g.next_offset, "min_offset": g.min_offset,
                  "max_offset": g.max_offset, "count": len(g.messages)}
        bodies = [] if req.local else [bytes(m.raw) for m in g.messages]
        return Reply(_PULL_CODES[g.status], fields=fields, bodies=bodies)

    def check_held(self) -> None:
        """Answer held pulls whose queue moved past them or whose hold time is up (timer).

        Costs nothing while nothing happens; otherwise at most HELD_QUEUES_PER_CHECK queue refreshes
        and HELD_ANSWERS_PER_CHECK answers per call (the rest waits for the next call).
        """
        if not len(self.held):
            return
        budget = HELD_ANSWERS_PER_CHECK
        for h in self.held.expired(time.monotonic(), budget):
            self._answer_held(h)
            budget -= 1
        seq = self.state.w[W_DISPATCH_SEQ]
        if seq != self._held_seq:
            self._held_seq = seq
            self._held_again = True
        if not self._held_round and self._held_again:
            self._held_again = False
            self._held_round = deque(self.held.queues())
        reader = self._reader_or_none() if self._held_round else None
        if reader is None:
            return
        for _ in range(min(HELD_QUEUES_PER_CHECK, len(self._held_round))):
            if budget <= 0:
                return
            key = self._held_round.popleft()
            if not self.held.has_queue(key):            # its pulls were answered meanwhile
                continue
            ready = self.held.waiting_below(key, reader.refresh_queue(*key), budget)
            if len(ready) == budget:
                self._held_round.appendleft(key)        # maybe more of this queue: first in the next call
            for h in ready:
                self._answer_held(h)
            budget -= len(ready)

    def _answer_held(self, h: HeldPull) -> None:
        try:
            reply = self._read(h.request)
        except HostMQError as e:            # e.g. the topic went away while the pull was held
            reply = Reply(response_code_for(e), remark=str(e))
        except Exception as e:
            log.exception("answering a held pull of %s", h.key)
            reply = Reply(ResponseCode.SYSTEM_ERROR, remark=f"{type(e).__name__}: {e}")
        if self.server is not None:
            self.server.reply(h.token, reply)

    @handles(QueueRequest)
    def max_offset(self, req: QueueRequest, token=None) -> Reply:
        return Reply(fields={"offset": self._reader().refresh_queue(req.topic, req.queue_id)})

    @handles(QueueRequest)
    def min_offset(self, req: QueueRequest, token=None) -> Reply:
        r = self._reader()
        r.refresh_queue(req.topic, req.queue_id)
        return Reply(fields={"offset": r.min_offset(req.topic, req.queue_id)})

    @handles(QueueRequest)
    def search_offset(self, req: QueueRequest, token=None) -> Reply:
        r = self._reader()
        r.refresh_queue(req.topic, req.queue_id)
        return Reply(fields={"offset": r.offset_for_timestamp(req.topic, req.queue_id, req.timestamp_ms)})

    @handles(ViewMessageRequest)
    def view_message(self, req: ViewMessageRequest, token=None) -> Reply:
        m = self._reader().view(req.msg_id)
        return Reply(fields={"broker": self.rt.name}, bodies=[bytes(m.raw)])

    # -- offsets and clients ----------------------------------------------------------------------------
    @handles(OffsetRequest)
    def query_offset(self, req: OffsetRequest, token=None) -> Reply:
        off = self.offsets.query(req.group, req.topic, req.queue_id)
        if off is None:
            return Reply(ResponseCode.QUERY_NOT_FOUND, fields={"offset": -1}, remark="no offset committed")
        return Reply(fields={"offset": off})

    @handles(OffsetRequest)
    def update_offset(self, req: OffsetRequest, token=None) -> Reply:
        uid = self.member_uid(token)
        if uid is not None:                 # a member's commit names a queue that exists, of a group it may add
            self._read_queue(req.topic, req.queue_id)
            R.validate_topic(retry_topic(req.group))
            self.members.admit_groups(uid, self._new_groups([req.group]))
        if not self.offsets.accepts(req.group, req.reset_version):
            # The group was reset after this client last looked: its position is from before.
            return Reply(fields={"ignored": True, "reason": "offsets were reset"})
        self.offsets.commit(req.group, req.topic, req.queue_id, req.offset)
        return Reply(fields={"ignored": False})

    @handles(ResetOffsetRequest)
    def reset_offset(self, req: ResetOffsetRequest, token=None) -> Reply:
        if not self.topics.get(req.topic):
            raise NoRouteError(f"topic {req.topic!r} does not exist on broker {self.rt.name}")
        reader = self._reader_or_none()
        offsets = {}
        for qid in range(self.topics.get(req.topic).read_queues):
            if reader is None:
                offsets[qid] = 0
                continue
            reader.refresh_queue(req.topic, qid)
            offsets[qid] = reader.offset_for_timestamp(req.topic, qid, req.timestamp_ms)
        version = self.state.bump("offsets_reset_version")      # running consumers reload at once
        self.offsets.reset(req.group, req.topic, offsets, version)
        self.offsets.persist()
        log.info("reset %s on %s to %d: %s", req.group, req.topic, req.timestamp_ms, offsets)
        return Reply(fields={"offsets": {str(q): o for q, o in offsets.items()}})

    # -- transactions (transaction_check) -----------------------------------------------------------
    @handles(EndTransactionRequest)
    def end_transaction(self, req: EndTransactionRequest, token=None) -> Reply:
        return Reply(fields=self.transactions.end(self._reader_or_none(), req.group, req.queue_offset,
                                                  req.phys_offset, req.state))

    @handles(CheckTransactionRequest)
    def transaction_checks(self, req: CheckTransactionRequest, token=None) -> Reply:
        rows, bodies = self.transactions.poll(req.group, req.max_count)
        return Reply(fields={"checks": rows}, bodies=bodies)

    def check_transactions(self) -> None:
        """The transaction check walk (timer)."""
        reader = self._reader_or_none()
        if reader is not None:
            self.transactions.walk(reader, int(time.time() * 1000))

    @handles(GroupRequest, invalid=ValidationError)
    def consume_stats(self, req: GroupRequest, token=None) -> Reply:
        """A group's committed offset beside each queue's max offset (RocketMQ ``ConsumeStats``)."""
        group = req.group
        if not group:
            raise ValidationError("group must be a non-empty string")
        rows = []
        reader = self._reader_or_none()
        for (topic, qid), off in sorted(self.offsets.group_offsets(group).items()):
            mx = reader.refresh_queue(topic, qid) if reader is not None else 0
            rows.append({"topic": topic, "queue_id": qid, "broker_offset": mx, "consumer_offset": off})
        return Reply(fields={"broker": self.rt.name, "rows": rows})

    def runtime_info(self, frame: Frame, token=None) -> Reply:
        st = self.state
        queues = []
        reader = self._reader_or_none()
        for topic, cfg in sorted(self.topics.topics.items()):
            for qid in range(max(cfg.read_queues, cfg.write_queues)):
                mx = reader.refresh_queue(topic, qid) if reader is not None else 0
                mn = reader.min_offset(topic, qid) if reader is not None else 0
                queues.append({"topic": topic, "queue_id": qid, "min_offset": mn, "max_offset": mx})
        from .ha_master import ha_address
        b = self.rt.config.broker
        ha = ha_address(self.rt, st.get("ha_port"))
        return Reply(fields={"broker": self.rt.name, "pid": os.getpid(), "state": st.snapshot(),
                             "broker_id": self.rt.registered_id, "role": b.role, "instance": self.rt.instance,
                             "epoch": self.rt.epoch, "ha_address": ha,
                             "sessions": len(st.active_slots()),
                             "topics": self.topics.registration(), "queues": queues,
                             "groups": self.offsets.groups(), "clients": len(self.consumers),
                             "transactions": self.transactions.stats(), "control": self.control_stats()})

    def control_stats(self) -> dict[str, int]:
        """The control socket's counters (``transport.Server.stats``) and the held pulls."""
        out = self.server.stats() if self.server is not None else {}
        return {**out, "held_pulls": len(self.held)}

    def close(self) -> None:
        """At stop (the children are gone): persist and answer held pulls."""
        self.commits.close()
        self.transactions.progress.persist()
        for h in self.held.drain():
            if self.server is not None:
                self.server.reply(h.token, Reply(ResponseCode.SERVICE_NOT_AVAILABLE, remark="broker stopping"))
        if self.reader is not None:
            self.reader.close()
            self.reader = None


__all__ = ["BrokerService", "is_system_topic"]
