"""Where the exporter serves ``/metrics`` (issue 27, attack 5): a TCP port, the same with TLS and
client certificates, or a unix socket under the root.

A TCP port on 127.0.0.1 is open to every local user, and the metrics name topics and groups, their
lag and each process's memory. Two ways to keep them to the people the root is for:

* **a unix socket** (``--listen unix`` → ``ROOT/exporter.sock``, or ``--listen unix:PATH``): mode
  ``0660`` in a root that is ``2750`` — exactly who may use the root may scrape (its owner and
  group). Prometheus cannot scrape a unix socket itself: put a proxy that authenticates in front
  (docs/trust-control.md has an nginx recipe), or read it with ``curl --unix-socket``.
* **TLS with client certificates** (``--tls-cert/--tls-key`` and ``--tls-client-ca``):
  prometheus_client's own TLS server; with a client CA every scrape must present a certificate that
  CA signed (Prometheus: ``tls_config: {cert_file, key_file, ca_file}``).

Ownership: the exporter process binds and unlinks its unix socket (a stale one left by a killed
exporter is replaced at the next start; a socket another live exporter serves is refused).
"""
from __future__ import annotations

import os
import socket
import socketserver
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from .errors import ConfigError

UNIX_PREFIX = "unix"


@dataclass(frozen=True)
class TlsOptions:
    """prometheus_client's TLS options: server certificate and key, and the CA client certificates
    must be signed by ("" = no client certificates asked for)."""

    cert: str
    key: str
    client_ca: str = ""


class _UnixHandler(WSGIRequestHandler):
    """wsgiref's handler reads the peer's (host, port); a unix socket's peer has none."""

    def setup(self) -> None:
        self.client_address = ("unix", 0)
        super().setup()

    def log_message(self, format, *args) -> None:        # scrapes are not worth a log line each
        pass


class _UnixWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    address_family = socket.AF_UNIX
    daemon_threads = True

    def server_bind(self) -> None:
        socketserver.UnixStreamServer.server_bind(self)     # not HTTPServer's: no host name to look up
        self.server_name, self.server_port = "localhost", 0
        self.setup_environ()


def unix_path(listen: str, root: str) -> str | None:
    """``unix`` → ``ROOT/exporter.sock``, ``unix:PATH`` → PATH; None for HOST:PORT."""
    if listen == UNIX_PREFIX:
        return os.path.join(root, "exporter.sock")
    if listen.startswith(UNIX_PREFIX + ":"):
        path = listen[len(UNIX_PREFIX) + 1:]
        if not path:
            raise ConfigError("--listen unix:PATH needs a path")
        return os.path.abspath(path)
    return None


def serve_unix(path: str, registry) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``registry`` at ``/metrics`` on a unix socket at ``path`` (mode 0660), in a thread."""
    from prometheus_client import make_wsgi_app
    from .access import secure_socket
    _remove_stale(path)
    server = _UnixWSGIServer(path, _UnixHandler)
    secure_socket(path)
    server.set_app(make_wsgi_app(registry))
    thread = threading.Thread(target=server.serve_forever, name="metrics-unix", daemon=True)
    thread.start()
    return server, thread


def _remove_stale(path: str) -> None:
    """A socket file nobody answers on (a killed exporter's) is removed; a live one is refused."""
    if not os.path.exists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(path)
        return
    finally:
        probe.close()
    raise ConfigError(f"another exporter serves {path}")


def serve_tcp(host: str, port: int, registry, tls: TlsOptions | None = None):
    """prometheus_client's server on ``host:port``, with TLS (and client certificates) if asked."""
    from prometheus_client import start_http_server
    if tls is None:
        return start_http_server(port, addr=host, registry=registry)
    for name, path in (("--tls-cert", tls.cert), ("--tls-key", tls.key), ("--tls-client-ca", tls.client_ca)):
        if path and not os.path.isfile(path):
            raise ConfigError(f"{name}: no file {path}")
    return start_http_server(port, addr=host, registry=registry, certfile=tls.cert, keyfile=tls.key,
                             client_cafile=tls.client_ca or None, client_auth_required=bool(tls.client_ca))


def close_unix(server: WSGIServer, path: str) -> None:
    """Stop serving and remove our socket file."""
    server.shutdown()
    server.server_close()
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
