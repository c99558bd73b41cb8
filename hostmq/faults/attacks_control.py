"""A hostile group member on the control path (issue 27, attack 4): run it as a uid in the root's
group that is not its owner.

:func:`attack` tries, against every control socket of the root (each NameServer and broker):

* every administration code (``protocol.permissions.ADMIN_CODES``) with fields a server would act on
  — delete the victim topic, reset its group's offsets, create topics, promote, unregister the broker,
  put and delete KV config;
* re-registering a broker name (``broker-a``) at a socket of its own, with a replication address of
  its own (what would send producers and slaves to it);
* a flood of heartbeats, each with a new client id and a new consumer group (each a retry topic on
  the broker), and of first sends auto-creating new topics.

It reports, never raises, what happened to each (:class:`AttackReport`): an attempt ``refused`` with
the typed PermissionDeniedError is what the owner-only rule promises; ``accepted`` is a breach. The
flood's counts show where the per-uid caps stopped it. ``python -m hostmq.faults.attacks_control ROOT``
prints the report as JSON (so a harness can run it under another uid with ``setpriv``).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, dataclass, field

import orjson

from ..errors import HostMQError, PermissionDeniedError, RemoteError
from ..protocol.codes import RequestCode, ResponseCode, code_name
from ..protocol.permissions import ADMIN_CODES
from ..root import RootPaths, ipc_address

FLOOD_WINDOW = 128          # heartbeats in flight at once (a flood, not one request at a time)


@dataclass
class AttackReport:
    uid: int
    admin: dict[str, str] = field(default_factory=dict)      # "CODE(n) @ socket" → outcome
    reregister: dict[str, str] = field(default_factory=dict)  # namesrv socket → outcome
    heartbeats_accepted: int = 0
    heartbeats_refused: int = 0
    auto_topics_accepted: int = 0
    auto_topics_refused: int = 0
    other_errors: list[str] = field(default_factory=list)

    def breaches(self) -> list[str]:
        """Administration that was not refused (the owner-only rule broken)."""
        return [f"{what}: {how}" for what, how in {**self.admin, **self.reregister}.items()
                if how not in ("refused", "not supported")]


def _admin_fields(code: int, victim_topic: str, victim_group: str, broker: dict, own_address: str) -> dict:
    """Fields a server would act on for ``code`` (so only the permission check stands in the way)."""
    c = RequestCode
    return {
        c.REGISTER_BROKER: {"cluster": broker["cluster"], "broker_name": broker["name"], "broker_id": 0,
                            "address": own_address, "ha_address": "tcp://127.0.0.1:9", "topics": {},
                            "data_version": time.time_ns()},
        c.UNREGISTER_BROKER: {"cluster": broker["cluster"], "broker_name": broker["name"], "broker_id": 0,
                              "address": broker["address"]},
        c.UPDATE_AND_CREATE_TOPIC: {"topic": victim_topic, "read_queues": 1, "write_queues": 1, "perm": 4,
                                    "order": False},
        c.DELETE_TOPIC_IN_BROKER: {"topic": victim_topic},
        c.DELETE_TOPIC_IN_NAMESRV: {"topic": victim_topic},
        c.INVOKE_BROKER_TO_RESET_OFFSET: {"group": victim_group, "topic": victim_topic, "timestamp_ms": 0},
        c.PROMOTE_BROKER: {"role": "ASYNC_MASTER", "force": True, "epoch": 1 << 40},
        c.PUT_KV_CONFIG: {"namespace": "ORDER_TOPIC_CONFIG", "key": victim_topic, "value": "broker-evil:1"},
        c.DELETE_KV_CONFIG: {"namespace": "ORDER_TOPIC_CONFIG", "key": victim_topic},
    }.get(code, {})


def _outcome(client, code: int, fields: dict) -> str:
    try:
        client.request(code, fields, timeout_s=10.0)
        return "accepted"
    except PermissionDeniedError:
        return "refused"
    except RemoteError as e:
        if e.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
            return "not supported"
        return f"failed: {e}"
    except HostMQError as e:
        return f"failed: {type(e).__name__}: {e}"


def _sockets(paths: RootPaths) -> tuple[list[str], list[str]]:
    namesrvs = [p for i in range(16) if os.path.exists(p := paths.namesrv_socket(i))]
    bdir = os.path.join(paths.root, "brokers")
    brokers = [p for n in sorted(os.listdir(bdir)) if os.path.exists(p := os.path.join(bdir, n, "broker.sock"))]
    return namesrvs, brokers


def _broker_row(ns_client, name: str) -> dict:
    info = ns_client.request(RequestCode.GET_BROKER_CLUSTER_INFO, {}).fields
    row = info.get("brokers", {}).get(name, {})
    return {"cluster": row.get("cluster", "DefaultCluster"), "name": name,
            "address": row.get("addrs", {}).get("0", "")}


def attack(root: str, *, victim_topic: str, victim_group: str, broker_name: str = "broker-a",
           groups: int = 4000, auto_topics: int = 200, own_socket: str = "") -> AttackReport:
    """Run every attempt above against ``root``'s sockets; the report of what each got."""
    from ..remoting import RemotingClient
    paths = RootPaths(root)
    report = AttackReport(os.geteuid())
    namesrvs, brokers = _sockets(paths)
    own_address = ipc_address(own_socket or os.path.join(paths.root, "brokers", broker_name, "evil.sock"))
    with RemotingClient(ipc_address(namesrvs[0]), timeout_s=10.0) as ns:
        broker = _broker_row(ns, broker_name)
    for sock in namesrvs + brokers:
        with RemotingClient(ipc_address(sock), timeout_s=10.0) as client:
            for code in sorted(ADMIN_CODES):
                fields = _admin_fields(code, victim_topic, victim_group, broker, own_address)
                report.admin[f"{code_name(code)} @ {os.path.basename(sock)}"] = _outcome(client, code, fields)
            if sock in namesrvs:
                fields = _admin_fields(RequestCode.REGISTER_BROKER, victim_topic, victim_group, broker, own_address)
                fields["topics"] = {victim_topic: {"read_queues": 8, "write_queues": 8, "perm": 6, "order": False}}
                report.reregister[os.path.basename(sock)] = _outcome(client, RequestCode.REGISTER_BROKER, fields)
    with RemotingClient(ipc_address(os.path.join(paths.root, "brokers", broker_name, "broker.sock")),
                        timeout_s=30.0) as b:
        _flood_heartbeats(b, groups, report)
        _flood_auto_topics(b, auto_topics, report)
    return report


def _flood_heartbeats(client, n: int, report: AttackReport) -> None:
    tag = f"{os.getpid()}-{time.monotonic_ns()}"
    for start in range(0, n, FLOOD_WINDOW):
        futures = [client.request_async(RequestCode.HEART_BEAT, {
            "client_id": f"evil-{tag}-{i}", "producer_groups": [], "consumer_groups": [f"evil-{tag}-{i}"],
            "pid": os.getpid()}) for i in range(start, min(n, start + FLOOD_WINDOW))]
        for f in futures:
            _count(f, report, "heartbeats")


def _flood_auto_topics(client, n: int, report: AttackReport) -> None:
    tag = f"{os.getpid()}-{time.monotonic_ns()}"
    futures = [client.request_async(RequestCode.AUTO_CREATE_TOPIC, {"topic": f"evil-{tag}-{i}"}) for i in range(n)]
    for f in futures:
        _count(f, report, "auto_topics")


def _count(future, report: AttackReport, what: str) -> None:
    try:
        future.result(timeout=60)
        setattr(report, f"{what}_accepted", getattr(report, f"{what}_accepted") + 1)
    except PermissionDeniedError:
        setattr(report, f"{what}_refused", getattr(report, f"{what}_refused") + 1)
    except Exception as e:          # reported, not raised: the harness judges
        if len(report.other_errors) < 20:
            report.other_errors.append(f"{what}: {type(e).__name__}: {e}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hostmq.faults.attacks_control", description=__doc__.split("\n\n")[0])
    p.add_argument("root")
    p.add_argument("--victim-topic", required=True)
    p.add_argument("--victim-group", required=True)
    p.add_argument("--broker", default="broker-a")
    p.add_argument("--groups", type=int, default=4000)
    p.add_argument("--auto-topics", type=int, default=200)
    args = p.parse_args(argv)
    report = attack(args.root, victim_topic=args.victim_topic, victim_group=args.victim_group,
                    broker_name=args.broker, groups=args.groups, auto_topics=args.auto_topics)
    sys.stdout.write(orjson.dumps(asdict(report)).decode() + "\n")
    return 1 if report.breaches() else 0


if __name__ == "__main__":
    sys.exit(main())
