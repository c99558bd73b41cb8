"""Fixtures for the asyncio clients: one real cluster per test module, and leak checks.

``aio_cluster`` starts one cluster for the whole module (its ``BROKERS`` and ``CONFIG`` module
constants, merged over the e2e tests' small-file config) — tests use their own topics and groups.
At the module's end the cluster is stopped and the module fails if a child process, a socket file
or a shared-memory name of the root is left. After every test, no client thread (``hostmq…``) may
be left: a closed asyncio client joins its threads.
"""
from __future__ import annotations

import asyncio
import os
import threading
from typing import Any, Awaitable, TypeVar

import pytest

from hostmq import LocalCluster
from tests.conftest import TEST_CONFIG, child_pids, merge, stop_and_check, wait_until

T = TypeVar("T")


def run(coro: Awaitable[T], timeout_s: float = 60.0) -> T:
    """Drive a test coroutine on a fresh event loop, failing it after ``timeout_s``."""
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout_s)
    return asyncio.run(bounded())


def client_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("hostmq")]


@pytest.fixture(scope="module")
def aio_cluster(tmp_path_factory, request) -> Any:
    root = tmp_path_factory.mktemp("aio") / "root"
    root.mkdir()
    older = child_pids()
    config = merge(TEST_CONFIG, getattr(request.module, "CONFIG", {}))
    c = LocalCluster(str(root), brokers=getattr(request.module, "BROKERS", 1), config=config)
    c.start()
    yield c
    stop_and_check([c], str(root), older)


@pytest.fixture(autouse=True)
def no_client_thread_left():
    yield
    wait_until(lambda: not client_threads(), 10, f"client threads to end ({client_threads()})")


async def eventually(cond: Any, timeout_s: float = 15.0, what: str = "condition", step_s: float = 0.02) -> Any:
    """``wait_until`` for a coroutine function ``cond``: its first truthy result, or fail after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        v = await cond()
        if v:
            return v
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(step_s)
