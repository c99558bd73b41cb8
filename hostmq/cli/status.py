"""``hostmq status [ROOT] [--json]``: brokers (pids, positions, page-cache residency, dirty bytes, faults and
RSS per process in --json, transaction checks), topics with per-queue offsets, groups and lag."""
from __future__ import annotations

import argparse

from ..client.admin import Admin
from ..observe import broker_tuning
from ..root import RootPaths
from .common import print_json, print_table


def add_parser(sub) -> None:
    p = sub.add_parser("status", help="brokers, topics, queues and consumer lag under a root")
    p.add_argument("root", nargs="?", default=None)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=main)


def gather(admin: Admin) -> dict:
    brokers = admin.brokers()
    paths = RootPaths.of(admin.root)
    for b in brokers:       # page-cache picture, read from outside the broker (mincore, /proc)
        b["tuning"] = broker_tuning(paths.store_dir(b["name"]), b.get("state") if b["alive"] else None)
    groups = sorted({g for b in brokers for g in b.get("groups", [])})
    progress = {g: admin.consumer_progress(g) for g in groups}
    return {"root": admin.root, "brokers": brokers, "topics": admin.topics(), "groups": progress}


def main(args: argparse.Namespace) -> int:
    with Admin(args.root) as a:
        data = gather(a)
    if args.json:
        for rows in data["groups"].values():
            for r in rows:
                r["queue"] = str(r["queue"])
        print_json(data)
        return 0
    print(f"root {data['root']}")
    rows = []
    for b in data["brokers"]:
        st = b.get("state", {})
        rows.append({"broker": b["name"], "id": b["id"], "cluster": b["cluster"], "alive": b["alive"],
                     "pid": b["pids"].get("broker", "-"),
                     "writer/dispatcher/flusher": "/".join(str(b["pids"].get(k, "-"))
                                                          for k in ("writer", "dispatcher", "flusher")),
                     "write_pos": st.get("write_pos", "-"), "dispatched": st.get("dispatched_pos", "-"),
                     "flushed": st.get("flushed_pos", "-"), "sessions": b.get("sessions", "-"),
                     "cached (log/cq)": f"{b['tuning']['commitlog']['total_pct']}%/"
                                        f"{b['tuning']['consume_queues']['total_pct']}%",
                     "dirty": b["tuning"].get("dirty_bytes", "-"),
                     "tx checking/given up": "{}/{}".format(b.get("transactions", {}).get("checking", "-"),
                                                            b.get("transactions", {}).get("given_up_total", "-"))})
    print_table(rows, ["broker", "id", "cluster", "alive", "pid", "writer/dispatcher/flusher", "write_pos",
                       "dispatched", "flushed", "sessions", "cached (log/cq)", "dirty", "tx checking/given up"])
    queues = [{"topic": q["topic"], "broker": b["name"], "queue": q["queue_id"], "min_offset": q["min_offset"],
               "max_offset": q["max_offset"]} for b in data["brokers"] for q in b.get("queues", [])]
    print()
    print_table(sorted(queues, key=lambda r: (r["topic"], r["broker"], r["queue"])),
                ["topic", "broker", "queue", "min_offset", "max_offset"])
    for g, rows in data["groups"].items():
        print(f"\ngroup {g}")
        print_table([{"queue": str(r["queue"]), "broker_offset": r["broker_offset"],
                      "consumer_offset": r["consumer_offset"], "lag": r["lag"]} for r in rows],
                    ["queue", "broker_offset", "consumer_offset", "lag"])
    return 0
