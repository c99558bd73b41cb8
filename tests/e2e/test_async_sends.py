"""``send_async``'s natural batching (hostmq/client/async_sends.py): a lone send goes out at once,
sends made while a frame is in flight share the next frame, and every message keeps its own
Future (a ``SendFuture`` view) and its own SendResult. The writer is paused with SIGSTOP to hold a
frame in flight — a real broker, a real pause."""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import threading

import pytest

import hostmq
from hostmq import Message, SendStatus
from hostmq.client.async_sends import SendFuture
from hostmq.errors import ConnectError, ValidationError
from tests.conftest import wait_until
from tests.e2e.conftest import check_results_name_their_messages, consume_all

pytestmark = pytest.mark.timeout(120)


def _writer_pid(root: str) -> int:
    with hostmq.Admin(root) as a:
        return a.brokers()[0]["pids"]["writer"]


@contextlib.contextmanager
def writer_paused(root: str):
    """The broker's writer stopped (SIGSTOP) for the block; continued after, whatever happens."""
    pid = _writer_pid(root)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):      # killed in the block
            os.kill(pid, signal.SIGCONT)


def test_a_burst_gets_one_result_per_message_and_every_message_arrives_once(cluster):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        a.create_topic("burst", queues=3)
    n = 3000
    with hostmq.Producer(c.root) as p:
        futs = [p.send_async(Message("burst", b"m%05d" % i, tags="t", keys=["k%d" % i] if i % 7 == 0 else ()))
                for i in range(n)]
        assert all(isinstance(f, concurrent.futures.Future) for f in futs)
        results = [f.result(30) for f in futs]
    by_body = check_results_name_their_messages(c.root, "burst", results)
    for i in range(n):
        m = by_body[b"m%05d" % i]
        assert m.tags == "t" and m.keys == (("k%d" % i,) if i % 7 == 0 else ())


def test_sends_made_while_a_frame_flies_share_the_next_frame(cluster):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        a.create_topic("flight", queues=4)
    with hostmq.Producer(c.root) as p:
        p.send(Message("flight", b"warm"))                    # route and session
        with writer_paused(c.root):
            first = p.send_async(Message("flight", b"first"))         # nothing in flight: out alone
            held = [p.send_async(Message("flight", b"held %d" % i)) for i in range(20)]
            with pytest.raises(concurrent.futures.TimeoutError):
                first.result(0.3)                              # the writer is stopped: no answer
            assert not first.done()
        results = [f.result(30) for f in held]
        r0 = first.result(30)
    # the 20 went out as one frame: one queue, consecutive offsets, not the first message's queue
    assert len({r.queue for r in results}) == 1 and results[0].queue != r0.queue
    assert [r.queue_offset for r in results] == list(range(results[0].queue_offset, results[0].queue_offset + 20))
    got = consume_all(c.root, "flight", 22)
    assert sorted(m.body for m in got) == sorted([b"warm", b"first"] + [b"held %d" % i for i in range(20)])


def test_a_lone_send_is_not_held_back_and_callbacks_run_once(cluster):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        a.create_topic("lone", queues=2)
    with hostmq.Producer(c.root) as p:
        seen: list = []
        done = threading.Event()
        f = p.send_async(Message("lone", b"alone"), callback=lambda f: (seen.append(f.result()), done.set()))
        assert done.wait(30)                    # nobody asked for the result: it went out anyway
        assert f.done() and seen == [f.result()] and f.result().status == SendStatus.SEND_OK
        late: list = []
        f.add_done_callback(late.append)        # on a finished future: at once, in this thread
        assert late == [f]
        # held behind a paused writer, answered once it runs, with nobody waiting on a result
        with writer_paused(c.root):
            fs = [p.send_async(Message("lone", b"cb %d" % i), callback=seen.append) for i in range(10)]
        wait_until(lambda: len(seen) == 11, 30, "every callback")
        assert sorted(id(x) for x in seen[1:]) == sorted(id(x) for x in fs)
        assert all(x.result().status == SendStatus.SEND_OK for x in fs)


def test_the_views_work_with_wait_as_completed_and_asyncio(cluster):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        a.create_topic("api", queues=2)
    with hostmq.Producer(c.root) as p:
        futs = [p.send_async(Message("api", b"a %d" % i)) for i in range(50)]
        done, not_done = concurrent.futures.wait(futs, timeout=30)
        assert not not_done and len(done) == 50
        more = [p.send_async(Message("api", b"b %d" % i)) for i in range(50)]
        assert {f.result().msg_id for f in concurrent.futures.as_completed(more, timeout=30)} == \
            {f.result().msg_id for f in more}
        assert not more[0].cancel() and not more[0].cancelled() and not more[0].running()
        assert "SendFuture" in repr(more[0])

        async def main() -> list:
            return await asyncio.gather(*(asyncio.wrap_future(p.send_async(Message("api", b"c %d" % i)))
                                          for i in range(20)))
        rs = asyncio.run(main())
        assert [r.status for r in rs] == [SendStatus.SEND_OK] * 20 and len({r.msg_id for r in rs}) == 20
        with pytest.raises(RuntimeError):
            futs[0].set_result(None)
    assert len(consume_all(c.root, "api", 120)) == 120


def test_a_bad_message_raises_in_the_caller_and_a_changed_message_changes_nothing_sent(cluster):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        a.create_topic("safe", queues=1)
    with hostmq.Producer(c.root) as p:
        p.send(Message("safe", b"warm"))
        with writer_paused(c.root):
            p.send_async(Message("safe", b"in flight"))
            m = Message("safe", b"original")
            f = p.send_async(m)                 # held in the open frame, already encoded
            m.body = b"changed afterwards"
            m.topic = "elsewhere"
            with pytest.raises(ValidationError):
                p.send_async(Message("safe", b""))             # empty body
            with pytest.raises(ValidationError):
                p.send_async(Message("bad topic!", b"x"))
            with pytest.raises(ValidationError):
                p.send_async(Message("safe", "not bytes"))     # a str body: the spec refuses it
        assert f.result(30).status == SendStatus.SEND_OK
    bodies = sorted(m.body for m in consume_all(c.root, "safe", 3))
    assert bodies == [b"in flight", b"original", b"warm"]


def test_a_broker_that_dies_fails_the_frames_in_flight_and_the_held_ones(cluster):
    c = cluster()
    with hostmq.Admin(c.root) as a:
        a.create_topic("gone", queues=1)
    with hostmq.Producer(c.root, send_timeout_s=5) as p:
        p.send(Message("gone", b"warm"))
        with writer_paused(c.root):
            fs = [p.send_async(Message("gone", b"x %d" % i)) for i in range(5)]
            c.signal_group("broker-a", signal.SIGKILL)
            c.processes["broker-a"].wait(30)
        for f in fs:                            # the one in flight and the four held behind it
            with pytest.raises(ConnectError):
                f.result(30)
        assert all(f.done() and isinstance(f.exception(), ConnectError) for f in fs)


def test_a_session_closed_from_its_own_completion_thread_ends_cleanly(cluster, caplog):
    """What a broken session's completion thread does when it publishes held async frames: the
    producer replaces the broken session, closing it from that very thread (it once tried to join
    itself, and the held messages failed with a RuntimeError instead of the broker's error)."""
    c = cluster()
    with hostmq.Admin(c.root) as a:
        a.create_topic("self", queues=1)
    with hostmq.Producer(c.root) as p:
        assert p.send_async(Message("self", b"x")).result(10).status == SendStatus.SEND_OK
        s = p._sessions["broker-a"]
        assert s._thread is not None and s._thread.is_alive()
        s.on_drained = lambda: s.close(0)
        s.wake_completion_thread()
        wait_until(lambda: s.closed and not s._thread.is_alive(), 15, "the session closed by its own thread")
        assert "after reading completions" not in caplog.text
        del p._sessions["broker-a"]             # the producer opens a new one for the next send
        assert p.send(Message("self", b"y")).status == SendStatus.SEND_OK
