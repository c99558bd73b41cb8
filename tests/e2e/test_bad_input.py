"""Bad input gets a typed error or an error response, stores nothing, and every server keeps serving."""
from __future__ import annotations

import os

import pytest
import zmq

import hostmq
from hostmq import Message
from hostmq import records as R
from hostmq.errors import ConnectError, NoRouteError, ValidationError
from hostmq.protocol.codes import RequestCode, ResponseCode
from hostmq.protocol.frames import decode, encode_request
from hostmq.root import RootPaths, ipc_address
from hostmq.ingress.session import ProducerSession
from hostmq.shm import notify_if_waiting
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(120)


def write_pos(root: str) -> int:
    with hostmq.Admin(root) as a:
        return a.brokers()[0]["state"]["write_pos"]


def test_bad_messages_are_refused_before_anything_is_stored(cluster):
    c = cluster()
    with hostmq.Producer(c.root) as p:
        p.send(Message("good", b"first"))
        before = write_pos(c.root)
        bad = [Message("bad topic!", b"x"), Message("", b"x"), Message("t" * 200, b"x"),
               Message("good", b""), Message("good", b"x" * (5 << 20)), Message("good", "not bytes"),
               Message("good", b"x", properties={"p": "v" * 40_000}), Message("good", b"x", keys=["a b"]),
               Message("good", b"x", tags="a\x01b"), Message("SCHEDULE_TOPIC_XXXX", b"x"),
               Message("%RETRY%g", b"x"),
               # issue 31: RocketMQ's system topics and its putUserProperty rules
               Message("rmq_sys_x", b"x"), Message("TRANS_CHECK_MAX_TIME_TOPIC", b"x"), Message("CHECKPOINT_TOPIC", b"x"),
               Message("good", b"x", properties={"a": None}), Message("good", b"x", properties={None: "v"}),
               Message("good", b"x", properties={"a": ""}), Message("good", b"x", properties={"a": " \t"}),
               Message("good", b"x", properties={" ": "v"}), Message("good", b"x", tags="\ud800"),
               Message(["a", "list"], b"x"), Message(7, b"x"), Message(None, b"x")]
        for m in bad:
            with pytest.raises(ValidationError):
                p.send(m)
            with pytest.raises(ValidationError):         # the batch path (one native call) checks alike
                p.send_batch([m])
            with pytest.raises(ValidationError):         # and the async one (client/async_sends.py)
                p.send_async(m)
        # A name the system sets itself is refused by a typed error that names it: a TAGS property
        # would be written twice and match neither tag filter (the consume queue takes the first).
        for props, names in (({"TRACE_ON": "true"}, ("TRACE_ON",)), ({"TAGS": "x", "KEYS": "k"}, ("KEYS", "TAGS")),
                             ({R.PROP_UNIQ_KEY: "u", "ok": "v"}, (R.PROP_UNIQ_KEY,))):
            with pytest.raises(hostmq.ReservedPropertyError) as e:
                p.send(Message("good", b"x", tags="y", properties=props))
            assert e.value.names == names and all(n in str(e.value) for n in names)
        with pytest.raises(ValidationError):
            p.send_async(Message("good", b""))
        with pytest.raises(ValidationError):
            p.send_batch([Message("good", b"a"), Message("other", b"b")])
        with pytest.raises(ValidationError):
            p.send_batch([])
        with pytest.raises(ValidationError, match="hostmq.Message"):
            p.send_batch([b"not a message"])
        with pytest.raises(ValidationError):
            p.send(Message("good", b"x"), queue=hostmq.MessageQueue("other", "broker-a", 0))
        assert write_pos(c.root) == before
        assert p.send(Message("good", b"still fine")).status == hostmq.SendStatus.SEND_OK


def test_unknown_root_and_missing_servers_are_connect_errors(tmp_path):
    with pytest.raises(ConnectError, match="does not exist"):
        hostmq.Producer(str(tmp_path / "nowhere")).start()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConnectError, match="no NameServer"):
        hostmq.Producer(str(empty)).send(Message("t", b"x"))
    with pytest.raises(ConnectError):
        hostmq.Admin(str(tmp_path / "nowhere"))


def test_topic_missing_with_auto_create_off(cluster):
    c = cluster(broker={"auto_create_topic": False})
    with hostmq.Producer(c.root) as p:
        with pytest.raises(NoRouteError, match="auto_create_topic is disabled"):
            p.send(Message("nope", b"x"), timeout=2.0)


@pytest.mark.parametrize("server", ["namesrv", "broker"])
def test_garbage_frames_get_error_responses_and_the_server_keeps_serving(cluster, server):
    c = cluster()
    paths = RootPaths(c.root)
    sock = paths.namesrv_socket(0) if server == "namesrv" else paths.broker_socket("broker-a")
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.RCVTIMEO, 5000)
    dealer.connect(ipc_address(sock))
    try:
        junk = [[b"not json"], [b"{}"], [b"\xff" * 1000], [b'{"v": 99, "code": 105, "id": 1}'], [b"", b""],
                [b"[1, 2, 3]"], [b" " * (1 << 20)]]      # larger frames cost the connection: test_limits.py
        for frames in junk:
            dealer.send_multipart(frames)
            reply = decode(dealer.recv_multipart())
            assert reply.response and reply.code == ResponseCode.BAD_REQUEST
        bad_fields = [(RequestCode.PULL_MESSAGE, {"topic": 5}),
                      (900, {"name": "/etc", "pid": 1}),        # the old session request: no longer served
                      (RequestCode.UPDATE_CONSUMER_OFFSET, {"group": "g", "topic": "t", "queue_id": -1, "offset": 1}),
                      (RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "x y"}), (RequestCode.REGISTER_BROKER, {}),
                      (RequestCode.VIEW_MESSAGE_BY_ID, {"msg_id": "zz"}), (12345, {})]
        for i, (code, fields) in enumerate(bad_fields, 100):
            dealer.send_multipart(encode_request(code, i, fields))
            reply = decode(dealer.recv_multipart())
            assert reply.response and reply.request_id == i and reply.code != ResponseCode.SUCCESS, (code, reply)
        dealer.send_multipart(encode_request(RequestCode.PING, 7))
        assert decode(dealer.recv_multipart()).code == ResponseCode.SUCCESS
    finally:
        dealer.close()
        ctx.term()
    assert all(proc.poll() is None for proc in c.processes.values())
    with hostmq.Producer(c.root) as p:
        assert p.send(Message("after", b"ok")).status == hostmq.SendStatus.SEND_OK


def test_a_producer_writing_garbage_into_its_ring_harms_nobody_else(cluster):
    """A rogue producer: a record with a bad CRC is refused (BAD_RECORD), an impossible frame header
    gets its ring dropped; the writer keeps serving a well-behaved producer."""
    c = cluster()
    with hostmq.Producer(c.root) as good:
        good.send(Message("rogue", b"warm-up"))
        rogue = ProducerSession(good.instance, "broker-a", good.instance.broker_address("broker-a"),
                                data_bytes=64 * 1024, completion_entries=64, spin_s=0.0)
        ring, wake = rogue.ring, rogue.wake
        try:
            rec = bytearray(R.encode_record(b"rogue", b"payload", b"", queue_id=0))
            rec[R.MSG_HEADER.size] ^= 0xFF                     # body no longer matches its CRC
            assert ring.try_write(R.FRAME_MESSAGE, 1, bytes(rec), 1)
            notify_if_waiting(ring.writer_waiting, wake)
            comps = wait_until(lambda: _nonempty(ring.completions()), 10, "a completion")
            assert int(comps[0]["status"]) == R.COMPLETION_BAD_RECORD
            # The broker checks properties again (issue 31): a name twice, an empty value.
            for seq, props in ((2, b"TAGS\x01x\x02TAGS\x01y\x02"), (3, b"TAGS\x01x\x02k\x01\x02")):
                assert ring.try_write(R.FRAME_MESSAGE, seq, R.encode_record(b"rogue", b"p", props, queue_id=0), 1)
                notify_if_waiting(ring.writer_waiting, wake)
                comps = wait_until(lambda: _nonempty(ring.completions()), 10, "a completion")
                assert int(comps[0]["status"]) == R.COMPLETION_BAD_RECORD
            unknown = R.encode_record(b"no-such-topic", b"payload", b"", queue_id=0)
            assert ring.try_write(R.FRAME_MESSAGE, 4, unknown, 1)
            notify_if_waiting(ring.writer_waiting, wake)
            comps = wait_until(lambda: _nonempty(ring.completions()), 10, "a completion")
            assert int(comps[0]["status"]) == R.COMPLETION_NO_TOPIC
            # An impossible frame header: declared longer than the ring itself.
            R.FRAME_HEADER.pack_into(ring._data, ring._wpos & ring._mask, 1 << 30, R.FRAME_MESSAGE, 5, 1, 0)
            ring._q[R.RING_WORD["data_write_pos"]] = ring._wpos + 64
            notify_if_waiting(ring.writer_waiting, wake)
            wait_until(lambda: ring.dropped, 10, "the writer to drop the ring")
            assert good.send(Message("rogue", b"still served")).status == hostmq.SendStatus.SEND_OK
        finally:
            rogue.broken = ConnectError("dropped")          # nothing is pending: close without waiting
            rogue.close()
        with hostmq.Admin(c.root) as a:
            # Left: the good producer's session and the broker's own scheduler's.
            wait_until(lambda: a.brokers()[0]["sessions"] == 2, 10, "the dead session to be freed")


def _nonempty(arr):
    return arr if len(arr) else None
