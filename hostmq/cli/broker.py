"""``hostmq broker [ROOT] --name NAME [--id 0] [--master tcp://HOST:PORT]``: run a broker (and its
children) in the foreground. An id ≥ 1 runs a slave of NAME's master (docs/replication.md): from
``--master`` (another host), else from the master's HA address the NameServers hold."""
from __future__ import annotations

import argparse

from ..broker import supervisor
from ..live import group
from ..live.runtime import BrokerRuntime
from ..root import broker_instance, resolve_root
from .common import add_root_and_config, load_config, run_foreground


def add_parser(sub) -> None:
    p = sub.add_parser("broker", help="run a broker in the foreground (Ctrl-C stops it cleanly)")
    add_root_and_config(p)
    p.add_argument("--name", default="broker-a", help="broker name (default broker-a)")
    p.add_argument("--id", type=int, default=0, help="broker id: 0 = master, ≥ 1 = a slave of the master")
    p.add_argument("--master", default=None, help="a slave's master, tcp://HOST:PORT (default: ask the NameServers)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    root = resolve_root(args.root)
    cfg = load_config(root, args.config)
    if args.id != 0 or args.master:
        record = group.record(root, broker_instance(args.name, args.id)) if args.id == 0 else None
        if args.id == 0 and (record is None or not record.is_slave):
            print("hostmq: error: --master is for a slave: give it an id ≥ 1 (--id 1), or demote this master "
                  "first (hostmq ha demote)")
            return 2
        # Instance 0 plays a slave only by its role record (live/role.py), which sets the role itself.
        cfg = cfg.with_overrides({"broker": {**({"role": "SLAVE"} if args.id != 0 else {}),
                                             **({"ha_master": args.master} if args.master else {})}})
    rt = BrokerRuntime(root, args.name, args.id, cfg)
    return run_foreground(supervisor.run, rt, cfg, root, args.log_level, name=rt.instance)
