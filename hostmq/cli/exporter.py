"""``hostmq exporter [ROOT] --listen 127.0.0.1:9464``: Prometheus metrics of a root at ``/metrics``
(``hostmq/metrics.py``; needs the ``metrics`` extra: ``pip install 'hostmq[metrics]'``)."""
from __future__ import annotations

import argparse

from .. import metrics
from ..root import resolve_root
from .common import add_root_and_config, load_config, run_foreground


def add_parser(sub) -> None:
    p = sub.add_parser("exporter", help="serve Prometheus metrics of a root (brokers, lag, flush latency)")
    add_root_and_config(p)
    p.add_argument("--listen", default="127.0.0.1:9464", help="HOST:PORT to serve on (default 127.0.0.1:9464; "
                   "port 0 picks a free one and prints it)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    root = resolve_root(args.root)
    host, port = metrics.parse_listen(args.listen)
    cfg = load_config(root, args.config)
    return run_foreground(metrics.run, metrics.ExporterConfig(root, host, port), cfg, root, args.log_level,
                          name="exporter")
