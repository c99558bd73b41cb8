"""The control-frame fuzzer: random and hostile control messages against a live broker and NameServer.

``run(workdir, cases, seed)`` starts a ``LocalCluster`` (one NameServer, one broker) under a short
root, makes a topic with a few messages and a live consumer (so cases can name real topics, message
ids and another client's id), then sends ``cases`` messages from ``frame_cases`` over zmq DEALER
sockets — each case to the broker or the NameServer, a fresh connection now and then — in batches.
After every batch it checks what the issue promises:

* both servers still answer PING (a hang is a failure line) and their processes are alive (a crash
  is a failure line, with the tail of its log); the broker's children were not restarted;
* every answer the fuzzing sockets got is a well-formed response frame.

A batch that breaks a promise is reported with the seed and the cases it held (so ``run`` with the
same seed reproduces it), and the cluster is started again on a fresh root (at most MAX_RESTARTS
times). Returns one FuzzResult per server: ``frames:broker`` and ``frames:namesrv``.

Unix socket paths must stay under 107 bytes: a ``workdir`` whose root would be too long is replaced
by a directory under /tmp (removed afterwards).
"""
from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
import time

import zmq

from ..remoting import RemotingClient
from ..cluster import LocalCluster
from ..errors import HostMQError, ProtocolError
from ..protocol.codes import RequestCode, ResponseCode
from ..protocol.frames import decode, encode_request
from ..root import RootPaths, ipc_address
from . import FuzzResult
from .frame_cases import Case, Known, make_case

log = logging.getLogger(__name__)

BATCH = 64                  # cases between two health checks
NEW_CONNECTION_EVERY = 16   # cases per DEALER identity
PING_TIMEOUT_S = 20.0       # a server that does not answer within this is hung (loaded machines are slow)
MAX_RESTARTS = 3
MAX_ROOT_CHARS = 60         # leaves room for brokers/NAME/broker.sock within the 107-byte limit
CHILDREN = ("writer_pid", "dispatcher_pid", "flusher_pid", "scheduler_pid")
SERVERS = ("broker", "namesrv")
SENTINEL_ID = 1 << 62       # request ids of the fuzzer's own PINGs (cases use random ids, rarely this high)

CONFIG = {
    "namesrv": {"scan_interval_s": 1.0, "broker_expiry_s": 30.0},
    "broker": {"register_interval_s": 1.0},
    "store": {"commitlog_file_bytes": 4 << 20, "consume_queue_file_entries": 4000, "index_slots": 1000,
              "index_entries": 8000},
}


def run(workdir: str, cases: int, seed: int) -> list[FuzzResult]:
    """Fuzz a fresh cluster with ``cases`` control messages from ``random.Random(seed)``."""
    base, made = _short_dir(workdir, seed)
    results = {s: FuzzResult(f"frames:{s}", 0) for s in SERVERS}
    t0 = time.monotonic()
    try:
        _fuzz(base, cases, seed, results)
    finally:
        for r in results.values():
            r.seconds = time.monotonic() - t0
        if made:
            shutil.rmtree(base, ignore_errors=True)
    return list(results.values())


def _short_dir(workdir: str, seed: int) -> tuple[str, bool]:
    os.makedirs(workdir, exist_ok=True)
    base = os.path.join(os.path.realpath(workdir), f"frames-{seed}")
    if len(base) + 8 <= MAX_ROOT_CHARS:
        os.makedirs(base, exist_ok=True)
        return base, False
    return tempfile.mkdtemp(prefix="hmqff-", dir="/tmp"), True


def _fuzz(base: str, cases: int, seed: int, results: dict[str, FuzzResult]) -> None:
    rng = random.Random(seed)
    done, restarts = 0, 0
    while done < cases:
        target = _Target(os.path.join(base, f"r{restarts}"))
        try:
            while done < cases:
                batch = [(done + i, rng.choice(SERVERS), make_case(rng, target.known))
                         for i in range(min(BATCH, cases - done))]
                broken = target.send_and_check(batch)
                for server in SERVERS:
                    results[server].cases += sum(1 for _, s, _ in batch if s == server)
                done += len(batch)
                if broken:
                    _report(results, broken, batch, seed)
                    break
        finally:
            target.close()
        if done < cases:
            restarts += 1
            if restarts > MAX_RESTARTS:
                results["broker"].failures.append(f"seed {seed}: stopped after {MAX_RESTARTS} restarts "
                                                  f"({done} of {cases} cases run)")
                return


def _report(results, broken: dict[str, str], batch, seed: int) -> None:
    for server, why in broken.items():
        held = [f"#{i} {c.describe()[:160]}" for i, s, c in batch if s == server]
        results[server].failures.append(f"seed {seed}, cases {batch[0][0]}..{batch[-1][0]}: {why}; "
                                        f"its cases: " + " | ".join(held))


def _answer(msg: list[bytes]):
    """(the decoded answer, "") or (None, what is wrong with it)."""
    try:
        frame = decode(msg)
    except ProtocolError as e:
        return None, f"an undecodable answer: {e}"
    if not frame.response:
        return None, f"a request instead of a response: {frame!r:.120}"
    return frame, ""


class _Target:
    """One cluster under fuzz, the fuzzing sockets, and the health checks."""

    def __init__(self, root: str) -> None:
        os.makedirs(root, exist_ok=True)
        self.cluster = LocalCluster(root, config=CONFIG).start()
        paths = RootPaths(root)
        self.addresses = {"broker": ipc_address(paths.broker_socket("broker-a")),
                          "namesrv": ipc_address(paths.namesrv_socket(0))}
        self.processes = {"broker": "broker-a", "namesrv": "namesrv-0"}
        self.ctx = zmq.Context()
        self.dealers: dict[str, zmq.Socket] = {}
        self.sent = 0
        self.consumer = None
        self.known = self._prepare(root)
        self.children = self._children()

    def _prepare(self, root: str) -> Known:
        import hostmq     # the public API: a topic, messages, and a live consumer whose id the cases use
        known = Known(addresses=list(self.addresses.values()))
        with hostmq.Admin(root) as a:
            queues = a.create_topic("fuzz", queues=4)
        with hostmq.Producer(root) as p:
            known.msg_ids = [p.send(hostmq.Message("fuzz", b"fuzz %d" % i, keys=[f"k{i}"])).msg_id for i in range(8)]
        self.consumer = hostmq.PullConsumer(root, group="victim")
        self.consumer.assign(queues)
        self.consumer.poll(0.1)
        with RemotingClient(self.addresses["broker"], timeout_s=PING_TIMEOUT_S) as c:
            known.client_ids = c.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                         {"group": "victim"}).fields["consumer_ids"] or ["nobody"]
        return known

    def _children(self) -> dict[str, int]:
        with RemotingClient(self.addresses["broker"], timeout_s=PING_TIMEOUT_S) as c:
            st = c.request(RequestCode.GET_BROKER_RUNTIME_INFO).fields["state"]
        return {k: st[k] for k in CHILDREN}

    def send_and_check(self, batch: list[tuple[int, str, Case]]) -> dict[str, str]:
        """Send one batch; {server: what broke} ({} when both servers kept every promise)."""
        broken: dict[str, str] = {}
        for _, server, case in batch:
            d = self.dealers.get(server)
            if d is not None and self.sent % NEW_CONNECTION_EVERY == 0:
                broken.setdefault(server, self._retire(server))
                d = None
            if d is None:
                d = self.dealers[server] = self.ctx.socket(zmq.DEALER)
                d.setsockopt(zmq.LINGER, 0)
                d.connect(self.addresses[server])
            self.sent += 1
            d.send_multipart(case.frames, copy=len(case.frames[0]) < 65536)
        for server in list(self.dealers):
            broken.setdefault(server, self._retire(server))
        for server in SERVERS:              # a crash or a hang explains a lost answer: it comes first
            broken[server] = self._health(server) or broken.get(server, "")
        return {s: why for s, why in broken.items() if why}

    def _retire(self, server: str) -> str:
        """Read every answer a fuzzing connection has coming, then close it; what was wrong, or "".

        A PING goes last: the server answers one connection in order, so once the PING's answer is
        in, so is every earlier one (a held pull answers later, never). An oversized case costs the
        connection, and the PING with it; it is sent again until answered or PING_TIMEOUT_S passes.
        """
        d = self.dealers.pop(server)
        try:
            deadline, sentinel = time.monotonic() + PING_TIMEOUT_S, 0
            while time.monotonic() < deadline:
                if self.cluster.processes[self.processes[server]].poll() is not None:
                    return ""                   # dead: the health check reports it
                sentinel += 1
                d.send_multipart(encode_request(RequestCode.PING, SENTINEL_ID + sentinel))
                while d.poll(1000):
                    frame, why = _answer(d.recv_multipart())
                    if why:
                        return why
                    if frame.request_id == SENTINEL_ID + sentinel and frame.code == ResponseCode.SUCCESS:
                        return ""
            return f"{self.processes[server]} did not answer a fuzzing connection's PING within {PING_TIMEOUT_S:g} s"
        finally:
            d.close(0)

    def _health(self, server: str) -> str:
        name = self.processes[server]
        proc = self.cluster.processes[name]
        if proc.poll() is not None:
            return f"{name} exited with {proc.returncode}:\n{self.cluster.log_tail(name, 15)}"
        try:
            with RemotingClient(self.addresses[server], timeout_s=PING_TIMEOUT_S) as c:
                if c.request(RequestCode.PING).code != ResponseCode.SUCCESS:
                    return f"{name} answered PING with an error"
                if server == "broker":
                    st = c.request(RequestCode.GET_BROKER_RUNTIME_INFO).fields["state"]
                    moved = {k: st[k] for k in CHILDREN if st[k] != self.children[k]}
                    if moved:
                        self.children = {k: st[k] for k in CHILDREN}
                        return f"broker children restarted: {moved}\n{self.cluster.log_tail(name, 15)}"
        except HostMQError as e:
            return f"{name} did not answer PING: {e}"
        return ""

    def close(self) -> None:
        for d in self.dealers.values():
            d.close(0)
        self.dealers.clear()
        self.ctx.term()
        if self.consumer is not None:
            try:
                self.consumer.close()
            except HostMQError as e:       # the broker may be the one that broke
                log.info("closing the fuzz consumer: %s", e)
        self.cluster.stop()


__all__ = ["run"]
