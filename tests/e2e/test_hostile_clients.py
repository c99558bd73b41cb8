"""No local client can corrupt the store or stop a server (issue 15, items 2, 3, 4, 9).

Each test plays a hostile or buggy producer against a real broker: it changes ring bytes after
publishing them, hands over rings that could be truncated, registers a ring twice, closes or floods
sessions that are not its own, sends properties no decoder accepts — and checks that the broker's
processes never restart, that nothing bad reaches the commitlog or the file system, and that a
well-behaved producer is served all along.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import hostmq
from hostmq import Message
from hostmq import records as R
from hostmq.ingress.session import ProducerSession
from hostmq.errors import BrokerBusyError, ConnectError, ValidationError
from hostmq.protocol import session as P
from hostmq.live.state import BrokerState
from hostmq.root import RootPaths, shm_name
from hostmq.ingress.ring import IngressRing
from hostmq.shm import FutexWord, Segment, notify_if_waiting
from hostmq.store import MessageStore
from tests.e2e.conftest import sessions_settled
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(180)


def _pids(root: str) -> dict:
    with hostmq.Admin(root) as a:
        return dict(a.brokers()[0]["pids"])


def _completion(ring: IngressRing, timeout_s: float = 10.0):
    return wait_until(lambda: (lambda c: c if len(c) else None)(ring.completions()), timeout_s, "a completion")


def _raw_open(root: str, ring: IngressRing, label: str = "ring.raw") -> tuple[socket.socket, dict]:
    """Open a session by hand over session.sock (the client keeps the ring's descriptor); the reply
    carries ``doorbell`` (a FutexWord) when the session was opened."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(10)
    s.connect(RootPaths(root).broker_session_socket("broker-a"))
    socket.send_fds(s, [P.OpenSession(label).encode()], [ring.segment.fd])
    msg, fds, _, _ = socket.recv_fds(s, 4096, 1)
    reply = P.decode_reply(msg)
    for fd in fds:
        seg = Segment.from_fd(fd, R.DOORBELL_KIND, R.DOORBELL_VERSION)
        reply["doorbell"] = FutexWord(seg.array(np.int64, 1), R.DOORBELL_WRITER_WORD)
        os.close(fd)
    return s, reply


def _session(producer: hostmq.Producer, **kw) -> ProducerSession:
    inst = producer.instance
    return ProducerSession(inst, "broker-a", inst.broker_address("broker-a"), data_bytes=kw.get("data_bytes", 1 << 16),
                           completion_entries=64, spin_s=0.0)


def _close(session: ProducerSession) -> None:
    session.broken = ConnectError("test done")
    session.close()


def test_bytes_changed_after_publishing_never_reach_the_store_unchecked(cluster):
    """Item 2: the writer copies a frame before it validates it. A producer that keeps rewriting its
    published frames (topic to ``../../PWNED``, body bits) gets each frame either refused or stored
    exactly as checked: every stored record passes its CRC, no file appears outside the root, the
    dispatcher keeps running, and a well-behaved producer is served throughout."""
    c = cluster()
    root = c.root
    with hostmq.Producer(root) as good:
        good.send(Message("hostile", b"warm-up"))
        before = _pids(root)
        rogue = _session(good)
        ring, stop = rogue.ring, threading.Event()
        rec = R.encode_record(b"hostile", b"B" * 64, b"", queue_id=0)
        evil_topic = b"../../PWNED"[:len(b"hostile")]              # same length: only the bytes change
        tpos = R.MSG_HEADER.size + 64 + 1
        statuses = []
        try:
            for seq in range(300):
                assert ring.try_write(R.FRAME_MESSAGE, seq, rec, 1)
                pos = (ring._wpos - ((R.FRAME_HEADER.size + len(rec) + 7) & ~7)) & ring._mask
                payload = ring._data[pos + R.FRAME_HEADER.size:pos + R.FRAME_HEADER.size + len(rec)]

                def flip(payload=payload):
                    i = 0
                    while not stop.is_set() and i < 2000:
                        payload[tpos:tpos + len(evil_topic)] = evil_topic if i % 2 else b"hostile"
                        payload[R.MSG_HEADER.size + (i % 64)] ^= 0x01
                        i += 1
                t = threading.Thread(target=flip)
                t.start()
                notify_if_waiting(ring.writer_waiting, rogue.wake)
                statuses += [int(s) for s in _completion(ring)["status"]]
                t.join()
                del payload
                if seq % 50 == 0:
                    assert good.send(Message("hostile", b"honest %d" % seq)).status == hostmq.SendStatus.SEND_OK
        finally:
            stop.set()
            _close(rogue)
        assert set(statuses) <= {R.COMPLETION_SEND_OK, R.COMPLETION_BAD_RECORD, R.COMPLETION_NO_TOPIC}
        assert R.COMPLETION_BAD_RECORD in statuses or R.COMPLETION_NO_TOPIC in statuses
        assert good.send(Message("hostile", b"after")).status == hostmq.SendStatus.SEND_OK
    assert _pids(root) == before                                  # no server process restarted
    with hostmq.Admin(root) as a:
        write_pos = a.brokers()[0]["state"]["write_pos"]
    c.stop()
    parent = os.path.dirname(root)
    assert not any("PWNED" in d or "PWNED" in f for d, _, fs in os.walk(parent) for f in fs + [d])
    store = RootPaths(root).store_dir("broker-a")
    open(os.path.join(store, "abort"), "wb").close()               # abnormal recovery checks every CRC
    with MessageStore(store) as s:                                # sizes from the store's store.json
        assert s.recovery.abnormal and s.recovery.commitlog_max_offset == write_pos   # nothing cut
        bodies = [m.body for q in range(4) for m in s.get("hostile", q, 0, max_count=4096).messages]
    assert b"after" in bodies and b"warm-up" in bodies
    assert all(b == b"B" * 64 or b.startswith((b"honest", b"warm-up", b"after")) for b in bodies)


def test_a_ring_that_could_be_truncated_is_refused_and_a_sealed_one_cannot_be(cluster):
    """Item 3: truncating a ring under the writer killed it with SIGBUS. Rings are memfds sealed
    against shrinking: the broker refuses anything else, and the seal refuses the truncation."""
    c = cluster()
    root = c.root
    with hostmq.Producer(root) as good:
        good.send(Message("sealed", b"warm-up"))
        before = _pids(root)
        # An unsealed memfd, a regular file and a named POSIX segment are refused.
        unsealed = os.memfd_create("unsealed", os.MFD_ALLOW_SEALING)
        os.ftruncate(unsealed, 1 << 20)
        plain = os.open(os.path.join(root, "plain"), os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(plain, 1 << 20)
        for fd in (unsealed, plain):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.settimeout(10)
            s.connect(RootPaths(root).broker_session_socket("broker-a"))
            socket.send_fds(s, [P.OpenSession("ring.bad").encode()], [fd])
            reply = P.decode_reply(s.recv(4096))
            assert reply["ok"] is False and reply["error"] == "invalid", reply
            s.close()
            os.close(fd)
        # A sealed ring: registered, and the client's own descriptor cannot shrink it.
        ring = IngressRing.create("ring.sealed", 1 << 16, 64)
        s, reply = _raw_open(root, ring)
        assert reply["ok"], reply
        with pytest.raises(PermissionError):
            os.ftruncate(ring.segment.fd, 4096)
        rec = R.encode_record(b"sealed", b"still served", b"", queue_id=0)
        assert ring.try_write(R.FRAME_MESSAGE, 1, rec, 1)
        s.close()                                              # ends the session; the writer drains it
        assert good.send(Message("sealed", b"after")).status == hostmq.SendStatus.SEND_OK
        ring.close()
    assert _pids(root) == before


def test_sessions_belong_to_their_connection_and_clients_are_capped(cluster):
    """Item 4: a client could register another's ring twice, close another's session, or take every
    slot. Now a ring is registered once, only its own connection ends a session, a client process
    holds at most ``max_sessions_per_client`` sessions, and a dead client's slots come back."""
    c = cluster(broker={"max_sessions_per_client": 3, "session_handshake_timeout_s": 0.5})
    root = c.root
    with hostmq.Producer(root) as good, hostmq.Admin(root) as admin:
        good.send(Message("caps", b"warm-up"))
        base = sessions_settled(admin)                   # the scheduler's and the good producer's
        ring = IngressRing.create("ring.twice", 1 << 16, 64)
        s1, r1 = _raw_open(root, ring)
        assert r1["ok"]
        s2, r2 = _raw_open(root, ring)                    # the same ring again
        assert not r2["ok"] and "already registered" in r2["message"]
        # "close" on a connection that opened nothing is refused; the real session is untouched.
        s3 = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s3.settimeout(10)
        s3.connect(RootPaths(root).broker_session_socket("broker-a"))
        s3.send(P.CloseSession().encode())
        assert P.decode_reply(s3.recv(4096))["error"] == "invalid"
        rec = R.encode_record(b"caps", b"mine", b"", queue_id=0)
        assert ring.try_write(R.FRAME_MESSAGE, 7, rec, 1)
        notify_if_waiting(lambda: True, r1["doorbell"])
        comp = _completion(ring)
        assert int(comp[0]["seq"]) == 7 and int(comp[0]["status"]) == R.COMPLETION_SEND_OK
        # This process already holds the good producer's session and s1: one more, then "busy".
        extra = IngressRing.create("ring.extra", 1 << 16, 64)
        s4, r4 = _raw_open(root, extra)
        assert r4["ok"]
        ring5 = IngressRing.create("ring.five", 1 << 16, 64)
        s5, r5 = _raw_open(root, ring5)
        assert not r5["ok"] and r5["error"] == "busy" and "max_sessions_per_client" in r5["message"]
        with pytest.raises(BrokerBusyError):
            _session(good)
        # Another process is still served.
        out = subprocess.run([sys.executable, "-c", _SEND_ONE, root], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "SEND_OK" in out.stdout, out.stderr[-2000:]
        # A connection that never opens a session is closed after the handshake timeout.
        idle = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        idle.settimeout(10)
        idle.connect(RootPaths(root).broker_session_socket("broker-a"))
        assert P.decode_reply(idle.recv(4096))["error"] == "invalid"
        for sock in (s1, s2, s3, s4, s5, idle):
            sock.close()
        for r in (ring, extra, ring5):
            r.close()
        wait_until(lambda: admin.brokers()[0]["sessions"] == base, 10, "closed sessions to be freed")
        refused = admin.brokers()[0]["state"]["sessions_refused"]
        assert refused >= 4
        # A client killed while holding sessions gives them back.
        p = subprocess.Popen([sys.executable, "-c", _HOLD_SESSIONS, root], stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline().strip() == "holding"
            assert admin.brokers()[0]["sessions"] == base + 3
        finally:
            p.kill()
            p.wait(30)
        wait_until(lambda: admin.brokers()[0]["sessions"] == base, 10, "a dead client's sessions to be freed")


_SEND_ONE = """
import sys, hostmq
with hostmq.Producer(sys.argv[1]) as p:
    print(p.send(hostmq.Message("caps", b"other process")).status.value)
"""

_HOLD_SESSIONS = """
import sys, time, hostmq
from hostmq.ingress.session import ProducerSession
p = hostmq.Producer(sys.argv[1]).start()
inst = p.instance
held = [ProducerSession(inst, "broker-a", inst.broker_address("broker-a"), data_bytes=1 << 16,
                        completion_entries=64, spin_s=0.0) for _ in range(3)]
print("holding", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("props, why", [
    (b"A\x01\xff\xfe\x02", "not UTF-8"),
    (b"A\x01b", "not end"),
    (b"\x01b\x02", "malformed"),
    (b"REAL_TOPIC\x01../../x\x02", "outside"),
    (b"DELAY\x01soon\x02", "integer"),
])
def test_records_with_properties_no_decoder_accepts_are_refused(cluster, props, why):
    """Item 9: a record with non-UTF-8 properties was acknowledged and then stalled every SQL92
    consumer of its queue. The writer refuses it; the broker and other producers carry on."""
    c = cluster()
    with hostmq.Producer(c.root) as good:
        good.send(Message("props", b"warm-up"))
        rogue = _session(good)
        try:
            rec = R.encode_record(b"props", b"body", props, queue_id=0)
            assert rogue.ring.try_write(R.FRAME_MESSAGE, 1, rec, 1)
            notify_if_waiting(rogue.ring.writer_waiting, rogue.wake)
            assert int(_completion(rogue.ring)[0]["status"]) == R.COMPLETION_BAD_RECORD
            ok = R.encode_record(b"props", b"body", b"A\x01b\x02", queue_id=0)
            batch = ok + R.encode_record(b"props", b"body", props, queue_id=0)
            assert rogue.ring.try_write(R.FRAME_BATCH, 2, batch, 2)          # one bad record spoils its batch
            notify_if_waiting(rogue.ring.writer_waiting, rogue.wake)
            assert int(_completion(rogue.ring)[0]["status"]) == R.COMPLETION_BAD_RECORD
        finally:
            _close(rogue)
        with pytest.raises(ValidationError):
            good.send(Message("props", b"x", properties={"REAL_TOPIC": "../../x"}))
        assert good.send(Message("props", b"fine")).status == hostmq.SendStatus.SEND_OK
    pc = hostmq.PullConsumer(c.root, group="g-props", consume_from=hostmq.ConsumeFrom.FIRST_OFFSET)
    try:
        pc.subscribe("props", hostmq.SQL("a IS NULL"))
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 2 and time.monotonic() < deadline:
            got += pc.poll(timeout=1.0)
        assert sorted(m.body for m in got) == [b"fine", b"warm-up"]
    finally:
        pc.close()


def test_a_session_closed_before_the_writer_saw_it_still_has_its_frames_appended(cluster):
    """A producer killed right after publishing its first frame: the broker sees the connection close
    before the writer ever attached the ring. The slot is freed only once the writer has drained it."""
    c = cluster()
    root = c.root
    with hostmq.Admin(root) as a:
        a.create_topic("early", queues=1)
        writer = a.brokers()[0]["pids"]["writer"]
        base = sessions_settled(a)                      # the scheduler's
        os.kill(writer, signal.SIGSTOP)
        try:
            ring = IngressRing.create("ring.early", 1 << 16, 64)
            s, reply = _raw_open(root, ring)
            assert reply["ok"]
            assert ring.try_write(R.FRAME_MESSAGE, 1, R.encode_record(b"early", b"published, then gone", b""), 1)
            s.close()                                       # the session ends; nobody has read the ring
            ring.close()
            st = BrokerState.attach(shm_name(root, "broker-a", "state"), readonly=True)
            try:
                slot = reply["slot"]
                wait_until(lambda: st.slot(slot)[0] == R.SLOT_CLOSING, 10, "the broker to see the close")
                end = time.monotonic() + 0.5                # several of the session server's 0.1 s turns
                while time.monotonic() < end:               # held until the writer has drained it
                    assert st.slot(slot)[0] == R.SLOT_CLOSING and a.brokers()[0]["sessions"] == base + 1
            finally:
                st.close()
        finally:
            os.kill(writer, signal.SIGCONT)
        wait_until(lambda: a.brokers()[0]["sessions"] == base, 10, "the drained session to be freed")
    pc = hostmq.PullConsumer(root, group="g-early", consume_from=hostmq.ConsumeFrom.FIRST_OFFSET)
    try:
        pc.subscribe("early", "*")
        got = wait_until(lambda: pc.poll(timeout=0.5), 20, "the message")
        assert [m.body for m in got] == [b"published, then gone"]
    finally:
        pc.close()


@pytest.mark.parametrize("write_pos", [-8, 3, 1 << 40])
def test_a_ring_corrupted_before_the_writer_attached_it_is_dropped_not_left_hanging(cluster, write_pos):
    """Found by the ring fuzzer on a loaded machine: a producer that wrote an impossible cursor right
    after registering, before the writer attached its ring, was neither served nor dropped (the attach
    failed its checks and the writer left the session ACTIVE): its sends waited forever. The writer
    must drop such a ring and wake its producer, and keep serving everyone else."""
    c = cluster()
    with hostmq.Producer(c.root) as good:
        good.send(Message("early", b"warm-up"))
        writer = _pids(c.root)["writer"]
        os.kill(writer, signal.SIGSTOP)
        try:
            rogue = _session(good)
            rogue.ring._q[R.RING_WORD["data_write_pos"]] = write_pos    # before the writer ever looked
            assert not rogue.ring.dropped
        finally:
            os.kill(writer, signal.SIGCONT)
        try:
            wait_until(lambda: rogue.ring.dropped, 10, "the writer to drop the ring")
            assert good.send(Message("early", b"still served")).status == hostmq.SendStatus.SEND_OK
        finally:
            _close(rogue)
        assert _pids(c.root)["writer"] == writer


def test_a_dropped_ring_gets_no_phantom_completion_and_its_sends_fail_at_once(cluster):
    """The writer wakes a waiting producer when it drops its ring; the wake must not move the
    completion cursor (it did: the producer then read a stale completion slot as an answer), and a
    send waiting on that session fails with ConnectError at once, not at its next liveness check."""
    c = cluster()
    with hostmq.Producer(c.root) as good:
        good.send(Message("drops", b"warm-up"))
        rogue = _session(good)
        ring = rogue.ring
        try:
            published = ring._q[R.RING_WORD["completion_write_pos"]]
            ring.producer_waiting.set()                   # as if a send were sleeping on its answer
            R.FRAME_HEADER.pack_into(ring._data, ring._wpos & ring._mask, 1 << 30, R.FRAME_MESSAGE, 9, 1, 0)
            ring._q[R.RING_WORD["data_write_pos"]] = ring._wpos + 64
            notify_if_waiting(ring.writer_waiting, rogue.wake)
            wait_until(lambda: ring.dropped, 10, "the writer to drop the ring")
            assert ring._q[R.RING_WORD["completion_write_pos"]] == published
            assert len(ring.completions()) == 0
            ring.producer_waiting.clear()
            rogue._next_check = time.monotonic() + 3600   # no liveness check due: the drop alone must tell
            with pytest.raises(ConnectError, match="dropped"):
                rogue._check_alive(time.monotonic())
        finally:
            _close(rogue)
