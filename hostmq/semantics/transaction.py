"""Transactional messages (RocketMQ ``TransactionalMessageService`` / ``EndTransactionProcessor``).

A transaction producer stores a **half message**: the message's bytes under
``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0, its real topic and queue in ``REAL_TOPIC`` / ``REAL_QID``, and
``TRAN_MSG`` / ``PGROUP`` (its producer group) — :func:`half_parts`. Consumers never see it. After
its local transaction the producer asks the broker to end it (END_TRANSACTION) — unless it ends well
before the half can be checked back (``transaction_timeout_s``): then nobody else can be resolving
it and the producer does not ask (``TransactionProducer.send_in_transaction``); the broker answers
whether it may be resolved (not resolved already, not given up), and the producer stores, through
its ingress ring — the writer stays the only appender — the committed message (:func:`commit_record`:
real topic and queue, ``TRANSACTION_COMMIT`` sys flag, ``PREPAREDTRANSACTIONOFFSET`` = the half's
commitlog offset) if it commits, then an **op message** (:func:`op_record`) under
``RMQ_SYS_TRANS_OP_HALF_TOPIC`` whose body is the half's queue offset (tag ``d``), commit or rollback.

Halves without an op are **checked back**: every ``transaction_check_interval_s`` the broker walks
the half queue from the first unresolved half (:func:`plan_checks`); a half older than
``transaction_timeout_s`` (or its ``CHECK_IMMUNITY_TIME_IN_SECONDS``) is handed to a producer of its
group (which polls with CHECK_TRANSACTION_STATE and answers with END_TRANSACTION), and after
``transaction_check_max`` checks it is given up (logged; it stays readable under the half topic).
Where the walk stands and how often each half was checked is ``config/transaction.json``
(:class:`TransactionProgress`; the broker's control loop is its only writer). As in RocketMQ,
delivery is at least once: a producer that dies between storing the commit and the op is asked
again, and a second COMMIT stores the message again.
"""
from __future__ import annotations

import dataclasses
import logging
import time

from .. import records as R
from ..errors import ValidationError
from ..jsonfile import read_json, write_json
from ..message import TransactionState

log = logging.getLogger(__name__)

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
OP_TAG = "d"                                    # RocketMQ TransactionalMessageUtil.REMOVETAG
PROP_CHECK_IMMUNITY_S = "CHECK_IMMUNITY_TIME_IN_SECONDS"
HALF_TOPIC_B, OP_TOPIC_B = HALF_TOPIC.encode(), OP_TOPIC.encode()
_STRIP = (R.PROP_REAL_TOPIC, R.PROP_REAL_QUEUE_ID, R.PROP_TRANSACTION_PREPARED)
STATES = tuple(s.value for s in TransactionState)


# -- records (pure) -------------------------------------------------------------------------------------
def half_parts(topic: str, queue_id: int, props_b: bytes, group: str) -> tuple[bytes, int, bytes]:
    """Where a half message is stored: ``(topic bytes, queue id, properties)`` of its record."""
    extra = R.encode_properties({R.PROP_REAL_TOPIC: topic, R.PROP_REAL_QUEUE_ID: str(queue_id),
                                 R.PROP_TRANSACTION_PREPARED: "true", R.PROP_PRODUCER_GROUP: group})
    return HALF_TOPIC_B, 0, props_b + extra


def _half(raw: bytes):
    h, topic, body, props = R.decode_record(raw, 0, len(raw), verify_crc=False)
    real_topic, real_qid = props.get(R.PROP_REAL_TOPIC), props.get(R.PROP_REAL_QUEUE_ID)
    if topic != HALF_TOPIC or not real_topic or not (real_qid or "").isdigit():
        raise ValidationError(f"record at {h.phys_offset} is not a half message")
    return h, real_topic, int(real_qid), body, props


def commit_record(raw: bytes, half_phys: int, store_host: bytes) -> tuple[str, int, bytes]:
    """The message a COMMIT stores: ``(real topic, real queue id, record)``. Same body, flags, born
    time and host, unique id, producer group and user properties as the half."""
    h, topic, qid, body, props = _half(raw)
    kept = {k: v for k, v in props.items() if k not in _STRIP}
    sys_flag = (h.sys_flag & ~R.SYSFLAG_TX_MASK) | R.SYSFLAG_TX_COMMIT
    rec = R.encode_record(R.validate_topic(topic), body, R.encode_properties(kept), queue_id=qid, flag=h.flag,
                          sys_flag=sys_flag, born_ts_ms=h.born_ts_ms, born_host=bytes(h.born_host),
                          store_host=store_host, prepared_tx_offset=half_phys)
    return topic, qid, rec


def check_view(raw: bytes) -> bytes:
    """The half as a producer's checker sees it (RocketMQ restores the real topic and queue before
    it sends a check): real topic and queue, the half's offsets and store time, ``TRAN_MSG`` kept."""
    h, topic, qid, body, props = _half(raw)
    kept = {k: v for k, v in props.items() if k not in (R.PROP_REAL_TOPIC, R.PROP_REAL_QUEUE_ID)}
    return R.encode_record(R.validate_topic(topic), body, R.encode_properties(kept), queue_id=qid, flag=h.flag,
                           sys_flag=h.sys_flag, born_ts_ms=h.born_ts_ms, born_host=bytes(h.born_host),
                           store_ts_ms=h.store_ts_ms, store_host=bytes(h.store_host),
                           queue_offset=h.queue_offset, phys_offset=h.phys_offset)


def op_record(half_queue_offset: int, store_host: bytes) -> bytes:
    """The op message that marks half ``half_queue_offset`` resolved (committed or rolled back)."""
    props = R.encode_properties({R.PROP_TAGS: OP_TAG})
    return R.encode_record(OP_TOPIC_B, str(half_queue_offset).encode(), props, queue_id=0,
                           born_ts_ms=int(time.time() * 1000), born_host=R.host_bytes(), store_host=store_host)


def op_half_offset(body: bytes) -> int | None:
    """The half queue offset an op message names (None for a body that names none)."""
    try:
        text = body.decode("ascii")
    except UnicodeDecodeError:
        return None
    return int(text) if text.isdigit() else None


# -- the check walk (pure) -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Half:
    queue_offset: int
    store_ts_ms: int
    immunity_ms: int = 0            # CHECK_IMMUNITY_TIME_IN_SECONDS of the message, in ms


@dataclasses.dataclass(frozen=True)
class CheckPlan:
    half_offset: int                # every half below is resolved or given up
    check: tuple[int, ...]          # halves to check back now
    give_up: tuple[int, ...]        # halves checked ``check_max`` times already


def plan_checks(halves: list[Half], half_offset: int, done: set[int], busy: set[int], checks: dict[int, int],
                now_ms: int, timeout_ms: int, check_max: int) -> CheckPlan:
    """One walk over ``halves`` (consecutive, from ``half_offset``): ``done`` are resolved or given up,
    ``busy`` are being ended by a producer right now. The walk stops at the first half too young to
    check (the rest are younger); ``half_offset`` moves over the done prefix."""
    check, give_up, start, prefix = [], [], half_offset, True
    for h in halves:
        off = h.queue_offset
        finished = off in done
        if not finished and off not in busy:
            if now_ms - h.store_ts_ms < max(timeout_ms, h.immunity_ms):
                break
            if checks.get(off, 0) >= check_max:
                give_up.append(off)
                finished = True
            else:
                check.append(off)
        if prefix and finished:
            start = off + 1
        else:
            prefix = False
    return CheckPlan(start, tuple(check), tuple(give_up))


# -- progress (config/transaction.json) -------------------------------------------------------------
class TransactionProgress:
    """Where the check walk stands: the first half not known done (``half_offset``), the op queue
    offset from which re-reading the ops rebuilds what is resolved above it (``op_offset``), check
    counts, and the halves given up above ``half_offset``."""

    def __init__(self, path: str) -> None:
        self.path = path
        data = read_json(path, {})
        data = data if isinstance(data, dict) else {}

        def count(key: str) -> int:
            v = data.get(key, 0)
            return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0
        self.half_offset, self.op_offset = count("half_offset"), count("op_offset")
        self.given_up_total, self.checks_total = count("given_up_total"), count("checks_total")
        raw_checks = data.get("checks", {})
        self.checks: dict[int, int] = {int(k): v for k, v in (raw_checks.items() if isinstance(raw_checks, dict) else ())
                                       if str(k).isdigit() and isinstance(v, int) and v > 0}
        raw_given = data.get("given_up", [])
        self.given_up: set[int] = {v for v in (raw_given if isinstance(raw_given, list) else ())
                                   if isinstance(v, int) and v >= 0}
        self._saved = self._doc()

    def _doc(self) -> dict:
        return {"half_offset": self.half_offset, "op_offset": self.op_offset,
                "checks": {str(k): v for k, v in sorted(self.checks.items())}, "given_up": sorted(self.given_up),
                "checks_total": self.checks_total, "given_up_total": self.given_up_total}

    def persist(self) -> bool:
        doc = self._doc()
        if doc == self._saved:
            return False
        write_json(self.path, doc)
        self._saved = doc
        return True
