"""The pieces under hostmq.aio, without a cluster: the bridge from a thread's future to the loop,
the per-client worker thread, and the consumer's own futex word in private memory."""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import numpy as np
import pytest

from hostmq import ValidationError
from hostmq.aio._bridge import Worker, bridge
from hostmq.shm.futex import FutexWord, sleep_any
from tests.aio.conftest import run

pytestmark = pytest.mark.timeout(60)


def test_bridge_copies_the_outcome_and_a_cancelled_await_leaves_the_source_alone():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        ok, bad, dropped = (concurrent.futures.Future() for _ in range(3))
        threading.Thread(target=ok.set_result, args=(7,)).start()
        assert await bridge(ok, loop) == 7
        threading.Thread(target=bad.set_exception, args=(ValidationError("no"),)).start()
        with pytest.raises(ValidationError, match="no"):
            await bridge(bad, loop)
        waiting = asyncio.ensure_future(bridge(dropped, loop))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert not dropped.cancelled()
        dropped.set_result("late")          # whoever resolves it later is not refused
    run(main())


def test_the_worker_runs_calls_in_order_on_one_thread_and_joins_it():
    async def main() -> None:
        w = Worker("hostmq-test-worker")
        seen: list[tuple[int, str]] = []

        def step(i: int) -> int:
            seen.append((i, threading.current_thread().name))
            return i
        assert await asyncio.gather(*[w.call(step, i) for i in range(20)]) == list(range(20))
        assert [i for i, _ in seen] == list(range(20)) and len({name for _, name in seen}) == 1
        w.shutdown()
        assert not [t for t in threading.enumerate() if t.name.startswith("hostmq-test-worker")]
        with pytest.raises(ValidationError, match="closed"):
            await w.call(step, 99)
    run(main())


def test_a_private_futex_word_wakes_a_sleeper_alone_and_among_others():
    """The asyncio consumer's own word (private memory, posted by the loop) ends a futex sleep,
    also the multi-word sleep a poll makes on the brokers' words plus this one."""
    for words in (1, 2):
        arrays = [np.zeros(1, np.int64) for _ in range(words)]
        futexes = [FutexWord(a, 0) for a in arrays]
        tokens = [f.arm() for f in futexes]
        woke: list[bool] = []
        started = threading.Event()

        def sleeper() -> None:
            started.set()
            woke.append(sleep_any(futexes, tokens, 30.0))
        t = threading.Thread(target=sleeper)
        t.start()
        started.wait(10)
        while not woke:
            futexes[-1].post()              # a post before the sleep began changes the word: no sleep
            t.join(0.05)
        t.join(10)
        assert woke == [True]               # ended by the word, not by the 30 s timeout
