"""The pull consumer (docs/api.md "Consuming"; RocketMQ's lite pull consumer) — the read side.

``assign`` queues, then ``poll``: messages are read straight from the broker's store files through
read-only maps (``broker_view``), never over a socket. Positions start at the group's committed
offset (kept by the broker), else where ``consume_from`` says (a new group with LAST_OFFSET starts at
the end and does not replay history). ``poll`` waits for new messages without busy-spinning: a short
spin on the brokers' ``dispatch_seq`` words, then a sleep on all of their futexes at once
(``futex_waitv``), which each dispatcher wakes after publishing — nothing is registered with the
brokers. Offsets are committed to the broker by ``commit`` (and every
``auto_commit_interval_s`` and at ``close`` with ``auto_commit``).

Queues are either assigned (``assign``) or group-managed (``subscribe``: the group's members share
each topic's queues, see ``membership``; a member heartbeats and rebalances from ``poll``, so a
consumer that stops polling for the broker's client expiry (120 s) leaves its group until it polls
again). Not thread-safe: one thread polls a consumer (as with Kafka's and RocketMQ's lite consumers).

A stored record that cannot be decoded (an old store, a damaged disk) is never returned: the read
side skips it, the position moves past it, it is logged once (``store/read_check.py``) and
counted in ``skipped_records``; a filter never sees it either.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Iterable

import numpy as np

from .. import records as R
from ..errors import HostMQError, ValidationError
from ..message import ConsumeFrom, MessageExt, MessageQueue
from ..live.state import W_COMMITTED_POS, W_CONFIRMED_POS, W_DISPATCHED_POS, W_WRITE_POS
from ..store import read_check
from ..store.reader import GetStatus, MessageBatch
from ..shm.futex import MAX_WAITV
from ..shm.signal import WaitStats, wait_changed
from ..waiting import IdleStrategy, client_idle
from .broker_view import BrokerView
from .slave_reads import SlaveReads
from ..store.filter import parse_tag_expression
from .offset_store import BrokerOffsets
from .membership import HEARTBEAT_INTERVAL_S, REBALANCE_INTERVAL_S, GroupMember
from .rebalance import Strategy
from .sql92 import SQL
from .instance import ClientInstance

log = logging.getLogger(__name__)

DEFAULT_TIMESTAMP_LOOKBACK_MS = 30 * 60 * 1000      # RocketMQ consumeTimestamp default: 30 min ago
STALE_CHECK_S = 0.5
TAIL_SCAN_WAIT_S = 0.001         # a poll with a tail still catching up sleeps at most this long
_EMPTY = np.empty(0, np.int64)
WOKEN_QUEUES = 8        # the most queues a consumer may poll for its wake-ups' one-call rounds (_woken_round)


def tail_round(reader, view, seen: tuple | None, pos: int, max_count: int, mark: int, readable: int,
               word: int | None, topic: str, queue_id: int, out: list):
    """A tailing consumer's round for one queue (``PullConsumer._read_news``), the spec of
    ``store/_read.c`` ``tail_poll`` (which takes ``reader.poll_context()`` for ``reader``): False
    when ``seen`` — the consumer's entry for the queue, (view, readable mark or None, max offset,
    (word, readable) or None) — says nothing is at ``pos``: the readable mark has not moved since
    we read the queue to its end, or (many queues, BrokerView.quiet_words) its word and the readable
    position have not. Else ``StoreReader.read_tail`` with the round's ends: (the new seen entry, the
    queue's max offset, the next position with the messages appended to ``out`` — or None where the
    read stopped short of a result, for the caller's ``get``)."""
    if seen is not None and seen[0] is view and pos >= seen[2] and \
            (seen[1] == mark or (word is not None and seen[3] == (word, readable))):
        return False
    m, g = reader.read_tail(topic, queue_id, pos, max_count, mark, readable)
    # a tail still scanning (or at its bound, or stopped) may show more without the mark moving
    caught_up = reader.tail.caught_up()
    seen = (view, mark if caught_up else None, m, (word, readable) if caught_up and word is not None else None)
    if g is None:
        return seen, m, None
    out.extend(g.messages)
    return seen, m, g.next_offset


def _got(g) -> tuple:
    """A GetResult as ``PullConsumer._read_news`` answers: (messages, the next position — None
    where the read does not move it — and records skipped)."""
    stays = g.status == GetStatus.NO_MESSAGE_IN_QUEUE or g.status == GetStatus.OFFSET_OVERFLOW_ONE
    return g.messages, None if stays else g.next_offset, g.skipped


class PullConsumer:
    def __init__(self, root=None, group: str = "DEFAULT_CONSUMER", auto_commit: bool = True,
                 consume_from: ConsumeFrom = ConsumeFrom.LAST_OFFSET, consume_timestamp_ms: int | None = None, *,
                 auto_commit_interval_s: float = 5.0, max_poll_records: int = 32, spin_s: float | None = None,
                 idle: "str | IdleStrategy | None" = None, timeout_s: float = 3.0, allocate: Strategy = "average",
                 rebalance_interval_s: float = REBALANCE_INTERVAL_S,
                 heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S, offset_store=None,
                 on_assign: Callable[[list[MessageQueue]], None] | None = None,
                 on_revoke: Callable[[list[MessageQueue]], None] | None = None,
                 commit_position: Callable[[MessageQueue], int | None] | None = None) -> None:
        """Hooks (RocketMQ's ``MessageQueueListener`` and the push consumer's offset rule), called on
        the polling thread: ``on_assign(queues)`` after a rebalance gives this member ``queues``
        (positions set); ``on_revoke(queues)`` before the commit of queues a rebalance takes away;
        ``commit_position(mq)`` the offset ``commit`` stores for ``mq`` (None: nothing now), instead
        of the next offset to read. The methods of those names call them (a subclass may override
        the methods instead). ``idle``: how ``poll`` waits for new messages — an
        :class:`~hostmq.waiting.IdleStrategy` or its string ("spin", "backoff:50", "sleep", "auto";
        default ``$HOSTMQ_IDLE`` or auto, budget 50 µs); a bare ``spin_s`` is a busy spin that long."""
        for name, fn in (("on_assign", on_assign), ("on_revoke", on_revoke), ("commit_position", commit_position)):
            if fn is not None and not callable(fn):
                raise ValidationError(f"{name} must be callable, got {fn!r}")
        self._on_assign, self._on_revoke, self._commit_position = on_assign, on_revoke, commit_position
        R.validate_consumer_group(group)
        if not isinstance(consume_from, ConsumeFrom):
            raise ValidationError(f"consume_from must be a hostmq.ConsumeFrom, got {consume_from!r}")
        if max_poll_records < 1:
            raise ValidationError("max_poll_records must be ≥ 1")
        self.group = group
        self.auto_commit = auto_commit
        self.consume_from = consume_from
        self.consume_timestamp_ms = consume_timestamp_ms
        self.auto_commit_interval_s = auto_commit_interval_s
        self.max_poll_records = max_poll_records
        self.idle = client_idle(idle, spin_s, 50e-6, "PullConsumer idle")
        self.spin_s = self.idle.spin_s
        self.instance = ClientInstance(root, timeout_s=timeout_s)
        self.root = self.instance.root
        self.views: dict[str, BrokerView] = {}
        self.slave_reads = SlaveReads(self.root, group)    # lagging queues read from a slave (slave_read_enable)
        self.positions: dict[MessageQueue, int] = {}
        self.expression = "*"
        self._committed: dict[MessageQueue, int] = {}
        self.paused: set[MessageQueue] = set()
        self._reset_seen: dict[str, int] = {}           # broker → offsets_reset_version applied
        self.reset_queues: set[MessageQueue] = set()    # queues moved by a reset (a push consumer resyncs)
        self.assignment_version = 0     # bumped whenever queues join or leave ``positions``
        self._by_broker: dict[str, tuple[MessageQueue, ...]] = {}
        self._by_broker_at = -1         # the assignment_version _by_broker was grouped at
        self.offsets = offset_store if offset_store is not None else BrokerOffsets(self.instance, group)
        self.member: GroupMember | None = None          # set by subscribe (group-managed queues)
        self.subscriptions: dict[str, str | SQL] = {}
        self._allocate, self._rebalance_s, self._heartbeat_s = allocate, rebalance_interval_s, heartbeat_interval_s
        self._seen: dict[MessageQueue, tuple] = {}     # mq → (view, readable mark, max offset, quiet key) at refresh
        self._rr = 0
        self._order: list[MessageQueue] = []
        self._order_at = -1             # the assignment_version _order was listed at (_rotation)
        self._next_commit = time.monotonic() + auto_commit_interval_s
        self._next_stale_check = 0.0
        self.skipped_records = 0        # records this consumer's polls passed over (undecodable)
        self.wait_stats = WaitStats()   # how its polls waited (spins, futex sleeps, slice timeouts)
        self._following: list[bool] = []
        self.closed = False
        # what the last fetch returned and, per queue, the slice of it that queue gave (a push
        # consumer's pull thread hands each queue's messages on without grouping them again)
        self.last_fetch: tuple[list, list[tuple[MessageQueue, int, int]]] = ([], [])
        self._woken: tuple | None = None    # what a wake-up reads first (_woken_round)

    # -- assignment -----------------------------------------------------------------------------------
    def assign(self, queues: Iterable[MessageQueue], expression: str = "*") -> None:
        """Read exactly these queues (replacing any earlier assignment); ``expression`` is a tag filter
        (``*`` or ``A || B``): other messages are skipped, their offsets still advance."""
        if self.member is not None:
            raise ValidationError("this consumer subscribed to topics; assign and subscribe cannot be mixed")
        parse_tag_expression(expression)
        queues = list(queues)
        for mq in queues:
            if not isinstance(mq, MessageQueue):
                raise ValidationError(f"assign takes MessageQueue objects, got {mq!r}")
        self._check_open()
        positions = {}
        for mq in sorted(set(queues)):
            positions[mq] = self.positions[mq] if mq in self.positions else self._initial_offset(mq)
        self.positions = positions
        self.assignment_version += 1
        self.expression = expression

    def subscribe(self, topic: str, expression: str | SQL = "*") -> None:
        """Read ``topic`` as a member of the group: the group's consumers share its queues (rebalanced
        when members come and go, and every ``rebalance_interval_s``). ``expression`` is a tag
        expression or a ``hostmq.SQL`` filter; filtered-out messages still advance the offset."""
        self._check_open()
        if self.positions and self.member is None:
            raise ValidationError("this consumer has assigned queues; assign and subscribe cannot be mixed")
        R.validate_topic(topic)
        if isinstance(expression, str):
            parse_tag_expression(expression)
        elif not isinstance(expression, SQL):
            raise ValidationError(f"expression must be a tag expression or hostmq.SQL, got {expression!r}")
        if self.member is None:
            self.member = GroupMember(self.instance, self.group, self._allocate,
                                      heartbeat_interval_s=self._heartbeat_s, rebalance_interval_s=self._rebalance_s)
        self.subscriptions[topic] = expression
        self.member.add_topic(topic)
        self.member.heartbeat(force=True)
        self._rebalance()

    def _maybe_rebalance(self) -> None:
        m = self.member
        if m is None:
            return
        m.heartbeat()
        versions = {name: v.consumers_version() for name, v in self.views.items() if v.live}
        if m.rebalance_due(versions):
            self._rebalance()

    def _rebalance(self) -> None:
        """Take this member's share: commit and drop queues it lost, start the ones it gained at the
        group's committed offset (handover without loss: the old owner commits before it lets go)."""
        m = self.member
        for topic in m.topics:                       # views of every broker, to watch their versions
            try:
                for b in {q.broker for q in self.instance.subscribe_queues(topic)}:
                    self._view(b)
            except HostMQError:
                pass
        versions = {name: v.consumers_version() for name, v in self.views.items() if v.live}
        shares = m.allocation(versions)
        if shares is None:
            return
        mine = {q for qs in shares.values() for q in qs}
        lost = [q for q in self.positions if q not in mine]
        gained = sorted(mine - set(self.positions))
        if lost:
            self.on_revoke(lost)
            try:
                self.commit_queues(lost)
            except HostMQError as e:        # its broker is down: the next owner cannot read it either
                log.warning("committing released queues of %s failed: %s", self.group, e)
            for q in lost:
                del self.positions[q]
                self._seen.pop(q, None)
        for q in gained:
            self.positions[q] = self._initial_offset(q)
        if lost or gained:
            self.assignment_version += 1
        if gained:
            self.on_assign(gained)
        if lost or gained:
            log.info("%s %s: rebalanced: %d queues (-%d +%d)", self.group, m.client_id, len(self.positions),
                     len(lost), len(gained))

    def assignment(self) -> list[MessageQueue]:
        return list(self.positions)

    def _view(self, broker: str) -> BrokerView:
        v = self.views.get(broker)
        if v is None:
            v = self.views[broker] = BrokerView(self.root, broker, tail=True, slaves=True)
            self._reset_seen[broker] = v.offsets_reset_version()     # resets before we came are in the offsets
        return v

    def _initial_offset(self, mq: MessageQueue) -> int:
        committed = self.committed(mq)
        if committed is not None:
            return committed
        r = self._view(mq.broker).reader
        mx = r.refresh_queue(mq.topic, mq.queue_id)
        if self.consume_from == ConsumeFrom.LAST_OFFSET:
            return mx
        if self.consume_from == ConsumeFrom.FIRST_OFFSET:
            return r.min_offset(mq.topic, mq.queue_id)
        ts = self.consume_timestamp_ms
        if ts is None:
            ts = int(time.time() * 1000) - DEFAULT_TIMESTAMP_LOOKBACK_MS
        return r.offset_for_timestamp(mq.topic, mq.queue_id, ts)

    # -- polling --------------------------------------------------------------------------------------
    def poll(self, timeout: float = 1.0) -> list[MessageExt]:
        """Up to ``max_poll_records`` messages from the assigned queues, waiting up to ``timeout``
        seconds for some to arrive; [] if none did."""
        deadline = time.monotonic() + max(0.0, timeout)
        # Auto-commit what earlier polls returned — the application has had them since, and calls
        # poll again — never what this poll is about to return (RocketMQ's and Kafka's rule): a
        # consumer killed before handling a batch gets it again (at least once).
        self._maybe_autocommit()
        woke = False
        while True:
            if woke:            # woken for news: read it first; the bookkeeping comes before the next sleep
                f = self._woken
                msgs = self._fetch(self.max_poll_records) if f is None else self._fetch_woken(f)
                if msgs:
                    return msgs
            self._maybe_rebalance()
            self._maybe_reload_offsets()
            seqs = self._seqs()
            msgs = self._fetch(self.max_poll_records)
            if msgs or time.monotonic() >= deadline:
                return msgs
            self._woken = self._woken_round()
            woke = self._wait(seqs, deadline)

    def poll_batch(self, timeout: float = 1.0, max_count: int = 4096) -> MessageBatch:
        """The next messages of one assigned queue as a zero-copy MessageBatch (bodies valid until the
        next poll); an empty batch if nothing arrived within ``timeout``."""
        if max_count < 1:
            raise ValidationError("max_count must be ≥ 1")
        deadline = time.monotonic() + max(0.0, timeout)
        self._maybe_autocommit()            # what earlier polls returned, as in poll()
        while True:
            self._maybe_rebalance()
            self._maybe_reload_offsets()
            seqs = self._seqs()
            b = self._fetch_batch(max_count)
            if b is not None:
                return b
            if time.monotonic() >= deadline:
                return MessageBatch(None, _EMPTY, [], None, _EMPTY, _EMPTY, GetStatus.NO_MESSAGE_IN_QUEUE, 0)
            if self._wait(seqs, deadline):         # woken for news: read it first (as poll does)
                b = self._fetch_batch(max_count)
                if b is not None:
                    return b

    def pause(self, queues: Iterable[MessageQueue]) -> None:
        """Stop fetching from these queues (flow control) until ``resume``; positions are kept."""
        self.paused |= set(queues)

    def resume(self, queues: Iterable[MessageQueue]) -> None:
        self.paused -= set(queues)

    def _rotation(self) -> list[MessageQueue]:
        """The assigned queues not paused, from the next one round-robin (not to be changed: the
        list of all of them is kept per assignment)."""
        if self.paused:
            qs = [q for q in self.positions if q not in self.paused]
        else:
            if self._order_at != self.assignment_version:
                self._order, self._order_at = list(self.positions), self.assignment_version
            qs = self._order
        if len(qs) < 2:
            return qs
        self._rr = (self._rr + 1) % len(qs)
        return qs[self._rr:] + qs[:self._rr]

    def _fetch(self, limit: int) -> list[MessageExt]:
        if self.closed:                                     # _check_open, _refresh_stale
            raise ValidationError("the consumer is closed")
        if time.monotonic() >= self._next_stale_check:
            self.refresh_brokers()
        out: list[MessageExt] = []
        groups: list[tuple[MessageQueue, int, int]] = []
        ends: dict[str, tuple] = {}         # broker → what its tailing view showed at this round's start
        for mq in self._rotation():
            expr = self.subscriptions.get(mq.topic, self.expression) if self.subscriptions else self.expression
            sql = expr if expr.__class__ is not str and isinstance(expr, SQL) else None
            msgs = self._took(mq, self._read_news(mq, limit - len(out), "*" if sql else expr, ends))
            if msgs is None:
                continue
            if self.slave_reads.on_slave and mq in self.slave_reads.on_slave:
                self.slave_reads.messages += len(msgs)
            # properties of every returned message decoded when it was read (MessageExt.check)
            n0 = len(out)
            out.extend(msgs if sql is None else [m for m in msgs if sql.matches(m.properties)])
            if len(out) > n0:
                groups.append((mq, n0, len(out)))
            if len(out) >= limit:
                break
        self.last_fetch = (out, groups)
        return out

    def _took(self, mq: MessageQueue, got: tuple | None) -> list[MessageExt] | None:
        """A queue's answer (``_read_news``'s) applied: its position moved, skipped records counted; its
        messages, or None for no answer."""
        if got is None:
            return None
        msgs, nxt, skipped = got
        if nxt is not None:
            self.positions[mq] = nxt
        if skipped:
            self.skipped_records += skipped
        return msgs

    def _woken_round(self) -> tuple | None:
        """What a wake-up reads first (``_fetch_woken``), prepared before the sleep: for a consumer of
        at most ``WOKEN_QUEUES`` queues of one broker, none paused, with no filter, of a tailing view of
        a master (no SYNC_FLUSH, not read from a slave) whose round the native read side takes — a
        push consumer's topic queues and its retry queue, say — one ``_read.woken_poll`` round tuple
        per queue, in rotation: ``((queue, round), ...)``; else None, and the wake-up runs the general
        round (``_fetch``). A consumer of several queues needs their wake words (the view does not
        follow the dispatcher): the round of a queue whose word has not moved since this sleep began
        reads nothing, and the queue whose word moved is read."""
        n = len(self.positions)
        if not n or n > WOKEN_QUEUES or self.paused or self.slave_reads.on_slave or len(self.views) != 1:
            return None
        view = next(iter(self.views.values()))
        if not view.tailing or view.slave_read_lag_bytes or view.state.sync_flush:
            return None
        poll = view.tail_poll          # set by the round that found nothing (_read_news)
        if poll[0] is not read_check.NATIVE or poll[2] is None or not hasattr(poll[0], "woken_poll"):
            return None
        st = view.state
        wake = None
        if n > 1:
            if view.follows_dispatcher():   # news without a word moving: the general round reads them all
                return None
            wake = st.queue_wake
        subs, expr, broker = self.subscriptions, self.expression, view.broker
        rounds = []
        order = list(self.positions)
        k = self._rr % n                # the general round's rotation as it stands (not advanced: its turn)
        for mq in order[k:] + order[:k]:
            e = subs.get(mq.topic, expr) if subs else expr
            if e.__class__ is not str or e != "*" or mq.broker != broker:
                return None
            if wake is None:
                b = armed = -1
            else:
                b = view.word_index(mq)
                armed = int(wake[b])
            rounds.append((mq, (view, poll[1], st, st.w, mq.topic, mq.queue_id, W_WRITE_POS, W_COMMITTED_POS,
                                W_CONFIRMED_POS, W_DISPATCHED_POS, wake, b, armed)))
        return tuple(rounds) if len(rounds) == n else None

    def _fetch_woken(self, rounds: tuple) -> list[MessageExt]:
        """``_fetch`` as a wake-up's first read: the messages of the first queue of ``rounds``
        (``_woken_round``) with news, each queue's wake word, consumer_ends and tail_poll in one native
        call (``_read.woken_poll``; its spec: ``BrokerView.quiet_words``, ``BrokerState.consumer_ends``
        and ``_read_news``). The other queues are read by the next poll's general round, before it
        sleeps again. The general round where the stale check is due or the call does not take the
        case."""
        if self.closed or time.monotonic() >= self._next_stale_check:
            return self._fetch(self.max_poll_records)
        woken_poll = read_check.NATIVE.woken_poll
        for mq, args in rounds:
            view = args[0]
            pos = self.positions[mq]
            out: list[MessageExt] = []
            try:
                t = woken_poll(args, pos, self._seen.get(mq), self.max_poll_records, out)
            except BaseException:
                view.reader.tail.clear()    # whatever it had applied: the tail starts over from the dispatcher
                raise
            if t is None:       # a replication bound, or a round tail_poll leaves to its spec: the general round
                return self._fetch(self.max_poll_records)
            if t is not False and t[2] is not None:     # the usual answer (_tail_answer and _took, inline)
                self._seen[mq] = t[0]
                self.positions[mq] = t[2]
                if out:
                    self.last_fetch = (out, [(mq, 0, len(out))])
                    return out
                continue
            msgs = self._took(mq, self._tail_answer(view, mq, pos, self.max_poll_records, "*", t, out))
            if msgs:
                self.last_fetch = (msgs, [(mq, 0, len(msgs))])
                return msgs
        self.last_fetch = ([], [])
        return []

    def _fetch_batch(self, max_count: int) -> MessageBatch | None:
        self._check_open()
        self._refresh_stale()
        for mq in self._rotation():
            r = self._reader_with_news(mq)
            if r is None:
                continue
            b = r.get_batch(mq.topic, mq.queue_id, self.positions[mq], max_count)
            if b.status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW_BADLY, GetStatus.MESSAGE_WAS_REMOVING,
                            GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE):
                self.positions[mq] = b.next_offset
            self.skipped_records += b.skipped
            if mq in self.slave_reads.on_slave:
                self.slave_reads.messages += len(b)
            if len(b):
                return b
        return None

    def _read_news(self, mq: MessageQueue, max_count: int, expr: str, ends: dict) -> tuple | None:
        """``_reader_with_news`` and its ``get``: None when ``mq`` certainly has nothing at our
        position, else (messages, the next position or None where it stays, records skipped). A
        tailing view of a master read with no filter does the queue's round — the skip, the refresh
        and the read, ``StoreReader.read_tail``, and the queue's seen entry — in one native call where
        it can (``_read.tail_poll``), else by its spec, :func:`tail_round`. ``ends``: what each
        broker's view showed at the start of this fetch round, shared by its queues (filled here)."""
        view = self._view(mq.broker)
        if not view.tailing or expr != "*" or view.slave_read_lag_bytes:
            r = self._reader_with_news(mq)
            return None if r is None else _got(r.get(mq.topic, mq.queue_id, self.positions[mq], max_count, expr))
        e = ends.get(mq.broker)
        if e is None:
            # The queues' wake words first, then the store (BrokerView.quiet_words): a queue's word
            # unchanged next time, with the readable position, means nothing of it came since,
            # whatever other queues stored — so a consumer of many queues reads only those with
            # news, not every queue per round (one queue gains nothing: news of any queue is news
            # of it). Once per round and broker; records stored during the round wait for the next.
            words = view.quiet_words() if len(self.positions) > 1 else None
            mark, readable = view.state.consumer_ends()   # a tailing view's readable_mark() and the limit
            poll = view.tail_poll
            if poll[0] is not read_check.NATIVE:
                ctx = view.reader.poll_context()
                poll = view.tail_poll = (read_check.NATIVE, ctx, read_check.NATIVE.tail_poll if ctx else None)
            e = ends[mq.broker] = (words, mark, readable, poll[1], poll[2])
        words, mark, readable, ctx, tail_poll = e
        word = words[view.word_index(mq)] if words is not None else None
        pos = self.positions[mq]
        seen = self._seen.get(mq)
        out: list[MessageExt] = []
        t = None
        if tail_poll is not None:
            try:
                t = tail_poll(ctx, view, seen, pos, max_count, mark, readable, word, mq.topic, mq.queue_id, out)
            except BaseException:
                view.reader.tail.clear()    # whatever it had applied: the tail starts over from the dispatcher
                raise
        if t is None:
            t = tail_round(view.reader, view, seen, pos, max_count, mark, readable, word, mq.topic, mq.queue_id, out)
        return self._tail_answer(view, mq, pos, max_count, expr, t, out)

    def _tail_answer(self, view: BrokerView, mq: MessageQueue, pos: int, max_count: int, expr: str, t,
                     out: list) -> tuple | None:
        """``_read_news``'s answer from a tail round's (``tail_round``, ``_read.tail_poll``): the queue's
        new seen entry kept, the messages read into ``out``, or the reader's ``get`` where the tail
        stopped short of a result."""
        if t is False:
            return None
        self._seen[mq] = t[0]
        if t[2] is not None:
            return out, t[2], 0
        # At the queue's readable end nothing is there (``get`` would answer OFFSET_OVERFLOW_ONE or
        # NO_MESSAGE_IN_QUEUE and move nothing): the common answer for a queue with no news while
        # another assigned queue (a push consumer's retry queue) moved the mark.
        return None if pos == t[1] else _got(view.reader.get(mq.topic, mq.queue_id, pos, max_count, expr))

    def _reader_with_news(self, mq: MessageQueue):
        """The store reader of ``mq``'s broker, brought up to date — or None when ``mq`` certainly has
        nothing at our position: the broker's readable position has not moved since the queue was
        last refreshed and we have read up to what it held then (a poll then costs one word read
        per queue instead of a refresh)."""
        view = self._view(mq.broker)
        mark = view.readable_mark()
        seen = self._seen.get(mq)
        if mark is not None and seen is not None and seen[0] is view and seen[1] == mark \
                and self.positions[mq] >= seen[2]:
            return None
        r = view.reader
        m = r.refresh_queue(mq.topic, mq.queue_id, mark if view.tailing else None)
        # A tail still scanning (or at its bound, or stopped) may show more at the next refresh
        # without the stored position moving: no short cut until it has caught up.
        self._seen[mq] = (view, mark if r.tail_caught_up() else None, m, None)
        if view.slave_read_lag_bytes and self.positions[mq] < m:
            return self.slave_reads.reader(view, r, mq, self.positions[mq])
        return r

    def _seqs(self) -> list[tuple]:
        """What to sleep on until there may be news, read once per poll round before fetching: each
        broker's wake words (``BrokerView.wake_words``) with their current values. Also lets go of the
        store files every consumer group has read (``broker.consumed``: one word read per broker)."""
        if self._by_broker_at != self.assignment_version:      # queues per broker, as tuples (wake_words)
            grouped: dict[str, list[MessageQueue]] = {}
            for mq in self.positions:
                grouped.setdefault(mq.broker, []).append(mq)
            self._by_broker = {b: tuple(qs) for b, qs in grouped.items()}
            self._by_broker_at = self.assignment_version
        by_broker = self._by_broker
        lists = []
        self.slave_reads.drop_consumed()
        for name, v in self.views.items():
            v.reader.drop_consumed()
            lists.append(v.wake_words(by_broker.get(name, ())))
        if sum(map(len, lists)) > MAX_WAITV:     # one futex_waitv takes at most 128 words: the
            lists = [v.wake_words((), dispatch_only=True) for v in self.views.values()]   # dispatchers'
        self._following = [v.follows_dispatcher() for v in self.views.values()]
        return [(w, w.arm()) for ws in lists for w in ws]

    def _wait(self, seqs: list[tuple], deadline: float) -> bool:
        """Sleep until a word of ``seqs`` moves (True: news may have come) or the stale check / the
        deadline is due (False)."""
        end = min(deadline, time.monotonic() + STALE_CHECK_S)
        if any(v.tail_scanning() for v in self.views.values()):
            end = min(end, time.monotonic() + TAIL_SCAN_WAIT_S)    # more stored records to scan now
        if not seqs:            # no broker running: nothing can wake us before the stale check
            time.sleep(max(0.0, end - time.monotonic()))
            return False
        if [v.follows_dispatcher() for v in self.views.values()] != self._following:
            return False        # the fetch filled a tail to its bound: sleep on the dispatcher's word too
        return wait_changed(seqs, end, idle=self.idle, stats=self.wait_stats)

    def _refresh_stale(self) -> None:
        if time.monotonic() >= self._next_stale_check:
            self.refresh_brokers()

    def refresh_brokers(self) -> None:
        """Look now, rather than at the next poll's half-second check, for brokers that restarted,
        stopped, or whose slave takes over (a master down) or gives back (the master runs again):
        their store views are rebuilt."""
        self._next_stale_check = time.monotonic() + STALE_CHECK_S
        self.slave_reads.drop_stale()
        for name, v in list(self.views.items()):
            if v.stale():
                del self.views[name]
                nv = self._view(name)
                nv.reader.carry_shown(v.reader)     # positions read through the old run stay reachable
                v.close()
                log.info("broker %s started or stopped; reading %s now%s", name, nv.instance,
                         "" if nv.live else " (stopped: what its recovery keeps)")

    # -- offsets --------------------------------------------------------------------------------------
    def seek(self, mq: MessageQueue, offset: int) -> None:
        """Continue ``mq`` from ``offset`` (the next poll reads it first)."""
        if mq not in self.positions:
            raise ValidationError(f"{mq} is not assigned to this consumer")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ValidationError(f"offset must be an int ≥ 0, got {offset!r}")
        self.positions[mq] = offset

    def seek_to_timestamp(self, timestamp_ms: int) -> None:
        """Every assigned queue continues from its first message stored at or after ``timestamp_ms``."""
        for mq in self.positions:
            r = self._view(mq.broker).reader
            r.refresh_queue(mq.topic, mq.queue_id)
            self.positions[mq] = r.offset_for_timestamp(mq.topic, mq.queue_id, int(timestamp_ms))

    def position(self, mq: MessageQueue) -> int:
        """The next offset ``poll`` reads from ``mq``."""
        return self.positions[mq]

    def commit(self) -> None:
        """Store every changed position as the group's offset on its broker."""
        self.commit_queues(list(self.positions))

    def commit_queues(self, queues) -> None:
        for mq in queues:
            off = self.commit_position(mq)
            if off is None or self._committed.get(mq) == off:
                continue
            if self.offsets.store(mq, off, self._reset_seen.get(mq.broker)):
                self._committed[mq] = off
            else:                           # reset on the broker since we looked: take the new offsets
                self._reset_seen.pop(mq.broker, None)
        self.offsets.flush()

    def _maybe_reload_offsets(self) -> None:
        """Backtracking: when a broker says a group's offsets were reset, continue every queue of
        that broker from its committed offset (RocketMQ resetOffset, without a restart)."""
        for name, view in self.views.items():
            v = view.offsets_reset_version()
            if self._reset_seen.get(name) == v:
                continue
            for mq in [q for q in self.positions if q.broker == name]:
                committed = self.offsets.query(mq)
                if committed is not None and committed != self._committed.get(mq):
                    log.info("%s: %s reset to offset %d", self.group, mq, committed)
                    self.positions[mq] = committed
                    self._committed[mq] = committed
                    self._seen.pop(mq, None)
                    self.reset_queues.add(mq)
            self._reset_seen[name] = v

    def on_revoke(self, queues: list[MessageQueue]) -> None:
        """Called when a rebalance takes ``queues`` away, before their offsets are committed (a push
        consumer lets the batches being consumed finish, so the commit covers them): the
        ``on_revoke`` callback, if one was given."""
        if self._on_revoke is not None:
            self._on_revoke(queues)

    def on_assign(self, queues: list[MessageQueue]) -> None:
        """Called when a rebalance gives this member ``queues`` (their positions set): the
        ``on_assign`` callback, if one was given."""
        if self._on_assign is not None:
            self._on_assign(queues)

    def reload_position(self, mq: MessageQueue) -> int:
        """Continue ``mq`` from the group's committed offset as it is now (or the ``consume_from``
        start if there is none): an orderly member that has just locked a queue reads from where its
        previous owner committed before it unlocked, not from what it saw at rebalance time."""
        if mq not in self.positions:
            raise ValidationError(f"{mq} is not assigned to this consumer")
        off = self.positions[mq] = self._initial_offset(mq)
        self._seen.pop(mq, None)
        return off

    def commit_position(self, mq: MessageQueue) -> int | None:
        """The offset ``commit`` stores for ``mq``: the next one to read (a push consumer stores the
        first one its listener has not finished; None: nothing to store for it now) — the
        ``commit_position`` callback's answer, if one was given."""
        if self._commit_position is not None:
            return self._commit_position(mq)
        return self.positions[mq]

    def committed(self, mq: MessageQueue) -> int | None:
        """The group's committed offset of ``mq``, or None if it has none."""
        off = self.offsets.query(mq)
        if off is not None:
            self._committed[mq] = off
        return off

    def _maybe_autocommit(self) -> None:
        if self.auto_commit and time.monotonic() >= self._next_commit:
            self._next_commit = time.monotonic() + self.auto_commit_interval_s
            try:
                self.commit()
            except HostMQError as e:
                log.warning("auto-commit of %s failed: %s", self.group, e)

    # -- life -----------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise ValidationError("the consumer is closed")

    def close(self) -> None:
        if self.closed:
            return
        if self.auto_commit:
            try:
                self.commit()
            except HostMQError as e:
                log.warning("final commit of %s failed: %s", self.group, e)
        self.closed = True
        if self.member is not None:
            self.member.leave()
        for v in self.views.values():
            v.close()
        self.views.clear()
        self.slave_reads.close()
        self.instance.close()

    def __enter__(self) -> "PullConsumer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
