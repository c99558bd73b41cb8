"""Group commit of a broker's topic changes (issue 27): ``topics.json`` is rewritten at most once per
``interval_s`` however many topics change, and a request that changed topics is answered only
after the write.

Every change rewrites the whole file with an fsync, tells the writer process (it reloads the file)
and re-registers every topic with the NameServers — all of it O(topics). Done once per change, a
member whose heartbeats name thousands of new groups (a retry topic each) made the cost quadratic
and held the control loop for tens of seconds. Here a change only marks the table dirty; the control
socket's batch hook and a timer call :meth:`TopicCommits.commit`, which writes when the last write is
``interval_s`` old — or, for a large table, ``COST_FACTOR`` times as long as that write took, so
writing takes at most about a fifth of the loop's time whatever the table's size — and then answers
the requests that waited for it (``Server.reply``; they were DEFERred). A lone change is written at
once; a pipelined flood costs one write per interval. A client that sends one change at a time and
waits for each answer still costs one write per change, but is slowed to one per interval (the
per-uid caps of ``quotas`` bound how many it makes). Requests that changed nothing are answered at
once, as before.

If the write fails the waiting requests get the error and the table stays dirty (the next commit
tries again); a crash before a write loses only changes nobody was answered for.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from ..errors import HostMQError
from ..protocol.codes import ResponseCode, response_code_for
from ..transport import DEFER, Reply

log = logging.getLogger(__name__)

COMMIT_INTERVAL_S = 0.05        # topics.json is rewritten at most this often under a flood of changes
COST_FACTOR = 4.0               # ... and no sooner than this many times its last write's duration after it


class TopicCommits:
    """The dirty flag, the requests waiting for the next write, and when the last write was."""

    def __init__(self, topics, publish: Callable[[], None], interval_s: float = COMMIT_INTERVAL_S) -> None:
        self.topics = topics                # TopicTable (autosave=False)
        self.publish = publish              # after a write: wake the writer, re-register
        self.interval_s = interval_s
        self.changes = 0                    # changes made so far (a handler compares before/after)
        self.dirty = False
        self.writes = 0
        self.server = None
        self._waiting: list[tuple[object, Reply]] = []
        self._next_write = float("-inf")     # monotonic time before which no write starts (unless forced)

    def attach(self, server) -> None:
        """Commit after each batch of ``server``'s requests and on a timer (for the waiting)."""
        self.server = server
        server.add_batch_hook(self.commit)
        server.add_timer(self.interval_s, self.commit)

    def changed(self) -> None:
        self.changes += 1
        self.dirty = True
        if self.server is None:             # no batch will follow (a test or a tool calling a handler)
            self.commit(force=True)

    def reply_when_committed(self, token, reply: Reply, since: int):
        """``reply`` now if nothing changed since ``since`` (``changes`` before the request), else
        DEFER: it is sent once the change is written."""
        if self.changes == since or not self.dirty:
            return reply
        if self.server is None or token is None:
            self.commit(force=True)
            return reply
        self._waiting.append((token, reply))
        return DEFER

    def commit(self, force: bool = False) -> None:
        """Write, publish and answer the waiting requests if dirty and the last write is old enough."""
        started = time.monotonic()
        if not self.dirty or not force and started < self._next_write:
            return
        self._next_write = started + self.interval_s
        waiting, self._waiting = self._waiting, []
        try:
            self.topics.flush()
        except (HostMQError, OSError) as e:
            log.error("topics.json not written (%s); %d requests get the error", e, len(waiting))
            failed = Reply(response_code_for(e) if isinstance(e, HostMQError) else ResponseCode.SYSTEM_ERROR,
                           remark=f"the broker could not write its topics: {e}")
            self._answer([(token, failed) for token, _ in waiting])
            return
        self.dirty = False
        self.writes += 1
        try:
            self.publish()
        finally:
            self._answer(waiting)
            ended = time.monotonic()
            self._next_write = max(self._next_write, ended + COST_FACTOR * (ended - started))

    def close(self) -> None:
        """At stop: write what is pending and answer whoever waits."""
        self.commit(force=True)

    def _answer(self, waiting) -> None:
        if self.server is not None:
            for token, reply in waiting:
                self.server.reply(token, reply)
