"""Waiting: how a loop spends its time before it sleeps (:class:`IdleStrategy`, CONVENTIONS §19), and
polling a condition against a deadline where no futex word announces the change (another process's
files or sockets; a test's or the fault harness's observations: :func:`poll_until`). Waits on shared
memory use ``shm.signal.wait_for`` (an idle strategy's phase, then futex sleeps)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from .errors import IdleStrategyError


def poll_until(cond: Callable[[], Any], timeout_s: float, what: str, *, step_s: float = 0.02,
               error: type[Exception] = TimeoutError) -> Any:
    """``cond()``'s first truthy result, looked at every ``step_s``; ``error`` (a message naming
    ``what``) once ``timeout_s`` has passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise error(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(step_s)


# -- idle strategies (CONVENTIONS §19; docs/tuning.md "Idle strategies") -------------------------------

IDLE_KINDS = ("spin", "yield", "backoff", "sleep")
IDLE_CODES = {k: i for i, k in enumerate(IDLE_KINDS)}      # the native waits' codes (hostmq/ingress/_step.c)
DEFAULT_SPIN_US = 50.0          # the spin budget where neither the string nor a legacy *_spin_s key names one
BACKOFF_SPIN_US = 10.0          # backoff: the busy-spin part of its budget; the rest is spent yielding
MAX_SPIN_US = 1_000_000.0       # one second: a longer budget is a mistake, not a strategy
HOT_PATH_PROCESSES = 4          # producer, writer, dispatcher, consumer: who must run for one message to go


@dataclass(frozen=True)
class IdleStrategy:
    """How a waiting loop spends its time before it sleeps on a futex (Aeron's and Chronicle's idle
    strategies, over hostmq's spin-then-block protocol in ``shm.signal.wait_for``).

    * ``spin`` — busy-spin re-checking the condition for ``spin_us``, then sleep on the futex: the
      lowest wake-up latency, one core at 100 % while it spins (only where cores are spare);
    * ``yield`` — re-check and ``sched_yield()`` for ``spin_us``, then sleep: the core stays busy but
      gives way to any runnable thread;
    * ``backoff`` — busy-spin up to ``BACKOFF_SPIN_US`` of the budget, yield for the rest, then sleep:
      most of spin's latency for a fraction of its CPU (the default where cores allow);
    * ``sleep`` — sleep on the futex at once: no CPU while idle, a futex wake-up (tens of µs) per message.
    """

    kind: str = "backoff"
    spin_us: float = DEFAULT_SPIN_US

    def __post_init__(self) -> None:
        if self.kind not in IDLE_KINDS:
            raise IdleStrategyError(f"idle strategy must be one of {', '.join(IDLE_KINDS)} (or auto), got {self.kind!r}")
        if isinstance(self.spin_us, bool) or not isinstance(self.spin_us, (int, float)) \
                or not 0 <= self.spin_us <= MAX_SPIN_US:
            raise IdleStrategyError(f"idle spin budget must be within 0..{MAX_SPIN_US:g} µs, got {self.spin_us!r}")

    @property
    def spin_s(self) -> float:
        """Seconds spent before the futex sleep (0 for ``sleep``)."""
        return 0.0 if self.kind == "sleep" else self.spin_us * 1e-6

    @property
    def spins(self) -> bool:
        return self.spin_s > 0

    def with_budget(self, spin_us: float) -> "IdleStrategy":
        return IdleStrategy(self.kind, spin_us)

    def __str__(self) -> str:
        return self.kind if self.kind == "sleep" else f"{self.kind}:{self.spin_us:g}"

    def idle(self, ready: Callable[[], Any], deadline_s: float) -> bool:
        """The strategy's phase before the futex: re-check ``ready`` for the budget (bounded by
        ``deadline_s``, ``time.monotonic()``); True as soon as it holds, False when the budget is spent."""
        if not self.spins:
            return False
        now = time.monotonic()
        end = min(now + self.spin_s, deadline_s)
        if self.kind == "backoff":
            busy_end = min(now + BACKOFF_SPIN_US * 1e-6, end)
        else:
            busy_end = end if self.kind == "spin" else now
        while now < busy_end:
            if ready():
                return True
            now = time.monotonic()
        while now < end:                # yield (and backoff's second part): give the core away each round
            if ready():
                return True
            os.sched_yield()
            now = time.monotonic()
        return False

    @classmethod
    def parse(cls, spec: "str | IdleStrategy | None", *, spin_us: float | None = None,
              processes: int = HOT_PATH_PROCESSES, what: str = "idle") -> "IdleStrategy":
        """``"spin"``, ``"yield:20"``, ``"backoff:50"``, ``"sleep"`` or ``"auto"`` (or ``"auto:50"``):
        the kind, then optionally ``:`` and the spin budget in µs; without one, ``spin_us`` (a legacy
        ``*_spin_s`` setting) or ``DEFAULT_SPIN_US``. ``None`` or ``""``: ``$HOSTMQ_IDLE`` if set (a
        per-process choice), else ``auto``. ``auto`` picks with :meth:`auto` for ``processes``.
        Raises :class:`IdleStrategyError` naming ``what``."""
        if isinstance(spec, IdleStrategy):
            return spec
        if spec is None or spec == "":
            spec = os.environ.get("HOSTMQ_IDLE", "") or "auto"
        if not isinstance(spec, str):
            raise IdleStrategyError(f"{what} must be an idle strategy string such as 'backoff:50', got {spec!r}")
        kind, sep, budget = spec.strip().lower().partition(":")
        if sep:
            try:
                us = float(budget)
            except ValueError:
                raise IdleStrategyError(f"{what}: the spin budget after ':' must be µs, got {spec!r}") from None
            if not 0 <= us <= MAX_SPIN_US:       # also refuses nan and inf
                raise IdleStrategyError(f"{what}: the spin budget must be within 0..{MAX_SPIN_US:g} µs, got {spec!r}")
        else:
            us = DEFAULT_SPIN_US if spin_us is None else spin_us
        if kind == "auto":
            return cls.auto(processes, spin_us=us)
        if kind not in IDLE_KINDS:
            raise IdleStrategyError(f"{what} must be one of {', '.join(IDLE_KINDS)} or auto "
                                    f"(optionally ':' and a spin budget in µs), got {spec!r}")
        try:
            return cls(kind, us)
        except IdleStrategyError as e:
            raise IdleStrategyError(f"{what}: {e}") from None

    @classmethod
    def auto(cls, processes: int = HOT_PATH_PROCESSES, *, spin_us: float = DEFAULT_SPIN_US,
             cores: int | None = None) -> "IdleStrategy":
        """``backoff`` where this process may run on more cores than the ``processes`` a message's
        hand-offs keep busy (a spinner then takes a spare core), else ``sleep``: never spin where
        processes outnumber — or merely match — the cores (a spinner would take a peer's CPU)."""
        n = available_cores() if cores is None else cores
        return cls("backoff", spin_us) if n > processes else cls("sleep", spin_us)


SLEEP = IdleStrategy("sleep", 0.0)      # a timer's wait, or a thread that must not hold the GIL spinning


def client_idle(idle: "str | IdleStrategy | None", spin_s: float | None, default_spin_s: float,
                what: str = "idle") -> IdleStrategy:
    """A client's strategy from its ``idle=`` and legacy ``spin_s=`` arguments: ``idle`` wins (its
    budget, if it names none, is ``spin_s`` or ``default_spin_s``); a bare ``spin_s`` keeps its old
    meaning, a busy spin of that long (0: sleep at once); neither: ``$HOSTMQ_IDLE`` or ``auto``."""
    if idle is None and spin_s is not None:
        if isinstance(spin_s, bool) or not isinstance(spin_s, (int, float)):
            raise IdleStrategyError(f"spin_s must be seconds, got {spin_s!r}")
        return IdleStrategy("spin", spin_s * 1e6) if spin_s > 0 else SLEEP
    budget = default_spin_s if spin_s is None else spin_s
    return IdleStrategy.parse(idle, spin_us=budget * 1e6, what=what)


def available_cores() -> int:
    """The CPUs this process may run on (its affinity mask, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):       # pragma: no cover - not Linux
        return os.cpu_count() or 1
