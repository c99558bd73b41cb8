"""How the asyncio clients reach the blocking parts of the sync clients without blocking the loop.

Two pieces, both bounded per client, never per call:

* :class:`Worker` — one thread per client that runs, in submission order, every step of the sync
  client that can block: opening a session, a route lookup, a control request (commit, rebalance,
  admin), a poll that sleeps on the brokers' futex words. A call awaits an ``asyncio`` future that
  the thread resolves through ``loop.call_soon_threadsafe`` — a write to the self-pipe the loop
  watches. ``shutdown`` joins the thread, so a closed client leaves none behind.
* :func:`bridge` — a ``concurrent.futures.Future`` resolved by a sync client's own helper thread
  (the producer session's completion reader, which sleeps on the ring's completion futex) copied
  into an ``asyncio`` future. Unlike ``asyncio.wrap_future`` it never cancels the source: a
  cancelled ``await`` leaves the sync side's bookkeeping (a completion slot's waiter) to finish
  normally, and its result is dropped.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from typing import Any, Callable, TypeVar

from ..errors import ValidationError

T = TypeVar("T")


def _copy(src: concurrent.futures.Future, dst: asyncio.Future) -> None:
    """On the loop: give ``dst`` the outcome of the finished ``src`` (unless ``dst`` was cancelled)."""
    if dst.done():
        return
    exc = src.exception()
    if exc is not None:
        dst.set_exception(exc)
    else:
        dst.set_result(src.result())


def bridge(src: concurrent.futures.Future, loop: asyncio.AbstractEventLoop) -> asyncio.Future:
    """An asyncio future of ``loop`` that completes with ``src`` (see the module docstring)."""
    dst: asyncio.Future = loop.create_future()

    def done(f: concurrent.futures.Future) -> None:
        try:
            loop.call_soon_threadsafe(_copy, f, dst)
        except RuntimeError:        # the loop is closed: nobody awaits the outcome any more
            pass
    src.add_done_callback(done)
    return dst


class Worker:
    """One thread per client for its blocking steps (see the module docstring). Started on first
    use; ``shutdown`` waits for what was submitted and joins the thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.closed = False

    def submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future:
        """Queue ``fn(*args)`` on the thread without awaiting it (from any thread)."""
        if self.closed:                 # as the sync clients answer a call after close()
            raise ValidationError(f"the client is closed ({self.name})")
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=self.name)
        return self._executor.submit(fn, *args)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on the thread; its result (or exception) here. A cancelled call
        that has started runs to its end on the thread (its result is dropped)."""
        src = self.submit(functools.partial(fn, *args, **kwargs))
        return await bridge(src, asyncio.get_running_loop())

    def shutdown(self) -> None:
        """Join the thread after what was submitted (callers first wait for their last call)."""
        self.closed = True
        ex, self._executor = self._executor, None
        if ex is not None:
            ex.shutdown(wait=True)
