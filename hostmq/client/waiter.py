"""A consumer's wake-up word: waiting for new messages without busy-spinning (DESIGN §2).

The consumer creates (and owns) a tiny segment ``/hostmq.<hash12 of root>.wait.<pid>-<n>``
(``records.WAITER``) plus a semaphore of the same name and registers them with every broker it
reads from (OPEN_WAITER). Each broker's dispatcher, after publishing ``dispatched_pos``, posts the
semaphore if the ``waiting`` word is set — so one blocked consumer is woken by whichever broker gets
a message first. The predicate checked around the block is the brokers' ``dispatch_seq`` words.
"""
from __future__ import annotations

import itertools
import logging
import os

from .. import records as R
from ..errors import HostMQError
from ..protocol.codes import RequestCode
from ..root import shm_name
from ..shm.segment import Segment
from ..shm.signal import Flag, Signal, wait_for

log = logging.getLogger(__name__)

_waiter_ids = itertools.count(1)


class ArrivalWaiter:
    def __init__(self, root: str) -> None:
        self.name = shm_name(root, "", "wait", f"{os.getpid()}-{next(_waiter_ids)}")
        self.segment = Segment.create(self.name, R.WAITER.itemsize, R.WAITER_KIND, R.WAITER_VERSION)
        try:
            self.signal = Signal.create(self.name)
        except BaseException:
            self.segment.close()
            self.segment.unlink()
            raise
        self._words = self.segment.buf[:R.WAITER.itemsize].cast("q")
        self.flag = Flag(self._words, 0)
        self.registrations: dict[str, tuple[str, int, int]] = {}    # broker → (address, slot, generation)

    def register(self, instance, broker: str, address: str) -> None:
        """Register with a broker (again after it restarted); errors are left to the caller."""
        f = instance.broker_request(address, RequestCode.OPEN_WAITER, {"name": self.name, "pid": os.getpid()}).fields
        self.registrations[broker] = (address, f["slot"], f["generation"])

    def unregister(self, instance, broker: str) -> None:
        reg = self.registrations.pop(broker, None)
        if reg is None:
            return
        address, slot, gen = reg
        try:
            instance.broker_request(address, RequestCode.CLOSE_WAITER, {"slot": slot, "generation": gen},
                                    timeout_s=1.0)
        except HostMQError as e:
            log.debug("closing waiter with %s: %s", broker, e)

    def wait(self, predicate, deadline_s: float, spin_s: float, stop=None) -> bool:
        return wait_for(predicate, self.signal, deadline_s, flag=self.flag, spin_s=spin_s, stop=stop)

    def close(self, instance=None) -> None:
        if instance is not None:
            for broker in list(self.registrations):
                self.unregister(instance, broker)
        self.flag = None
        self._words.release()
        self.segment.close()
        self.segment.unlink()
        self.signal.close()
        self.signal.unlink()
