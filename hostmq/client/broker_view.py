"""A client's read-only view of one broker's store (consumers read message bytes here, never over
a socket).

The view maps the broker's commitlog and the consume queues it needs read-only
(``store.readonly.StoreReader``) and reads no further than the broker says is safe: its state
segment's ``readable_pos`` (dispatched, and flushed under SYNC_FLUSH; on a SYNC_MASTER also confirmed by its
replication process — ``BrokerState.consumer_readable_pos``). With the broker down, the
store is still readable up to what crash recovery would keep. A broker restart (a new state
segment) is noticed by :meth:`stale`; the owner then builds a new view.

A consumer's view of a broker name whose master is down reads a running slave of that name on this
root instead (``ROOT/brokers/NAME.ID``: RocketMQ's consumers pull from a slave while the master is
gone), and is stale again as soon as the master runs. The slave's commitlog is the master's byte for
byte and its dispatcher gives every record the master's queue offset, so positions carry over both
ways; a slave may hold less than the consumer read from the master, so its view never corrects a
position past a queue's end (RocketMQ: a slave does not check offsets, ``offsetCheckInSlave``).
A master with ``broker.slave_read_enable`` also sends consumers that lag far behind to a slave while
it runs (:func:`slave_view`, ``PullConsumer``).
"""
from __future__ import annotations

from .. import records as R
from ..live.group import recorded_master, running_master, running_slave
from ..live.state import W_DISPATCH_SEQ, BrokerState
from ..config import StoreConfig
from ..root import RootPaths
from ..store.readonly import StoreReader, infer_store_config


def broker_running(root: str, broker: str) -> bool:
    """Whether a master of broker name ``broker`` runs on this root."""
    found = running_master(root, broker)
    if found is None:
        return False
    found[1].close()
    return True


class BrokerView:
    def __init__(self, root: str, broker: str, store_config: StoreConfig | None = None, *,
                 by_id: bool = False, tail: bool = False, slaves: bool = False,
                 _slave: tuple[str, BrokerState] | None = None) -> None:
        """``by_id``: a view for reading messages by id (Admin), bounded by what is stored rather
        than by what consumers may read (dispatched), so a message is found as soon as it is acked.
        ``tail``: a consumer's view, which also reads the records stored past the dispatched position
        from the commitlog (``store/tail.py``): a message is readable one hop after the writer.
        ``slaves``: with the master not running, read a running slave of the name instead."""
        self.root = root
        self.broker = broker
        self.slaves = slaves
        self._wake_for: tuple | None = None     # wake_words: the queues tuple its word indices are of
        self._wake_idx: list[int] = []
        self.lag_reads = _slave is not None     # a slave read beside a running master (slave_view)
        # The process group read: the master (whichever instance plays it, live/group.py), or a
        # slave; with none running, the stopped master's store (None: read what recovery would keep).
        self.state: BrokerState | None = None
        found = _slave or running_master(root, broker)
        if found is None and slaves:
            found = running_slave(root, broker)
        if found is not None:
            self.instance, self.state = found
        else:
            self.instance = recorded_master(root, broker)
        if self.on_slave:
            tail = False            # a slave's records are readable once its dispatcher has them
        # A running master's bound for reads from its slaves (broker.slave_read_enable, fixed for its
        # run): a consumer whose next message lies further below stored_pos() reads it from a slave.
        # 0: never (off, or not a running master).
        self.slave_read_lag_bytes = self.state.slave_read_lag_bytes if self.live and not self.on_slave else 0
        cfg = store_config or StoreConfig()
        if self.state is not None:
            st = self.state
            cfg = StoreConfig(**{**cfg.__dict__, "commitlog_file_bytes": st.commitlog_file_bytes,
                                 "consume_queue_file_entries": st.consume_queue_file_entries,
                                 "index_slots": st.index_slots, "index_entries": st.index_entries})
        self.store_dir = RootPaths(root).store_dir(self.instance)
        if self.state is None:          # stopped: read with the file sizes it was written with
            cfg = infer_store_config(self.store_dir, cfg)
        self.config = cfg
        self.reader = StoreReader(self.store_dir, cfg, broker=broker, scan_queues=False,
                                  limit_phys=None if self.state is None else
                                  (self.state.stored_pos if by_id else self.state.consumer_readable_pos),
                                  consumed_below=None if self.state is None else self.state.consumed_below,
                                  tail_limit=self.state.consumer_stored_pos if tail and self.state is not None
                                  else None,
                                  alive=None if self.state is None else self.state.owner_alive,
                                  corrects=not self.on_slave)
        self.tailing = self.reader.tail is not None
        self._word_of: dict = {}            # MessageQueue → index of its queue wake word (word_index)
        # (the native read side it was taken with, reader.poll_context(), _read.tail_poll): a tailing
        # consumer's one-call round (PullConsumer._read_news), looked up once per native module
        self.tail_poll: tuple = (False, None, None)

    @property
    def live(self) -> bool:
        return self.state is not None

    @property
    def on_slave(self) -> bool:
        return self.state is not None and self.state.is_slave

    def stored_pos(self) -> int:
        return self.state.stored_pos() if self.state is not None else 0

    def dispatch_seq(self) -> int:
        return self.state.w[W_DISPATCH_SEQ] if self.state is not None else 0

    def consumers_version(self) -> int:
        """Bumped by the broker whenever a consumer group's members change."""
        return int(self.state.get("consumers_version")) if self.state is not None else 0

    def offsets_reset_version(self) -> int:
        """Bumped by the broker whenever a group's offsets are reset to a timestamp."""
        return int(self.state.get("offsets_reset_version")) if self.state is not None else 0

    def readable_mark(self) -> int | None:
        """The broker's readable position (stored, for a tailing view): while it is unchanged no queue
        of this broker has new messages (None for a view of a stopped broker, which is static)."""
        if self.state is None:
            return None
        return self.state.consumer_stored_pos() if self.tailing else self.state.consumer_readable_pos()

    def follows_dispatcher(self) -> bool:
        """Whether news may come from the dispatcher (or flusher) rather than the writer's queue wake
        words: not a tailing view, a broker whose writer does not wake queues (``queue_wakes``), or a
        tail at its bound or stopped at a record it cannot read."""
        st, tail = self.state, self.reader.tail
        return st is not None and (not self.tailing or not st.queue_wakes or tail.capped
                                   or tail.stopped_at is not None)

    def quiet_words(self) -> list[int] | None:
        """The queue wake words' current values where news of a queue can only come with a change of
        its word or of the readable (dispatched) position: a tailing view of a broker whose writer
        wakes queues, the tail neither at its bound nor stopped, no replication process bounding
        reads (``confirmed_pos`` moves on its own). The writer adds one to a queue's word after every
        batch for it is readable (after ``write_pos``), so a consumer that read the words, then the
        store, and finds a queue's word unchanged later has seen every record of it stored since.
        None where that does not hold."""
        st = self.state
        if st is None or self.follows_dispatcher() or st.confirms():
            return None
        return st.queue_wake.tolist()

    def word_index(self, mq) -> int:
        """Which queue wake word is ``mq``'s (``records.queue_wake_word``), cached."""
        b = self._word_of.get(mq)
        if b is None:
            if len(self._word_of) >= 65536:
                self._word_of.clear()
            b = self._word_of[mq] = R.queue_wake_word(mq.topic.encode(), mq.queue_id)
        return b

    def tail_scanning(self) -> bool:
        """The tail has stored records left to scan (a refresh scans a bounded number at a time)."""
        return self.reader.tail is not None and self.reader.tail.scanning()

    def wake_words(self, queues, dispatch_only: bool = False) -> list:
        """The futex words whose change may mean news for ``queues`` (MessageQueues of this broker):
        for a tailing view each queue's wake word, which the writer wakes as soon as a batch is
        readable; when the view follows the dispatcher (or ``dispatch_only``) also ``dispatch_seq``,
        and under SYNC_FLUSH ``flush_count``, which the flusher wakes."""
        st = self.state
        if st is None:
            return []
        words = []
        if dispatch_only or self.follows_dispatcher():
            words.append(st.dispatch_seq_word)
            if st.sync_flush:
                words.append(st.flush_count_word)
        if st.confirms():               # a SYNC_MASTER's consumers read what a slave acknowledged
            words.append(st.confirm_wake_word)
        if self.tailing and not dispatch_only:
            if queues is not self._wake_for:        # a consumer passes the same tuple while its queues stay
                idx = sorted({R.queue_wake_word(q.topic.encode(), q.queue_id) for q in queues})
                if not isinstance(queues, tuple):
                    return words + [st.queue_wake_words[b] for b in idx]
                self._wake_for, self._wake_idx = queues, idx
            words.extend(st.queue_wake_words[b] for b in self._wake_idx)
        return words

    def stale(self) -> bool:
        """True if the broker this view follows has gone; for a static view (nothing was running),
        once the master — or, for a view that may read slaves, one of its slaves — runs; for a
        slave's view, once the master runs again (a :func:`slave_view`: once that slave stops)."""
        if self.state is None:
            if broker_running(self.root, self.broker):
                return True
            found = running_slave(self.root, self.broker) if self.slaves else None
            if found is not None:
                found[1].close()
            return found is not None
        if self.on_slave and not self.lag_reads and broker_running(self.root, self.broker):
            return True
        return self.state.gone()

    def close(self) -> None:
        self.reader.close()
        if self.state is not None:
            self.state.close()


def slave_view(root: str, broker: str) -> BrokerView | None:
    """A view of a running slave of ``broker`` (the lowest id) while its master runs — for consumers
    the master sends there because they lag (``BrokerView.slave_read_lag_bytes``) — or None."""
    found = running_slave(root, broker)
    return None if found is None else BrokerView(root, broker, slaves=True, _slave=found)
