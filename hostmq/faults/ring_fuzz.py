"""A hostile producer: random bytes and bit flips in an ingress ring, against a real broker.

Each case publishes one frame into a real producer session's ring — a valid record or batch with
random bit flips, a record that lies about its sizes, hostile topics and properties, random bytes,
an impossible frame header or cursor — and optionally keeps rewriting it after publishing (the
check-then-copy race). The writer must answer every frame (stored, or refused with a status) or drop
the session; it must never hang, restart or crash, never create a file from a record's bytes, and
what it stores must pass abnormal recovery's checks in full (recovery keeps everything up to the
broker's last write position). A well-behaved producer is served all along.

Failures are one line each in the :class:`~hostmq.faults.FuzzResult` of kind ``"ring"``.
"""
from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
import threading
import time
from collections import Counter

from .. import records as R
from ..client.producer import Producer
from ..admin.admin import Admin
from ..ingress.session import ProducerSession
from ..cluster import LocalCluster
from ..errors import ConnectError, HostMQError
from ..message import Message
from ..root import RootPaths
from ..shm.signal import notify_if_waiting
from ..store.message_store import MessageStore
from . import FuzzResult

log = logging.getLogger(__name__)

TOPIC = b"ringfuzz"
ANSWER_TIMEOUT_S = 10.0
CHECK_EVERY = 250
CONFIG = {"store": {"commitlog_file_bytes": 4 << 20, "consume_queue_file_entries": 20_000,
                    "index_slots": 4000, "index_entries": 32_000}}
_HOSTILE_TOPICS = [b"../../PWNED", b"", b"a/b", b"x" * 255, b"\x00\xff", b"SCHEDULE_TOPIC_XXXX", b"ringfuzz\n",
                   b"RMQ_SYS_TRANS_HALF_TOPIC", b"RMQ_SYS_TRANS_OP_HALF_TOPIC"]
_HOSTILE_PROPS = [b"A\x01\xff\x02", b"A\x01b", b"\x01b\x02", b"REAL_TOPIC\x01../x\x02", b"DELAY\x01-1\x02",
                  b"A\x01b\x01c\x02", b"\x02\x02", b"TAGS\x01" + b"t" * 40_000 + b"\x02"]


def _record(rng: random.Random, body_bytes: int | None = None) -> bytearray:
    body = rng.randbytes(body_bytes if body_bytes is not None else rng.randint(1, 300))
    props = rng.choice([b"", b"TAGS\x01a\x02", b"KEYS\x01k1 k2\x02UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x01" + b"A" * 32 + b"\x02"])
    return bytearray(R.encode_record(TOPIC, body, props, queue_id=rng.randint(0, 1)))


def _flip(rng: random.Random, b: bytearray, count: int) -> bytearray:
    for _ in range(count):
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    return b


def make_case(rng: random.Random) -> tuple[str, int, int, bytes, str]:
    """``(kind, frame kind, record count, payload, what)``: one hostile (or honest) frame."""
    k = rng.randrange(10)
    if k == 0:
        return "honest", R.FRAME_MESSAGE, 1, bytes(_record(rng)), "a valid record"
    if k == 1:
        rec = _record(rng)
        return "flip", R.FRAME_MESSAGE, 1, bytes(_flip(rng, rec, rng.randint(1, 4))), "bit flips in a record"
    if k == 2:
        n = rng.randint(2, 20)
        recs = [_record(rng, 64) for _ in range(n)]
        blob = bytearray(b"".join(recs))
        return "batch", R.FRAME_BATCH, n, bytes(_flip(rng, blob, rng.randint(0, 3))), "a batch with bit flips"
    if k == 3:
        rec = _record(rng)
        R.SIZE_MAGIC.pack_into(rec, 0, rng.choice([0, 8, 90, len(rec) - 1, len(rec) + 1, 1 << 30, -5]),
                               R.MAGIC_CODE)
        return "size", R.FRAME_MESSAGE, 1, bytes(rec), "TOTALSIZE lies"
    if k == 4:
        topic = rng.choice(_HOSTILE_TOPICS)
        try:
            rec = R.encode_record(topic, b"hostile topic", b"", queue_id=0)
        except HostMQError:
            rec = bytes(_record(rng))
        return "topic", R.FRAME_MESSAGE, 1, rec, f"topic {topic[:20]!r}"
    if k == 5:
        props = rng.choice(_HOSTILE_PROPS)
        try:
            rec = R.encode_record(TOPIC, b"hostile properties", props, queue_id=0)
        except HostMQError:
            rec = bytes(_record(rng))
        return "props", R.FRAME_MESSAGE, 1, rec, f"properties {props[:20]!r}"
    if k == 6:
        n = rng.randint(1, 3)
        return "random", R.FRAME_BATCH, n, rng.randbytes(rng.randint(n * R.MIN_RECORD_BYTES, 2000)), "random bytes"
    if k == 7:
        rec = _record(rng)
        at = R.FIELD["queue_id"]
        rec[at:at + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\x00\x00\x10\x00"])
        return "queue", R.FRAME_MESSAGE, 1, bytes(rec), "impossible queue id"
    if k == 8:
        return "race", R.FRAME_MESSAGE, 1, bytes(_record(rng, 128)), "bytes rewritten after publishing"
    return "header", R.FRAME_MESSAGE, 1, bytes(_record(rng)), "impossible frame header or cursor"


class _Player:
    """Plays cases through one producer session at a time (a new one after the writer drops it)."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.session: ProducerSession | None = None
        self.seq = 0

    def _fresh(self) -> ProducerSession:
        if self.session is None or self.session.ring.dropped:
            if self.session is not None:
                self.session.broken = ConnectError("dropped by the writer")
                self.session.close()
            inst = self.producer.instance
            self.session = ProducerSession(inst, "broker-a", inst.broker_address("broker-a"),
                                           data_bytes=1 << 16, completion_entries=64, spin_s=0.0)
        return self.session

    def play(self, rng: random.Random, case) -> str:
        kind, fkind, count, payload, _ = case
        s = self._fresh()
        ring = s.ring
        self.seq += 1
        if kind == "header":
            return self._bad_header(rng, s)
        if len(payload) > ring.max_payload_bytes or not ring.try_write(fkind, self.seq, payload, count):
            ring.completions()
            return "skipped"
        stop = threading.Event()
        t = None
        if kind == "race":
            size = (R.FRAME_HEADER.size + len(payload) + 7) & ~7
            off = (ring._wpos - size) & ring._mask
            view = ring._data[off + R.FRAME_HEADER.size:off + R.FRAME_HEADER.size + len(payload)]
            t = threading.Thread(target=_rewrite, args=(view, rng.randrange(1 << 30), stop), daemon=True)
            t.start()
        try:
            notify_if_waiting(ring.writer_waiting, s.wake)
            return self._answer(s)
        finally:
            stop.set()
            if t is not None:
                t.join()

    def _bad_header(self, rng: random.Random, s: ProducerSession) -> str:
        ring = s.ring
        if rng.random() < 0.5:
            R.FRAME_HEADER.pack_into(ring._data, ring._wpos & ring._mask, rng.choice([0, 1, 23, 1 << 30]),
                                     rng.choice([0, 1, 2, 3, 99]), self.seq, rng.choice([0, 1, 7, 1 << 31]), 0)
            ring._q[R.RING_WORD["data_write_pos"]] = ring._wpos + 64
        else:
            ring._q[R.RING_WORD["data_write_pos"]] = rng.choice([-8, ring._wpos + 3, ring._wpos + (1 << 40)])
        notify_if_waiting(lambda: True, s.wake)
        return self._answer(s)

    def _answer(self, s: ProducerSession) -> str:
        ring = s.ring
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while time.monotonic() < deadline:
            if ring.dropped:
                return "dropped"
            comps = ring.completions()
            if len(comps):
                st = int(comps[-1]["status"])
                return "stored" if st >= 0 else "refused"
            time.sleep(0.0002)
        return "hang"


def _rewrite(view, seed: int, stop: threading.Event) -> None:
    rng = random.Random(seed)
    n = len(view)
    while not stop.is_set():
        view[rng.randrange(n)] ^= 1 << rng.randrange(8)


def run(workdir: str, cases: int, seed: int) -> list[FuzzResult]:
    """``cases`` hostile frames against a broker started under a fresh root (see the module doc)."""
    rng = random.Random(seed)
    os.makedirs(workdir, exist_ok=True)
    root = tempfile.mkdtemp(prefix="hqrf-", dir="/tmp")           # socket paths stay short
    failures: list[str] = []
    outcomes: Counter = Counter()
    t0 = time.monotonic()
    write_pos = 0
    try:
        with LocalCluster(root, config=CONFIG), Producer(root, retries=0) as good, Admin(root) as admin:
            admin.create_topic(TOPIC.decode(), queues=2)
            good.send(Message(TOPIC.decode(), b"warm-up"))
            pids = admin.brokers()[0]["pids"]
            player = _Player(good)
            for i in range(cases):
                case = make_case(rng)
                outcome = player.play(rng, case)
                outcomes[outcome] += 1
                if outcome == "hang":
                    failures.append(f"case {i} ({case[4]}): no answer and no drop within {ANSWER_TIMEOUT_S:.0f} s")
                if i % CHECK_EVERY == CHECK_EVERY - 1 or i == cases - 1:
                    failures += _check_servers(admin, good, pids, i)
                    if len(failures) > 20:
                        break
            write_pos = admin.brokers()[0]["state"]["write_pos"]
            if player.session is not None:
                player.session.broken = ConnectError("done")
                player.session.close()
        failures += _check_store(root, write_pos)
        failures += _outside(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    log.info("ring fuzz: %d cases, outcomes %s", cases, dict(outcomes))
    return [FuzzResult("ring", cases, failures, time.monotonic() - t0)]


def _check_servers(admin: Admin, good: Producer, pids: dict, i: int) -> list[str]:
    out = []
    try:
        now = admin.brokers()[0]["pids"]
        if now != pids:
            out.append(f"after case {i}: a broker process restarted ({pids} -> {now})")
        good.send(Message(TOPIC.decode(), b"honest after %d" % i), timeout=10.0)
    except HostMQError as e:
        out.append(f"after case {i}: the well-behaved producer was not served: {e}")
    return out


def _check_store(root: str, write_pos: int) -> list[str]:
    """Abnormal recovery (every CRC checked) must keep everything the broker wrote."""
    store = RootPaths(root).store_dir("broker-a")
    open(os.path.join(store, "abort"), "wb").close()
    try:
        with MessageStore(store, CONFIG["store"]) as s:
            if s.recovery.commitlog_max_offset != write_pos:
                return [f"abnormal recovery kept {s.recovery.commitlog_max_offset} bytes of the {write_pos} "
                        f"the broker wrote: something it stored does not pass the checks"]
    except HostMQError as e:
        return [f"the store does not open after the run: {e}"]
    return []


def _outside(root: str) -> list[str]:
    parent = os.path.dirname(root)
    return [f"a file was created outside the root: {os.path.join(parent, n)}"
            for n in os.listdir(parent) if "PWNED" in n]
