"""``hostmq up [ROOT] [--brokers N] [--namesrvs N] [--config FILE] [--profile dev|production] [--demo]``:
a whole cluster in the foreground (NameServers + brokers as processes); Ctrl-C or SIGTERM stops it cleanly.
A new root gets the ``dev`` store profile (tens of MB) unless the config or ``--profile`` says otherwise.

Exit code 0 only when every server stopped cleanly at our request; 1 (``EXIT_UNCLEAN``) when a server
died on its own (the cluster is stopped then: systemd's ``Restart=on-failure`` restarts it) or stopped
uncleanly. Under a notify socket it is the unit's voice: READY=1 once every server is ready,
WATCHDOG=1 while every server runs, STOPPING=1 (the servers themselves do not notify)."""
from __future__ import annotations

import argparse
import logging
import os
import threading
import time

from .. import logsetup
from ..access import secure_root
from ..client.producer import Producer
from ..cluster import LocalCluster
from ..process import EXIT_CLEAN, EXIT_UNCLEAN, describe_exit, ignore_stop_signals, stop_on_signals
from ..sdnotify import Watchdog, sd_notify
from ..root import resolve_root
from . import workload
from ..config import PROFILES
from .common import add_root_and_config, load_config, raw_config

DEMO_TOPIC = "DemoTopic"
log = logging.getLogger("hostmq.up")


def add_parser(sub) -> None:
    p = sub.add_parser("up", help="run NameServer(s) and broker(s) in the foreground (Ctrl-C stops them)")
    add_root_and_config(p)
    p.add_argument("--brokers", type=int, default=1, help="brokers to run (default 1)")
    p.add_argument("--namesrvs", type=int, default=1, help="NameServers to run (default 1)")
    p.add_argument("--group", default=None, help="the group whose members may use the root (default: "
                   "[access] group, else the root directory's group)")
    p.add_argument("--profile", choices=sorted(PROFILES), default=None,
                   help="store file sizes of a new root: dev (tens of MB) or production (RocketMQ's: 1 GiB "
                        "commitlog files); default: [store] profile of the config, else dev")
    p.add_argument("--demo", action="store_true", help="run a short produce / consume demo, then keep serving")
    p.add_argument("--demo-messages", type=int, default=20_000, help="messages per demo phase (default 20 000)")
    p.set_defaults(func=main)


def demo(root: str, n: int) -> None:
    print(f"demo: topic {DEMO_TOPIC}, 100-byte bodies, {n:,} messages per phase", flush=True)
    workload.ensure_topic(root, DEMO_TOPIC)
    # Rates move 10× with what else runs: say how busy this machine is, and what a healthy figure is.
    load1 = os.getloadavg()[0]
    cpus = os.cpu_count() or 1
    print(f"  machine: {cpus} CPU(s), load average {load1:.1f}"
          + (" — busy: the figures below will be low" if load1 > cpus else ""), flush=True)
    print("  healthy on a quiet 2-vCPU VM (docs/performance.md): sync sends ≈ 35 k/s (p50 ≈ 21 µs), "
          "send_batch ≈ 115 k/s, end to end p50 ≈ 0.3 ms", flush=True)
    with Producer(root, group="demo") as p:
        rate, lat = workload.sync_sends(p, DEMO_TOPIC, min(n, 5000))
        print(f"  send (sync, one at a time)  {rate:>12,.0f} msgs/s   latency p50 {lat['p50']:.0f} µs, "
              f"p99 {lat['p99']:.0f} µs, p99.9 {lat['p99.9']:.0f} µs", flush=True)
        rate = workload.async_sends(p, DEMO_TOPIC, n)
        print(f"  send_async                  {rate:>12,.0f} msgs/s", flush=True)
        rate = workload.batch_sends(p, DEMO_TOPIC, n * 5)
        print(f"  send_batch (100 a batch)    {rate:>12,.0f} msgs/s", flush=True)
        total = min(n, 5000) + n + n * 5
        rate = workload.consume_all(root, DEMO_TOPIC, total)
        print(f"  consume (pull, mmap reads)  {rate:>12,.0f} msgs/s", flush=True)
        e2e = workload.end_to_end(p, root, DEMO_TOPIC, 2000)
        print(f"  end to end, producer → consumer process: p50 {e2e['p50']:.0f} µs, p99 {e2e['p99']:.0f} µs, "
              f"p99.9 {e2e['p99.9']:.0f} µs ({e2e['received']} received)", flush=True)


def store_profile(raw: dict, chosen: str | None) -> dict:
    """The store keys ``up`` runs with: the chosen profile (else the config's, else dev) and the sizes
    the config file sets itself, which win over any profile."""
    store = raw.get("store") if isinstance(raw.get("store"), dict) else {}
    profile = chosen or store.get("profile") or "dev"
    return {"profile": profile, **{k: v for k, v in store.items() if k in PROFILES["production"]}}


def main(args: argparse.Namespace) -> int:
    root = resolve_root(args.root)
    cfg = load_config(root, args.config)
    cfg = cfg.with_overrides({"store": store_profile(raw_config(root, args.config), args.profile)})
    if args.group is not None:              # written into the servers' config by LocalCluster
        cfg = cfg.with_overrides({"access": {"group": args.group}})
    logsetup.configure(cfg.logging, root, args.log_level, "up")   # exported: the servers inherit the level
    secure_root(root, cfg.access.group)
    stop = threading.Event()
    stop_on_signals(stop, ignore_sigint=False)
    watchdog = Watchdog.from_env()
    died: list[str] = []
    print(f"hostmq up: root {root}, {args.namesrvs} NameServer(s), {args.brokers} broker(s)", flush=True)
    with LocalCluster(root, brokers=args.brokers, namesrvs=args.namesrvs, config=cfg) as cluster:
        print(f"  running: {', '.join(cluster.brokers)} (logs in {root}/logs); Ctrl-C stops", flush=True)
        sd_notify(f"READY=1\nSTATUS=serving: {len(cluster.processes)} servers under {root}")
        if args.demo:
            demo(root, args.demo_messages)
            print("demo done; still serving — Ctrl-C stops the cluster", flush=True)
        while not stop.is_set():
            ended = [(n, p) for n, p in cluster.processes.items() if p.poll() is not None]
            if ended and all(p.returncode == 0 for _, p in ended):
                # Stopped cleanly by someone else (systemd signals every process of the unit at
                # once): the cluster stops with it, and that is not a failure.
                print(f"hostmq up: {ended[0][0]} stopped; stopping the cluster", flush=True)
                break
            died = [f"{n} (pid {p.pid}) {describe_exit(p.returncode)}" for n, p in ended if p.returncode != 0]
            if died:
                msg = f"hostmq up: {died[0]} — it was not asked to stop; stopping the cluster"
                print(msg, flush=True)
                log.error(msg)
                sd_notify(f"STATUS={msg}")
                break
            for line in watchdog.due(time.monotonic(), []):
                sd_notify(line)
            if stop.wait(min(0.5, watchdog.period_s / 4) if watchdog.enabled else 0.5):
                break
        sd_notify("STOPPING=1\nSTATUS=stopping")
        print("stopping…", flush=True)
    unclean = [f"{n} {describe_exit(c)}" for n, c in cluster.exit_codes.items() if c != 0]
    if unclean and not died:
        print(f"hostmq up: stopped uncleanly: {', '.join(unclean)}", flush=True)
    print("stopped", flush=True)
    ignore_stop_signals()           # stopped: a late SIGTERM must not turn this exit into a kill
    return EXIT_UNCLEAN if died or unclean else EXIT_CLEAN
