"""The broker's side of transactions (RocketMQ ``EndTransactionProcessor`` and
``TransactionalMessageCheckService``), run by the broker's control loop; the records, the walk and
its progress file are in ``transaction.py``.

* END_TRANSACTION: may this half be resolved now? Not if an op message says it was, it was given up,
  the state is UNKNOWN, or another producer was told yes moments ago (its lease,
  ``broker.transaction_resolve_lease_s``: that producer is storing the commit and op; if it dies
  first, the half is checked again once the lease ends).
* the check walk (timer, every ``transaction_check_interval_s``): ops are read to learn what is
  resolved; halves due a check wait in ``pending`` under their producer group.
* CHECK_TRANSACTION_STATE: a transaction producer polls for the checks of its group; each is handed
  to one producer (with the half's bytes, so the producer needs no read of the store).
"""
from __future__ import annotations

import logging
import time

from .. import records as R
from ..errors import ValidationError
from ..store.readonly import StoreReader
from ..semantics.transaction import (HALF_TOPIC, OP_TOPIC, PROP_CHECK_IMMUNITY_S, STATES, Half, TransactionProgress,
                          op_half_offset, plan_checks)

log = logging.getLogger(__name__)

BUSY_S = 30.0               # default lease of a producer told "resolve it" (BrokerConfig.transaction_resolve_lease_s)
MAX_WALK = 20_000           # halves one walk reads at most (the rest wait for the next)
MAX_CHECKS_PER_POLL = 256
MAX_POLL_BYTES = 4 << 20    # half bytes one poll answer carries at most (at least one half)


class TransactionCheck:
    def __init__(self, progress_path: str, timeout_s: float, check_max: int, lease_s: float = BUSY_S) -> None:
        self.progress = TransactionProgress(progress_path)
        self.lease_s = lease_s
        self.timeout_ms = int(timeout_s * 1000)
        self.check_max = check_max
        self.resolved: dict[int, int] = {}      # half queue offset → op queue offset that resolved it
        self.op_read = self.progress.op_offset  # ops below were read
        self.busy: dict[int, float] = {}        # half queue offset → monotonic deadline
        self.pending: dict[str, dict[int, tuple[int, int, bytes]]] = {}   # group → offset → (phys, checks, raw)
        self.seen: dict[int, float] = {}        # half queue offset → monotonic time this run first read it

    # -- ops ------------------------------------------------------------------------------------------
    def read_ops(self, reader: StoreReader) -> None:
        end = reader.refresh_queue(OP_TOPIC, 0)
        off = max(self.op_read, reader.min_offset(OP_TOPIC, 0))
        floor = self.progress.half_offset
        while off < end:
            g = reader.get(OP_TOPIC, 0, off, 256)
            for m in g.messages:
                half = op_half_offset(m.body)
                if half is not None and half >= floor:
                    self.resolved.setdefault(half, m.queue_offset)
            if g.next_offset <= off:
                break
            off = g.next_offset
        self.op_read = off

    def _done(self, off: int) -> str | None:
        if off < self.progress.half_offset or off in self.resolved:
            return "resolved already"
        if off in self.progress.given_up:
            return f"given up after {self.check_max} checks"
        return None

    # -- END_TRANSACTION -----------------------------------------------------------------------------
    def end(self, reader: StoreReader | None, group: str, queue_offset: int, phys_offset: int, state: str) -> dict:
        if state not in STATES:
            raise ValidationError(f"transaction state must be one of {', '.join(STATES)}, got {state!r}")
        if queue_offset < 0 or phys_offset < 0:
            raise ValidationError("end transaction needs queue_offset ≥ 0 and phys_offset ≥ 0")
        if reader is not None:
            self.read_ops(reader)
            self._check_half(reader, group, queue_offset, phys_offset)
        why = self._done(queue_offset)
        if why is None and state == "UNKNOWN":
            why = "state unknown: the broker will check back"
        now = time.monotonic()
        if why is None and self.busy.get(queue_offset, 0.0) > now:
            why = "being resolved by another producer"
        if why is not None:
            return {"resolve": False, "reason": why}
        self.busy[queue_offset] = now + self.lease_s
        for checks in self.pending.values():
            checks.pop(queue_offset, None)
        return {"resolve": True, "op_topic": OP_TOPIC, "op_queue_id": 0}

    @staticmethod
    def _check_half(reader: StoreReader, group: str, queue_offset: int, phys_offset: int) -> None:
        """The half at ``queue_offset`` is the one named and of ``group`` — when it is dispatched
        already (a producer may end its transaction before the dispatcher reached the half)."""
        if queue_offset >= reader.refresh_queue(HALF_TOPIC, 0) or queue_offset < reader.min_offset(HALF_TOPIC, 0):
            return
        got = reader.get(HALF_TOPIC, 0, queue_offset, 1).messages
        if not got:
            return
        m = got[0]
        if m.commitlog_offset != phys_offset:
            raise ValidationError(f"half message {queue_offset} is at commitlog offset {m.commitlog_offset}, "
                                  f"not {phys_offset}")
        owner = m.properties.get(R.PROP_PRODUCER_GROUP)
        if owner != group:
            raise ValidationError(f"half message {queue_offset} belongs to producer group {owner!r}, not {group!r}")

    # -- the walk (timer) ----------------------------------------------------------------------------
    def walk(self, reader: StoreReader, now_ms: int) -> None:
        self.read_ops(reader)
        p = self.progress
        end = reader.refresh_queue(HALF_TOPIC, 0)
        start = max(p.half_offset, reader.min_offset(HALF_TOPIC, 0))
        halves, msgs, off = [], {}, start
        mono = time.monotonic()
        while off < end and len(halves) < MAX_WALK:
            g = reader.get(HALF_TOPIC, 0, off, 64)
            for m in g.messages:
                # A half's age is the older of its store time's and the time since this run first read
                # it: store times never go back (commitlog._store_ts), so after the wall clock stepped
                # back they lie in the future until it catches up — a half stored then was never old
                # enough to check, and a transaction whose end was lost with its broker was lost (the
                # fault run on 8c9fbaa, after a one-hour step)
                first = self.seen.setdefault(m.queue_offset, mono)
                age_ts = min(m.store_timestamp_ms, now_ms - int((mono - first) * 1000))
                halves.append(Half(m.queue_offset, age_ts, _immunity_ms(m.properties)))
                msgs[m.queue_offset] = m
            if g.next_offset <= off:
                break
            off = g.next_offset
        self.busy = {k: t for k, t in self.busy.items() if t > mono}
        plan = plan_checks(halves, start, set(self.resolved) | p.given_up, set(self.busy), p.checks, now_ms,
                           self.timeout_ms, self.check_max)
        for half in plan.give_up:
            m = msgs[half]
            log.warning("transaction of half message %s (producer group %s, topic %s) given up after %d checks",
                        m.unique_id, m.properties.get(R.PROP_PRODUCER_GROUP), m.properties.get(R.PROP_REAL_TOPIC),
                        p.checks.get(half, 0))
            p.given_up.add(half)
            p.checks.pop(half, None)
            p.given_up_total += 1
        for half in plan.check:
            m = msgs[half]
            n = p.checks[half] = p.checks.get(half, 0) + 1
            p.checks_total += 1
            group = m.properties.get(R.PROP_PRODUCER_GROUP, "")
            self.pending.setdefault(group, {})[half] = (m.commitlog_offset, n, bytes(m.raw))
        floor = p.half_offset = plan.half_offset
        done = set(self.resolved) | p.given_up
        for group in list(self.pending):
            self.pending[group] = {k: v for k, v in self.pending[group].items() if k >= floor and k not in done}
            if not self.pending[group]:
                del self.pending[group]
        self.resolved = {k: v for k, v in self.resolved.items() if k >= floor}
        self.seen = {k: t for k, t in self.seen.items() if k >= floor}
        p.given_up = {k for k in p.given_up if k >= floor}
        p.checks = {k: v for k, v in p.checks.items() if k >= floor}
        p.op_offset = min(self.resolved.values(), default=self.op_read)
        p.persist()

    # -- CHECK_TRANSACTION_STATE ---------------------------------------------------------------------
    def poll(self, group: str, max_count: int) -> tuple[list[dict], list[bytes]]:
        """Up to ``max_count`` checks waiting for ``group`` (and about ``MAX_POLL_BYTES`` of halves),
        handed out: each to one producer."""
        if not 1 <= max_count <= MAX_CHECKS_PER_POLL:
            raise ValidationError(f"max_count must be within 1..{MAX_CHECKS_PER_POLL}")
        waiting = self.pending.get(group)
        rows, bodies = [], []
        if not waiting:
            return rows, bodies
        size = 0
        for half in sorted(waiting)[:max_count]:
            if bodies and size + len(waiting[half][2]) > MAX_POLL_BYTES:
                break
            phys, n, raw = waiting.pop(half)
            if self._done(half) is None:
                rows.append({"queue_offset": half, "phys_offset": phys, "check_times": n})
                bodies.append(raw)
                size += len(raw)
        return rows, bodies

    def stats(self) -> dict:
        p = self.progress
        return {"half_offset": p.half_offset, "checking": len(p.checks), "checks_total": p.checks_total,
                "given_up_total": p.given_up_total, "pending": sum(len(v) for v in self.pending.values())}


def _immunity_ms(props: dict[str, str]) -> int:
    v = props.get(PROP_CHECK_IMMUNITY_S, "")
    return int(v) * 1000 if v.isdigit() else 0
