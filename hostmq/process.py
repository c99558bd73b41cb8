"""How hostmq processes are launched, stopped and supervised (docs/internals.md facts 12, 13).

What a process *runs* is a module with ``run(config, stop) -> int`` (``stop`` is a
``threading.Event`` set on SIGTERM); *how* it is launched is here, so a test can call ``run`` in a
thread or launch it for real. Children are started with the ``spawn`` method from the main thread
(never ``fork`` once threads or zmq exist) and set ``PR_SET_PDEATHSIG`` so they die with their parent.

Who orders a stop: the supervisor. A child stops on ``CHILD_STOP_SIGNAL`` (SIGUSR1), which only its
supervisor sends (``Child.stop``) and the kernel sends when the supervisor dies. SIGTERM or SIGINT that
reaches a child — systemd's default stop signals every process of the unit at once, Ctrl-C signals the
whole foreground process group — is passed on to the supervisor, never obeyed directly: the broker's
writer → dispatcher → flusher drain only works in that order, and a writer that stopped by itself
while the dispatcher still ran, or a dispatcher that stopped before the writer's last batch, left the
store needing recovery. So a SIGTERM to any process of a broker stops the whole broker, in order.
The supervisor restarts a child that died, with exponential backoff (``restart_delay_s``, pure).
"""
from __future__ import annotations

import ctypes
import importlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
CHILD_STOP_SIGNAL = signal.SIGUSR1
_SPAWN = multiprocessing.get_context("spawn")


def set_parent_death_signal(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` when our parent dies; exit now if it already has."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        log.warning("prctl(PR_SET_PDEATHSIG) unavailable; child may outlive its parent")
    if parent == 1 or os.getppid() != parent:
        os._exit(0)


class _SignalRelay:
    """Signal handlers that never take a lock. CPython runs a Python handler in the main thread
    between two bytecodes — inside another handler, too, or while that thread holds an Event's lock
    in ``Event.wait``. A handler that calls ``Event.set`` (which takes that lock) then waits on its
    own thread forever. It happened: systemd signals all six processes of a broker at once, five
    children forward their SIGTERM, and the supervisor, handling one, got the next and hung with no
    stop begun (``tests/test_process.py`` sends such bursts). So the handler only writes the
    signal's number into a pipe (non-blocking: a full pipe already holds a wake-up), and a daemon
    thread reads it and acts — sets the event, forwards to the parent — outside signal context."""

    def __init__(self) -> None:
        self.actions: dict[int, object] = {}
        self.r, self.w = os.pipe()
        os.set_blocking(self.w, False)
        threading.Thread(target=self._relay, name="hostmq-signals", daemon=True).start()

    def handler(self, signum, _frame) -> None:
        try:
            os.write(self.w, bytes((signum,)))
        except OSError:                     # full (a wake-up is pending) or closed at exit
            pass

    def _relay(self) -> None:
        while True:
            try:
                got = os.read(self.r, 64)
            except InterruptedError:
                continue
            except OSError:
                return
            if not got:
                return
            for signum in dict.fromkeys(got):         # each signal once per read, in order
                action = self.actions.get(signum)
                if action is None:
                    continue
                try:
                    action(signum)
                except Exception:                      # noqa: BLE001 — the relay must outlive one action
                    log.exception("handling signal %d", signum)


_relay: _SignalRelay | None = None
_relay_lock = threading.Lock()


def on_signal(signum: int, action) -> None:
    """Run ``action(signum)`` when ``signum`` arrives — from the relay thread, never in signal
    context, so it may take locks (``Event.set``). Install from the main thread, as ``signal.signal``."""
    global _relay
    with _relay_lock:
        if _relay is None:              # a forked child starts without one (below)
            _relay = _SignalRelay()
        _relay.actions[int(signum)] = action
        signal.signal(signum, _relay.handler)


def _forget_relay_in_fork_child() -> None:
    # A child forked without exec has no relay thread, and its pipe is shared with the parent: its
    # signals go back to the default action until it installs its own.
    global _relay
    if _relay is not None:
        for signum in _relay.actions:
            signal.signal(signum, signal.SIG_DFL)
        _relay = None


os.register_at_fork(after_in_child=_forget_relay_in_fork_child)


def ignore_stop_signals() -> None:
    """Once a process's run has returned: later stop signals are moot. CPython's finalization puts
    back the default action of every signal with a Python handler, so a SIGTERM (or a second
    CHILD_STOP_SIGNAL) arriving while it exits would kill it and turn a clean exit into "killed by
    SIGTERM"; an ignored signal stays ignored."""
    for signum in (signal.SIGTERM, signal.SIGINT, CHILD_STOP_SIGNAL):
        signal.signal(signum, signal.SIG_IGN)


def stop_on_signals(stop: threading.Event, ignore_sigint: bool) -> None:
    """SIGTERM (and SIGINT unless ignored) set ``stop``: the process's loop ends cleanly."""
    on_signal(signal.SIGTERM, lambda _s: stop.set())
    if ignore_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    else:
        on_signal(signal.SIGINT, lambda _s: stop.set())


def defer_stop_to_parent(stop: threading.Event) -> None:
    """A supervised child's signals: ``CHILD_STOP_SIGNAL`` sets ``stop``; SIGTERM and SIGINT are passed
    to the parent (the supervisor orders the stop) — or set ``stop`` if the parent is already gone."""
    def forward(_signum):
        parent = os.getppid()
        if parent == 1:
            stop.set()
            return
        try:
            os.kill(parent, signal.SIGTERM)
        except OSError:
            stop.set()
    on_signal(CHILD_STOP_SIGNAL, lambda _s: stop.set())
    on_signal(signal.SIGTERM, forward)
    on_signal(signal.SIGINT, forward)


def resolve(target: str):
    """``"package.module:function"`` (function defaults to ``run``) → the callable."""
    module, _, func = target.partition(":")
    return getattr(importlib.import_module(module), func or "run")


PR_SET_NAME = 15


def set_process_name(name: str) -> None:
    """The name ``ps -o comm`` and ``top`` show (15 bytes), e.g. ``hostmq-writer``."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


def child_main(target: str, config) -> None:
    """Entry point of a spawned child: stop when the supervisor says so (or dies), run the target."""
    set_parent_death_signal(CHILD_STOP_SIGNAL)
    set_process_name("hostmq-" + target.rsplit(".", 1)[-1].split(":")[0])
    stop = threading.Event()
    defer_stop_to_parent(stop)
    cfg = getattr(config, "config", None)          # a BrokerRuntime: the broker's [logging] section
    if cfg is not None and hasattr(cfg, "logging"):
        from . import logsetup
        role = target.rsplit(".", 1)[-1].split(":")[0]
        logsetup.configure(cfg.logging, getattr(config, "root", None),
                           name=f"{getattr(config, 'name', '')}.{role}".lstrip("."))
    else:
        logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {target} %(levelname)s %(message)s")
    try:
        rc = resolve(target)(config, stop)
    finally:
        ignore_stop_signals()
    sys.exit(rc or 0)


EXIT_CLEAN = 0
EXIT_UNCLEAN = 1            # a server that stopped but left work undone (a broker's store needs recovery),
                            # or ``hostmq up`` after a server it started died: systemd's on-failure restarts


def describe_exit(code: int | None) -> str:
    """An exit status as an operator reads it: ``exit code 3``, ``killed by SIGKILL``, ``still running``."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def restart_delay_s(restarts: int, uptime_s: float, base_s: float = 0.1, cap_s: float = 5.0) -> float:
    """Backoff before restarting a child that died: doubles per quick death, resets after 10 s up."""
    if uptime_s >= 10.0:
        return base_s
    return min(cap_s, base_s * (2 ** min(restarts, 16)))


@dataclass
class Child:
    """One supervised child process running ``target(config, stop)``."""

    name: str
    target: str
    config: object
    process: multiprocessing.process.BaseProcess | None = None
    started_at: float = 0.0
    restarts: int = 0
    next_start_at: float = 0.0
    history: list = field(default_factory=list)

    def start(self) -> None:
        self.process = _SPAWN.Process(target=child_main, args=(self.target, self.config),
                                      name=f"hostmq-{self.name}", daemon=False)
        self.process.start()
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """``CHILD_STOP_SIGNAL``, wait up to ``timeout_s``, then SIGKILL. Returns the exit code."""
        p = self.process
        if p is None:
            return None
        if p.is_alive():
            try:
                os.kill(p.pid, CHILD_STOP_SIGNAL)
            except ProcessLookupError:
                pass
            p.join(timeout_s)
            if p.is_alive():
                log.warning("%s did not stop in %.1f s; killing it", self.name, timeout_s)
                p.kill()
                p.join(5.0)
        code = p.exitcode
        p.close()
        self.process = None
        return code


class Supervisor:
    """Starts children, restarts the ones that die, stops them in order."""

    def __init__(self, children: list[Child]) -> None:
        self.children = children

    def start(self) -> None:
        for c in self.children:
            c.start()

    def check(self, now: float | None = None) -> list[str]:
        """Restart children that died (after their backoff); returns the names restarted."""
        now = time.monotonic() if now is None else now
        restarted = []
        for c in self.children:
            if c.process is None or c.alive():
                continue
            if c.next_start_at == 0.0:
                code = c.process.exitcode
                c.history.append(code)
                c.next_start_at = now + restart_delay_s(c.restarts, now - c.started_at)
                log.warning("%s (pid %s) exited with %s (%s); restarting", c.name, c.pid, code, describe_exit(code))
            if now >= c.next_start_at:
                c.process.close()
                c.restarts += 1
                c.next_start_at = 0.0
                c.start()
                restarted.append(c.name)
        return restarted

    def stop(self, timeout_s: float = 10.0) -> dict[str, int | None]:
        """Stop children in list order (writer → dispatcher → flusher for a broker)."""
        return {c.name: c.stop(timeout_s) for c in self.children}
