"""Reads a master sends to a slave because the consumer lags (``broker.slave_read_enable``).

RocketMQ's broker answers a pull whose messages lie more than ``accessMessageInMemoryMaxRatio`` (40 %)
of RAM behind its commitlog's end with ``suggestWhichBrokerId`` = a slave: those bytes are likely not
in the page cache any more, and reading them from the master's disk competes with its writes and
flushes. Once the consumer is back within the bound, the slave suggests the master again. hostmq's
consumers read store files themselves, so the consumer makes the same decision per read: the master
publishes the bound in its state (``BrokerView.slave_read_lag_bytes``), and a queue whose next
message lies further behind the master's stored position is read from a running slave of the name —
if the slave already holds that offset (a slave's dispatcher gives every record the master's queue
offset, so positions carry over both ways). Otherwise, and once the queue is back within the bound,
it reads the master.
"""
from __future__ import annotations

import logging
import time

from ..message import MessageQueue
from ..store.readonly import StoreReader
from .broker_view import BrokerView, slave_view

log = logging.getLogger(__name__)

LOOK_AGAIN_S = 0.5      # a broker with no running slave is looked at again after this long


def lags(view: BrokerView, reader: StoreReader, mq: MessageQueue, position: int) -> bool:
    """Whether the message at ``position`` (the queue refreshed in ``reader``, the master's) lies
    further behind the master's stored position than its bound."""
    bound = view.slave_read_lag_bytes
    if not bound:
        return False
    phys = reader.phys_at(mq.topic, mq.queue_id, position)
    return phys is not None and view.stored_pos() - phys > bound


class SlaveReads:
    """A consumer's views of slaves, one per broker name, made when a queue first lags."""

    def __init__(self, root: str, group: str) -> None:
        self.root, self.group = root, group
        self.views: dict[str, BrokerView] = {}
        self.on_slave: set[MessageQueue] = set()
        self.messages = 0               # messages read from slaves while their master ran
        self._look_after: dict[str, float] = {}

    def reader(self, view: BrokerView, reader: StoreReader, mq: MessageQueue, position: int) -> StoreReader:
        """The reader of ``mq``'s next messages: the master's ``reader`` (its queue just refreshed),
        or a slave's when the queue lags and the slave holds ``position``."""
        if lags(view, reader, mq, position):
            sv = self._view(mq.broker)
            if sv is not None and sv.reader.refresh_queue(mq.topic, mq.queue_id) > position:
                if mq not in self.on_slave:
                    self.on_slave.add(mq)
                    log.info("%s: %s lags more than %d bytes behind its master: reading it from %s",
                             self.group, mq, view.slave_read_lag_bytes, sv.instance)
                return sv.reader
        if mq in self.on_slave:
            self.on_slave.discard(mq)
            log.info("%s: %s reads its master again", self.group, mq)
        return reader

    def _view(self, broker: str) -> BrokerView | None:
        sv = self.views.get(broker)
        if sv is None and time.monotonic() >= self._look_after.get(broker, 0.0):
            sv = slave_view(self.root, broker)
            if sv is None:
                self._look_after[broker] = time.monotonic() + LOOK_AGAIN_S
            else:
                self.views[broker] = sv
        return sv

    def drop_stale(self) -> None:
        """Let go of views of slaves that stopped (the next lagging read looks for another)."""
        for name, sv in list(self.views.items()):
            if sv.stale():
                sv.close()
                del self.views[name]
                self.on_slave -= {mq for mq in self.on_slave if mq.broker == name}

    def drop_consumed(self) -> None:
        for sv in self.views.values():
            sv.reader.drop_consumed()

    def close(self) -> None:
        for sv in self.views.values():
            sv.close()
        self.views.clear()
        self.on_slave.clear()
