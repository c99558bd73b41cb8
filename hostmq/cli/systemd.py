"""``hostmq systemd [ROOT] --out DIR [--user USER] [--group GROUP]``: systemd units for one root.

Renders ``hostmq-namesrv.service``, ``hostmq-broker@.service`` (instance = broker name) and
``hostmq-exporter.service`` (Prometheus metrics, ``hostmq exporter``) with the absolute path of this
installation's ``hostmq``. What each setting is for:

* ``Type=notify``, ``NotifyAccess=main``: the server says READY=1 only once it serves (a broker: writable
  and registered), STATUS= lines, STOPPING=1 (``hostmq/sdnotify.py``); ``WatchdogSec=``: a broker pings
  only while every child's heartbeat is fresh, so a hung writer gets the unit restarted.
* ``Restart=on-failure``: a broker exits non-zero when it stopped uncleanly (its store needs recovery)
  or died; 0 only after a clean stop.
* ``TimeoutStartSec``: crash recovery of a large store takes minutes; it also extends the timeout
  itself (EXTEND_TIMEOUT_USEC) while it runs. ``TimeoutStopSec``: the writer → dispatcher → flusher
  drain and the final flush.
* ``KillMode=mixed``: SIGTERM to the main process only, SIGKILL to the rest after the timeout. The
  default (``control-group``: SIGTERM to every process at once) stops a broker just as cleanly — its
  children pass the signal to their supervisor (``hostmq/process.py``) — so this is not what makes a
  stop correct, only quieter.
* ``LimitMEMLOCK=infinity`` (brokers only): the transient store pool and the commitlog head are ``mlock``ed.
* ``User=``/``Group=``/``UMask=0007``: the root belongs to one user and one group (docs/guarantees.md: access).
* Sandboxing that still lets the bus work, each unit given only what it needs: ``ProtectSystem=strict``
  with ``ReadWritePaths=`` the root, and ``/dev/shm`` for brokers (segments and semaphores); address
  families AF_UNIX for the NameServer (no IP at all), AF_INET/AF_INET6 too for brokers (replication)
  and the exporter (HTTP); no capabilities; ``PrivateTmp=no`` and no ``PrivateDevices=`` (both would
  give the unit its own /dev/shm or /tmp, invisible to clients); ``RemoveIPC=no`` — with ``User=``,
  ``RemoveIPC=yes`` would unlink the user's shared memory when the unit stops, the segments a
  restarted broker salvages acknowledged messages from.
"""
from __future__ import annotations

import argparse
import grp
import os
import pwd
import shutil
import sys

from ..errors import ConfigError
from ..root import resolve_root

NAMESRV_UNIT = "hostmq-namesrv.service"
BROKER_UNIT = "hostmq-broker@.service"
EXPORTER_UNIT = "hostmq-exporter.service"
WATCHDOG_SEC = 30
# Hardening every unit shares: no capabilities at all (mlock within LimitMEMLOCK needs none), the
# file system read-only but for ReadWritePaths=, no clock, kernel-log, hostname or namespace changes,
# native system calls only. Not used, each for a reason: ProtectProc=invisible (a broker reads a
# client's /proc/PID to check what SO_PEERCRED names, and clients run as other users),
# PrivateTmp=/PrivateDevices= (a private /dev/shm or /tmp is invisible to clients),
# MemoryDenyWriteExecute= (ctypes callbacks need executable memory), PrivateUsers= (clients' groups),
# SystemCallFilter= (futex_waitv is newer than some filter sets, and a filtered call kills the server).
SANDBOX = """\
ProtectSystem=strict
ProtectHome=read-only
ReadWritePaths={rw}
PrivateTmp=no
RemoveIPC=no
NoNewPrivileges=yes
CapabilityBoundingSet=
AmbientCapabilities=
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
SystemCallArchitectures=native
DevicePolicy=closed
RestrictAddressFamilies={families}
"""
NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def add_parser(sub) -> None:
    p = sub.add_parser("systemd", help="render systemd units (NameServer, broker@NAME) for a root")
    p.add_argument("root", nargs="?", default=None, help="root directory (default $HOSTMQ_ROOT or ~/.hostmq)")
    p.add_argument("--out", required=True, help="directory to write the unit files to (e.g. /etc/systemd/system)")
    p.add_argument("--user", default=None, help="user the servers run as (default: the root's owner, else you)")
    p.add_argument("--group", default=None, help="group that may use the bus (default: the user's group)")
    p.add_argument("--metrics-listen", default="127.0.0.1:9464", help="the exporter unit's HOST:PORT, or 'unix' "
                   "for ROOT/exporter.sock (docs/trust-control.md)")
    p.set_defaults(func=main)


def hostmq_command() -> list[str]:
    """The absolute command line of this installation's ``hostmq``."""
    exe = os.path.join(os.path.dirname(sys.executable), "hostmq")
    if os.access(exe, os.X_OK):
        return [exe]
    found = shutil.which("hostmq")
    if found:
        return [os.path.realpath(found)]
    return [sys.executable, "-m", "hostmq.cli.main"]


def _check_name(kind: str, value: str) -> str:
    if not value or not set(value) <= NAME_CHARS or value.startswith("-"):
        raise ConfigError(f"{kind} must be letters, digits, '.', '_' or '-', got {value!r}")
    return value


def _quote(arg: str) -> str:
    """One argument of an ``ExecStart=`` line (systemd's own quoting; ``%`` is a specifier)."""
    arg = arg.replace("%", "%%")
    if arg and not any(c in arg for c in " \t\"'\\;$"):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_units(root: str, command: list[str], user: str, group: str,
                 metrics_listen: str = "127.0.0.1:9464") -> dict[str, str]:
    """The unit files (name → text) for ``root``; pure."""
    from ..metrics import parse_listen
    from ..metrics_http import unix_path
    if not os.path.isabs(root):
        raise ConfigError(f"the root must be an absolute path in a unit, got {root!r}")
    _check_name("user", user)
    _check_name("group", group)
    unix = unix_path(metrics_listen, root)
    if unix is None:
        parse_listen(metrics_listen)
    where = f"unix:{unix}:/metrics (owner and group only)" if unix else f"http://{metrics_listen}/metrics"
    exe = " ".join(_quote(a) for a in command)
    r = _quote(root)
    identity = f"""\
Type=notify
NotifyAccess=main
Restart=on-failure
RestartSec=2s
User={user}
Group={group}
UMask=0007
Environment=HOSTMQ_ROOT={r}
"""
    server = identity + f"""\
WatchdogSec={WATCHDOG_SEC}s
KillMode=mixed
LimitNOFILE=65536
"""
    # The NameServer keeps routes: its sockets in the root, no shared memory, no network, no mlock.
    namesrv_sandbox = server + SANDBOX.format(rw=r, families="AF_UNIX") + "IPAddressDeny=any\n"
    # A broker maps its state and pool buffers in /dev/shm, mlocks them, and replicates over TCP.
    broker_sandbox = server + "LimitMEMLOCK=infinity\n" + SANDBOX.format(rw=f"{r} /dev/shm",
                                                                         families="AF_UNIX AF_INET AF_INET6")
    exporter = f"""\
# Rendered by `hostmq systemd` for the root {root}: Prometheus metrics at {where}
# (needs the metrics extra: pip install 'hostmq[metrics]').
[Unit]
Description=hostmq metrics exporter ({root})
After={NAMESRV_UNIT}

[Service]
ExecStart={exe} exporter {r} --listen {_quote(metrics_listen)}
TimeoutStartSec=60s
TimeoutStopSec=10s
{identity}{SANDBOX.format(rw=r, families="AF_UNIX AF_INET AF_INET6")}
[Install]
WantedBy=multi-user.target
"""
    namesrv = f"""\
# Rendered by `hostmq systemd` for the root {root}.
[Unit]
Description=hostmq NameServer ({root})
After=local-fs.target

[Service]
ExecStart={exe} namesrv {r}
TimeoutStartSec=60s
TimeoutStopSec=30s
{namesrv_sandbox}
[Install]
WantedBy=multi-user.target
"""
    broker = f"""\
# Rendered by `hostmq systemd` for the root {root}. One instance per broker name:
#   systemctl enable --now hostmq-broker@broker-a
[Unit]
Description=hostmq broker %i ({root})
Wants={NAMESRV_UNIT}
After={NAMESRV_UNIT} local-fs.target

[Service]
ExecStart={exe} broker {r} --name %i
# Crash recovery of a large store is long (it extends this itself while it makes progress);
# a stop drains the writer, dispatcher and flusher and writes the final checkpoint.
TimeoutStartSec=300s
TimeoutStopSec=120s
{broker_sandbox}
[Install]
WantedBy=multi-user.target
"""
    return {NAMESRV_UNIT: namesrv, BROKER_UNIT: broker, EXPORTER_UNIT: exporter}


def default_user_group(root: str, user: str | None, group: str | None) -> tuple[str, str]:
    """``--user`` else the root's owner (if it exists) else whoever runs this; ``--group`` else that
    user's primary group."""
    if user is None:
        uid = os.stat(root).st_uid if os.path.exists(root) else os.getuid()
        user = pwd.getpwuid(uid).pw_name
    if group is None:
        try:
            group = grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name
        except KeyError:
            raise ConfigError(f"no such user {user!r}; give --group") from None
    return user, group


def missing_prerequisites(root: str, user: str, group: str) -> list[str]:
    """What the units need that this host lacks yet: the user, the group, the root (each with the
    command that makes it). A unit started without them fails with 217/USER or 226/NAMESPACE."""
    out = []
    try:
        pwd.getpwnam(user)
    except KeyError:
        out.append(f"user {user!r} does not exist: useradd --system --no-create-home --shell /usr/sbin/nologin "
                   f"--user-group {user}")
    try:
        grp.getgrnam(group)
    except KeyError:
        out.append(f"group {group!r} does not exist: groupadd --system {group}")
    if not os.path.isdir(root):
        out.append(f"root {root} does not exist: install -d -m 2750 -o {user} -g {group} {root}")
    return out


def main(args: argparse.Namespace) -> int:
    root = resolve_root(args.root)
    user, group = default_user_group(root, args.user, args.group)
    for line in missing_prerequisites(root, user, group):
        print(f"hostmq: warning: {line}", file=sys.stderr)
    os.makedirs(args.out, exist_ok=True)
    for name, text in render_units(root, hostmq_command(), user, group, args.metrics_listen).items():
        path = os.path.join(args.out, name)
        with open(path, "w") as f:
            f.write(text)
        print(path)
    print(f"next: systemctl daemon-reload && systemctl enable --now {NAMESRV_UNIT} "
          f"hostmq-broker@broker-a.service")
    return 0
