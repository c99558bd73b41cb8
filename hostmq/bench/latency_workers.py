"""The processes of ``bench/latency.py`` (spawned; each talks to the bench over one ``Pipe``).

Latency rows, one producer process and one consumer process per row:

* consumer ``CONSUMERS[system](conn, cfg)``: set up (connect, join, map), send ``"ready"``, read
  until ``cfg["total"]`` messages arrived or ``cfg["budget_s"]`` passed after ``"go"``, then send
  ``{"lat_ns": int64 array (messages past the warm-up), "received": n, "waits": {...}}``;
* producer ``PRODUCERS[system](conn, cfg)``: set up, send ``"ready"``, on ``"go"`` send
  ``cfg["total"]`` messages on an absolute schedule (message i at start + i × ``cfg["period_s"]``),
  then send ``{"sent": n, "late": sends more than one period behind schedule}``.

Every body is 100 bytes: the send time (``time.perf_counter_ns()``, little-endian int64) and the
message's sequence number, then padding. On Linux ``perf_counter`` is ``clock_gettime(CLOCK_MONOTONIC)``
(``time.get_clock_info("perf_counter").implementation`` says so; ``bench/latency.py`` checks it at
start), one clock for every process of the host — so receive time − send time taken in two
processes is the one-way latency, with no clock offset to correct.

Also here: the neighbour (a CPU-bound busy loop), the one-process send / control / consume
measurements of the send table, and the REQ/REP echo server they compare hostmq's PING with.
"""
from __future__ import annotations

import mmap
import queue as queue_mod
import struct
import time

import numpy as np

from ..ingress.step import current_cpu
from ..shm_layouts import STATE_WORD

STAMP = struct.Struct("<qq")              # send perf_counter_ns, sequence number
BODY_BYTES = 100
PAD = b"x" * (BODY_BYTES - STAMP.size)
POLL_S = 0.2                              # longest single blocking receive (a consumer re-checks its budget)
RING_SLOTS = 4096                         # raw shm ring: slots of RING_SLOT_BYTES
RING_SLOT_BYTES = 128
RING_HEADER = np.dtype([("write_seq", "<i8"), ("read_seq", "<i8")])   # see _Ring
WRITE_SEQ, READ_SEQ = 0, 1
assert RING_HEADER.itemsize == 16
RING_BYTES = 64 + RING_SLOTS * RING_SLOT_BYTES        # header padded to one cache line
SEND_BATCH = 100


def make_body(seq: int) -> bytes:
    return STAMP.pack(time.perf_counter_ns(), seq) + PAD


# -- the common loops ----------------------------------------------------------------------------------
def _produce(conn, cfg: dict, send, extra=None) -> None:
    """Paced sends: message i goes at start + i × period (sleep until then, no spin: a spinning
    producer would take a CPU from the consumer and the broker on a 2-vCPU host). The stamp is taken
    at the send itself, so a late send does not count as latency; ``late`` says how often the
    schedule slipped by more than one period."""
    conn.send("ready")
    conn.recv()
    period_ns = int(cfg["period_s"] * 1e9)
    late = errors = 0
    start = time.perf_counter_ns()
    for i in range(cfg["total"]):
        due = start + i * period_ns
        wait_ns = due - time.perf_counter_ns()
        if wait_ns > 0:
            time.sleep(wait_ns / 1e9)
        elif -wait_ns > period_ns:
            late += 1
        try:
            send(make_body(i))
        except Exception:       # noqa: BLE001 — counted and reported (a missing message shows in the row)
            errors += 1
    conn.send({"sent": cfg["total"] - errors, "late": late, "errors": errors, **(extra() if extra else {})})


def _consume(conn, cfg: dict, receive, counters=None, stamped: bool = False, wakes: "_WakeStamps | None" = None) -> None:
    """``receive()`` returns a list of bodies, waiting at most about POLL_S (with ``stamped``: a list
    of (receive perf_counter_ns, body), for a receiver that stamps them itself). A hostmq poll
    receiver passes its ``wakes`` (``_WakeStamps``: when its futex wait ended, per message)."""
    total, warmup = cfg["total"], cfg["warmup"]
    lat = np.zeros(total, np.int64)
    seen = np.zeros(total, bool)
    conn.send("ready")
    conn.recv()
    before = counters() if counters else {}
    got = 0
    end = time.monotonic() + cfg["budget_s"]
    while got < total and time.monotonic() < end:
        items = receive()
        now = time.perf_counter_ns()            # one receive time for what one call returned
        for item in items:
            if stamped:
                now, item = item
            t, seq = STAMP.unpack_from(item)
            if 0 <= seq < total and not seen[seq]:
                seen[seq] = True
                lat[seq] = now - t
                got += 1
    after = counters() if counters else {}
    conn.send({"lat_ns": lat[warmup:][seen[warmup:]], "received": got,
               "waits": {k: after[k] - before[k] for k in after},
               **(wakes.result(warmup) if wakes is not None else {})})


def _wait_totals(stats=None) -> dict:
    """Futex-wait counters: a consumer's own (``PullConsumer.wait_stats``), else this process's
    (``hostmq.shm.signal.process_totals``: waits whose caller passed none)."""
    from ..shm.signal import process_totals
    s = stats if stats is not None else process_totals
    return {"blocked": s.blocked, "wakeups": s.wakeups, "slice_timeouts": s.slice_timeouts, "rescued": s.rescued}


# -- raw shared-memory ring + POSIX semaphore (the bench creates and unlinks both) ---------------------
class _Ring:
    """The bench's ring: int64 words ``[write_seq, read_seq]`` (messages written / read so far; each
    word has one writer and is published with an aligned int64 store, docs/internals.md fact 14),
    padded to 64 bytes, then RING_SLOTS slots of RING_SLOT_BYTES."""

    def __init__(self, shm_name: str, sem_name: str) -> None:
        import posix_ipc
        seg = posix_ipc.SharedMemory(shm_name)
        self.mm = mmap.mmap(seg.fd, RING_BYTES)
        seg.close_fd()
        self.sem = posix_ipc.Semaphore(sem_name)
        self._view = memoryview(self.mm)
        self.words = self._view[:RING_HEADER.itemsize].cast("q")
        self.slots = self._view[64:]

    def close(self) -> None:
        for v in (self.words, self.slots, self._view):
            v.release()
        self.mm.close()
        self.sem.close()


def shm_producer(conn, cfg: dict) -> None:
    ring = _Ring(cfg["shm_name"], cfg["sem_name"])

    def send(body: bytes) -> None:
        w = ring.words[WRITE_SEQ]
        while w - ring.words[READ_SEQ] >= RING_SLOTS:          # full: never at these rates, but never overwrite
            time.sleep(50e-6)
        at = (w % RING_SLOTS) * RING_SLOT_BYTES
        ring.slots[at:at + len(body)] = body
        ring.words[WRITE_SEQ] = w + 1                           # publish after the data
        ring.sem.release()
    try:
        _produce(conn, cfg, send)
    finally:
        ring.close()


def shm_consumer(conn, cfg: dict) -> None:
    import posix_ipc
    ring = _Ring(cfg["shm_name"], cfg["sem_name"])

    def receive() -> list:
        try:
            ring.sem.acquire(POLL_S)            # one post per message: one acquire reads one slot
        except posix_ipc.BusyError:
            return []
        r = ring.words[READ_SEQ]
        at = (r % RING_SLOTS) * RING_SLOT_BYTES
        body = bytes(ring.slots[at:at + BODY_BYTES])
        ring.words[READ_SEQ] = r + 1
        return [body]
    try:
        _consume(conn, cfg, receive)
    finally:
        ring.close()


# -- pyzmq PUSH → PULL over ipc (no store, no acknowledgement) ------------------------------------------
def zmq_producer(conn, cfg: dict) -> None:
    import zmq
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    s.connect(cfg["address"])
    try:
        _produce(conn, cfg, s.send)
    finally:
        s.close(linger=2000)
        ctx.term()


def zmq_consumer(conn, cfg: dict) -> None:
    import zmq
    ctx = zmq.Context()
    s = ctx.socket(zmq.PULL)
    s.bind(cfg["address"])

    def receive() -> list:
        if not s.poll(int(POLL_S * 1000)):
            return []
        out = [s.recv()]
        while True:
            try:
                out.append(s.recv(zmq.NOBLOCK))
            except zmq.Again:
                return out
    try:
        _consume(conn, cfg, receive)
    finally:
        s.close(linger=0)
        ctx.term()


# -- Redis Streams: XADD → XREAD BLOCK ----------------------------------------------------------------
def redis_producer(conn, cfg: dict) -> None:
    import redis
    r = redis.Redis(port=cfg["port"])
    r.ping()                                    # connected before the clock runs
    _produce(conn, cfg, lambda body: r.xadd(cfg["key"], {"d": body}))
    r.close()


def redis_consumer(conn, cfg: dict) -> None:
    import redis
    r = redis.Redis(port=cfg["port"])
    r.ping()
    last = ["0-0"]

    def receive() -> list:
        got = r.xread({cfg["key"]: last[0]}, count=1000, block=int(POLL_S * 1000))
        if not got:
            return []
        entries = got[0][1]
        last[0] = entries[-1][0]
        return [e[1][b"d"] for e in entries]
    _consume(conn, cfg, receive)
    r.close()


# -- Zenoh: peer mode over a unix socket, express publisher, Python callback subscriber ------------------
ZENOH_KEY = "hqlat/bench"


def _zenoh_session(path: str, listen: bool):
    """A Zenoh peer session on ``unixsock-stream/PATH`` (the consumer listens, the producer connects),
    with multicast scouting off: the two find each other only through the socket."""
    import json
    import zenoh
    conf = zenoh.Config()
    conf.insert_json5("mode", '"peer"')
    endpoints = json.dumps([f"unixsock-stream/{path}"])
    conf.insert_json5("listen/endpoints", endpoints if listen else "[]")
    if not listen:
        conf.insert_json5("connect/endpoints", endpoints)
    conf.insert_json5("scouting/multicast/enabled", "false")
    # Its shared-memory transport carries only payloads allocated from a Zenoh SHM provider (these are
    # bytes, sent over the socket either way); enabled, each session leaves a /dev/shm/<n>.zenoh file
    # behind when its process ends without the transport's own clean-up.
    conf.insert_json5("transport/shared_memory/enabled", "false")
    return zenoh.open(conf)


def zenoh_producer(conn, cfg: dict) -> None:
    import zenoh
    s = _zenoh_session(cfg["path"], listen=False)
    try:
        # BLOCK, not Zenoh's default DROP: every other system here is lossless, and a dropped sample left
        # the consumer waiting out its whole budget (30 s a row, beside the busy loop)
        pub = s.declare_publisher(ZENOH_KEY, express=True, congestion_control=zenoh.CongestionControl.BLOCK)
        deadline = time.monotonic() + 30            # the subscriber is declared before "ready": wait for it
        while not pub.matching_status.matching and time.monotonic() < deadline:
            time.sleep(0.005)
        _produce(conn, cfg, pub.put)
        pub.undeclare()
    finally:
        s.close()


def zenoh_consumer(conn, cfg: dict) -> None:
    """The subscriber's callback (on a Zenoh thread) stamps the receive time, as a push listener does."""
    arrived: queue_mod.SimpleQueue = queue_mod.SimpleQueue()

    def callback(sample) -> None:
        arrived.put((time.perf_counter_ns(), sample.payload.to_bytes()))
    s = _zenoh_session(cfg["path"], listen=True)
    try:
        sub = s.declare_subscriber(ZENOH_KEY, callback)
        _consume_stamped(conn, cfg, arrived, None)
        sub.undeclare()
    finally:
        s.close()


# -- multiprocessing.Queue (pickled through a pipe by a feeder thread) -----------------------------------
def mpq_producer(conn, cfg: dict) -> None:
    q = cfg["queue"]
    _produce(conn, cfg, q.put)
    q.close()
    q.join_thread()


def mpq_consumer(conn, cfg: dict) -> None:
    q = cfg["queue"]

    def receive() -> list:
        try:
            return [q.get(timeout=POLL_S)]
        except queue_mod.Empty:
            return []
    _consume(conn, cfg, receive)


# -- hostmq ------------------------------------------------------------------------------------------------
def hostmq_producer(conn, cfg: dict) -> None:
    """``cfg["idle"]``: the producer's idle strategy (how a send waits for its completion); None: its
    default. Also reports when each frame was published in the ring, from the send stamp (p50, µs)."""
    import hostmq
    published = _publish_stamps()
    to_published: list[int] = []
    with hostmq.Producer(cfg["root"], group="lat", idle=cfg.get("idle")) as p:
        topic = cfg["topic"]

        def send(body: bytes) -> None:
            published[0] = 0
            p.send(hostmq.Message(topic, body))
            if published[0]:
                to_published.append(published[0] - STAMP.unpack_from(body)[0])

        def extra() -> dict:
            v = to_published[cfg["warmup"]:]
            return {"to_published_us": float(np.median(v)) / 1000 if v else float("nan")}
        _produce(conn, cfg, send, extra)


def _publish_stamps() -> list:
    """Note, in this (bench worker) process, when a producer's send reaches the ring write of its frame
    (the native ``IngressRing.write_and_ring``, which also rings the doorbell, or ``try_write``):
    both wrapped to set ``[0]`` to ``perf_counter_ns`` as they are entered, for a write that then
    succeeds — the producer's own work before the hand-off, the same point on either path.
    Measurement only: the wrapped calls are the real ones."""
    from ..ingress.ring import IngressRing
    last = [0]
    for name in ("write_and_ring", "try_write"):
        real = getattr(IngressRing, name)

        def wrapped(self, *a, _real=real, **k):
            t = time.perf_counter_ns()
            r = _real(self, *a, **k)
            if r:
                last[0] = t
            return r
        setattr(IngressRing, name, wrapped)
    return last


W_STEP_STARTED, W_STEP_WOKE, W_STEP_CPU = (STATE_WORD["step_started_ns"], STATE_WORD["step_woke_ns"],
                                          STATE_WORD["step_cpu"])


class _WakeStamps:
    """When a poll's futex wait ended (``PullConsumer._wait`` wrapped, measurement only), against the
    send stamp of the first message that poll returned, and the poll's return after it: the two p50s
    (µs) ``result`` reports — send → consumer woken, woken → returned. Only polls that slept and were
    woken count (a message found without a wait has no wake-up)."""

    def __init__(self, c) -> None:
        self.c = c
        self.woke = 0
        self.to_woken: list[int] = []
        self.rounds: list[int] = []
        self.to_step: list[int] = []            # send → the writer's step began (its stamp word)
        self.to_wake: list[int] = []            # send → the writer woke the queues
        self.placed: list[tuple[bool, int]] = []    # (woken on the waking writer's CPU, send → returned)
        real = c._wait

        def wait(*a):
            r = real(*a)
            self.woke = time.perf_counter_ns() if r else 0
            return r
        c._wait = wait

    def before(self) -> None:
        self.woke = 0

    def delivered(self, now: int, first_body) -> None:
        """A push listener was called at ``now`` with a batch whose first body is ``first_body``:
        counted against the pull thread's last wake-up, once (the listener runs on the pull thread
        on the hot path; a batch found without a wait has no wake-up)."""
        woke, self.woke = self.woke, 0
        if woke:
            t, seq = STAMP.unpack_from(first_body)
            if seq >= 0:
                self.to_woken.append(woke - t)
                self.rounds.append(now - woke)
                self._writer_stamps(t, woke, now)

    def after(self, bodies) -> None:
        if self.woke and bodies:
            now = time.perf_counter_ns()
            t, seq = STAMP.unpack_from(bodies[0])
            if seq >= 0:
                self.to_woken.append(self.woke - t)
                self.rounds.append(now - self.woke)
                self._writer_stamps(t, self.woke, now)

    def _writer_stamps(self, t: int, woke: int, now: int) -> None:
        """The writer's stamps of the step that woke us (the broker state's ``step_started_ns`` and
        ``step_woke_ns``, CLOCK_MONOTONIC as ``perf_counter_ns``, and ``step_cpu``), kept when they
        fall between the send and the wake-up (a later step may have overwritten them: then not
        counted); with the CPU this process runs on now (read after the stamps, so not inside the
        measured round), whether the writer woke us on its own CPU."""
        v = next(iter(self.c.views.values()), None)       # the bench's one broker
        if v is None:
            return
        w = v.state.w
        started, woke_q, cpu = int(w[W_STEP_STARTED]), int(w[W_STEP_WOKE]), int(w[W_STEP_CPU])
        if t <= started <= woke_q <= woke:
            self.to_step.append(started - t)
            self.to_wake.append(woke_q - t)
            mine = current_cpu()
            if cpu > 0 and mine >= 0:
                self.placed.append((cpu - 1 == mine, now - t))

    def result(self, warmup: int) -> dict:
        def med(v: list[int]) -> float:
            v = v[warmup // 2:]
            return float(np.median(v)) / 1000 if v else float("nan")
        placed = self.placed[warmup // 2:]
        same = [d for on_writer, d in placed if on_writer]
        other = [d for on_writer, d in placed if not on_writer]
        return {"to_woken_us": med(self.to_woken), "round_us": med(self.rounds),
                "to_step_us": med(self.to_step), "to_wake_us": med(self.to_wake),
                "same_cpu_share": len(same) / len(placed) if placed else float("nan"),
                "same_cpu_us": float(np.median(same)) / 1000 if same else float("nan"),
                "other_cpu_us": float(np.median(other)) / 1000 if other else float("nan")}


def _pull_consumer(cfg: dict):
    import hostmq
    with hostmq.Admin(cfg["root"]) as a:
        queues = a.route(cfg["topic"])
    c = hostmq.PullConsumer(cfg["root"], group=cfg["group"], consume_from=hostmq.ConsumeFrom.FIRST_OFFSET,
                            auto_commit=False, idle=cfg.get("idle"))
    c.assign(queues)
    c.poll(0.05)                                # maps the store files before the clock runs
    return c


def hostmq_poll_consumer(conn, cfg: dict) -> None:
    def receive() -> list:
        wakes.before()
        bodies = [m.body for m in c.poll(POLL_S)]
        wakes.after(bodies)
        return bodies
    with _pull_consumer(cfg) as c:
        wakes = _WakeStamps(c)
        _consume(conn, cfg, receive, lambda: _wait_totals(c.wait_stats), wakes=wakes)


def hostmq_poll_batch_consumer(conn, cfg: dict) -> None:
    def receive():
        wakes.before()
        bodies = c.poll_batch(POLL_S).bodies
        wakes.after(bodies)
        return bodies
    with _pull_consumer(cfg) as c:
        wakes = _WakeStamps(c)
        _consume(conn, cfg, receive, lambda: _wait_totals(c.wait_stats), wakes=wakes)


def hostmq_push_consumer(conn, cfg: dict) -> None:
    """The listener stamps the receive time; the bench loop only collects what it handed over."""
    import hostmq
    arrived: queue_mod.SimpleQueue = queue_mod.SimpleQueue()

    def listener(msgs):
        now = time.perf_counter_ns()
        stamps = [(now, bytes(m.body[:STAMP.size])) for m in msgs]     # the store view may move on
        if wakes is not None:
            wakes.delivered(now, stamps[0][1])
        for x in stamps:
            arrived.put(x)
        return hostmq.ConsumeResult.SUCCESS
    c = hostmq.PushConsumer(cfg["root"], group=cfg["group"], consume_from=hostmq.ConsumeFrom.FIRST_OFFSET,
                            threads=1, idle=cfg.get("idle"))
    wakes = None
    c.subscribe(cfg["topic"])
    c.register(listener)
    c.start()
    wakes = _WakeStamps(c.pull)         # send → pull thread woken, woken → listener called
    try:
        deadline = time.monotonic() + 30
        while not c.assignment() and time.monotonic() < deadline:   # its first rebalance
            time.sleep(0.01)
        _consume_stamped(conn, cfg, arrived, lambda: _wait_totals(c.pull.wait_stats), wakes)
    finally:
        c.shutdown()


def _consume_stamped(conn, cfg: dict, arrived: queue_mod.SimpleQueue, counters,
                     wakes: "_WakeStamps | None" = None) -> None:
    """``_consume`` of what the listener (or a Zenoh callback) handed over with its own receive time."""
    def receive() -> list:
        try:
            return [arrived.get(timeout=POLL_S)]
        except queue_mod.Empty:
            return []
    _consume(conn, cfg, receive, counters, stamped=True, wakes=wakes)


# hostmq poll once per idle strategy (producer and consumer both; the broker's own is --broker-idle):
# hostmq_poll is the default (auto), hostmq_poll_<kind> names one.
IDLE_ROWS = {"hostmq_poll_sleep": "sleep", "hostmq_poll_backoff": "backoff:50", "hostmq_poll_spin": "spin:50"}
CONSUMERS = {"shm_ring": shm_consumer, "zmq_ipc": zmq_consumer, "zenoh": zenoh_consumer, "redis": redis_consumer,
             "mp_queue": mpq_consumer, "hostmq_poll": hostmq_poll_consumer, "hostmq_poll_4q": hostmq_poll_consumer,
             "hostmq_push": hostmq_push_consumer, "hostmq_poll_batch": hostmq_poll_batch_consumer,
             **{k: hostmq_poll_consumer for k in IDLE_ROWS}}
PRODUCERS = {"shm_ring": shm_producer, "zmq_ipc": zmq_producer, "zenoh": zenoh_producer, "redis": redis_producer,
             "mp_queue": mpq_producer, "hostmq_poll": hostmq_producer, "hostmq_poll_4q": hostmq_producer,
             "hostmq_push": hostmq_producer, "hostmq_poll_batch": hostmq_producer,
             **{k: hostmq_producer for k in IDLE_ROWS}}


# -- the neighbour ------------------------------------------------------------------------------------------
def busy_loop(started) -> None:
    """A CPU-bound neighbour at the bench's niceness: spins until killed."""
    started.set()
    while True:
        pass


# -- the send table (one process, unpaced) ---------------------------------------------------------------
def _rate_and_p50(n: int, one) -> tuple[float, float]:
    """``n`` calls of ``one()``: (calls/s, p50 of one call in µs)."""
    lat = np.empty(n, np.int64)
    t0 = time.perf_counter()
    for i in range(n):
        s = time.perf_counter_ns()
        one()
        lat[i] = time.perf_counter_ns() - s
    return n / (time.perf_counter() - t0), float(np.percentile(lat, 50)) / 1000


def hostmq_send_worker(conn, cfg: dict) -> None:
    """Sync sends, batches of 100, async sends into ``cfg["topic"]`` (which the consume test then
    drains), and PINGs of the broker and the NameServer over the control socket."""
    import hostmq
    from ..remoting import RemotingClient
    from ..protocol.codes import RequestCode
    from ..root import RootPaths, ipc_address
    topic, body = cfg["topic"], make_body(0)
    out = {}
    with hostmq.Producer(cfg["root"], group="lat-send") as p:
        for _ in range(200):                    # warm-up: route, session, ring pages
            p.send(hostmq.Message(topic, body))
        out["sync_per_s"], out["sync_p50_us"] = _rate_and_p50(cfg["sync"], lambda: p.send(hostmq.Message(topic, body)))
        batch = [hostmq.Message(topic, body) for _ in range(SEND_BATCH)]
        rate, _ = _rate_and_p50(cfg["batches"], lambda: p.send_batch(batch))
        out["batch_msgs_per_s"] = rate * SEND_BATCH
        t0 = time.perf_counter()
        futures = [p.send_async(hostmq.Message(topic, body)) for _ in range(cfg["async"])]
        for f in futures:
            f.result(60)
        out["async_msgs_per_s"] = cfg["async"] / (time.perf_counter() - t0)
    with hostmq.Producer(cfg["root"], group="lat-send-batched", auto_batch=True) as p:
        p.send(hostmq.Message(topic, body))     # route and session
        t0 = time.perf_counter()
        futures = [p.send_async(hostmq.Message(topic, body)) for _ in range(cfg["async"])]
        for f in futures:
            f.result(60)
        out["auto_batch_msgs_per_s"] = cfg["async"] / (time.perf_counter() - t0)
    paths = RootPaths(cfg["root"])
    for key, path in (("ping_broker_p50_us", paths.broker_socket("broker-a")), ("ping_namesrv_p50_us", paths.namesrv_socket())):
        with RemotingClient(ipc_address(path)) as c:
            for _ in range(100):
                c.request(RequestCode.PING)
            _, out[key] = _rate_and_p50(cfg["pings"], lambda: c.request(RequestCode.PING))
    out["sent"] = 200 + cfg["sync"] + cfg["batches"] * SEND_BATCH + 1 + 2 * cfg["async"]
    conn.send(out)


def redis_send_worker(conn, cfg: dict) -> None:
    import redis
    r = redis.Redis(port=cfg["port"])
    key, body = cfg["key"], make_body(0)
    for _ in range(200):
        r.xadd(key, {"d": body})
    out = {}
    out["sync_per_s"], out["sync_p50_us"] = _rate_and_p50(cfg["sync"], lambda: r.xadd(key, {"d": body}))

    def batch() -> None:
        pipe = r.pipeline(transaction=False)
        for _ in range(SEND_BATCH):
            pipe.xadd(key, {"d": body})
        pipe.execute()
    rate, _ = _rate_and_p50(cfg["batches"], batch)
    out["batch_msgs_per_s"] = rate * SEND_BATCH
    _, out["ping_p50_us"] = _rate_and_p50(cfg["pings"], r.ping)
    r.close()
    conn.send(out)


def rep_server(address: str, ready) -> None:
    """Echo server for the raw REQ/REP round trip; runs until killed."""
    import zmq
    ctx = zmq.Context()
    s = ctx.socket(zmq.REP)
    s.bind(address)
    ready.set()
    while True:
        s.send(s.recv())


def router_server(address: str, ready) -> None:
    """Echo server in hostmq's control-socket shape with none of its code: a ROUTER polled beside an
    eventfd (``transport.Server.poll_once``), the identity frame taken without a copy, the reply sent
    NOBLOCK — the floor a Python server of that shape pays over REQ/REP. Runs until killed."""
    import os as os_
    import zmq
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.bind(address)
    wake = os_.eventfd(0, os_.EFD_NONBLOCK)
    poller = zmq.Poller()
    poller.register(s, zmq.POLLIN)
    poller.register(wake, zmq.POLLIN)
    ready.set()
    while True:
        if s in dict(poller.poll(1000)):
            while True:
                try:
                    first = s.recv(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                rest = s.recv_multipart() if first.more else []
                s.send_multipart([first.bytes, *rest], zmq.NOBLOCK)


def dealer_worker(conn, cfg: dict) -> None:
    """Round trips through :func:`router_server` as ``RemotingClient`` makes them: a DEALER, the
    request sent NOBLOCK, a poll, the reply received NOBLOCK."""
    import zmq
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.connect(cfg["address"])
    frame = b"x" * 64                   # about a PING's JSON header

    def one() -> None:
        s.send_multipart([frame], zmq.NOBLOCK)
        s.poll(1000, zmq.POLLIN)
        s.recv_multipart(zmq.NOBLOCK)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:              # connected (the send is NOBLOCK)
        try:
            s.send_multipart([frame], zmq.NOBLOCK)
            break
        except zmq.Again:
            time.sleep(0.01)
    s.poll(5000, zmq.POLLIN)
    s.recv_multipart(zmq.NOBLOCK)
    _round_trips(conn, cfg, ctx, s, one)


def reqrep_worker(conn, cfg: dict) -> None:
    import zmq
    ctx = zmq.Context()
    s = ctx.socket(zmq.REQ)
    s.connect(cfg["address"])

    def one() -> None:
        s.send(b"ping")
        s.recv()
    _round_trips(conn, cfg, ctx, s, one)


def _round_trips(conn, cfg: dict, ctx, sock, one) -> None:
    """Warm up, time ``cfg["pings"]`` calls of ``one``, close; send their p50 (µs)."""
    for _ in range(100):
        one()
    _, p50_us = _rate_and_p50(cfg["pings"], one)
    sock.close(linger=0)
    ctx.term()
    conn.send({"p50_us": p50_us})


def hostmq_drain_worker(conn, cfg: dict) -> None:
    """Consume rates over a pre-filled topic, each a fresh group reading from the first offset:
    ``poll_batch`` taking the bodies columnar (``bodies_joined()``: one copy, no Python object per
    message), ``poll_batch`` touching each body view, and ``poll`` (a MessageExt per message)."""
    import hostmq
    out = {}
    with hostmq.Admin(cfg["root"]) as a:
        queues = a.route(cfg["topic"])
    for kind in ("poll_batch_joined", "poll_batch", "poll"):
        with hostmq.PullConsumer(cfg["root"], group=f"drain-{kind}", consume_from=hostmq.ConsumeFrom.FIRST_OFFSET,
                                 auto_commit=False, max_poll_records=4096) as c:
            c.assign(queues)
            got, nbytes = 0, 0
            t0 = time.perf_counter()
            end = time.monotonic() + 120
            while got < cfg["expect"] and time.monotonic() < end:
                if kind == "poll_batch_joined":
                    b = c.poll_batch(0.5, 4096)
                    joined, _ = b.bodies_joined()
                    nbytes += len(joined)
                    got += len(b)
                elif kind == "poll_batch":
                    b = c.poll_batch(0.5, 4096)
                    nbytes += sum(len(v) for v in b.bodies)
                    got += len(b)
                else:
                    msgs = c.poll(0.5)
                    nbytes += sum(len(m.body) for m in msgs)
                    got += len(msgs)
            out[f"{kind}_msgs_per_s"] = got / (time.perf_counter() - t0)
            out[f"{kind}_got"] = got
    conn.send(out)

