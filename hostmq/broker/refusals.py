"""Why the writer refuses writes right now (pure: time comes in as an argument).

Three independent reasons, each answered with the completion status the producer turns into a typed
error (``client.session.completion_error``):

* the disk is fuller than ``store.disk_refuse_ratio`` (checked every few seconds) → STORE_FULL;
* an append failed in the OS (ENOSPC / EDQUOT → STORE_FULL, anything else such as EIO → NOT_AVAILABLE):
  writes are refused for ``retry_s``, then one is tried again and a success clears it;
* the flusher's ``fdatasync`` failed (``flush_error`` in the broker state) → DISK_ERROR until the
  broker is restarted (a later sync could not be trusted: see ``broker.flusher``).
"""
from __future__ import annotations

import errno

from .. import records as R

IO_RETRY_S = 1.0
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class WriteRefusals:
    def __init__(self, retry_s: float = IO_RETRY_S) -> None:
        self.retry_s = retry_s
        self.disk_full = False
        self.io_status = 0          # refusal status while an OS error is fresh
        self._io_until_s = 0.0

    def status(self, now_s: float, flush_error: int) -> int:
        """0 when writes are accepted, else the COMPLETION_* status to refuse them with."""
        if self.disk_full:
            return R.COMPLETION_STORE_FULL
        if self.io_status and now_s < self._io_until_s:
            return self.io_status
        return R.COMPLETION_DISK_ERROR if flush_error else 0

    def io_failed(self, err: int, now_s: float) -> tuple[int, bool]:
        """An append failed with ``err``: ``(status, whether this starts a refusal)``."""
        first = not self.io_status
        self.io_status = R.COMPLETION_STORE_FULL if err in _FULL_ERRNOS else R.COMPLETION_NOT_AVAILABLE
        self._io_until_s = now_s + self.retry_s
        return self.io_status, first

    def io_succeeded(self) -> bool:
        """An append went through: whether that ends an OS-error refusal."""
        was, self.io_status = bool(self.io_status), 0
        return was

    def disk_ratio(self, refuse: bool) -> bool:
        """The periodic disk check says whether to refuse; whether that changed anything."""
        changed, self.disk_full = refuse != self.disk_full, refuse
        return changed
