"""The transaction producer (docs/api.md "Producing"; RocketMQ ``TransactionMQProducer``).

``send_in_transaction(msg, local, arg)`` stores ``msg`` as a half message (``semantics.transaction``:
consumers do not see it), runs ``local(msg, arg)`` — the local transaction — and ends the
transaction with its answer: COMMIT stores the message under its topic, ROLLBACK drops it, UNKNOWN
(or an exception, or no answer because this process died) leaves it to the broker, which checks
back. A background thread polls every broker for such checks of this producer's group and answers
each with ``checker(MessageExt)``; any producer of the group may answer, so a restarted process
resolves what its predecessor left open. Everything else of :class:`Producer` works as usual.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Callable

from .. import records as R
from ..semantics.transaction import OP_TOPIC, check_view, commit_record, half_parts, op_record
from ..errors import HostMQError, ValidationError
from ..message import Message, MessageExt, MessageQueue, SendResult, TransactionState
from ..protocol.codes import RequestCode
from ..protocol.messages import CheckTransactionRequest, EndTransactionRequest
from .producer import Producer
from ..ingress.session import ProducerSession, Waiter

log = logging.getLogger(__name__)

CHECK_POLL_S = 0.5              # how often every broker is asked for checks
BROKER_LIST_MAX_AGE_S = 10.0
# A transaction whose local part ends this much before the broker would first check its half back
# is ended without asking (the margin covers the dispatch of the op before the broker's next walk).
UNASKED_END_MARGIN_S = 1.0


@dataclasses.dataclass(frozen=True, slots=True)
class TransactionSendResult(SendResult):
    """A SendResult of the half message (its queue is the real topic's queue the message goes to;
    ``queue_offset`` is the half's) with the local transaction's answer and the transaction id (the
    message's unique id, which the committed message keeps)."""

    local_transaction_state: TransactionState = TransactionState.UNKNOWN
    transaction_id: str = ""


class TransactionProducer(Producer):
    """See the module docstring. ``checker(MessageExt) -> TransactionState`` answers the broker's
    check-backs; it sees the half with its real topic and queue."""

    def __init__(self, root=None, group: str = "DEFAULT_TX_PRODUCER", checker: Callable | None = None, *,
                 check_poll_s: float = CHECK_POLL_S, **kwargs) -> None:
        if not callable(checker):
            raise ValidationError("TransactionProducer needs checker=fn(MessageExt) -> TransactionState "
                                  "to answer the broker's check-backs")
        super().__init__(root, group, **kwargs)
        self.checker = checker
        self.check_poll_s = check_poll_s
        self._check_stop = threading.Event()
        self._check_thread: threading.Thread | None = None
        self._brokers: tuple[float, list[tuple[str, str]]] = (0.0, [])
        self.unasked_ends = 0       # transactions ended without END_TRANSACTION (send_in_transaction)

    def start(self) -> "TransactionProducer":
        super().start()
        if self._check_thread is None:
            self._check_stop.clear()
            self._check_thread = threading.Thread(target=self._check_loop, name=f"tx-check-{self.group}",
                                                  daemon=True)
            self._check_thread.start()
        return self

    def shutdown(self) -> None:
        self._check_stop.set()
        if self._check_thread is not None:
            self._check_thread.join(10)
            self._check_thread = None
        super().shutdown()

    close = shutdown

    # -- sending --------------------------------------------------------------------------------------
    def send_in_transaction(self, msg: Message, local: Callable, arg=None,
                            timeout: float | None = None) -> TransactionSendResult:
        """Store ``msg`` as a half message, run ``local(msg, arg)``, end the transaction with its
        answer. A half that cannot be stored raises (and ``local`` is not run)."""
        if not callable(local):
            raise ValidationError("send_in_transaction needs local=fn(msg, arg) -> TransactionState")
        if isinstance(msg, Message) and msg.delay_level:
            raise ValidationError("a transactional message cannot be a delay message (as in RocketMQ)")
        deadline = time.monotonic() + (self.send_timeout_s if timeout is None else timeout)
        _, body, sys_flag, props = self.prepare(msg)
        tx_id = R.decode_properties(props).get(R.PROP_UNIQ_KEY, "")
        half = b""

        def attempt(mq: MessageQueue, session) -> SendResult:
            nonlocal half
            half_topic_b, half_qid, half_props = half_parts(mq.topic, mq.queue_id, props, self.group)
            if len(half_props) > session.max_properties_bytes:
                raise ValidationError(f"properties of {len(half_props)} bytes with the transaction routing "
                                      f"exceed {session.max_properties_bytes}")
            half = R.encode_record(half_topic_b, body, half_props, queue_id=half_qid, flag=msg.flag,
                                   sys_flag=sys_flag, born_ts_ms=int(time.time() * 1000), born_host=R.host_bytes(),
                                   store_host=session.store_host)
            return session.send(R.FRAME_MESSAGE, half, 1, Waiter(mq), deadline)
        sent_at = time.monotonic()                      # the half's store time is no earlier than this
        mq, sent = self._retrying(msg, None, None, None, None, deadline, attempt)
        state = self._run(f"local transaction of {tx_id}", local, msg, arg)
        if state != TransactionState.UNKNOWN:          # UNKNOWN: nothing to end; the broker checks back
            phys = R.decode_msg_id(sent.msg_id)[1]
            try:
                session = self._broker_session(mq.broker)
                if time.monotonic() - sent_at < session.transaction_timeout_s - UNASKED_END_MARGIN_S:
                    # No check-back of this half can have been handed out yet (the broker checks a
                    # half only once it is transaction_timeout_s old), so nobody else may be ending
                    # it: store the end without asking (one ring round trip, no END_TRANSACTION).
                    self._store_end(session, mq.broker, half, sent.queue_offset, phys, state)
                    self.unasked_ends += 1
                else:
                    self._end(mq.broker, half, sent.queue_offset, phys, state, False)
            except HostMQError as e:    # the broker will check back (RocketMQ logs and returns too)
                log.warning("ending transaction %s (%s) failed: %s; the broker will check back", tx_id,
                            state.value, e)
        return TransactionSendResult(sent.status, sent.msg_id, mq, sent.queue_offset, state, tx_id)

    @staticmethod
    def _run(what: str, fn: Callable, *args) -> TransactionState:
        """``fn(*args)`` as a TransactionState: an exception or another answer is UNKNOWN."""
        try:
            state = fn(*args)
        except Exception:
            log.exception("%s raised; its state is UNKNOWN", what)
            return TransactionState.UNKNOWN
        if not isinstance(state, TransactionState):
            log.warning("%s returned %r, not a TransactionState; its state is UNKNOWN", what, state)
            return TransactionState.UNKNOWN
        return state

    def _end(self, broker: str, half: bytes, queue_offset: int, phys_offset: int, state: TransactionState,
             from_check: bool, address: str | None = None) -> bool:
        """Ask the broker, then store the committed message (COMMIT) and the op message; True if
        this call resolved the transaction. ``state`` is COMMIT or ROLLBACK. ``address``: the broker
        instance that handed out the check — after a failover the master of ``broker`` is another
        instance than the one this producer's session may still point at."""
        # its address is the broker's (no NameServer lookup)
        session = self._session_to(broker, address) if address else self._broker_session(broker)
        req = EndTransactionRequest(self.group, queue_offset, phys_offset, state.value, from_check)
        answer = self.instance.broker_request(session.address, RequestCode.END_TRANSACTION, req.to_fields()).fields
        if not answer.get("resolve"):
            log.info("transaction at half offset %d not ended with %s: %s", queue_offset, state.value,
                     answer.get("reason"))
            return False
        self._store_end(session, broker, half, queue_offset, phys_offset, state)
        return True

    def _store_end(self, session, broker: str, half: bytes, queue_offset: int, phys_offset: int,
                   state: TransactionState) -> None:
        """Store the committed message (COMMIT) and the op message that resolves the half. Both frames
        are published before waiting: the writer appends a session's frames in order, so the op is
        never stored without the commit before it (a commit refused for a disk error refuses the op
        after it too; one refused because its topic is gone is dropped, as it would be after every
        check-back failed)."""
        deadline = time.monotonic() + self.send_timeout_s
        waiters = []
        if state == TransactionState.COMMIT:
            topic, qid, rec = commit_record(half, phys_offset, session.store_host)
            waiters.append(Waiter(MessageQueue(topic, broker, qid)))
            session.submit(R.FRAME_MESSAGE, rec, 1, waiters[-1], deadline)
        waiters.append(Waiter(MessageQueue(OP_TOPIC, broker, 0)))
        session.submit(R.FRAME_MESSAGE, op_record(queue_offset, session.store_host), 1, waiters[-1], deadline)
        for w in waiters:
            session.result(w, deadline)

    # -- check-backs ----------------------------------------------------------------------------------
    def _check_loop(self) -> None:
        while not self._check_stop.wait(self.check_poll_s):
            try:
                brokers = self._broker_list()
            except HostMQError as e:
                log.debug("transaction checks: no broker list (%s)", e)
                continue
            for name, address in brokers:
                if self._check_stop.is_set():
                    return
                try:
                    self._check_broker(name, address)
                except HostMQError as e:
                    log.debug("transaction checks of %s failed: %s", name, e)
                    self._brokers = (0.0, [])       # a master that moved: ask the NameServers again

    def _session_to(self, broker: str, address: str) -> ProducerSession:
        """The session to ``broker`` at ``address`` (the instance that checks back), replacing one that
        is broken or open to another instance of the name (its master before a failover)."""
        s = self._sessions.get(broker)
        if s is not None and s.broken is None and s.address == address:
            return s
        with self._lock:
            s = self._sessions.get(broker)
            if s is not None and s.broken is None and s.address == address:
                return s
            if s is not None:
                s.close(0)
            s = ProducerSession(self.instance, broker, address, data_bytes=self.ring_bytes,
                                completion_entries=self.completion_entries, idle=self.idle)
            self._sessions[broker] = s
            return s

    def _broker_list(self) -> list[tuple[str, str]]:
        at, brokers = self._brokers
        if time.monotonic() - at > BROKER_LIST_MAX_AGE_S or not brokers:
            info = self.instance.cluster_info()
            brokers = sorted((n, b.master_address) for n, b in info["brokers"].items() if b.master_address)
            self._brokers = (time.monotonic(), brokers)
        return brokers

    def _check_broker(self, broker: str, address: str) -> None:
        req = CheckTransactionRequest(self.group)
        frame = self.instance.broker_request(address, RequestCode.CHECK_TRANSACTION_STATE, req.to_fields())
        for row, raw in zip(frame.fields.get("checks", []), frame.bodies):
            raw = bytes(raw)
            try:
                view = MessageExt(check_view(raw), broker)
            except HostMQError as e:
                log.warning("broker %s sent a check that is not a half message: %s", broker, e)
                continue
            state = self._run(f"transaction checker for {view.unique_id}", self.checker, view)
            if state != TransactionState.UNKNOWN:
                try:
                    self._end(broker, raw, int(row["queue_offset"]), int(row["phys_offset"]), state,
                              from_check=True, address=address)
                except HostMQError as e:    # checked again at the next round
                    log.info("ending checked transaction %s (%s) at %s failed: %s", view.unique_id,
                             state.value, broker, e)
