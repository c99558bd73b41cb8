"""What both ends of a replication link share: the root's secret, the TLS context, the endpoint a
proof binds, and whether a master listens at all (docs/trust-replication.md).

``ROOT/ha.secret`` is written once by the first master that needs it (its only writer; readers
assume it never changes while a link is up: a new secret ends every link at its next handshake).
"""
from __future__ import annotations

import ipaddress
import logging
import os
import socket
import ssl

from ..errors import ConfigError
from ..fsutil import fsync_dir
from ..live import group
from ..live.runtime import BrokerRuntime

SECRET_BYTES = 32
SECRET_MODE = 0o600
log = logging.getLogger(__name__)
LOOPBACK_LISTEN = "tcp://127.0.0.1:0"   # where a master listens when a slave is configured but ha_listen is ""


def parse_tcp(address: str) -> tuple[str, int]:
    host, _, port = address[len("tcp://"):].rpartition(":")
    return host.strip("[]"), int(port)


def replication_secret(path: str, create: bool) -> bytes | None:
    """The root's replication secret (hex in ``path``), made by the first master that needs it.
    Owner-only (0600): whoever holds it can act as a master or a slave of every broker of the root,
    and the root's group members produce and consume, nothing more. A group-readable secret (made
    by an older hostmq) is made owner-only here when this process owns it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        if not create:
            return None
        return _new_secret(path)
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o077 and st.st_uid == os.geteuid():
            os.fchmod(fd, SECRET_MODE)
            log.warning("%s was readable by others than its owner: now owner-only (0600)", path)
        with os.fdopen(os.dup(fd), "rb") as f:
            return bytes.fromhex(f.read().decode().strip())
    except ValueError:
        raise ConfigError(f"{path} does not hold a hex replication secret") from None
    finally:
        os.close(fd)


def _new_secret(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, SECRET_MODE)
    except FileExistsError:             # another master made it meanwhile
        return replication_secret(path, create=False)
    secret = os.urandom(SECRET_BYTES)
    with os.fdopen(fd, "w") as f:
        f.write(secret.hex() + "\n")
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(os.path.dirname(path))
    return secret


def endpoint(addr: tuple) -> str:
    """``IP:PORT`` of a socket address, the same text on both ends of one TCP connection (the slave's
    ``getpeername``, the master's ``getsockname``): what a handshake proof binds."""
    ip = ipaddress.ip_address(addr[0].split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return f"[{ip.compressed}]:{addr[1]}" if ip.version == 6 else f"{ip.compressed}:{addr[1]}"


def link_endpoint(sock: socket.socket, side: str, rt: BrokerRuntime) -> str:
    """The endpoint this side's proofs bind: "" on TLS (the certificates bind the channel, and a
    link through NAT or a proxy still works) or without ``[ha] bind_endpoint``, else the master
    listener's ``IP:PORT`` as seen here."""
    if rt.config.ha.tls or not rt.config.ha.bind_endpoint:
        return ""
    return endpoint(sock.getpeername() if side == "slave" else sock.getsockname())


def tls_context(rt: BrokerRuntime, server_side: bool) -> ssl.SSLContext | None:
    """Mutual TLS from ``[ha] tls_cert/tls_key/tls_ca``, None without it. Both ends present a
    certificate and verify the other's against ``tls_ca``; host names are not checked (a cluster's
    own CA signs only its brokers, and the handshake's proofs still name the broker)."""
    cfg = rt.config.ha
    if not cfg.tls:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server_side else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    try:
        ctx.load_cert_chain(cfg.tls_cert, cfg.tls_key)
        ctx.load_verify_locations(cfg.tls_ca)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"ha.tls_cert/tls_key/tls_ca cannot be loaded: {e}") from None
    return ctx


def slave_configured(rt: BrokerRuntime) -> bool:
    """Whether this master expects a slave: a SYNC_MASTER (its sends wait for one), a promoted master
    (its old master rejoins as a slave), or another instance of its name on this root."""
    if rt.config.broker.role == "SYNC_MASTER" or rt.epoch >= 1:
        return True
    return any(i != rt.broker_id for i in group.instance_ids(rt.root, rt.name))


def listen_address(rt: BrokerRuntime) -> str:
    """Where this master's replication listener binds, "" for none: ``broker.ha_listen`` when set,
    else loopback on any port once a slave is configured. No slave, no TCP port."""
    if rt.is_slave:
        return ""
    if rt.config.broker.ha_listen:
        return rt.config.broker.ha_listen
    return LOOPBACK_LISTEN if slave_configured(rt) else ""
