"""``hostmq status [ROOT] [--json | --check [--max-lag N] | --watch [--interval S]]``: brokers (pids,
positions, page-cache residency, dirty bytes, faults and RSS per process in --json, transaction
checks), topics with per-queue offsets, groups and lag.

``--check`` is for scripts and monitors: exit 0 with ``ok: …``, or exit 1 with one line saying why —
a broker down (registered but not answering, or its processes gone), a child's heartbeat older than
``broker.heartbeat_stale_s``, a group's lag on a queue above ``--max-lag``. ``--watch`` redraws the
view every ``--interval`` seconds, like ``top``, until Ctrl-C."""
from __future__ import annotations

import argparse
import sys
import threading
import time

from .. import records as R
from ..semantics.retry import DLQ_PREFIX
from ..semantics.system_topics import is_system_topic
from ..admin.admin import Admin
from ..errors import HostMQError
from ..observe import broker_tuning
from ..process import stop_on_signals
from ..root import RootPaths, resolve_root
from ..sdnotify import stale_heartbeats
from .common import load_config, print_json, print_table

EXIT_OK, EXIT_UNHEALTHY = 0, 1


def add_parser(sub) -> None:
    p = sub.add_parser("status", help="brokers, topics, queues and consumer lag under a root")
    p.add_argument("root", nargs="?", default=None)
    p.add_argument("--config", default=None, help="TOML config file (default ROOT/hostmq.toml if present)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--json", action="store_true", help="machine-readable output")
    mode.add_argument("--check", action="store_true", help="exit 1 with one line when something is unhealthy")
    mode.add_argument("--watch", action="store_true", help="refresh the view until Ctrl-C")
    p.add_argument("--max-lag", type=int, default=None, help="--check: fail when a group lags more messages "
                   "than this on a queue")
    p.add_argument("--all", action="store_true",
                   help="also list system topics (SCHEDULE_TOPIC_XXXX, RMQ_SYS_*, %%RETRY%%…), hidden by default")
    p.add_argument("--interval", type=float, default=2.0, help="--watch: seconds between refreshes (default 2)")
    p.set_defaults(func=main)


def problems(data: dict, stale_ms: int, max_lag: int | None, now_ms: int) -> list[str]:
    """What ``--check`` fails for, worst first (pure)."""
    out = []
    for b in data["brokers"]:
        if not b["alive"]:
            out.append(f"broker {b['name']} is down ({b.get('error', 'not answering')})")
            continue
        st = b.get("state", {})
        # 0: a process this broker does not run (a slave has no scheduler, a master without HA no ha)
        beats = {p: int(st.get(f, 0) or 0) for p, f in R.STATE_HEARTBEATS.items() if st.get(f, 0)}
        for line in stale_heartbeats(beats, now_ms, stale_ms):
            out.append(f"broker {b['name']}: {line}")
    if max_lag is not None:
        for g, rows in sorted(data["groups"].items()):
            for r in rows:
                if r["lag"] > max_lag:
                    out.append(f"group {g} lags {r['lag']} messages on {r['queue']} (more than {max_lag})")
    return out


def check(args: argparse.Namespace) -> int:
    root = resolve_root(args.root)
    stale_ms = int(load_config(root, args.config).broker.heartbeat_stale_s * 1000)
    try:
        with Admin(root) as a:
            data = gather(a, tuning=False)
    except HostMQError as e:
        print(f"unhealthy: {e}")
        return EXIT_UNHEALTHY
    if not data["brokers"]:
        print("unhealthy: no broker is registered with the NameServers")
        return EXIT_UNHEALTHY
    bad = problems(data, stale_ms, args.max_lag, int(time.time() * 1000))
    if bad:
        print(f"unhealthy: {bad[0]}" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""))
        return EXIT_UNHEALTHY
    lag = max((r["lag"] for rows in data["groups"].values() for r in rows), default=0)
    print(f"ok: {len(data['brokers'])} broker(s) up, every process beating, largest group lag {lag}")
    return EXIT_OK


def watch(args: argparse.Namespace) -> int:
    stop = threading.Event()
    stop_on_signals(stop, ignore_sigint=False)
    with Admin(args.root) as a:
        while not stop.is_set():
            try:
                data = gather(a)
            except HostMQError as e:
                data = None
                error = str(e)
            sys.stdout.write("\x1b[H\x1b[2J")          # home and clear, as top does
            print(f"hostmq status — {time.strftime('%H:%M:%S')} — every {args.interval:g} s, Ctrl-C quits")
            if data is None:
                print(f"unavailable: {error}")
            else:
                show(data)
            sys.stdout.flush()
            stop.wait(args.interval)
    return EXIT_OK


def gather(admin: Admin, tuning: bool = True) -> dict:
    brokers = admin.brokers()
    paths = RootPaths.of(admin.root)
    for b in brokers if tuning else ():     # page-cache picture, read from outside the broker (mincore, /proc)
        b["tuning"] = broker_tuning(paths.store_dir(b.get("instance", b["name"])), b.get("state") if b["alive"] else None)
    groups = sorted({g for b in brokers for g in b.get("groups", [])})
    progress = {g: admin.consumer_progress(g) for g in groups}
    return {"root": admin.root, "brokers": brokers, "topics": admin.topics(), "groups": progress}


def main(args: argparse.Namespace) -> int:
    if args.check:
        return check(args)
    if args.watch:
        return watch(args)
    with Admin(args.root) as a:
        data = gather(a)
    if args.json:
        for rows in data["groups"].values():
            for r in rows:
                r["queue"] = str(r["queue"])
        print_json(data)
        return 0
    show(data, system_topics=args.all)
    return 0


def replication(b: dict) -> str:
    """A slave: how far behind its master it is (bytes, and "!" while its replica is not connected);
    a master: how many slaves stream from it; "-" for neither."""
    st = b.get("state") or {}
    if b.get("role") == "SLAVE" and "lag_bytes" in b:
        return f"{b['lag_bytes']} B" + ("" if st.get("replica_connected") else " !")
    return f"{st['ha_slaves']} slave(s)" if st.get("ha_pid") else "-"


def shown_topic(topic: str, system_topics: bool) -> bool:
    """Whether ``status`` lists a topic: the users' own, and dead letters (they need someone's attention);
    the broker's own topics and retry topics only with ``--all``."""
    return system_topics or topic.startswith(DLQ_PREFIX) or not is_system_topic(topic)


def show(data: dict, system_topics: bool = False) -> None:
    print(f"root {data['root']}")
    rows = []
    for b in data["brokers"]:
        st = b.get("state", {})
        rows.append({"broker": b.get("instance", b["name"]), "id": b["id"], "role": b.get("role", "-"),
                     "epoch": b.get("epoch", "-"), "repl lag": replication(b), "cluster": b["cluster"],
                     "alive": b["alive"], "pid": b["pids"].get("broker", "-"),
                     "writer/dispatcher/flusher": "/".join(str(b["pids"].get(k, "-"))
                                                          for k in ("writer", "dispatcher", "flusher")),
                     "write_pos": st.get("write_pos", "-"), "dispatched": st.get("dispatched_pos", "-"),
                     "flushed": st.get("flushed_pos", "-"), "sessions": b.get("sessions", "-"),
                     "cached (log/cq)": f"{b['tuning']['commitlog']['total_pct']}%/"
                                        f"{b['tuning']['consume_queues']['total_pct']}%",
                     "dirty": b["tuning"].get("dirty_bytes", "-"),
                     "tx checking/given up": "{}/{}".format(b.get("transactions", {}).get("checking", "-"),
                                                            b.get("transactions", {}).get("given_up_total", "-"))})
    print_table(rows, ["broker", "id", "role", "epoch", "repl lag", "cluster", "alive", "pid",
                       "writer/dispatcher/flusher", "write_pos", "dispatched", "flushed", "sessions",
                       "cached (log/cq)", "dirty", "tx checking/given up"])
    queues = [{"topic": q["topic"], "broker": b["name"], "queue": q["queue_id"], "min_offset": q["min_offset"],
               "max_offset": q["max_offset"]} for b in data["brokers"] if b["id"] == 0 for q in b.get("queues", [])
              if shown_topic(q["topic"], system_topics)]
    hidden = {q["topic"] for b in data["brokers"] for q in b.get("queues", [])} - {q["topic"] for q in queues}
    print()
    print_table(sorted(queues, key=lambda r: (r["topic"], r["broker"], r["queue"])),
                ["topic", "broker", "queue", "min_offset", "max_offset"])
    if hidden:
        print(f"({len(hidden)} system topic(s) not shown: --all lists them)")
    for g, rows in data["groups"].items():
        print(f"\ngroup {g}")
        print_table([{"queue": str(r["queue"]), "broker_offset": r["broker_offset"],
                      "consumer_offset": r["consumer_offset"], "lag": r["lag"]} for r in rows],
                    ["queue", "broker_offset", "consumer_offset", "lag"])
