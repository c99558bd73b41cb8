"""``hostmq namesrv [ROOT] [--index N]``: run a NameServer in the foreground."""
from __future__ import annotations

import argparse

from ..namesrv import server
from ..root import resolve_root
from .common import add_root_and_config, load_config, run_foreground


def add_parser(sub) -> None:
    p = sub.add_parser("namesrv", help="run a NameServer in the foreground (Ctrl-C stops it)")
    add_root_and_config(p)
    p.add_argument("--index", type=int, default=0, help="0 = ROOT/namesrv.sock, N = ROOT/namesrv-N.sock")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    root = resolve_root(args.root)
    cfg = load_config(root, args.config)
    return run_foreground(server.run, server.NamesrvProcessConfig(root, args.index, cfg.namesrv), cfg, root,
                          args.log_level, name=f"namesrv-{args.index}")
