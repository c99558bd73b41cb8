"""The processes of a bench run (spawned; each talks to the runner over one ``Pipe``).

Protocol, the same for every worker: set up (connect, subscribe), send ``"ready"``, receive the
monotonic deadline, work until it, send one result dict. A consumer keeps reading after the
deadline until the runner tells it how many messages were sent (``("expect", n)``) and it has them,
or ``drain_s`` passes.

Every message body starts with the producer's CLOCK_MONOTONIC send time (ns, little-endian int64);
CLOCK_MONOTONIC is one clock for the whole machine, so receive − send is the end-to-end latency.
Latencies are returned in microseconds as float32 arrays.
"""
from __future__ import annotations

import random
import resource
import struct
import time

import numpy as np

STAMP = struct.Struct("<q")
POLL_S = 0.2


def body_maker(size_bytes: int):
    # incompressible, so a 16 KiB message is 16 KiB everywhere (hostmq's producer compresses bodies
    # over 4 KiB, and the bench turns that off to measure the store, not zlib)
    filler = random.Random(size_bytes).randbytes(max(0, size_bytes - STAMP.size))
    return lambda: STAMP.pack(time.monotonic_ns()) + filler


def _usage() -> tuple[float, int, int]:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime, u.ru_minflt, u.ru_majflt


def _result(count: int, nbytes: int, lat_ns: list, usage0, t0: float, t1: float, **extra) -> dict:
    cpu, minflt, majflt = _usage()
    return {"count": count, "bytes": nbytes, "lat_us": np.asarray(lat_ns, np.float64).astype(np.float32) / 1000,
            "cpu_s": cpu - usage0[0], "minflt": minflt - usage0[1], "majflt": majflt - usage0[2],
            "first_s": t0, "last_s": t1, **extra}


def _produce(conn, send, size_bytes: int) -> None:
    make = body_maker(size_bytes)
    conn.send("ready")
    deadline = conn.recv()
    usage0 = _usage()
    lat, n, errors = [], 0, 0
    t0 = time.monotonic()
    while True:
        body = make()
        s = time.monotonic_ns()
        if s >= deadline * 1e9:
            break
        try:
            send(body)
        except Exception:       # noqa: BLE001 — counted and reported, a bench run goes on
            errors += 1
            continue
        lat.append(time.monotonic_ns() - s)
        n += 1
    conn.send(_result(n, n * size_bytes, lat, usage0, t0, time.monotonic(), errors=errors))


def _consume(conn, receive, drain_s: float) -> None:
    """``receive()`` returns a list of bodies (possibly empty after a short wait)."""
    conn.send("ready")
    conn.recv()
    usage0 = _usage()
    lat, n, nbytes, expect = [], 0, 0, None
    first = last = 0.0
    give_up = None
    while True:
        if expect is None and conn.poll():
            msg = conn.recv()
            expect = msg[1]
            give_up = time.monotonic() + drain_s
        if expect is not None and (n >= expect or time.monotonic() >= give_up):
            break
        bodies = receive()
        if bodies:
            now = time.monotonic_ns()
            if not n:
                first = now / 1e9
            last = now / 1e9
            for b in bodies:
                lat.append(now - STAMP.unpack_from(b)[0])
                nbytes += len(b)
            n += len(bodies)
    conn.send(_result(n, nbytes, lat, usage0, first, last))


# -- hostmq --------------------------------------------------------------------------------------------
def hostmq_producer(conn, root: str, topic: str, size_bytes: int) -> None:
    import hostmq
    with hostmq.Producer(root, group="bench", compress_over_bytes=1 << 30) as p:
        p.send(hostmq.Message(topic, b"warmup"))        # routes and session ready before the clock runs
        _produce(conn, lambda body: p.send(hostmq.Message(topic, body)), size_bytes)


def hostmq_consumer(conn, root: str, topic: str, group: str, from_first: bool, drain_s: float) -> None:
    import hostmq
    start = hostmq.ConsumeFrom.FIRST_OFFSET if from_first else hostmq.ConsumeFrom.LAST_OFFSET
    with hostmq.PullConsumer(root, group=group, consume_from=start, max_poll_records=1024) as c:
        c.subscribe(topic, "*")
        # Join the group before the clock runs; what this first poll returns is a backlog to count.
        early = [c.poll(0.05)]

        def receive():
            msgs = early.pop() if early else c.poll(POLL_S)
            return [m.body for m in msgs if len(m.body) >= STAMP.size]   # warm-up sends are shorter
        _consume(conn, receive, drain_s)


# -- Redis Streams ----------------------------------------------------------------------------------------
def redis_producer(conn, port: int, size_bytes: int) -> None:
    import redis
    r = redis.Redis(port=port)
    _produce(conn, lambda body: r.xadd("bench", {"d": body}), size_bytes)


def redis_consumer(conn, port: int, drain_s: float) -> None:
    import redis
    r = redis.Redis(port=port)
    last = ["$"]

    def receive():
        got = r.xread({"bench": last[0]}, count=1000, block=int(POLL_S * 1000))
        if not got:
            return []
        entries = got[0][1]
        last[0] = entries[-1][0]
        return [e[1][b"d"] for e in entries]
    _consume(conn, receive, drain_s)


# -- pyzmq over ipc (PUSH → PULL: no acknowledgement, no store) -----------------------------------------
def zmq_producer(conn, address: str, size_bytes: int) -> None:
    import zmq
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    s.connect(address)
    _produce(conn, s.send, size_bytes)
    s.close(linger=2000)
    ctx.term()


def zmq_consumer(conn, address: str, drain_s: float) -> None:
    import zmq
    ctx = zmq.Context()
    s = ctx.socket(zmq.PULL)
    s.bind(address)

    def receive():
        if not s.poll(int(POLL_S * 1000)):
            return []
        out = [s.recv()]
        while len(out) < 1000:
            try:
                out.append(s.recv(zmq.NOBLOCK))
            except zmq.Again:
                break
        return out
    _consume(conn, receive, drain_s)
    s.close(linger=0)
    ctx.term()


# -- multiprocessing.Queue ---------------------------------------------------------------------------------
def mpq_producer(conn, queue, size_bytes: int) -> None:
    _produce(conn, queue.put, size_bytes)


def mpq_consumer(conn, queue, drain_s: float) -> None:
    import queue as q

    def receive():
        try:
            out = [queue.get(timeout=POLL_S)]
        except q.Empty:
            return []
        while len(out) < 1000:
            try:
                out.append(queue.get_nowait())
            except q.Empty:
                break
        return out
    _consume(conn, receive, drain_s)
