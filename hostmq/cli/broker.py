"""``hostmq broker [ROOT] --name NAME [--id 0]``: run a broker (and its children) in the foreground."""
from __future__ import annotations

import argparse

from ..broker import supervisor
from ..broker.runtime import BrokerRuntime
from ..root import resolve_root
from .common import add_root_and_config, load_config, run_foreground


def add_parser(sub) -> None:
    p = sub.add_parser("broker", help="run a broker in the foreground (Ctrl-C stops it cleanly)")
    add_root_and_config(p)
    p.add_argument("--name", default="broker-a", help="broker name (default broker-a)")
    p.add_argument("--id", type=int, default=0, help="broker id: 0 = master (slaves come with HA)")
    p.add_argument("--master", default=None, help="master broker name (HA; not supported yet)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    root = resolve_root(args.root)
    if args.id != 0 or args.master:
        print("hostmq: error: slave brokers (--id > 0, --master) need HA replication, which is not built yet")
        return 2
    cfg = load_config(root, args.config)
    return run_foreground(supervisor.run, BrokerRuntime(root, args.name, args.id, cfg), cfg, root, args.log_level,
                          name=args.name)
