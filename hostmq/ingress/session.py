"""A producer's session with one broker: its own ingress ring (docs/internals.md: processes).

The producer creates (and owns) its ring — a memfd sealed against shrinking, labelled
``ring.<pid>-<n>`` — and hands it to the broker over ``session.sock`` (``protocol.session``); the broker
answers with its doorbell. From then on the producer talks to the writer through shared memory only:
it publishes frames (one encoded record, or a batch) and rings the doorbell if the writer sleeps;
the writer answers each frame with a completion entry and wakes us through the futex of the ring's
completion cursor if we sleep. The session lasts as long as the connection: closing it (or dying)
ends the session, after the writer has appended what was published.

Threads: any number of threads may send. Writes to the ring are serialised by ``_write_lock``.
Completions are read by whoever holds ``_read_lock``: a thread waiting for its own sync send reads
them itself (no thread hop: spin, then block on the semaphore), and a background thread does it
while async or oneway sends are outstanding. Completions resolve their waiters by frame sequence.

Liveness: while waiting, the session checks every ``LIVENESS_CHECK_S`` that the broker still holds
the connection, is not stopping, and has not dropped the ring; otherwise the session is *broken*:
pending sends fail with ConnectError (their messages may or may not have been stored) and the
producer opens a new session, possibly with another broker.
"""
from __future__ import annotations

import concurrent.futures
import itertools
import logging
import os
import socket
import threading
import time

import numpy as np

from .. import records as R
from ..live.state import BrokerState
from ..errors import (BrokerBusyError, ConnectError, HostMQError, NoRouteError, NotMasterError, ProtocolError,
                      SendTimeout, StoreFullError, ValidationError)
from ..locks import whereabouts
from ..message import MessageQueue, SendResult, SendStatus
from ..protocol import session as P
from ..root import RootPaths
from ..shm.futex import FutexWord
from .ring import USE_NATIVE_SEND, IngressRing
from ..shm.segment import Segment
from ..store.encode import NATIVE as _NATIVE_ENCODE, batch_msg_ids
from ..store.gather import py_send_result
from ..shm.signal import notify_if_waiting, wait_for
from ..waiting import SLEEP, IdleStrategy

log = logging.getLogger(__name__)

LIVENESS_CHECK_S = 0.1
OPEN_TIMEOUT_S = 5.0
_ring_ids = itertools.count(1)
_send_result = getattr(_NATIVE_ENCODE, "send_result", None)     # store._encode.send_result, or None
_STATUS = {R.COMPLETION_SEND_OK: SendStatus.SEND_OK, R.COMPLETION_FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
           R.COMPLETION_FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
           R.COMPLETION_SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE}


def completion_error(status: int, broker: str) -> HostMQError:
    """The exception for a refused frame (nothing was stored)."""
    if status == R.COMPLETION_STORE_FULL:
        return StoreFullError(f"broker {broker}: disk too full, message refused")
    if status == R.COMPLETION_NO_TOPIC:
        return NoRouteError(f"broker {broker} does not serve this topic or queue")
    if status == R.COMPLETION_BAD_RECORD:
        return ValidationError(f"broker {broker} refused a malformed record")
    if status == R.COMPLETION_NOT_MASTER:
        return NotMasterError(f"broker {broker} is no longer the master of its name (a newer epoch's master "
                              f"serves it): message refused, nothing stored")
    if status == R.COMPLETION_DISK_ERROR:
        return BrokerBusyError(f"broker {broker}: its disk failed (I/O error); writes are refused until "
                               f"it is restarted")
    return BrokerBusyError(f"broker {broker} cannot accept messages now (status {status})")


class Waiter:
    """One frame in flight: its queue, record sizes (batches), and the outcome once completed.
    ``future``: resolved with the frame's SendResult; ``futures`` (an auto-batched frame,
    ``accumulator``): one per record, each resolved with that record's own SendResult; ``on_done``:
    called with the waiter once its outcome is set (``client.async_sends``), on the thread that read
    the completion — it must not take a lock a sender may hold while it publishes."""

    __slots__ = ("queue", "sizes", "future", "futures", "outcome", "done", "on_done")

    def __init__(self, queue: MessageQueue, sizes=None, future: concurrent.futures.Future | None = None,
                 futures: list | None = None, on_done=None) -> None:
        self.queue = queue
        self.sizes = sizes
        self.future = future
        self.futures = futures
        self.outcome = None
        self.done = False
        self.on_done = on_done


class ProducerSession:
    def __init__(self, instance, broker: str, address: str, *, data_bytes: int, completion_entries: int,
                 spin_s: float = 0.0, idle: IdleStrategy | None = None) -> None:
        """A session with broker ``broker`` (its instance at ``address``). ``instance``: anything with
        the root (``.root``) — a producer's ``ClientInstance``, or the broker's own runtime for its
        scheduler. ``idle``: how a sync send waits for its completion (without it: a busy spin of
        ``spin_s``, then the futex)."""
        self.broker = broker
        self.address = address
        self.instance = instance
        self.idle = idle if idle is not None else IdleStrategy("spin", spin_s * 1e6) if spin_s > 0 else SLEEP
        self.name = f"ring.{os.getpid()}-{next(_ring_ids)}"
        self.ring = IngressRing.create(self.name, data_bytes, completion_entries)
        self.sock: socket.socket | None = None
        self.doorbell: Segment | None = None
        self.wake: FutexWord | None = None
        self._bell: np.ndarray | None = None       # the doorbell's word, for the native ring write
        self.state: BrokerState | None = None
        try:
            f = self._open(RootPaths(instance.root).session_socket_of(broker, address))
            self.slot, self.generation = f["slot"], f["generation"]
            self.store_host = bytes.fromhex(f["store_host"])
            self.host_hex = self.store_host.hex().upper()
            self.max_message_bytes = f["max_message_bytes"]
            self.max_properties_bytes = f["max_properties_bytes"]
            self.max_batch_bytes = min(f.get("max_batch_bytes", 1 << 62), self.ring.max_payload_bytes)
            self.delay_levels = f.get("delay_levels", 0)
            # when the broker first checks a half back (0: unknown — every transaction end asks)
            self.transaction_timeout_s = float(f.get("transaction_timeout_s", 0.0))
            self.state = BrokerState.attach(f["state_name"], readonly=True)
            if self.state.generation != f["state_generation"]:
                raise ConnectError(f"broker {broker} restarted while the session was opening")
        except (KeyError, TypeError, ValueError) as e:
            self._release_ipc()
            raise ConnectError(f"broker {broker} answered the session request oddly: {e}") from None
        except BaseException:
            self._release_ipc()
            raise
        self.ring.segment.close_fd()            # the broker holds its own descriptor now
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._cond = threading.Condition()
        self._cond_waiters = 0
        self.pending: dict[int, Waiter] = {}
        self.async_pending: set[int] = set()
        self._seq = 0
        self._async_event = threading.Event()
        self._thread: threading.Thread | None = None
        self.broken: HostMQError | None = None
        self.closed = False
        self._next_check = time.monotonic() + LIVENESS_CHECK_S
        self.on_drained = None      # called by the completion thread after it read completions

    def _open(self, path: str) -> dict:
        """Hand the ring to the broker (``protocol.session``); its reply fields. Maps the doorbell."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self.sock = sock
        sock.settimeout(OPEN_TIMEOUT_S)
        try:
            sock.connect(path)
            socket.send_fds(sock, [P.OpenSession(self.name).encode()], [self.ring.segment.fd])
            msg, fds, _, _ = socket.recv_fds(sock, P.MAX_MESSAGE_BYTES, 1)
        except (FileNotFoundError, ConnectionRefusedError) as e:
            raise ConnectError(f"broker {self.broker} does not listen at {path} ({e.strerror}); "
                               f"{whereabouts(self.instance.root, self.broker)}") from None
        except socket.timeout:
            raise ConnectError(f"broker {self.broker} did not answer the session request within {OPEN_TIMEOUT_S:.0f} s; "
                               f"{whereabouts(self.instance.root, self.broker)}") from None
        except OSError as e:
            raise ConnectError(f"session with broker {self.broker}: {e}") from None
        try:
            if not msg:
                raise ConnectError(f"broker {self.broker} closed the session connection")
            try:
                reply = P.decode_reply(msg)
            except ProtocolError as e:
                raise ConnectError(f"broker {self.broker}: {e}") from None
            if not reply["ok"]:
                err = {"busy": BrokerBusyError, "stopping": NoRouteError}.get(reply["error"], ValidationError)
                raise err(f"broker {self.broker} refused the session: {reply['message']}")
            if len(fds) != 1:
                raise ConnectError(f"broker {self.broker} sent no doorbell")
            self.doorbell = Segment.from_fd(fds[0], R.DOORBELL_KIND, R.DOORBELL_VERSION, name="doorbell")
            self.wake = FutexWord(self.doorbell.array(np.int64, 1), R.DOORBELL_WRITER_WORD)
            self._bell = self.doorbell.array(np.int64, 1)
            sock.setblocking(False)     # from now on only polled (_connection_lost) and told "close"
            return reply
        finally:
            for fd in fds:
                os.close(fd)

    def _connection_lost(self) -> bool:
        """Whether the broker closed our session connection (it stopped or died)."""
        try:
            return self.sock.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    # -- sending ----------------------------------------------------------------------------------------
    @property
    def max_payload_bytes(self) -> int:
        return self.ring.max_payload_bytes

    def submit(self, kind: int, payload, count: int, waiter: Waiter, deadline: float, is_async: bool = False) -> int:
        """Publish one frame; its sequence number. BrokerBusyError if the ring stays full until
        ``deadline``; ConnectError if the session is broken."""
        ring = self.ring
        with self._write_lock:
            if self.broken is not None:
                raise self.broken
            self._seq += 1
            seq = self._seq
            self.pending[seq] = waiter
            if is_async:
                self.async_pending.add(seq)
            # The frame, then the doorbell if the writer sleeps: one native call where it takes it.
            rung = ring.write_and_ring(kind, seq, payload, count, self._bell) if self._bell is not None else None
            if not rung and not (rung is None and ring.try_write(kind, seq, payload, count)):
                try:
                    self._write_when_room(kind, seq, payload, count, deadline)
                except BaseException:
                    self.pending.pop(seq, None)
                    self.async_pending.discard(seq)
                    raise
        if not rung:
            notify_if_waiting(ring.writer_waiting, self.wake)
        if is_async:
            self._ensure_thread()
            if not self._async_event.is_set():
                self._async_event.set()
        return seq

    def send(self, kind: int, payload, count: int, waiter: Waiter, deadline: float):
        """Publish one frame and wait for its completion: the SendResult, or the refusal raised."""
        self.submit(kind, payload, count, waiter, deadline)
        return self.result(waiter, deadline)

    def result(self, waiter: Waiter, deadline: float):
        """Wait for a submitted frame: its SendResult, or the refusal raised."""
        self.wait(waiter, deadline)
        if isinstance(waiter.outcome, Exception):
            raise waiter.outcome
        return waiter.outcome

    def _write_when_room(self, kind: int, seq: int, payload, count: int, deadline: float) -> None:
        """Back-pressure: the ring is full; read completions and wait for the writer to free room."""
        ring = self.ring
        while True:
            self.poll_completions()
            if ring.try_write(kind, seq, payload, count):
                return
            now = time.monotonic()
            if now >= deadline:
                raise BrokerBusyError(f"broker {self.broker}: ingress ring full for the whole send timeout")
            self._check_alive(now)
            notify_if_waiting(ring.writer_waiting, self.wake)
            time.sleep(0.0002)

    # -- completions ------------------------------------------------------------------------------------
    def wait(self, waiter: Waiter, deadline: float) -> None:
        """Until ``waiter`` is done (SendTimeout / ConnectError otherwise); reads completions itself
        when no other thread does."""
        ring = self.ring
        while not waiter.done:
            now = time.monotonic()
            if now >= deadline:
                raise SendTimeout(f"no acknowledgement from broker {self.broker} within the send timeout "
                                  f"(the message may still be stored)")
            self._check_alive(now)
            if self._read_lock.acquire(blocking=False):
                try:
                    if not waiter.done:
                        if USE_NATIVE_SEND:
                            ring.await_completion(min(deadline, self._next_check), self.idle)
                        else:
                            wait_for(lambda: ring.has_completions() or ring.dropped or
                                     self._next_check <= time.monotonic(),
                                     ring.completion_word, min(deadline, self._next_check),
                                     flag=ring.producer_waiting, idle=self.idle)
                        self._drain()
                finally:
                    self._read_lock.release()
            else:
                with self._cond:
                    if not waiter.done:
                        self._cond_waiters += 1
                        self._cond.wait(0.002)
                        self._cond_waiters -= 1

    def _drain(self) -> int:
        comps = self.ring.completion_tuples()
        if not comps:
            return 0
        pending, apending = self.pending, self.async_pending
        for seq, status, count, qoff, phys, _ in comps:
            w = pending.pop(seq, None)
            if w is None:
                continue            # a duplicate after a writer restart, or a send we gave up on
            apending.discard(seq)
            self._resolve(w, status, qoff, phys)
        if self._cond_waiters:
            with self._cond:
                self._cond.notify_all()
        return len(comps)

    def _resolve(self, w: Waiter, status: int, qoff: int, phys: int) -> None:
        if status < 0:
            w.outcome = completion_error(status, self.broker)
        else:
            st = _STATUS.get(status, SendStatus.SEND_OK)
            if w.sizes is not None:
                w.outcome = SendResult(st, batch_msg_ids(self.host_hex, phys, w.sizes), w.queue, qoff)
            else:               # one message (every sync send): one native call where it is built
                r = _send_result(SendResult, st, self.host_hex, phys, w.queue, qoff) \
                    if _send_result is not None else None
                w.outcome = r if r is not None else py_send_result(SendResult, st, self.host_hex, phys, w.queue, qoff)
        w.done = True
        f = w.future
        if f is not None:
            if isinstance(w.outcome, Exception):
                f.set_exception(w.outcome)
            else:
                f.set_result(w.outcome)
        elif w.futures is not None:
            _resolve_each(w)
        if w.on_done is not None:
            w.on_done(w)

    def poll_completions(self) -> None:
        """Read the completions there are, without waiting (unless another thread reads them now)."""
        if self.ring.has_completions() and self._read_lock.acquire(blocking=False):
            try:
                self._drain()
            finally:
                self._read_lock.release()

    def _fail_all(self, error: HostMQError) -> None:
        pending, self.pending = self.pending, {}
        self.async_pending.clear()
        for w in pending.values():
            w.outcome = error
            w.done = True
            if w.future is not None and not w.future.done():
                w.future.set_exception(error)
            elif w.futures is not None:
                _resolve_each(w)
            if w.on_done is not None:
                try:
                    w.on_done(w)
                except Exception:
                    log.exception("failing a send in flight")
        with self._cond:
            self._cond.notify_all()

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._completion_loop, daemon=True,
                                            name=f"hostmq-completions {self.broker}")
            self._thread.start()

    def _completion_loop(self) -> None:
        ring = self.ring
        while not self.closed:
            if not self.async_pending:
                self._async_event.wait(0.05)
                self._async_event.clear()
                self._after_drain()
                continue
            now = time.monotonic()
            try:
                self._check_alive(now)
            except HostMQError:
                continue
            if self._read_lock.acquire(timeout=0.005):
                try:
                    # No spin here: a spinning Python thread holds the GIL and starves the thread
                    # that is sending; blocking on the semaphore releases it.
                    wait_for(ring.has_completions, ring.completion_word, now + 0.01,
                             flag=ring.producer_waiting, spin_s=0.0)
                    self._drain()
                except Exception:
                    log.exception("completion reader for %s failed", self.broker)
                finally:
                    self._read_lock.release()
                self._after_drain()

    def _after_drain(self) -> None:
        hook = self.on_drained
        if hook is not None:
            try:
                hook()
            except Exception:
                log.exception("after reading completions from %s", self.broker)

    def wake_completion_thread(self) -> None:
        """Have the completion thread run ``on_drained`` soon (another thread read the completions)."""
        if self._thread is not None:
            self._async_event.set()

    # -- liveness ---------------------------------------------------------------------------------------
    def _check_alive(self, now: float) -> None:
        if self.broken is not None:
            raise self.broken
        dropped = self.ring.dropped             # one word: looked at on every wake-up
        if now < self._next_check and not dropped:
            return
        self._next_check = now + LIVENESS_CHECK_S
        why = None
        if dropped:
            why = "dropped this session (malformed frames)"
        elif self.state.get("broker_state") == R.BROKER_STOPPING:
            why = "is shutting down"
        elif self._connection_lost():
            why = "closed the session (it stopped or died)"
        if why is not None:
            self.broken = ConnectError(f"broker {self.broker} {why}; sends in flight may or may not be stored")
            self._fail_all(self.broken)
            raise self.broken

    def usable(self) -> bool:
        try:
            self._check_alive(time.monotonic())
        except HostMQError:
            return False
        return not self.closed

    # -- closing ----------------------------------------------------------------------------------------
    def close(self, timeout_s: float = 3.0) -> None:
        """Wait (up to ``timeout_s``) for frames in flight, tell the broker, unlink the ring."""
        if self.closed:
            return
        deadline = time.monotonic() + timeout_s
        while self.pending and self.broken is None and time.monotonic() < deadline:
            if self._read_lock.acquire(timeout=0.01):
                try:
                    self._drain()
                finally:
                    self._read_lock.release()
            try:
                self._check_alive(time.monotonic())
            except HostMQError:
                break
            time.sleep(0.0005)
        self.closed = True
        self._async_event.set()
        # Closed from its own completion thread (an async frame published after a break replaces the
        # broken session from there): that thread ends at its loop's next turn; no join.
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(1.0)
        self._fail_all(ConnectError("producer shut down before the broker answered"))
        self.ring.mark_closed()
        if self.broken is None:
            try:
                self.sock.send(P.CloseSession().encode(), socket.MSG_DONTWAIT)
            except OSError as e:
                log.debug("closing session with %s: %s", self.broker, e)
        self._release_ipc()

    def _release_ipc(self) -> None:
        if self.sock is not None:
            self.sock.close()           # the broker sees the session end (after draining our frames)
        self.wake = self._bell = None
        if self.doorbell is not None:
            self.doorbell.close()
        if self.state is not None:
            self.state.close()
        self.ring.close()


def _resolve_each(w: Waiter) -> None:
    """An auto-batched frame's outcome, record by record: its own id and queue offset each."""
    out = w.outcome
    if isinstance(out, Exception):
        for f in w.futures:
            if not f.done():
                f.set_exception(out)
        return
    ids = out.msg_id.split(",")
    for i, f in enumerate(w.futures):
        if not f.done():
            f.set_result(SendResult(out.status, ids[i], w.queue, out.queue_offset + i))

