"""Polling a condition against a deadline, where no futex word announces the change (another
process's files or sockets; a test's or the fault harness's observations). Waits on shared memory
use ``shm.signal.wait_for`` instead (spin, then futex sleeps)."""
from __future__ import annotations

import time
from typing import Any, Callable


def poll_until(cond: Callable[[], Any], timeout_s: float, what: str, *, step_s: float = 0.02,
               error: type[Exception] = TimeoutError) -> Any:
    """``cond()``'s first truthy result, looked at every ``step_s``; ``error`` (a message naming
    ``what``) once ``timeout_s`` has passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise error(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(step_s)
