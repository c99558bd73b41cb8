"""systemd's notify protocol without a dependency: ``sd_notify`` and the watchdog's schedule.

Under a ``Type=notify`` unit systemd passes ``NOTIFY_SOCKET`` (a unix datagram socket; ``@`` is the
abstract namespace) and, with ``WatchdogSec=``, ``WATCHDOG_USEC`` (and ``WATCHDOG_PID``: the pid the
watchdog is meant for — a child that inherited the environment must not ping for its parent). The
messages hostmq sends (``man sd_notify``): ``READY=1`` once a server serves, ``STATUS=…`` lines,
``STOPPING=1``, ``WATCHDOG=1`` at half the watchdog period while the server is healthy, and
``EXTEND_TIMEOUT_USEC=…`` while a long start-up step (crash recovery) still runs.

``Watchdog`` is the pure part: given the time and what is unhealthy, which message is due. A server
whose children stopped beating (a hung writer, a SIGSTOPped dispatcher) stops pinging, so systemd
kills and restarts the unit — the one thing a supervisor in the same process group cannot do for
itself when the hung child holds the store.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass

NOTIFY_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def sd_notify(state: str) -> bool:
    """Send ``state`` (``"READY=1"``, several lines joined by newlines) to systemd: True if a notify
    socket took it; False without one (not under systemd) or when it refused."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        try:
            s.connect(addr)
            s.sendall(state.encode())
        except OSError:
            return False
    return True


def watchdog_period_s(env=None, pid: int | None = None) -> float | None:
    """The watchdog period systemd asked this process for (``WATCHDOG_USEC``), or None."""
    env = os.environ if env is None else env
    try:
        usec = int(env.get("WATCHDOG_USEC", "0"))
    except ValueError:
        return None
    target = env.get("WATCHDOG_PID")
    if usec <= 0 or (target and target != str(os.getpid() if pid is None else pid)):
        return None
    return usec / 1e6


def environment_without_notify(env=None) -> dict[str, str]:
    """``env`` minus the notify variables: for the servers ``hostmq up`` starts — they are not the
    unit's main process, and only ``hostmq up`` speaks for the cluster."""
    env = os.environ if env is None else env
    return {k: v for k, v in env.items() if k not in NOTIFY_ENV}


@dataclass
class Watchdog:
    """When to send ``WATCHDOG=1``: every half period while nothing is unhealthy (sd_watchdog_enabled's
    advice). While something is, the pings stop and one ``STATUS=`` line says why; when it is healthy
    again the pings resume at once with a status saying so."""

    period_s: float | None
    next_ping_s: float = 0.0
    withheld_for: str = ""

    @classmethod
    def from_env(cls, env=None) -> "Watchdog":
        return cls(watchdog_period_s(env))

    @property
    def enabled(self) -> bool:
        return self.period_s is not None

    def due(self, now_s: float, unhealthy: list[str]) -> list[str]:
        """The messages to send now (none when nothing is due)."""
        if self.period_s is None:
            return []
        if unhealthy:
            why = ", ".join(unhealthy)
            if why == self.withheld_for:
                return []
            self.withheld_for = why
            return [f"STATUS=unhealthy: {why}; watchdog pings withheld"]
        out = []
        if self.withheld_for:
            self.withheld_for = ""
            self.next_ping_s = 0.0
            out.append("STATUS=healthy again")
        if now_s >= self.next_ping_s:
            self.next_ping_s = now_s + self.period_s / 2
            out.append("WATCHDOG=1")
        return out


def stale_heartbeats(heartbeats_ms: dict[str, int], now_ms: int, stale_ms: int) -> list[str]:
    """The names whose heartbeat is older than ``stale_ms`` (0 = never beat: stale too)."""
    return [f"{name} heartbeat {'missing' if not ms else f'{(now_ms - ms) / 1000:.1f} s old'}"
            for name, ms in sorted(heartbeats_ms.items()) if not ms or now_ms - ms > stale_ms]
