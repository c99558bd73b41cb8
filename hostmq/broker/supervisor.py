"""The broker process (``hostmq broker ROOT --name NAME``): recovery, the writer / dispatcher / flusher /
scheduler children, and the control loop.

Start-up, in this order (docs/internals.md fact 3):

1. ``flock(brokers/NAME/broker.lock)`` — one broker per name and root — before touching shared
   memory or binding the socket (libzmq's bind silently steals a socket path);
   then its role, under the name's role lock: ``fencing.decide`` reads the role records, starts a
   master of an old epoch as a slave, and publishes ``starting.json`` before recovery, so that
   ``hostmq ha promote`` sees a master that is still recovering (``role_lock.py``);
2. reclaim segments and semaphores left by dead processes of this broker (its IPC prefix);
3. open the store with ``MessageStore`` — normal or abnormal recovery (``store.recovery``) — and
   close it cleanly, so every structure is consistent; then hold ``store/lock`` for the whole run
   and create ``store/abort`` (found at the next start ⇒ this run died ⇒ abnormal recovery);
4. create the doorbell (a sealed memfd producers ring to wake the writer) and the broker state
   segment (``state.py``; wake-ups are futex words in it);
5. spawn the children (``process.Supervisor``: restarted with backoff when they die, killed by the
   kernel when this process dies); bind the control socket and the session socket
   (``session_server``); once the children have reported in, mark the broker RUNNING and register with
   every NameServer.

Stop (SIGTERM / SIGINT): STOPPING (no new sessions), unregister from the NameServers, stop the
children in order scheduler → writer → dispatcher → flusher (each drains, then the flusher writes
the final checkpoint), persist offsets; remove ``abort`` only if all stopped cleanly; end the
producer sessions, unlink the state segment (its last word BROKER_STOPPED), close the sockets.

A run also ends when the broker's role changes — promoted (PROMOTE_BROKER, ``promotion.py``) or a
slave that must cut its log first (``replica.EXIT_TRUNCATE``): ``run`` then starts the next run in
the same process, under the same ``broker.lock``, in the role its ``config/role.json`` says
(``role.py``).
"""
from __future__ import annotations

import dataclasses
import fcntl
import logging
import os
import threading
import time

import numpy as np
import psutil

from .. import records as R
from ..access import control_policy
from ..errors import ConfigError, ConnectError, StoreLockedError, ValidationError
from ..fsutil import ensure_dir, fsync_dir, open_file
from ..process import EXIT_CLEAN, EXIT_UNCLEAN, Child, Supervisor, describe_exit
from ..sdnotify import Watchdog, sd_notify, stale_heartbeats
from ..root import shm_prefix
from ..shm.futex import FutexWord
from ..shm.segment import Segment, reclaim_stale, shm_free_bytes, unlink_segment
from ..store.message_store import MessageStore
from ..store.recovery import RecoveryProgress
from ..store.transient_pool import TransientStorePool
from ..protocol.codes import RequestCode
from ..protocol.messages import PromoteRequest, handles
from ..transport import Reply, Server
from ..jsonfile import read_json, write_json
from . import fencing, promotion
from ..live import role as roles
from .ha_link import listen_address
from .ha_master import SLAVE_OFFSETS_FILE, ha_address
from .registration import NamesrvLink
from .replica import EXIT_TRUNCATE, MASTER_FILE, META_FILE, TRUNCATE_MARKER
from .truncation import apply_truncate_marker
from ..live.role_lock import clear_starting
from ..live.runtime import BrokerRuntime
from .service import BrokerService
from .pool_salvage import salvage_pool
from .session_server import SessionServer
from ..live.state import BrokerState
from .writer import writer_wakes_queues

log = logging.getLogger(__name__)

# Stopped in this order: the scheduler first (it sends to the writer), then writer → dispatcher → flusher.
CHILDREN = (("scheduler", "hostmq.broker.scheduler:run"), ("writer", "hostmq.broker.writer:run"),
            ("dispatcher", "hostmq.broker.dispatcher:run"), ("flusher", "hostmq.broker.flusher:run"))
# A master also runs its replication process — stopped after the writer (a SYNC_MASTER writer's last
# sends wait for a slave's ack) and before dispatcher and flusher. A slave's writer is the replica
# (it appends what its master streams; producers never send to a slave) and it runs no scheduler.
MASTER_CHILDREN = CHILDREN[:2] + (("ha", "hostmq.broker.ha_master:run"),) + CHILDREN[2:]
SLAVE_CHILDREN = (("writer", "hostmq.broker.replica:run"),) + CHILDREN[2:]
PID_WORDS = {"writer": "writer_pid", "dispatcher": "dispatcher_pid", "flusher": "flusher_pid",
             "scheduler": "scheduler_pid", "ha": "ha_pid"}


def children_of(rt: BrokerRuntime) -> tuple[tuple[str, str], ...]:
    if rt.is_slave:
        return SLAVE_CHILDREN
    return MASTER_CHILDREN if listen_address(rt) else CHILDREN
READY_TIMEOUT_S = 60.0
SUPERVISE_INTERVAL_S = 0.2
SESSION_CHECK_INTERVAL_S = 1.0
LONG_POLL_CHECK_S = 0.005
MIN_SHM_FREE_BYTES = 64 << 20
RECOVERY_REPORT_S = 5.0         # a running recovery is logged and reported to systemd this often
MASTER_ASK_S = 2.0              # a slave without its master's HA address registers again this often
STATUS_INTERVAL_S = 5.0         # systemd's STATUS= line is refreshed this often while serving


def take_lock(path: str, what: str) -> int:
    """An exclusive ``flock`` on ``path`` (StoreLockedError naming ``what`` if it is held)."""
    fd = open_file(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLockedError(path, what) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


class Broker:
    def __init__(self, rt: BrokerRuntime) -> None:
        self.rt = rt
        self.state: BrokerState | None = None
        self.doorbell: Segment | None = None
        self.sessions: SessionServer | None = None
        self.children: Supervisor | None = None
        self.server: Server | None = None
        self.service: BrokerService | None = None
        self.link = NamesrvLink(rt)
        self._store_lock_fd: int | None = None
        self.recovery = None
        self.pool_names: list[str] = []
        self.watchdog = Watchdog.from_env()
        self.ready_sent = False
        self._next_status_s = 0.0
        self._stop: threading.Event | None = None
        self._outer: threading.Event | None = None
        self._master_ha = ""
        self._ha_registered = ""            # the replication address last registered
        self._next_slave_check_s = 0.0      # a master without a listener / a slave without its master's address
        self._seen_files: dict[str, tuple[int, int]] = {}     # file → (mtime_ns, size) last applied
        self.restart: str | None = None     # why this run ends with the broker starting again (its role changed)

    # -- start ----------------------------------------------------------------------------------------
    def _create_pool(self) -> None:
        """The transient store pool's buffers: shared memory that outlives a killed writer, so its
        successor commits what it appended (``store.transient_pool``). ASYNC_FLUSH only."""
        cfg = self.rt.config.store
        if not cfg.transient_store_pool_enable or cfg.flush_disk_type != "ASYNC_FLUSH":
            if cfg.transient_store_pool_enable:
                log.warning("broker %s: transient_store_pool_enable is ignored under SYNC_FLUSH", self.rt.name)
            return
        names = self.rt.pool_names(cfg.transient_store_pool_size)
        for name in names:
            unlink_segment(name)        # we hold the broker lock: any older one is ours to replace
        for seg in TransientStorePool.create_segments(names, cfg.commitlog_file_bytes):
            seg.close()                 # the writer maps them; we only own the names
        self.pool_names = names

    def start(self) -> None:
        rt = self.rt
        salvage_pool(rt)                    # before the stale segments it reads are reclaimed
        gone = reclaim_stale(rt.shm_prefix, grace_s=5.0, orphan_semaphores=True)
        gone += reclaim_stale(shm_prefix(rt.root, ""), grace_s=5.0)   # consumers
        if gone:
            log.info("reclaimed %d stale shared-memory names of %s", len(gone), rt.name)
        unlink_segment(rt.state_name)       # we hold the broker lock: any older one is ours to replace
        if shm_free_bytes() < MIN_SHM_FREE_BYTES:
            log.warning("/dev/shm has only %d MiB free; producer sessions may fail", shm_free_bytes() >> 20)
        store_host = R.host_bytes(os.getpid())
        if rt.is_slave:
            apply_truncate_marker(rt)       # before recovery: it then drops consume-queue entries past the cut
        end, last_ts = self._recover(store_host)
        rt = self.rt                        # now with the store's own file sizes (store.json)
        if not rt.is_slave and self._stepped_down():
            return                          # a promotion was recorded while it recovered: never serve
        self._store_lock_fd = take_lock(os.path.join(rt.store_dir, "lock"), "this broker")
        abort = os.path.join(rt.store_dir, "abort")
        fd = open_file(abort, os.O_WRONLY | os.O_CREAT)
        os.fsync(fd)
        os.close(fd)
        fsync_dir(rt.store_dir)
        b = rt.config.broker
        self.doorbell = Segment.create_memfd("doorbell", R.DOORBELL_BYTES, R.DOORBELL_KIND, R.DOORBELL_VERSION)
        doorbell_word = FutexWord(self.doorbell.array(np.int64, 1), R.DOORBELL_WRITER_WORD)
        self.state = BrokerState.create(rt.state_name, store_host=store_host,
                                        commitlog_file_bytes=rt.config.store.commitlog_file_bytes,
                                        consume_queue_file_entries=rt.config.store.consume_queue_file_entries,
                                        index_slots=rt.config.store.index_slots,
                                        index_entries=rt.config.store.index_entries,
                                        sync_flush=rt.config.store.flush_disk_type == "SYNC_FLUSH",
                                        start_pos=end, last_store_ts_ms=last_ts,
                                        session_slots=b.session_slots, doorbell_fd=self.doorbell.fd,
                                        # a slave's replica wakes no queue words: its readers sleep on dispatch_seq
                                        queue_wakes=writer_wakes_queues(rt.config.store) and not rt.is_slave,
                                        slave=rt.is_slave, role_epoch=rt.epoch, registered_id=rt.registered_id,
                                        slave_read_lag_bytes=roles.slave_read_lag_bytes(
                                            rt, psutil.virtual_memory().total))
        self._create_pool()
        self.service = BrokerService(rt, self.state, on_topics_changed=self.register, doorbell=doorbell_word)
        self.sessions = SessionServer(rt, self.state, doorbell_word, self.doorbell.fd, self.service.session_fields)
        self.children = Supervisor([Child(name, target, rt) for name, target in children_of(rt)])
        self.children.start()
        handlers = self.service.handlers()
        handlers[RequestCode.PROMOTE_BROKER] = self.promote
        self.server = Server(rt.address, handlers, name=f"broker {rt.instance}",
                             policy=control_policy(rt.root))     # administration: owners only
        self.service.attach(self.server)    # held pulls and topic commits (topics.json at most every 50 ms)
        self.server.bind()
        if not rt.is_slave:                 # producers never send to a slave: no session socket
            self.sessions.bind()
            self.sessions.start()
        elif os.path.exists(rt.session_socket_path):
            os.unlink(rt.session_socket_path)   # a killed master's, now a slave (we hold the broker lock)
        self._await_children()
        self.state.set("broker_state", R.BROKER_RUNNING)
        self.server.add_timer(SUPERVISE_INTERVAL_S, self.supervise)
        self.server.add_timer(SESSION_CHECK_INTERVAL_S, self.service.check_clients)
        if self.rt.config.store.madvise_dontneed_consumed:
            self.server.add_timer(self.rt.config.store.consumed_check_interval_s, self.service.check_consumed)
        self.server.add_timer(LONG_POLL_CHECK_S, self.service.check_held)
        self.server.add_timer(b.transaction_check_interval_s, self.service.check_transactions)
        self.server.add_timer(b.register_interval_s, self.register)
        self.server.add_timer(b.offset_persist_interval_s, self.service.offsets.persist)
        if not rt.is_slave:
            self.server.add_timer(fencing.ROLE_CHECK_INTERVAL_S, self.check_role)
        self.register()
        log.info("broker %s running at %s (commitlog end %d, %s recovery)", rt.name, rt.socket_path, end,
                 "abnormal" if self.recovery.abnormal else "normal")
        self.notify_ready()

    def _recover(self, store_host: bytes) -> tuple[int, int]:
        """Open the store (recovering it) and close it cleanly; its end and last store time. A
        recovery that takes long is logged every few seconds and keeps systemd's start timeout
        extended (``EXTEND_TIMEOUT_USEC``), with its progress as the unit's STATUS."""
        ensure_dir(self.rt.store_dir)
        progress = RecoveryProgress()
        done = threading.Event()
        sd_notify("STATUS=recovering the store")
        watcher = threading.Thread(target=_report_recovery, args=(self.rt.name, progress, done),
                                   name="recovery-report", daemon=True)
        watcher.start()
        try:
            store = MessageStore(self.rt.store_dir, self.rt.config, broker=self.rt.name, store_host=store_host,
                                 progress=progress)
        finally:
            done.set()
            watcher.join()
        try:
            # Children get the sizes the store was created with, whatever the configuration says.
            self.rt = dataclasses.replace(self.rt, config=dataclasses.replace(self.rt.config, store=store.config))
            self.recovery = store.recovery
            end, ts = store.commitlog.max_offset(), store.commitlog.last_store_ts_ms
        finally:
            store.close()
        return end, ts

    def _await_children(self) -> None:
        """Wait until each child has attached and published its pid (or one of them died)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            ready = all(self.state.get(PID_WORDS[c.name]) == c.pid for c in self.children.children)
            if ready:
                return
            for c in self.children.children:
                if not c.alive():
                    if self._truncate_requested():
                        # The replica met its master before its siblings had all started and found this
                        # slave ahead: not a failed start but a request to cut the log, which supervise()
                        # serves at its first turn by starting again.
                        return
                    raise ConnectError(f"broker {self.rt.name}: the {c.name} process exited with "
                                       f"{c.process.exitcode} during start-up (see its log)")
            self.server.poll_once(20)
        raise ConnectError(f"broker {self.rt.name}: children did not start within {READY_TIMEOUT_S:.0f} s")

    def _truncate_requested(self) -> bool:
        """Whether this slave's replica exited asking for its log to be cut (``replica.EXIT_TRUNCATE``)."""
        replica = self.children.children[0] if self.rt.is_slave else None     # SLAVE_CHILDREN[0]
        return replica is not None and replica.process is not None and replica.process.exitcode == EXIT_TRUNCATE

    # -- running --------------------------------------------------------------------------------------
    def supervise(self) -> None:
        if self._truncate_requested():
            # The replica found this slave ahead of its master: the next start cuts its log.
            self.start_again(f"to cut the log its master does not hold (store/{TRUNCATE_MARKER})")
            return
        if self._outer is not None and self._outer.is_set():
            self._stop.set()
        for name in self.children.check():
            log.warning("broker %s: restarted its %s process", self.rt.name, name)
        now_ms = int(time.time() * 1000)
        self.state.set("control_heartbeat_ms", now_ms)
        self.notify_ready()
        if self.rt.is_slave:
            self._note_master()
            self._apply_file(META_FILE, self.service.apply_master_meta, "the master's metadata")
        else:
            self._apply_file(SLAVE_OFFSETS_FILE, self.service.apply_slave_offsets, "offsets committed on a slave")
            self._replication_listener()
        mine = {"broker"} | {c.name for c in self.children.children}
        stale = stale_heartbeats({c: self.state.get(f) for c, f in R.STATE_HEARTBEATS.items() if c in mine},
                                 now_ms, int(self.rt.config.broker.heartbeat_stale_s * 1000))
        for line in self.watchdog.due(time.monotonic(), stale):
            if line.startswith("STATUS="):
                log.warning("broker %s: %s", self.rt.name, line[len("STATUS="):])
            sd_notify(line)
        if self.ready_sent and time.monotonic() >= self._next_status_s and not stale:
            self._next_status_s = time.monotonic() + STATUS_INTERVAL_S
            w = self.state.snapshot()
            sd_notify(f"STATUS=serving: {len(self.state.active_slots())} producer sessions, commitlog at "
                      f"{w['write_pos']}, dispatched {w['dispatched_pos']}, flushed {w['flushed_pos']}")

    def notify_ready(self) -> None:
        """READY=1 once the broker is writable and registered with a NameServer (systemd starts what
        is ordered after it then; a broker nobody can find is not ready)."""
        if self.ready_sent or self.state.get("broker_state") != R.BROKER_RUNNING or not self.link.registered:
            return
        self.ready_sent = True
        sd_notify(f"READY=1\nSTATUS=serving at {self.rt.socket_path}")

    def register(self) -> None:
        t = self.service.topics
        self._ha_registered = self.ha_address()
        self.link.register(t.registration(), t.data_version, self._ha_registered)

    def _replication_listener(self) -> None:
        """A master with no slave configured opens no TCP port (``ha_link.listen_address``): the first
        slave instance made on this root starts its replication process; a new listening address is
        registered at once (a slave learns it from its own registration's answer)."""
        now = time.monotonic()
        if not any(c.name == "ha" for c in self.children.children):
            if now < self._next_slave_check_s:
                return
            self._next_slave_check_s = now + SESSION_CHECK_INTERVAL_S
            if listen_address(self.rt):
                ha = Child("ha", dict(MASTER_CHILDREN)["ha"], self.rt)
                self.children.children.insert(2, ha)       # stopped where MASTER_CHILDREN has it
                ha.start()
                log.info("broker %s: a slave is configured now: replication listener started", self.rt.name)
        elif self.state.get("ha_port") and self.ha_address() != self._ha_registered:
            self.register()

    def ha_address(self) -> str:
        """A master's replication address for the NameServers, "" if it has none."""
        return ha_address(self.rt, self.state.get("ha_port") if self.state is not None else 0)

    def _note_master(self) -> None:
        """A slave: keep the master's HA address the NameServers answered with for the replica."""
        ha = self.link.master_ha_address
        if not ha and not self.rt.config.broker.ha_master and time.monotonic() >= self._next_slave_check_s:
            self._next_slave_check_s = time.monotonic() + MASTER_ASK_S   # its master may have started listening
            self.register()
        if ha and ha != self._master_ha:
            write_json(os.path.join(self.rt.broker_dir, MASTER_FILE), {"ha_address": ha})
            self._master_ha = ha

    def _apply_file(self, name: str, apply, what: str) -> None:
        """Apply a config file another process of this broker writes (a slave: the master's metadata
        its replica stored; a master: the offsets its replication process got from slaves) when it
        changed since last applied."""
        path = self.rt.config_file(name)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return
        if (st.st_mtime_ns, st.st_size) == self._seen_files.get(name):
            return
        self._seen_files[name] = (st.st_mtime_ns, st.st_size)
        try:
            data = read_json(path, default=None)
        except ConfigError as e:
            log.warning("broker %s: %s not applied: %s", self.rt.instance, what, e)
            return
        if isinstance(data, dict):
            apply(data)

    def _stepped_down(self) -> bool:
        newer = fencing.newer_master_seen(self.rt)
        if newer is not None:
            fencing.alert(self.rt, newer)
            self.start_again(f"as a slave: {newer[0]} is the master of epoch {newer[1]}")
        return newer is not None

    def check_role(self) -> None:
        """A master steps down when a newer master of its name is recorded (``fencing.py``)."""
        if self.state.get("fenced_epoch") or self.restart is not None:
            return
        newer = fencing.newer_master_seen(self.rt)
        if newer is not None:
            fencing.fence(self.rt, self.state, newer)
            self.start_again(f"as a slave: {newer[0]} is the master of epoch {newer[1]}")

    @handles(PromoteRequest, invalid=ValidationError)
    def promote(self, req: PromoteRequest, token=None) -> Reply:
        """PROMOTE_BROKER (``broker/promotion.py``): answer, then start again as the master. Bad fields
        get MESSAGE_ILLEGAL (ValidationError at the operator's side), as they always did."""
        record = promotion.handle(self.rt, self.state, req)
        self.start_again(f"as {record.role} (epoch {record.epoch})")
        return Reply(fields={"epoch": record.epoch, "write_pos": int(self.state.get("write_pos")),
                             "instance": self.rt.instance})

    def start_again(self, why: str) -> None:
        """End this run; ``run`` starts the broker again in this process (same lock, new run)."""
        log.warning("broker %s: starting again %s", self.rt.instance, why)
        self.restart = why
        if self._stop is not None:
            self._stop.set()

    def serve(self, stop: threading.Event) -> None:
        # This run ends when the process is asked to stop (checked by ``supervise``) or when the
        # broker starts again in another role (``start_again``).
        self._outer, self._stop = stop, threading.Event()
        if self.restart is not None:        # it stepped down while starting (_stepped_down)
            return
        self.server.run(self._stop)

    # -- stop -----------------------------------------------------------------------------------------
    def shutdown(self) -> bool:
        """Stop everything; True if the store was left clean (``abort`` removed)."""
        clean = False
        st = self.state
        sd_notify("STOPPING=1\nSTATUS=stopping: draining writer, dispatcher and flusher")
        if st is not None:
            st.set("broker_state", R.BROKER_STOPPING)
        if self.server is not None and not self.server.closed and self.service is not None:
            self.link.unregister()
        codes = self.children.stop(self.rt.config.broker.child_stop_timeout_s) if self.children else {}
        if self.service is not None:
            self.service.offsets.persist(force=True)
            self.service.close()
        if st is not None and codes and all(c == 0 for c in codes.values()):
            w = st.snapshot()
            clean = w["write_pos"] == w["dispatched_pos"] == w["flushed_pos"]
            if clean:
                os.unlink(os.path.join(self.rt.store_dir, "abort"))
                fsync_dir(self.rt.store_dir)
            else:
                log.warning("broker %s: positions disagree at stop (%s); next start recovers", self.rt.name, w)
        elif codes:
            bad = ", ".join(f"{n} {describe_exit(c)}" for n, c in codes.items() if c != 0)
            log.error("broker %s: stopped uncleanly — %s; the next start runs abnormal recovery", self.rt.name, bad)
        if self.sessions is not None:
            self.sessions.close()
        if self.server is not None:
            self.server.close()
        self.link.close()
        if self.doorbell is not None:
            self.doorbell.close()
        for name in self.pool_names:
            unlink_segment(name)
        if st is not None:
            st.set("broker_state", R.BROKER_STOPPED)    # readers of this run's segment: it is over
            st.unlink()
            st.close()
        if self._store_lock_fd is not None:
            os.close(self._store_lock_fd)
        clear_starting(self.rt.root, self.rt.instance)      # between runs it has not read its role yet
        return clean


def _report_recovery(name: str, progress: RecoveryProgress, done: threading.Event) -> None:
    """While recovery runs: every few seconds log its progress, and ask systemd for more start time
    (twice the interval, so one late report does not fail the start) with the progress as STATUS."""
    while not done.wait(RECOVERY_REPORT_S):
        line = progress.line()
        log.info("broker %s: recovering the store: %s", name, line)
        sd_notify(f"EXTEND_TIMEOUT_USEC={int(RECOVERY_REPORT_S * 2 * 1e6)}\nSTATUS=recovering: {line}")


def run(rt: BrokerRuntime, stop: threading.Event) -> int:
    """The broker process's entry point; returns its exit code: ``EXIT_CLEAN`` only when the store
    was left clean (no ``abort``: the next start is a normal recovery), else ``EXIT_UNCLEAN`` — so
    systemd's ``Restart=on-failure`` restarts a broker that stopped uncleanly."""
    ensure_dir(rt.broker_dir)
    ensure_dir(rt.config_dir)
    lock_fd = take_lock(rt.lock_path, f"another broker named {rt.instance}")
    try:
        while True:
            # Its role record (live/role.py) says what this instance plays: decided again each run
            # under the name's role lock (fencing.py), since a promotion, a demotion or a step-down
            # ends a run to start the next in the new role.
            broker = Broker(fencing.decide(rt))
            try:
                broker.start()
                broker.serve(stop)
            finally:
                clean = broker.shutdown()
            log.info("broker %s stopped (%s)", rt.instance, "clean" if clean else "store needs recovery")
            if broker.restart is None or stop.is_set():
                break
    finally:
        os.close(lock_fd)
    return EXIT_CLEAN if clean else EXIT_UNCLEAN
