"""``send_async`` with natural batching: one frame per burst, one completion per frame, a view per
message (docs/internals.md "Async sends").

A plain ``send_async`` (a ``Message`` for no pinned queue, selector or sharding key, no delay level,
a body too small to be compressed) is checked and encoded at once, in the caller — a bad message
raises there, and changing the message afterwards changes nothing sent — and then:

* if none of the producer's async frames is in flight, it goes out at once as its own frame (a lone
  send is not held back);
* otherwise it joins its topic's *open* frame, which goes out when it is full (``max_messages``
  records or ``max_bytes`` bytes), when the frames in flight are answered (whoever reads the
  completions — the session's completion thread, or a caller waiting on a result — publishes it), or
  as soon as a caller waits on one of its messages (``result``, ``exception``, ``done``) or flushes
  (``flush``, ``shutdown``).

The open frames live in ``store._encode.Gather`` (C; ``PyGather`` is its spec and stands in where it
is not built): ``Producer.send_async`` hands it the message, and for the common case — a plain
``Message`` onto a topic that already has an open frame — one native call checks it, encodes its
record onto the frame and makes its view. Everything else (the first message of a frame, keys and
user properties, a topic not seen yet, a bad message) goes through ``AsyncSends._add_py``.

So under load a frame carries what arrived during one round trip to the writer (the smart batching
of LMAX and Aeron): one ring write, one wake-up of the writer, one completion for many messages,
without a delay to tune. Each message still gets its own result — its own message id and queue
offset within the frame — through a :class:`SendFuture`: a ``concurrent.futures.Future`` that holds
nothing but its frame and its index (no lock, no condition, no result object until asked for), whose
``result()`` reads the completions itself rather than waiting for a thread to hand them over.

A frame is published like any async send (``Producer.publish_frame``: on another broker if its broker
is gone or busy); if it cannot be, or the broker refuses it, all its messages fail with that error.
Ordering: unpinned messages have none in RocketMQ; pinned ones never come here.
"""
from __future__ import annotations

import concurrent.futures
import logging
import threading
import time

from .. import records as R
from ..errors import HostMQError, ValidationError
from ..message import Message, SendResult
from ..store.encode import NATIVE as NATIVE_ENCODE, encode_messages, restamp, TAGS_B, UNIQ_B
from ..store.gather import PyGather, py_send_results
from ..ingress.session import Waiter

log = logging.getLogger(__name__)

MAX_MESSAGES = 256              # a frame goes out once it holds this many messages …
MAX_BYTES = 256 << 10           # … or this many bytes of records
_FOREVER = float("inf")
# concurrent.futures.Future's own state, built only when something outside this module asks for it
# (concurrent.futures.wait / as_completed): see SendFuture.__getattr__.
_FUTURE_STATE = frozenset(("_condition", "_state", "_result", "_exception", "_waiters", "_done_callbacks"))


class AsyncFrame:
    """The messages of one frame: open (gathering), then published (``waiter`` set), then done."""

    __slots__ = ("owner", "topic", "first_msg", "buf", "sizes", "deadline", "waiter", "session", "error", "results",
                 "callbacks", "finished")

    def __init__(self, owner: "AsyncSends", topic: str, deadline: float) -> None:
        self.owner = owner
        self.topic = topic
        self.first_msg = Message(topic, b"")    # routes it: the callers' messages may change afterwards
        self.buf = bytearray()              # the records (queue 0, no broker: restamped on publish)
        self.sizes: list[int] = []
        self.deadline = deadline
        self.waiter: Waiter | None = None   # set when published
        self.session = None
        self.error: BaseException | None = None     # it could not be published
        self.results = None                 # once asked for: its messages' SendResults, or its exception
        self.callbacks: list | None = None  # (view, fn) registered before it was done
        self.finished = False

    def outcome(self, index: int):
        """Message ``index``'s SendResult, or the exception of the frame (only once done)."""
        res = self.results
        if res is None:
            res = self.build_results()
        return res[index] if res.__class__ is list else res

    def build_results(self):
        """Once done: every message's SendResult (its own id and queue offset in the frame), or the
        frame's exception; kept in ``results``."""
        out = self.error if self.error is not None else self.waiter.outcome
        if not isinstance(out, BaseException):
            ids = out.msg_id.split(",")
            res = NATIVE_ENCODE.send_results(SendResult, out.status, ids, out.queue, out.queue_offset) \
                if NATIVE_ENCODE is not None else None
            out = res if res is not None else py_send_results(SendResult, out.status, ids, out.queue,
                                                              out.queue_offset)
        self.results = out
        return out

    def await_done(self, timeout: float | None) -> None:
        """Publish it if it is still open, then wait for its completion (TimeoutError after
        ``timeout`` seconds; ``None``: until it is answered or its session breaks)."""
        if self.waiter is None and self.error is None:
            self.owner.publish_open(self)
        deadline = _FOREVER if timeout is None else time.monotonic() + max(0.0, timeout)
        while not self.finished:
            w, s = self.waiter, self.session
            if w is None or s is None:      # being published by another thread right now
                if time.monotonic() >= deadline:
                    raise concurrent.futures.TimeoutError()
                time.sleep(0.0001)
                continue
            try:
                s.wait(w, deadline)
            except HostMQError:
                if not self.finished:           # SendTimeout (a TimeoutError) or a broken session
                    raise
        self.owner.poke()

    def answered(self, w: Waiter, session) -> None:
        """The session read its completion (or failed it): ``w`` is done."""
        if self.waiter is None:             # answered before publish_frame returned
            self.session, self.waiter = session, w
        self.finish()
        if self.owner.gather.open:          # frames held while this one flew may go now: the
            session.wake_completion_thread()    # completion thread publishes them (``poke``)

    def on_finish(self, view: "SendFuture", fn) -> bool:
        """Run ``fn(view)`` when it finishes: True if registered, False if it has finished already
        (the caller runs ``fn`` itself)."""
        with self.owner.cb_lock:
            if self.finished:
                return False
            if self.callbacks is None:
                self.callbacks = []
            self.callbacks.append((view, fn))
            return True

    def finish(self) -> None:
        """Its outcome is known (``waiter`` answered, or ``error``): done, counted out of the frames in
        flight, its callbacks run."""
        with self.owner.cb_lock:
            if self.finished:
                return
            self.finished = True
            cbs, self.callbacks = self.callbacks, None
        self.owner.gather.answered()
        if cbs:
            for view, fn in cbs:
                _call(fn, view)


def _call(fn, view) -> None:
    try:
        fn(view)
    except Exception:
        log.exception("exception calling callback for %r", view)


class SendFuture(concurrent.futures.Future):
    """One message of an async frame: a ``concurrent.futures.Future`` of its SendResult. Nothing is
    built per message until asked for; ``result()`` waits on the frame (reading completions itself),
    ``add_done_callback`` runs on the thread that reads the completion. ``cancel()`` is refused (the
    message may already be in the broker's ring), as for a running Future."""

    __slots__ = ("_frame", "_index")        # set by Gather (native) or here; no Future.__init__: no Condition

    def __init__(self, frame: AsyncFrame, index: int) -> None:
        self._frame = frame
        self._index = index

    # -- the Future API ------------------------------------------------------------------------------
    def done(self) -> bool:
        fr = self._frame
        if fr.finished:
            return True
        fr.owner.poll(fr)
        return fr.finished

    def result(self, timeout: float | None = None):
        fr = self._frame
        if not fr.finished:
            fr.await_done(timeout)
        res = fr.results
        if res is None:
            res = fr.build_results()
        if res.__class__ is list:
            return res[self._index]
        raise res

    def exception(self, timeout: float | None = None):
        fr = self._frame
        if not fr.finished:
            fr.await_done(timeout)
        out = fr.outcome(self._index)
        return out if isinstance(out, BaseException) else None

    def add_done_callback(self, fn) -> None:
        if not self._frame.on_finish(self, fn):
            _call(fn, self)

    def cancel(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return not self.done()

    def set_running_or_notify_cancel(self) -> bool:
        return True

    def set_result(self, result) -> None:
        raise RuntimeError("a send's future is resolved by the broker's answer only")

    set_exception = set_result

    def __repr__(self) -> str:
        fr = self._frame
        state = "finished" if fr.finished else "pending" if fr.waiter is None else "running"
        return f"<SendFuture message {self._index} of a frame of {len(fr.sizes)} on {fr.topic!r}: {state}>"

    def __getattr__(self, name: str):
        """``concurrent.futures.wait`` / ``as_completed`` reach into a Future's condition and state:
        build them on first use, kept in step with the frame."""
        if name not in _FUTURE_STATE:
            raise AttributeError(name)
        with self._frame.owner.cb_lock:
            built = "_condition" not in self.__dict__
            if built:
                concurrent.futures.Future.__init__(self)
        if built and not self._frame.on_finish(self, _mirror):
            _mirror(self)
        return object.__getattribute__(self, name)


def _mirror(view: SendFuture) -> None:
    """Copy the frame's outcome into the Future state ``__getattr__`` built (and wake its waiters)."""
    f = concurrent.futures.Future
    out = view._frame.outcome(view._index)
    try:
        if isinstance(out, BaseException):
            f.set_exception(view, out)
        else:
            f.set_result(view, out)
    except concurrent.futures.InvalidStateError:      # mirrored already (two threads asked at once)
        pass


class AsyncSends:
    """A producer's open async frames (``gather``: native where built) and their publishing."""

    def __init__(self, producer, max_messages: int = MAX_MESSAGES, max_bytes: int = MAX_BYTES,
                 native: bool = True, uid_source: list | None = None, host: list | None = None) -> None:
        """``uid_source`` and ``host``: one-item lists of ``records.unique_id_source()`` and
        ``records.host_bytes()`` (those of this process, which a forked child re-seeds, by default)."""
        self.producer = producer
        self.limits = lim = producer._limits
        self.uid_source = R._UID_SOURCE if uid_source is None else uid_source
        self.host = R._MY_HOST if host is None else host
        kind = NATIVE_ENCODE.Gather if native and NATIVE_ENCODE is not None else PyGather
        self.gather = kind(AsyncFrame, SendFuture, self.uid_source, self.host, TAGS_B, UNIQ_B, max_messages,
                           max_bytes, producer.compress_over_bytes, lim.max_message_bytes, lim.max_properties_bytes)
        self.cb_lock = threading.Lock()

    def add_slow(self, msg: Message, timeout_s: float) -> SendFuture | None:
        """``msg`` onto its topic's open frame where ``Gather.add`` declined (``Producer.send_async``
        calls that first): ``_add_py``, then the frame out if it is due. None where ``msg`` is not a
        plain message (the caller then sends it alone)."""
        view = self._add_py(msg, timeout_s)
        if view is not None and self.gather.due is not None:
            self.publish_due()
        return view

    def publish_due(self) -> None:
        """The frame the last ``add`` filled (or found with nothing in flight) out now."""
        fr = self.gather.take_due()
        if fr is not None:
            self._publish(fr)

    def _add_py(self, msg: Message, timeout_s: float) -> SendFuture | None:
        """What ``Gather.add`` does, in Python, for every message it leaves: checked (raises for a bad
        one), encoded by ``encode_messages`` (the spec where the native one declines), put onto its
        topic's open frame (a new one if there is none)."""
        p = self.producer
        body = msg.body if msg.__class__ is Message else None
        if body.__class__ is not bytes or msg.delay_level or len(body) > p.compress_over_bytes:
            return None
        topic = msg.topic
        topic_b = p.topic_bytes(topic)          # validated (raises for a bad or system topic), cached
        prefix, counter = self.uid_source[0]
        lim = self.limits
        record = encode_messages([msg], topic, topic_b, queue_id=0, born_ts_ms=int(time.time() * 1000),
                                 born_host=self.host[0], store_host=b"", max_body_bytes=lim.max_message_bytes,
                                 max_props_bytes=lim.max_properties_bytes, uid_prefix=prefix, uid_next=counter)[0]
        g = self.gather
        if len(g.topics) < 10_000:
            g.topics[topic] = topic_b
        while True:
            fr = g.open.get(topic)
            if fr is None:
                fr = g.open.setdefault(topic, AsyncFrame(self, topic, time.monotonic() + timeout_s))
            view = g.put(topic, fr, record)
            if view is not None:
                return view

    def publish_open(self, fr: AsyncFrame) -> None:
        """``fr`` out now if it is still open."""
        g = self.gather
        if g.open.get(fr.topic) is fr:
            taken = g.take(fr.topic)
            if taken is not None:
                self._publish(taken)

    def poke(self) -> None:
        """Completions were read: if nothing of ours is in flight, the open frames go out."""
        g = self.gather
        if not g.open or g.inflight > 0:
            return
        for fr in g.take_all():
            self._publish(fr)

    def poll(self, fr: AsyncFrame) -> None:
        """Read whatever completions are there without waiting (``SendFuture.done``)."""
        if fr.waiter is None and fr.error is None:
            self.publish_open(fr)
        s = fr.session
        if s is not None:
            s.poll_completions()
        self.poke()

    def flush(self) -> None:
        """Every open frame out now."""
        for fr in self.gather.take_all():
            self._publish(fr)

    def _publish(self, fr: AsyncFrame) -> None:
        """One frame on a queue the producer chooses; its messages fail together if it cannot go."""
        payload = bytes(fr.buf)
        fr.buf = None
        sizes = fr.sizes
        count = len(sizes)

        def frame(mq, session) -> tuple:
            if len(payload) > session.max_batch_bytes:
                raise ValidationError(f"an async frame of {len(payload)} bytes exceeds the {session.max_batch_bytes} "
                                      f"bytes a batch may take on broker {mq.broker}")
            w = Waiter(mq, sizes if count > 1 else None, on_done=lambda w, s=session: fr.answered(w, s))
            return (R.FRAME_MESSAGE if count == 1 else R.FRAME_BATCH,
                    restamp(payload, sizes, mq.queue_id, session.store_host), count, w)
        try:
            session, w = self.producer.publish_frame(fr.first_msg, None, None, None, None, fr.deadline, frame)
        except HostMQError as e:
            error: BaseException = e
        except Exception as e:          # never leave a caller's future hanging
            log.exception("async send: publishing a frame of %d messages failed", count)
            error = e
        else:
            if fr.waiter is None:
                fr.session, fr.waiter = session, w
            return
        fr.error = error
        fr.finish()
