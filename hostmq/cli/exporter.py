"""``hostmq exporter [ROOT] --listen 127.0.0.1:9464``: Prometheus metrics of a root at ``/metrics``
(``hostmq/metrics.py``; needs the ``metrics`` extra: ``pip install 'hostmq[metrics]'``).

``--listen unix`` serves on ``ROOT/exporter.sock`` (only the root's owner and group can connect);
``--tls-cert/--tls-key [--tls-client-ca]`` serve HTTPS, with client certificates required when a CA
is given (``hostmq/metrics_http.py``, docs/trust-control.md)."""
from __future__ import annotations

import argparse

from .. import metrics
from ..errors import ConfigError
from ..metrics_http import TlsOptions, unix_path
from ..root import resolve_root
from .common import add_root_and_config, load_config, run_foreground


def add_parser(sub) -> None:
    p = sub.add_parser("exporter", help="serve Prometheus metrics of a root (brokers, lag, flush latency)")
    add_root_and_config(p)
    p.add_argument("--listen", default="127.0.0.1:9464", help="HOST:PORT to serve on (default 127.0.0.1:9464; "
                   "port 0 picks a free one and prints it — any local user can read it), or 'unix' for "
                   "ROOT/exporter.sock, or unix:PATH (owner and group only)")
    p.add_argument("--tls-cert", default="", help="serve HTTPS with this certificate (PEM; with --tls-key)")
    p.add_argument("--tls-key", default="", help="the certificate's private key (PEM)")
    p.add_argument("--tls-client-ca", default="", help="require client certificates signed by this CA (PEM)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    root = resolve_root(args.root)
    unix = unix_path(args.listen, root)
    if bool(args.tls_cert) != bool(args.tls_key) or (args.tls_client_ca and not args.tls_cert):
        raise ConfigError("--tls-cert and --tls-key go together (and --tls-client-ca needs them)")
    if unix and args.tls_cert:
        raise ConfigError("TLS is for HOST:PORT; a unix socket's file permissions are its access control")
    tls = TlsOptions(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None
    host, port = metrics.parse_listen(args.listen) if unix is None else ("", 0)
    cfg = load_config(root, args.config)
    return run_foreground(metrics.run, metrics.ExporterConfig(root, host, port, unix or "", tls), cfg, root,
                          args.log_level, name="exporter")
