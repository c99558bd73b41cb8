"""Prometheus metrics of a root (``hostmq exporter [ROOT] --listen 127.0.0.1:9464``; extra ``metrics``).

Nothing here touches the data path: positions, counters, heartbeats and the flush latency histogram
are read from each broker's state segment (read-only), page-cache residency with ``mincore`` on the
store files and memory from ``/proc`` (``observe.py``), consumer lag from each broker's control socket
(GET_CONSUME_STATS, the request ``hostmq status`` uses). ``snapshot(root)`` gathers that;
``families(snapshot)`` turns it into metric families (pure, tested directly); ``run`` serves them.

The metrics (labels in braces):

* ``hostmq_broker_up{broker}`` — 1 while the broker's processes run and it is RUNNING
* ``hostmq_messages_stored_total{broker}`` — records appended since the broker started
* ``hostmq_commitlog_write_position_bytes{broker}``, ``hostmq_commitlog_flushed_position_bytes{broker}``
* ``hostmq_dispatch_lag_bytes{broker}`` — written but not yet in consume queues and index
* ``hostmq_consumer_lag_messages{group,topic,broker,queue}``
* ``hostmq_flush_latency_seconds{broker}`` — histogram of commitlog flushes (fdatasync)
* ``hostmq_page_cache_resident_ratio{broker,kind}`` — kind ``commitlog`` or ``consume_queue``
* ``hostmq_process_resident_memory_bytes{broker,process}``
* ``hostmq_heartbeat_age_seconds{broker,process}`` — how old each child's heartbeat is
* ``hostmq_producer_sessions{broker}``

Who can read them: anyone who can reach the listener. The default ``127.0.0.1:9464`` is every local
user, including users who cannot enter the root; ``--listen unix`` (a socket under the root, as
private as the root) or TLS with client certificates keep them in (``metrics_http``,
docs/trust-control.md).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from . import records as R
from .errors import ConfigError, HostMQError
from .observe import broker_tuning
from .metrics_http import TlsOptions, close_unix, serve_tcp, serve_unix
from .root import RootPaths

log = logging.getLogger(__name__)

PROCESSES = ("broker", "writer", "dispatcher", "flusher", "scheduler")


@dataclass(frozen=True)
class ExporterConfig:
    root: str
    host: str = "127.0.0.1"
    port: int = 9464
    unix_socket: str = ""                 # serve here instead of host:port (metrics_http.serve_unix)
    tls: TlsOptions | None = None         # TLS (and client certificates) on host:port


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9464`` for IPv6) → (host, port); ConfigError otherwise."""
    host, sep, port = listen.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--listen must be HOST:PORT, got {listen!r}")
    return host, int(port)


def snapshot(root: str, admin=None) -> dict:
    """Everything the metrics say, read at one moment: ``{"brokers": {name: {...}}, "lag": [rows]}``."""
    from .live.runtime import check_broker_name
    from .live.group import live_state
    paths = RootPaths.of(root)
    brokers = {}
    for name in paths.instances():      # masters (NAME) and slaves (NAME.ID): labelled by instance
        base, dot, bid = name.partition(".")
        try:
            check_broker_name(base)
        except HostMQError:
            continue                    # not a broker's directory
        if dot and not (bid.isdecimal() and bid[0] != "0"):
            continue
        st = live_state(root, name)
        try:
            state = st.snapshot() if st is not None else None
            sessions = len(st.active_slots()) if st is not None else 0
        finally:
            if st is not None:
                st.close()
        brokers[name] = {"state": state, "sessions": sessions,
                         "tuning": broker_tuning(paths.store_dir(name), state)}
    lag = []
    if admin is not None:
        try:
            groups = sorted({g for b in admin.brokers() for g in b.get("groups", [])})
            for g in groups:
                for r in admin.consumer_progress(g):
                    lag.append({"group": g, "topic": r["queue"].topic, "broker": r["queue"].broker,
                                "queue": r["queue"].queue_id, "lag": r["lag"]})
        except HostMQError as e:        # NameServer or broker unreachable: the positions still count
            log.warning("exporter: consumer lag unavailable: %s", e)
    return {"brokers": brokers, "lag": lag, "now_ms": int(time.time() * 1000)}


def families(snap: dict) -> list:
    """The metric families of a snapshot (prometheus_client ``Metric`` objects)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
    up = GaugeMetricFamily("hostmq_broker_up", "1 while the broker runs and is writable", labels=["broker"])
    stored = CounterMetricFamily("hostmq_messages_stored", "records appended to the commitlog since the broker "
                                 "started", labels=["broker"])
    wpos = GaugeMetricFamily("hostmq_commitlog_write_position_bytes", "end of the commitlog", labels=["broker"])
    fpos = GaugeMetricFamily("hostmq_commitlog_flushed_position_bytes", "end of what is on disk", labels=["broker"])
    dlag = GaugeMetricFamily("hostmq_dispatch_lag_bytes", "commitlog bytes not yet in consume queues and index",
                             labels=["broker"])
    sess = GaugeMetricFamily("hostmq_producer_sessions", "producer sessions open", labels=["broker"])
    flush = HistogramMetricFamily("hostmq_flush_latency_seconds", "commitlog flush (fdatasync) latency",
                                  labels=["broker"])
    cache = GaugeMetricFamily("hostmq_page_cache_resident_ratio", "share of the store's pages in the page cache",
                              labels=["broker", "kind"])
    rss = GaugeMetricFamily("hostmq_process_resident_memory_bytes", "resident memory of a broker process",
                            labels=["broker", "process"])
    beat = GaugeMetricFamily("hostmq_heartbeat_age_seconds", "age of a broker process's heartbeat",
                             labels=["broker", "process"])
    clag = GaugeMetricFamily("hostmq_consumer_lag_messages", "messages stored but not yet consumed by a group",
                             labels=["group", "topic", "broker", "queue"])
    slave = GaugeMetricFamily("hostmq_broker_is_slave", "1 while the instance runs as a slave of its group",
                              labels=["broker"])
    rlag = GaugeMetricFamily("hostmq_replication_lag_bytes", "a slave: commitlog bytes its master said it held "
                             "that the slave has not stored", labels=["broker"])
    rconn = GaugeMetricFamily("hostmq_replication_connected", "a slave: 1 while it streams from its master; a "
                              "master: slaves streaming from it", labels=["broker"])
    for name, b in sorted(snap["brokers"].items()):
        st, tuning = b["state"], b["tuning"]
        up.add_metric([name], 1.0 if st is not None and st["broker_state"] == R.BROKER_RUNNING else 0.0)
        for kind, key in (("commitlog", "commitlog"), ("consume_queue", "consume_queues")):
            part = tuning[key]
            total = part.get("total_bytes", 0)
            cache.add_metric([name, kind], part["resident_bytes"] / total if total else 0.0)
        if st is None:
            continue
        stored.add_metric([name], float(st["appended_records"]))
        slave.add_metric([name], float(st["role"] == R.ROLE_SLAVE))
        if st["role"] == R.ROLE_SLAVE:
            rlag.add_metric([name], float(max(0, st["master_end_pos"] - st["write_pos"])))
            rconn.add_metric([name], float(st["replica_connected"]))
        elif st["ha_pid"]:
            rconn.add_metric([name], float(st["ha_slaves"]))
        wpos.add_metric([name], float(st["write_pos"]))
        fpos.add_metric([name], float(st["flushed_pos"]))
        dlag.add_metric([name], float(max(0, st["write_pos"] - st["dispatched_pos"])))
        sess.add_metric([name], float(b["sessions"]))
        counts = [int(c) for c in st.get("flush_histogram") or []]
        buckets, running = [], 0
        for i, c in enumerate(counts[:-1]):     # bucket i: below 2^i µs; the last one is open-ended
            running += c
            buckets.append((repr((1 << i) / 1e6), running))
        buckets.append(("+Inf", sum(counts)))
        flush.add_metric([name], buckets, st.get("flush_latency_sum_us", 0) / 1e6)
        for proc, stats in sorted(tuning.get("processes", {}).items()):
            if stats is not None:
                rss.add_metric([name, proc], float(stats["rss_bytes"]))
        for proc, field in R.STATE_HEARTBEATS.items():
            ms = int(st.get(field, 0) or 0)
            if ms:
                beat.add_metric([name, proc], max(0.0, (snap["now_ms"] - ms) / 1000))
    for r in snap["lag"]:
        clag.add_metric([r["group"], r["topic"], r["broker"], str(r["queue"])], float(r["lag"]))
    return [up, stored, wpos, fpos, dlag, sess, flush, cache, rss, beat, clag, slave, rlag, rconn]


class Collector:
    """A prometheus_client collector: one snapshot per scrape (scrapes are serialised)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._admin = None

    def collect(self):
        with self._lock:
            if self._admin is None:
                from .admin.admin import Admin
                try:
                    self._admin = Admin(self.root, timeout_s=2.0)
                except HostMQError as e:
                    log.warning("exporter: no admin client (%s); consumer lag left out", e)
            snap = snapshot(self.root, self._admin)
        return families(snap)

    def close(self) -> None:
        with self._lock:
            if self._admin is not None:
                self._admin.close()
                self._admin = None


def run(config: ExporterConfig, stop: threading.Event) -> int:
    """The exporter process: serve ``/metrics`` until ``stop``."""
    try:
        from prometheus_client import CollectorRegistry
    except ImportError:
        raise ConfigError("the exporter needs prometheus_client: pip install 'hostmq[metrics]'") from None
    from .sdnotify import sd_notify
    registry = CollectorRegistry(auto_describe=False)
    collector = Collector(config.root)
    registry.register(collector)
    if config.unix_socket:
        server, thread = serve_unix(config.unix_socket, registry)
        where = f"unix:{config.unix_socket}"
        url = f"unix:{config.unix_socket}:/metrics"
    else:
        server, thread = serve_tcp(config.host, config.port, registry, config.tls)
        port = server.server_address[1]
        where = f"{config.host}:{port}"
        url = f"{'https' if config.tls else 'http'}://{config.host}:{port}/metrics"
    try:
        print(f"hostmq exporter: serving {url} for {config.root}", flush=True)
        log.info("exporter serving %s for %s", where, config.root)
        sd_notify(f"READY=1\nSTATUS=serving metrics on {where}")
        stop.wait()
        sd_notify("STOPPING=1")
    finally:
        if config.unix_socket:
            close_unix(server, config.unix_socket)
        else:
            server.shutdown()
            server.server_close()
        thread.join(5)
        collector.close()
    return 0
