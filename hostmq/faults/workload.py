"""The fault harness's load: producer and consumer processes that log every acknowledgement and receipt.

Each worker is its own OS process (``python -m hostmq.faults.workload producer|consumer ...``), so
killing or stopping one is a fault like any other, and what it logged survives it: every line is one
``os.write`` to a file opened with ``O_APPEND`` (the page cache keeps it when the process dies; a
line cut short by a kill is never a complete line and readers skip it). A restarted worker is a new
*incarnation* with a new name (``p1.3`` = worker p1, incarnation 3) and its own log file, so sequence
numbers never repeat and no two processes append to one file.

Message identity is carried in the body (:func:`encode_body`): run trial, producer incarnation, send
mode, sequence number and — for ordered sends — the ordering key and its per-key sequence. Every
message also has a unique key ``<producer>.<seq>`` (``Message.keys``) so it can be looked up by key.

Producers send with ``retries=0``: a message is handed to the broker at most once, so a second copy
in the commitlog is a broker bug — except a transaction that is committed twice because the broker
checked it back after the producer's own COMMIT was stored (RocketMQ's documented at-least-once),
which the logs account for: every COMMIT decision (the local transaction's and each check-back
answer) is logged.

Control (harness → worker, one line on stdin): ``go T`` (send messages of trial T), ``stop T`` (finish
what is in flight, answer ``done T`` on stdout), ``quit``. A worker prints ``ready`` once it can send
(producers) or has its queues (consumers).

Log lines (JSON, one object each; ``e`` is the event):

* ``ack``    a send was acknowledged: ``t`` trial, ``p`` producer, ``m`` mode, ``s`` seq, ``id`` message
  id (the stored record's; for a batch each message's own), ``q`` queue id, ``qo`` queue offset, ``st``
  send status, ``t0`` / ``t1`` wall-clock seconds at send start / acknowledgement, ``k`` / ``o``
  ordering key and its sequence; for ``tx`` the line is written by the local transaction when it
  decides COMMIT (the half is stored by then) and carries no id;
* ``fail``   a send raised (``err``); ``local`` a local transaction decided ``a`` (COMMIT/ROLLBACK);
  ``txend`` send_in_transaction returned (``id`` = the half's id, ``st`` its send status); ``check`` a
  check-back answered ``a``;
* ``recv``   (consumers) ``c`` consumer, ``t``/``p``/``m``/``s``/``k``/``o`` from the body, ``q``, ``qo``, ``ph``.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import orjson

BODY_MAGIC = b"hmqf"
MODES = ("sync", "async", "batch", "tx", "delay", "ordered")
# What each producer process sends by default (one thread per mode): three processes, so killing one
# producer stops only some kinds of sends.
DEFAULT_PRODUCERS = (("sync", "ordered"), ("async", "batch"), ("tx", "delay"))
# Messages per second per mode (a batch counts its messages); modest, so the harness fits 2 vCPUs.
DEFAULT_RATES = {"sync": 150, "async": 200, "batch": 160, "tx": 25, "delay": 40, "ordered": 120}
BATCH_MESSAGES = 8
ORDER_KEYS = 4                  # ordering keys per ordered producer incarnation
ASYNC_WINDOW = 32               # async sends in flight per producer
TX_ROLLBACK_EVERY = 8           # every 8th local transaction rolls back (must never be delivered)
DELAY_LEVEL = 1                 # 1 s with the default levels
DELAY_SEND_S = 0.5              # delay messages are sent only this long after ``go``, so they are due
                                # by the time the trial verifies (instead of making it wait a second)
PRODUCER_GROUP = "hmqf-p"
TX_GROUP = "hmqf-tx"
CONSUMER_GROUP = "hmqf-c"
SEND_TIMEOUT_S = 3.0
STOP_WAIT_S = 15.0              # a worker finishes in-flight sends within this (sends time out at 3 s)


# -- the message body (pure) -----------------------------------------------------------------------
def encode_body(trial: int, producer: str, mode: str, seq: int, okey: str = "", oseq: int = -1,
                size_bytes: int = 100) -> bytes:
    """``hmqf|trial|producer|mode|seq|okey|oseq|`` padded with dots to ``size_bytes``."""
    head = b"|".join([BODY_MAGIC, b"%d" % trial, producer.encode(), mode.encode(), b"%d" % seq,
                      okey.encode(), b"%d" % oseq, b""])
    return head + b"." * max(0, size_bytes - len(head))


def parse_body(body: bytes) -> tuple[int, str, str, int, str, int] | None:
    """``(trial, producer, mode, seq, okey, oseq)`` of a harness body, None for any other body."""
    parts = bytes(body).split(b"|")
    if len(parts) < 8 or parts[0] != BODY_MAGIC:
        return None
    try:
        return (int(parts[1]), parts[2].decode(), parts[3].decode(), int(parts[4]), parts[5].decode(),
                int(parts[6]))
    except (ValueError, UnicodeDecodeError):
        return None


def message_key(producer: str, seq: int) -> str:
    return f"{producer}.{seq}"


# -- log files --------------------------------------------------------------------------------------
class EventLog:
    """Append-only JSON lines; each line is one write(2), so a kill never leaves half a line that a
    later line completes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)

    def write(self, event: dict) -> None:
        os.write(self.fd, orjson.dumps(event) + b"\n")

    def write_many(self, events: list[dict]) -> None:
        if events:
            os.write(self.fd, b"".join(orjson.dumps(e) + b"\n" for e in events))

    def close(self) -> None:
        os.close(self.fd)


def read_events(path: str, offset: int = 0) -> tuple[list[dict], int]:
    """Complete lines of a log from ``offset``: ``(events, offset after the last complete line)``."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    events = []
    for line in data[:end].splitlines():
        try:
            events.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue            # cannot happen for our own whole lines; never trust a file blindly
    return events, offset + end


# -- worker processes ----------------------------------------------------------------------------------
class _Control:
    """The trial a worker's threads are sending for (None: paused), set from the stdin loop."""

    def __init__(self) -> None:
        self.trial: int | None = None
        self.since = 0.0                # when ``trial`` was set
        self.quit = threading.Event()
        self.changed = threading.Condition()

    def set(self, trial: int | None) -> None:
        with self.changed:
            self.trial = trial
            self.since = time.monotonic()
            self.changed.notify_all()

    def wait_trial(self) -> int | None:
        with self.changed:
            while self.trial is None and not self.quit.is_set():
                self.changed.wait(0.2)
            return self.trial


def _pace(next_t: float, rate: float) -> float:
    """Sleep until ``next_t`` (rate limiting, not synchronisation); the next send time."""
    delay = next_t - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    return max(next_t, time.monotonic() - 0.5) + 1.0 / rate


class ProducerProcess:
    """One producer process: a thread per send mode, each with its own producer (its own session)."""

    def __init__(self, root: str, name: str, modes: list[str], log_path: str, topic: str,
                 rates: dict[str, float], body_bytes: int) -> None:
        self.root, self.name, self.modes, self.topic = root, name, modes, topic
        self.rates, self.body_bytes = rates, body_bytes
        self.log = EventLog(log_path)
        self.log_dir = os.path.dirname(log_path)
        self.ctl = _Control()
        self.inflight = 0
        self._seq = 0
        self._decisions: dict[tuple[str, int], str] = {}       # tx: (producer, seq) → COMMIT/ROLLBACK
        self._loaded: set[str] = set()                        # earlier incarnations' logs read
        self._okeys = {i: 0 for i in range(ORDER_KEYS)}
        self.clients: list = []

    # -- bookkeeping shared by the modes ---------------------------------------------------------------
    def _begin(self) -> tuple[int, int] | None:
        """``(trial, seq)`` of the next send, counted in flight; None once paused or quitting."""
        with self.ctl.changed:
            if self.ctl.trial is None:
                return None
            self.inflight += 1
            self._seq += 1
            return self.ctl.trial, self._seq

    def _end(self) -> None:
        with self.ctl.changed:
            self.inflight -= 1
            self.ctl.changed.notify_all()

    def _ack(self, trial: int, mode: str, seq: int, r, t0: float, okey: str = "", oseq: int = -1,
             msg_id: str | None = None, queue_offset: int | None = None) -> dict:
        return {"e": "ack", "t": trial, "p": self.name, "m": mode, "s": seq, "id": msg_id or r.msg_id,
                "q": r.queue.queue_id, "qo": r.queue_offset if queue_offset is None else queue_offset,
                "st": r.status.value, "t0": t0, "t1": time.time(), "k": okey, "o": oseq}

    def _fail(self, trial: int, mode: str, seq: int, e: BaseException) -> None:
        self.log.write({"e": "fail", "t": trial, "p": self.name, "m": mode, "s": seq,
                        "err": f"{type(e).__name__}: {e}"[:300]})

    def _message(self, trial: int, mode: str, seq: int, okey: str = "", oseq: int = -1, delay: int = 0):
        from ..message import Message
        return Message(self.topic, encode_body(trial, self.name, mode, seq, okey, oseq, self.body_bytes),
                       keys=[message_key(self.name, seq)], delay_level=delay)

    # -- the modes: each sends one message (or batch) of ``trial`` --------------------------------------
    def send_sync(self, p, trial: int, seq: int) -> None:
        t0 = time.time()
        self.log.write(self._ack(trial, "sync", seq, p.send(self._message(trial, "sync", seq)), t0))

    def send_delay(self, p, trial: int, seq: int) -> None:
        t0 = time.time()
        r = p.send(self._message(trial, "delay", seq, delay=DELAY_LEVEL))
        self.log.write(self._ack(trial, "delay", seq, r, t0))

    def send_ordered(self, p, trial: int, seq: int) -> None:
        k = seq % ORDER_KEYS
        okey, oseq = f"{self.name}.k{k}", self._okeys[k]
        self._okeys[k] += 1
        t0 = time.time()
        r = p.send(self._message(trial, "ordered", seq, okey, oseq), sharding_key=okey)
        self.log.write(self._ack(trial, "ordered", seq, r, t0, okey, oseq))

    def send_batch(self, p, trial: int, seq: int) -> None:
        seqs = [seq] + [self._next_seq() for _ in range(BATCH_MESSAGES - 1)]
        t0 = time.time()
        r = p.send_batch([self._message(trial, "batch", s) for s in seqs])
        ids = r.msg_id.split(",")
        self.log.write_many([self._ack(trial, "batch", s, r, t0, msg_id=ids[i], queue_offset=r.queue_offset + i)
                             for i, s in enumerate(seqs)])

    def send_tx(self, p, trial: int, seq: int) -> None:
        r = p.send_in_transaction(self._message(trial, "tx", seq), local=self._local, arg=(trial, seq, time.time()))
        self.log.write({"e": "txend", "t": trial, "p": self.name, "s": seq, "id": r.msg_id,
                        "a": r.local_transaction_state.value, "st": r.status.value})

    def _next_seq(self) -> int:
        with self.ctl.changed:
            self._seq += 1
            return self._seq

    def send_async(self, p, trial: int, seq: int) -> None:
        while not self._window.acquire(timeout=0.2):
            if self.ctl.quit.is_set():
                self._end()
                return
        t0 = time.time()

        def done(f, trial=trial, seq=seq, t0=t0) -> None:
            try:
                e = f.exception()
                if e is None:
                    self.log.write(self._ack(trial, "async", seq, f.result(), t0))
                else:
                    self._fail(trial, "async", seq, e)
            finally:
                self._window.release()
                self._end()
        try:
            p.send_async(self._message(trial, "async", seq), callback=done)
        except BaseException:
            self._window.release()
            self._end()
            raise

    # -- transactions -------------------------------------------------------------------------------------
    def _local(self, msg, arg):
        """The local transaction: COMMIT (logged as the acknowledgement: the half is stored by now),
        or ROLLBACK for every TX_ROLLBACK_EVERY-th message."""
        from ..message import TransactionState
        trial, seq, t0 = arg
        answer = "ROLLBACK" if seq % TX_ROLLBACK_EVERY == 0 else "COMMIT"
        self._decisions[(self.name, seq)] = answer
        events = [{"e": "local", "t": trial, "p": self.name, "s": seq, "a": answer}]
        if answer == "COMMIT":
            events.append({"e": "ack", "t": trial, "p": self.name, "m": "tx", "s": seq, "id": None, "q": -1,
                           "qo": -1, "st": "SEND_OK", "t0": t0, "t1": time.time(), "k": "", "o": -1})
        self.log.write_many(events)
        return TransactionState[answer]

    def _check(self, m):
        """Check-back: what the local transaction of that message decided (any incarnation's log);
        ROLLBACK if it never decided and its process is gone."""
        from ..message import TransactionState
        parsed = parse_body(m.body)
        if parsed is None:
            return TransactionState.ROLLBACK
        trial, producer, _, seq, _, _ = parsed
        answer = self._decision(producer, seq)
        if answer is None:
            if producer == self.name:
                return TransactionState.UNKNOWN        # still deciding: ask again later
            answer = "ROLLBACK"
        self.log.write({"e": "check", "t": trial, "p": producer, "s": seq, "a": answer})
        return TransactionState[answer]

    def _decision(self, producer: str, seq: int) -> str | None:
        if producer != self.name and producer not in self._loaded and _safe_name(producer):
            self._loaded.add(producer)          # a dead incarnation's log is complete: read it once
            events, _ = read_events(os.path.join(self.log_dir, f"{producer}.log"))
            for ev in events:
                if ev.get("e") == "local":
                    self._decisions[(producer, ev["s"])] = ev["a"]
        return self._decisions.get((producer, seq))

    # -- running ------------------------------------------------------------------------------------------
    def _client(self, mode: str):
        from ..client.producer import Producer
        from ..client.transaction_producer import TransactionProducer
        if mode == "tx":
            c = TransactionProducer(self.root, group=TX_GROUP, checker=self._check, retries=0,
                                    send_timeout_s=SEND_TIMEOUT_S)
        else:       # async sends go through auto-batching: each one's own result is checked against the store
            c = Producer(self.root, group=PRODUCER_GROUP, retries=0, send_timeout_s=SEND_TIMEOUT_S,
                         auto_batch=mode == "async")
        self.clients.append(c.start())
        return c

    def _run_mode(self, mode: str, client) -> None:
        from ..errors import HostMQError
        send = getattr(self, f"send_{mode}")
        per_s = self.rates[mode] / (BATCH_MESSAGES if mode == "batch" else 1)
        next_t = time.monotonic()
        while not self.ctl.quit.is_set():
            if self.ctl.wait_trial() is None:
                continue
            next_t = _pace(max(next_t, time.monotonic() - 0.1), per_s)
            if mode == "delay" and time.monotonic() - self.ctl.since > DELAY_SEND_S:
                continue
            began = self._begin()
            if began is None:
                continue
            trial, seq = began
            try:
                send(client, trial, seq)
            except HostMQError as e:
                self._fail(trial, mode, seq, e)
                time.sleep(0.01)        # a broker that is down refuses fast; do not spin
            finally:
                if mode != "async":
                    self._end()

    def serve(self) -> int:
        self._window = threading.Semaphore(ASYNC_WINDOW)
        threads = [threading.Thread(target=self._run_mode, args=(m, self._client(m)), name=m, daemon=True)
                   for m in self.modes]
        for t in threads:
            t.start()
        _say("ready")
        for line in sys.stdin:
            cmd, _, arg = line.strip().partition(" ")
            if cmd == "go":
                self.ctl.set(int(arg))
            elif cmd == "stop":
                self.ctl.set(None)
                with self.ctl.changed:
                    self.ctl.changed.wait_for(lambda: self.inflight == 0, STOP_WAIT_S)
                    _say(f"done {arg} {self.inflight}")
            elif cmd == "quit":
                break
        self.ctl.quit.set()
        self.ctl.set(None)
        for t in threads:
            t.join(STOP_WAIT_S)
        for c in self.clients:
            c.shutdown()
        self.log.close()
        return 0


class ConsumerProcess:
    """One pull consumer reading every queue of the topic, logging each receipt before committing it
    (at least once: a consumer killed before it logged gets the messages again)."""

    def __init__(self, root: str, name: str, topic: str, log_path: str) -> None:
        self.root, self.name, self.topic = root, name, topic
        self.log = EventLog(log_path)
        self.quit = threading.Event()

    def _queues(self):
        from ..admin.admin import Admin
        from ..errors import HostMQError
        deadline = time.monotonic() + 60
        with Admin(self.root) as a:
            while True:
                try:
                    return a.route(self.topic)
                except HostMQError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)

    def _receipt(self, m) -> dict:
        parsed = parse_body(m.body)
        t, p, mode, s, k, o = parsed if parsed else (-1, "", "", -1, "", -1)
        return {"e": "recv", "c": self.name, "t": t, "p": p, "m": mode, "s": s, "k": k, "o": o,
                "q": m.queue_id, "qo": m.queue_offset, "ph": m.commitlog_offset}

    def _poll(self, c) -> None:
        from ..errors import HostMQError
        while not self.quit.is_set():
            try:
                msgs = c.poll(0.1)
                self.log.write_many([self._receipt(m) for m in msgs])
                if msgs:
                    c.commit()
            except HostMQError as e:
                self.log.write({"e": "error", "c": self.name, "err": f"{type(e).__name__}: {e}"[:300]})
                time.sleep(0.1)

    def serve(self) -> int:
        from ..client.pull_consumer import PullConsumer
        from ..message import ConsumeFrom
        c = PullConsumer(self.root, group=CONSUMER_GROUP, auto_commit=False,
                         consume_from=ConsumeFrom.FIRST_OFFSET, max_poll_records=256)
        c.assign(self._queues())
        t = threading.Thread(target=self._poll, args=(c,), daemon=True)
        t.start()
        _say("ready")
        for line in sys.stdin:
            if line.strip() == "quit":
                break
        self.quit.set()
        t.join(10)
        c.close()
        self.log.close()
        return 0


def _safe_name(name: str) -> bool:
    return bool(name) and len(name) < 64 and all(ch.isalnum() or ch in ".-_" for ch in name) and ".." not in name


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# -- entry point of a worker process -------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    import logging

    from ..process import set_parent_death_signal
    ap = argparse.ArgumentParser(prog="python -m hostmq.faults.workload")
    ap.add_argument("kind", choices=("producer", "consumer"))
    ap.add_argument("root")
    ap.add_argument("--name", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--modes", default="sync")
    ap.add_argument("--rates", default="{}", help="JSON {mode: messages per second}")
    ap.add_argument("--body-bytes", type=int, default=100)
    args = ap.parse_args(argv)
    set_parent_death_signal(9)          # a worker never outlives the harness
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.kind == "consumer":
        return ConsumerProcess(args.root, args.name, args.topic, args.log).serve()
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"unknown modes {bad}; known: {', '.join(MODES)}")
    rates = {**DEFAULT_RATES, **orjson.loads(args.rates)}
    return ProducerProcess(args.root, args.name, modes, args.log, args.topic, rates, args.body_bytes).serve()


if __name__ == "__main__":
    sys.exit(main())
