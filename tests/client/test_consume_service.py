"""The push consumer's consume services and contexts without a cluster (``client.consume_service``,
``client.orderly``): a real consumer, not started, whose services are driven directly with stored
records — what a listener sees in its context and what what it sets there does to the send-backs
and the queue's suspension. tests/e2e/test_consume_context.py runs the same through brokers."""
from __future__ import annotations

import collections
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from hostmq import ConsumeResult, MessageExt, MessageModel, MessageQueue, ValidationError
from hostmq import records as R
from hostmq.client.consume_service import (ACK_ALL, INLINE_MAX_S, ConsumeConcurrentlyContext,
                                           ConsumeMessageConcurrentlyService, ConsumeOrderlyContext, SendBack,
                                           takes_context)
from hostmq.client.orderly import ConsumeMessageOrderlyService
from hostmq.client.process_queue import ProcessQueue
from hostmq.client.push_consumer import PushConsumer
from hostmq.protocol.messages import SendBackRequest
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(30)
MQ = MessageQueue("T", "broker-a", 1)


def stored(offsets) -> list[MessageExt]:
    return [MessageExt(R.encode_record(b"T", b"m%d" % off, R.encode_properties({}), queue_id=MQ.queue_id,
                                       queue_offset=off), broker=MQ.broker) for off in offsets]


def held(batch: list[MessageExt]) -> ProcessQueue:
    pq = ProcessQueue(0)
    pq.add([(m.queue_offset, 100) for m in batch], batch[-1].queue_offset + 1)
    return pq


def sent_back(c: PushConsumer) -> list[tuple]:
    out = []
    while True:
        try:
            out.append(c.failed.get_nowait())
        except queue.Empty:
            return out


def consumer(listener, orderly: bool = False, **kw) -> PushConsumer:
    c = PushConsumer(group="ctx-g", **kw)
    c.register(listener, orderly=orderly)
    return c


def test_listeners_with_and_without_a_context_parameter():
    class L:
        def one(self, msgs):
            return ConsumeResult.SUCCESS

        def two(self, msgs, context):
            return ConsumeResult.SUCCESS
    assert not takes_context(lambda msgs: None) and takes_context(lambda msgs, ctx: None)
    assert not takes_context(L().one) and takes_context(L().two)
    assert not takes_context(print)             # no signature to read: the one-argument call


def test_a_concurrent_listener_sees_its_queue_and_a_one_argument_listener_still_works():
    seen = []
    batch = stored([0, 1])
    c = consumer(lambda msgs, ctx: seen.append((list(msgs), ctx)) or ConsumeResult.SUCCESS)
    assert isinstance(c.service, ConsumeMessageConcurrentlyService) and c.orderly is None
    pq = held(batch)
    c.service.consume(MQ, pq, batch, 0)
    [(msgs, ctx)] = seen
    assert msgs == batch and isinstance(ctx, ConsumeConcurrentlyContext) and ctx.message_queue == MQ
    assert ctx.ack_index == ACK_ALL and ctx.delay_level_when_next_consume == 0
    assert pq.count == 0 and not sent_back(c)

    plain = []
    c = consumer(lambda msgs: plain.append(list(msgs)) or ConsumeResult.SUCCESS)
    pq = held(batch)
    c.service.consume(MQ, pq, batch, 0)
    assert plain == [batch] and pq.count == 0


@pytest.mark.parametrize("level", [0, 5, -1])
def test_delay_level_when_next_consume_is_the_send_back_level(level):
    def listener(msgs, ctx):
        ctx.delay_level_when_next_consume = level
        return ConsumeResult.RECONSUME_LATER
    c = consumer(listener, max_reconsume_times=7)
    batch = stored([3, 4])
    pq = held(batch)
    c.service.consume(MQ, pq, batch, 0)
    [(mq, got_pq, backs)] = sent_back(c)
    assert mq == MQ and got_pq is pq and pq.count == 2          # held until the send-back is stored
    assert backs == (SendBack(batch[0], level), SendBack(batch[1], level))
    assert backs[0].request("ctx-g", 7) == SendBackRequest(group="ctx-g", reconsume_times=0, max_reconsume_times=7,
                                                           delay_level=level)


def test_ack_index_acknowledges_part_of_a_successful_batch():
    def listener(msgs, ctx):
        ctx.ack_index = 0
        ctx.delay_level_when_next_consume = 4
        return ConsumeResult.SUCCESS
    c = consumer(listener)
    batch = stored([10, 11, 12])
    pq = held(batch)
    c.service.consume(MQ, pq, batch, 0)
    [(_, _, backs)] = sent_back(c)
    assert [b.msg for b in backs] == batch[1:] and {b.delay_level for b in backs} == {4}
    assert sorted(pq.held) == [11, 12] and pq.safe_offset() == 11


def test_a_context_field_of_the_wrong_type_fails_the_batch_at_the_brokers_back_off():
    def listener(msgs, ctx):
        ctx.ack_index, ctx.delay_level_when_next_consume = "all", "soon"
        return ConsumeResult.SUCCESS
    c = consumer(listener)
    batch = stored([0])
    c.service.consume(MQ, held(batch), batch, 0)
    [(_, _, backs)] = sent_back(c)
    assert backs == (SendBack(batch[0], 0),)


def test_a_broadcasting_failure_is_consumed_again_here_not_sent_back():
    calls = []
    c = consumer(lambda msgs, ctx: calls.append(ctx.message_queue) or ConsumeResult.RECONSUME_LATER,
                 model=MessageModel.BROADCASTING, retry_delay_s=0.05)
    c.pool = ThreadPoolExecutor(1)              # the listener pool start() would make
    batch = stored([0])
    pq = held(batch)
    try:
        c.service.consume(MQ, pq, batch, 0)
        wait_until(lambda: len(calls) >= 3, 5, "local retries")
    finally:
        c.stopping.set()
        c.service.shutdown()
        c.pool.shutdown(wait=True)
    assert set(calls) == {MQ} and not sent_back(c) and pq.count == 1     # never released, never sent back


# -- consume_first: the pull thread's hot path, the listener before the books -------------------------
def test_consume_first_calls_the_listener_then_only_moves_the_next_offset_past_a_consumed_batch():
    seen = []

    def listener(msgs):
        seen.append((list(msgs), pq.count, pq.next_offset))      # the books as the listener runs
        return ConsumeResult.SUCCESS
    c = consumer(listener, batch_size=4)
    batch = stored([5, 6, 7])
    pq = ProcessQueue(5)
    before = c.service.inline_batches
    assert c.service.consume_first(MQ, pq, batch, {MQ: 8}) is True
    assert seen == [(batch, 0, 5)] and c.service.inline_batches == before + 1
    assert pq.count == 0 and pq.next_offset == 8 and pq.safe_offset() == 8 and not sent_back(c)
    assert c.service.consume_first(MQ, pq, stored([8]), {MQ: 9}) and pq.safe_offset() == 9


@pytest.mark.parametrize("how", ["later", "raises", "ack_index", "wrong type"])
def test_consume_first_holds_what_was_not_consumed_until_it_is_sent_back(how):
    def listener(msgs, ctx):
        if how == "raises":
            raise RuntimeError("listener bug")
        if how == "ack_index":
            ctx.ack_index = 0
            return ConsumeResult.SUCCESS
        if how == "wrong type":
            ctx.ack_index = "all"
            return ConsumeResult.SUCCESS
        return ConsumeResult.RECONSUME_LATER
    c = consumer(listener, batch_size=4)
    batch = stored([20, 21, 22])
    pq = ProcessQueue(20)
    assert c.service.consume_first(MQ, pq, batch, {MQ: 23})
    [(mq, got_pq, backs)] = sent_back(c)
    failed = batch[1:] if how == "ack_index" else batch
    assert mq == MQ and got_pq is pq and [b.msg for b in backs] == failed
    assert sorted(pq.held) == [m.queue_offset for m in failed] and pq.next_offset == 23
    assert pq.safe_offset() == failed[0].queue_offset           # no commit passes a message not consumed


def test_consume_first_keeps_a_batch_held_when_its_books_fail_after_the_listener():
    class Unorderable(int):                     # an int the verdict cannot compare: a bug past the listener
        def __lt__(self, other):
            raise RuntimeError("cannot compare")
        __gt__ = __le__ = __ge__ = __lt__

    def listener(msgs, ctx):
        ctx.ack_index = Unorderable(5)
        return ConsumeResult.SUCCESS
    c = consumer(listener, batch_size=4)
    batch = stored([30, 31])
    pq = ProcessQueue(30)
    assert c.service.consume_first(MQ, pq, batch, {MQ: 32})     # logged; the pull thread goes on
    assert sorted(pq.held) == [30, 31] and pq.safe_offset() == 30 and not sent_back(c)


def test_consume_first_declines_what_the_pool_or_another_service_must_take():
    calls = []
    c = consumer(lambda msgs: calls.append(msgs) or ConsumeResult.SUCCESS, batch_size=2)
    pq = ProcessQueue(0)
    assert c.service.consume_first(MQ, pq, stored([0, 1, 2]), {MQ: 3}) is False      # more than one batch
    c.service._pooled = 1                       # a batch runs on the pool: order of hand-offs kept
    assert c.service.consume_first(MQ, pq, stored([0]), {MQ: 1}) is False
    c.service._pooled = 0
    c.stopping.set()
    assert c.service.consume_first(MQ, pq, stored([0]), {MQ: 1}) is False
    o = consumer(lambda msgs: calls.append(msgs) or ConsumeResult.SUCCESS, orderly=True)
    assert o.service.consume_first(MQ, pq, stored([0]), {MQ: 1}) is False            # orderly: queue locks first
    assert not calls and pq.count == 0 and pq.next_offset == 0
    slow = consumer(lambda msgs: time.sleep(2 * INLINE_MAX_S) or ConsumeResult.SUCCESS)
    assert slow.service.consume_first(MQ, pq, stored([0]), {MQ: 1})           # slow: half its calls so far
    assert slow.service.consume_first(MQ, pq, stored([1]), {MQ: 2}) is False   # so the pool takes the next


def test_send_back_refuses_bad_input():
    m = stored([0])[0]
    with pytest.raises(ValidationError):
        SendBack(m, -2)
    with pytest.raises(ValidationError):
        SendBack(m, True)
    with pytest.raises(ValidationError):
        SendBack(b"raw", 0)                                       # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        PushConsumer(group="ctx-g", service_factory=3)            # type: ignore[arg-type]
    not_a_service = lambda consumer, orderly: object()        # noqa: E731
    c = PushConsumer(group="ctx-g", service_factory=not_a_service)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        c.register(lambda msgs: ConsumeResult.SUCCESS)


def orderly_running(listener, **kw) -> tuple[PushConsumer, ConsumeMessageOrderlyService, ProcessQueue, list]:
    """An orderly consumer whose service holds ``MQ``'s lock and has ``batch`` pending."""
    c = consumer(listener, orderly=True, **kw)
    service = c.orderly
    assert isinstance(service, ConsumeMessageOrderlyService) and service is c.service
    batch = stored([0, 1])
    pq = held(batch)
    c.queues[MQ] = pq
    service.locked.add(MQ)
    service.pending[MQ] = collections.deque(batch)
    service.running.add(MQ)
    return c, service, pq, batch


def test_an_orderly_listener_sees_its_queue_and_its_suspend_time_is_honoured():
    calls: list[tuple[float, ConsumeOrderlyContext]] = []

    def listener(msgs, ctx):
        calls.append((time.monotonic(), ctx))
        if len(calls) == 1:
            ctx.suspend_current_queue_time_millis = 200
            return ConsumeResult.RECONSUME_LATER
        return ConsumeResult.SUCCESS
    c, service, pq, batch = orderly_running(listener, retry_delay_s=20.0, batch_size=2)
    t = threading.Thread(target=service._consume, args=(MQ, pq))
    t.start()
    t.join(10)
    assert not t.is_alive(), "the queue was suspended for retry_delay_s, not the listener's 200 ms"
    assert len(calls) == 2 and all(ctx.message_queue == MQ and ctx.auto_commit for _, ctx in calls)
    assert 0.19 <= calls[1][0] - calls[0][0] < 5.0
    assert pq.count == 0 and MQ not in service.running and not sent_back(c)


def test_an_orderly_suspend_time_of_minus_one_or_nonsense_is_retry_delay_s():
    c, service, _, _ = orderly_running(lambda msgs, ctx: ConsumeResult.SUCCESS, retry_delay_s=1.5)
    assert service.suspend_s(ConsumeOrderlyContext(MQ)) == 1.5
    assert service.suspend_s(ConsumeOrderlyContext(MQ, suspend_current_queue_time_millis="x")) == 1.5
    assert service.suspend_s(ConsumeOrderlyContext(MQ, suspend_current_queue_time_millis=0)) == 0.0


def test_an_orderly_dead_letter_that_cannot_be_sent_back_is_consumed_again_in_its_place():
    c, service, pq, batch = orderly_running(lambda msgs, ctx: ConsumeResult.RECONSUME_LATER, max_reconsume_times=0)
    service.pending[MQ].popleft()               # as give_up does: the first message left for the DLQ
    service.consume_later(MQ, pq, batch[:1], 1)
    assert list(service.pending[MQ]) == batch
