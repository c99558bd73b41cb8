"""The ``hostmq`` data source: batch and streaming reads (PySpark Python Data Source API, 4.2+).

Planning (``partitions``, ``initialOffset``, ``latestOffset``) runs on the driver and looks at the
store through :class:`scan.StoreScan`; ``read`` runs in executors on a pickled copy of the reader, so
everything it needs travels in the partition. One partition per (broker, queue), or per chunk of at
most ``maxRecordsPerPartition`` entries.

Streaming offsets are ``{topic: {broker: {queue id: next queue offset}}}`` (sorted keys: Spark
compares offsets by their JSON). Two Spark traps are handled here:

* a crash before batch 0 commits makes Spark call ``initialOffset`` again and replay batch 0 from
  the new answer — with ``latest`` (or retention moving ``earliest``) that silently skips messages.
  The first ``latestOffset`` of a new query therefore returns the initial offset itself: batch 0 is
  empty, and its end — the pinned initial offset — is in Spark's offsets log before any data is
  read. A replayed batch 0 whose recomputed start lies past its logged end reads nothing.
* ``trigger(availableNow=True)``: ``prepareForTriggerAvailableNow`` records the target; no batch
  goes past it.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from ..errors import DataLossError, HostMQError
from . import options as O
from .options import EARLIEST, LATEST, QueueKey, ReadOptions
from .scan import SCHEMA_DDL, StoreScan, lost_range_message, read_range

log = logging.getLogger(__name__)


@dataclass
class QueueRange(InputPartition):
    """One task: queue offsets [start, end) of one queue."""

    topic: str
    broker: str
    queue_id: int
    start: int
    end: int

    @property
    def key(self) -> QueueKey:
        return (self.topic, self.broker, self.queue_id)


def split_ranges(ranges: dict[QueueKey, tuple[int, int]], max_records: int) -> list[QueueRange]:
    """Partitions of at most ``max_records`` entries over the non-empty ranges, in queue order."""
    out = []
    for (topic, broker, qid), (start, end) in sorted(ranges.items()):
        for s in range(start, end, max_records):
            out.append(QueueRange(topic, broker, qid, s, min(end, s + max_records)))
    return out


def prorate(starts: dict[QueueKey, int], ends: dict[QueueKey, int], limit: int) -> dict[QueueKey, int]:
    """Ends that admit at most ``limit`` messages in all, spread over the queues in proportion to
    their backlog (Kafka's ``maxOffsetsPerTrigger``), but never more than ``limit``: each queue gets
    the floor of its share, and what is left goes one each to the largest remainders."""
    backlog = {k: max(0, ends[k] - starts.get(k, ends[k])) for k in ends}
    total = sum(backlog.values())
    if total <= limit:
        return dict(ends)
    shares = {k: limit * n / total for k, n in backlog.items()}
    take = {k: math.floor(s) for k, s in shares.items()}
    left = limit - sum(take.values())
    for k in sorted(shares, key=lambda k: (take[k] - shares[k], k))[:left]:
        take[k] += 1
    return {k: starts.get(k, ends[k]) + take[k] for k in ends}


class HostMQDataSource(DataSource):
    """``spark.read.format("hostmq")`` / ``readStream`` / ``write`` / ``writeStream``."""

    @classmethod
    def name(cls) -> str:
        return "hostmq"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema) -> "BatchReader":
        return BatchReader(O.read_options(self.options, streaming=False))

    def streamReader(self, schema) -> "StreamReader":
        return StreamReader(O.read_options(self.options, streaming=True))

    def writer(self, schema, overwrite: bool):
        from .writer import BatchWriter, check_write_schema
        if overwrite:
            raise O.OptionError("hostmq topics are append-only: use .mode('append') (messages cannot be overwritten)")
        opts = O.write_options(self.options)
        return BatchWriter(opts, check_write_schema(schema, opts))

    def streamWriter(self, schema, overwrite: bool):
        from .writer import StreamWriter, check_write_schema
        opts = O.write_options(self.options)
        return StreamWriter(opts, check_write_schema(schema, opts))


def _start_offsets(scan: StoreScan, opts: ReadOptions, keys, bounds) -> dict[QueueKey, int]:
    """Where a new read starts in each queue: ``startingTimestamp`` first, else ``startingOffsets``."""
    out = {}
    for key in keys:
        lo, hi = bounds[key]
        if opts.starting_timestamp_ms is not None:
            out[key] = max(lo, scan.offset_for_timestamp(key, opts.starting_timestamp_ms))
            continue
        off = opts.starting.for_queue(key)
        out[key] = lo if off == EARLIEST else hi if off == LATEST else off
    return out


def _check_loss(key: QueueKey, start: int, lo: int, fail: bool) -> int:
    """The start to read from, given that offsets below ``lo`` are gone."""
    if start >= lo:
        return start
    if fail:
        raise DataLossError(lost_range_message(key, start, lo))
    log.warning("skipping: %s", lost_range_message(key, start, lo))
    return lo


class BatchReader(DataSourceReader):
    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[QueueRange]:
        opts = self.opts
        scan = StoreScan(opts.root)
        try:
            keys = scan.queues(opts.topics)
            bounds = {k: scan.bounds(k) for k in keys}
            starts = _start_offsets(scan, opts, keys, bounds)
            ranges = {}
            for key in keys:
                lo, hi = bounds[key]
                end = opts.ending.for_queue(key)
                end = hi if end == LATEST else min(end, hi)
                start = _check_loss(key, starts[key], lo, opts.fail_on_data_loss)
                if end > start:
                    ranges[key] = (start, end)
            return split_ranges(ranges, opts.max_records_per_partition)
        finally:
            scan.close()

    def read(self, partition: QueueRange):
        if not isinstance(partition, QueueRange):
            return iter(())             # Spark's single InputPartition(None) when nothing was planned
        o = self.opts
        return read_range(o.root, partition.key, partition.start, partition.end, row_filter=o.row_filter(),
                          fail_on_data_loss=o.fail_on_data_loss, arrow=o.arrow, batch_rows=o.arrow_batch_rows)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._scan: StoreScan | None = None
        self._initial: dict | None = None        # what initialOffset answered in this process
        self._planned = False                     # partitions() was called (a replayed batch)
        self._pinned = False
        self._target: dict[QueueKey, int] | None = None

    # -- driver ---------------------------------------------------------------------------------------
    def _look(self) -> tuple[list[QueueKey], dict[QueueKey, tuple[int, int]]]:
        if self._scan is None:
            self._scan = StoreScan(self.opts.root)
        keys = self._scan.queues(self.opts.topics)
        return keys, {k: self._scan.bounds(k) for k in keys}

    def initialOffset(self) -> dict:
        keys, bounds = self._look()
        self._initial = O.encode_offsets(_start_offsets(self._scan, self.opts, keys, bounds))
        return self._initial

    def prepareForTriggerAvailableNow(self) -> None:
        _, bounds = self._look()
        self._target = {k: hi for k, (_, hi) in bounds.items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        first_call = not self._pinned
        self._pinned = True
        if first_call and not self._planned and self._initial is not None and start == self._initial:
            return start                # batch 0 of a new query: empty, pins the initial offset
        begin = O.decode_offsets(start)
        _, bounds = self._look()
        ends = {}
        for key, (lo, hi) in bounds.items():
            if key not in begin:                   # a queue that appeared since: from its beginning
                begin[key] = lo
            end = hi if self._target is None else min(hi, self._target.get(key, lo))
            ends[key] = max(begin[key], end)
        if isinstance(limit, ReadMaxRows):
            ends = prorate(begin, ends, int(limit.max_rows))
        for key, off in begin.items():
            ends.setdefault(key, off)              # a queue no longer listed keeps its offset
        return O.encode_offsets(ends)

    def reportLatestOffset(self) -> dict:
        _, bounds = self._look()
        return O.encode_offsets({k: hi for k, (_, hi) in bounds.items()})

    def partitions(self, start: dict, end: dict) -> list[QueueRange]:
        self._planned = True
        begin, stop = O.decode_offsets(start), O.decode_offsets(end)
        _, bounds = self._look()
        ranges = {}
        for key, e in stop.items():
            s = begin.get(key, bounds.get(key, (0, 0))[0])
            if e <= s:
                continue
            lo = bounds.get(key, (s, s))[0]
            s = _check_loss(key, s, lo, self.opts.fail_on_data_loss)
            if e > s:
                ranges[key] = (s, e)
        return split_ranges(ranges, self.opts.max_records_per_partition)

    def commit(self, end: dict) -> None:
        """Informational in Spark (it lags a run behind); with option ``group`` the processed offsets
        are stored on the brokers so ``hostmq status`` shows the pipeline's lag."""
        if self.opts.group is None:
            return
        from .writer import commit_group_offsets
        try:
            commit_group_offsets(self.opts.root, self.opts.group, O.decode_offsets(end))
        except HostMQError as e:
            log.warning("committing offsets of group %s failed: %s", self.opts.group, e)

    def stop(self) -> None:
        if self._scan is not None:
            self._scan.close()
            self._scan = None

    def __getstate__(self):                     # read() runs on a pickled copy; views stay here
        state = dict(self.__dict__)
        state["_scan"] = None
        return state

    # -- executors ------------------------------------------------------------------------------------
    def read(self, partition: QueueRange):
        if not isinstance(partition, QueueRange):
            return iter(())             # Spark's single InputPartition(None) when nothing was planned
        o = self.opts
        return read_range(o.root, partition.key, partition.start, partition.end, row_filter=o.row_filter(),
                          fail_on_data_loss=o.fail_on_data_loss, arrow=o.arrow, batch_rows=o.arrow_batch_rows)
