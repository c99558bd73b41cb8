"""Why the writer refuses writes: disk ratio, OS errors with a retry, a failed flush (pure)."""
from __future__ import annotations

import errno

from hostmq import records as R
from hostmq.broker.refusals import WriteRefusals


def test_accepts_by_default_and_refuses_for_each_reason():
    r = WriteRefusals(retry_s=1.0)
    assert r.status(0.0, flush_error=0) == 0
    assert r.status(0.0, flush_error=errno.EIO) == R.COMPLETION_DISK_ERROR
    assert r.disk_ratio(True) and not r.disk_ratio(True)
    assert r.status(0.0, 0) == R.COMPLETION_STORE_FULL
    assert r.disk_ratio(False) and r.status(0.0, 0) == 0


def test_an_os_error_refuses_until_the_retry_time_and_a_success_clears_it():
    r = WriteRefusals(retry_s=1.0)
    assert r.io_failed(errno.ENOSPC, 10.0) == (R.COMPLETION_STORE_FULL, True)
    assert r.status(10.5, 0) == R.COMPLETION_STORE_FULL
    assert r.status(11.0, 0) == 0                      # time for one attempt
    assert r.io_failed(errno.EIO, 11.0) == (R.COMPLETION_NOT_AVAILABLE, False)
    assert r.status(11.9, 0) == R.COMPLETION_NOT_AVAILABLE
    assert r.io_succeeded() and not r.io_succeeded()
    assert r.status(11.9, 0) == 0
    assert r.io_failed(errno.EDQUOT, 20.0)[0] == R.COMPLETION_STORE_FULL
