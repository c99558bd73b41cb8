"""Administration only by the owner (issue 27, attack 4), with real other uids in the root's group.

A hostile member (``hostmq.faults.attacks_control``) tries every administration code on every control
socket, re-registers ``broker-a`` at a socket of its own and floods the broker with heartbeats naming
new groups and first sends naming new topics, while an honest member produces, pulls, heartbeats and
commits. Every admin attempt gets the typed refusal, routes, topics, offsets and KV config stay as they
were, the flood stops at the per-uid caps, the honest member is served throughout and the owner's own
administration still works.
"""
from __future__ import annotations

import json
import os
import threading

import pytest

import hostmq
from hostmq.remoting import RemotingClient
from hostmq.protocol.codes import RequestCode
from hostmq.root import RootPaths, ipc_address
from tests.e2e.conftest import TEST_CONFIG, leftovers, merge
from hostmq.faults.as_user import run_as
from tests.e2e.test_access import shared_root  # noqa: F401  (fixture)

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(os.geteuid() != 0 or not __import__("shutil").which("setpriv"),
                                 reason="needs root and setpriv to run clients as other users")]

GROUP, ATTACKER, HONEST = 54330, 54331, 54332      # ids nobody on the machine uses
CAPS = {"max_groups_per_uid": 40, "max_groups": 400, "max_clients_per_uid": 60, "max_clients": 600,
        "max_auto_topics_per_uid": 10, "max_auto_topics": 100}
FLOOD_GROUPS, FLOOD_TOPICS = 300, 30

ATTACK_CODE = """
import sys
from hostmq.faults.attacks_control import main
sys.exit(main(sys.argv[1:]))
"""

HONEST_CODE = """
import os, sys, time, hostmq
root, done = sys.argv[1:3]
rounds, sent, got = 0, 0, 0
pc = hostmq.PullConsumer(root, group="g-honest", consume_from=hostmq.ConsumeFrom.FIRST_OFFSET)
try:
    pc.subscribe("honest", "*")
    with hostmq.Producer(root, group="pg-honest") as p:
        deadline = time.monotonic() + 120
        while (rounds < 3 or not os.path.exists(done)) and time.monotonic() < deadline:
            p.send(hostmq.Message("honest", b"round %d" % rounds))       # default timeouts throughout
            sent += 1
            got += len(pc.poll(timeout=1.0))
            pc.commit()
            rounds += 1
    end = time.monotonic() + 30
    while got < sent and time.monotonic() < end:
        got += len(pc.poll(timeout=0.5))
        pc.commit()
    print("HONEST", rounds, sent, got, flush=True)
finally:
    pc.close()
"""


def _fields(root: str, code: int, fields: dict, sock: str = "namesrv") -> dict:
    paths = RootPaths(root)
    path = paths.namesrv_socket(0) if sock == "namesrv" else paths.broker_socket(sock)
    with RemotingClient(ipc_address(path), timeout_s=10.0) as c:
        return c.request(code, fields).fields


def _snapshot(root: str) -> dict:
    """What the attack must not change: the victim's route, its broker config, its group's offsets,
    the KV config and who is registered where."""
    topics = _fields(root, RequestCode.GET_ALL_TOPIC_CONFIG, {}, "broker-a")["topics"]
    offsets = [_fields(root, RequestCode.QUERY_CONSUMER_OFFSET, {"group": "g-owner", "topic": "owned",
                                                                  "queue_id": q}, "broker-a")["offset"]
               for q in range(2)]
    return {"route": _fields(root, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "owned"}),
            "owned": topics["owned"], "offsets": offsets,
            "kv": _fields(root, RequestCode.GET_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "owned"}),
            "brokers": _fields(root, RequestCode.GET_BROKER_CLUSTER_INFO, {})["brokers"]}


def _owner_setup(root: str) -> None:
    with hostmq.Admin(root) as a:
        a.create_topic("owned", queues=2, order=True)          # order=True: a KV entry on the NameServer
        a.create_topic("honest", queues=2)
    with hostmq.Producer(root) as p:
        for i in range(6):
            p.send(hostmq.Message("owned", b"owned %d" % i))
    pc = hostmq.PullConsumer(root, group="g-owner", consume_from=hostmq.ConsumeFrom.FIRST_OFFSET)
    try:
        pc.subscribe("owned", "*")
        got = []
        while len(got) < 6:
            got += pc.poll(timeout=1.0)
        pc.commit()
    finally:
        pc.close()


def test_a_hostile_member_administers_nothing_and_the_cluster_keeps_serving(shared_root):  # noqa: F811
    root, scratch = shared_root
    config = merge(TEST_CONFIG, {"access": {"group": str(GROUP)}, "broker": CAPS})
    cluster = hostmq.LocalCluster(root, config=config).start()
    try:
        _owner_setup(root)
        before = _snapshot(root)
        done = os.path.join(scratch, "attack-done")
        results: dict[str, object] = {}

        def attacker():
            try:
                results["attack"] = run_as(ATTACKER, ATTACKER, [GROUP], ATTACK_CODE, root, "--victim-topic", "owned",
                                           "--victim-group", "g-owner", "--groups", str(FLOOD_GROUPS),
                                           "--auto-topics", str(FLOOD_TOPICS), scratch=scratch)
            finally:
                open(done, "w").close()

        t = threading.Thread(target=attacker)
        t.start()
        honest = run_as(HONEST, HONEST, [GROUP], HONEST_CODE, root, done, scratch=scratch)
        t.join(200)
        attack = results["attack"]
        assert attack.stdout.strip(), attack.stderr
        report = json.loads(attack.stdout.strip().splitlines()[-1])

        # Every administration attempt got the typed refusal (or a code that socket does not serve).
        assert report["admin"] and report["reregister"], report
        breaches = {k: v for k, v in {**report["admin"], **report["reregister"]}.items()
                    if v not in ("refused", "not supported")}
        assert not breaches, breaches
        assert sum(v == "refused" for v in report["admin"].values()) >= 9, report["admin"]
        # The flood stopped at the attacker's caps; nothing else went wrong for it.
        assert report["heartbeats_accepted"] <= CAPS["max_groups_per_uid"], report
        assert report["heartbeats_accepted"] + report["heartbeats_refused"] == FLOOD_GROUPS, report
        assert report["auto_topics_accepted"] == CAPS["max_auto_topics_per_uid"], report
        assert report["auto_topics_refused"] == FLOOD_TOPICS - CAPS["max_auto_topics_per_uid"], report
        assert not report["other_errors"], report["other_errors"]

        # The honest member was served throughout, with its clients' normal timeouts.
        words = honest.stdout.split()
        assert words[:1] == ["HONEST"], honest.stdout + honest.stderr
        rounds, sent, got = map(int, words[1:4])
        assert rounds >= 3 and got == sent, honest.stdout

        # Routes, topics, offsets, KV config and registrations are what they were.
        after = _snapshot(root)
        assert after == before
        topics = _fields(root, RequestCode.GET_ALL_TOPIC_CONFIG, {}, "broker-a")["topics"]
        evil = [n for n in topics if "evil-" in n]
        assert len(evil) <= CAPS["max_groups_per_uid"] + CAPS["max_auto_topics_per_uid"], len(evil)

        # The owner still administers, and the cluster still serves the owner's topic.
        with hostmq.Admin(root) as a:
            a.create_topic("after-attack", queues=1)
            assert "after-attack" in a.topics()
            a.reset_offset("g-owner", "owned", 0)
            assert a.delete_topic("after-attack")
        with hostmq.Producer(root) as p:
            assert p.send(hostmq.Message("owned", b"after")).status == hostmq.SendStatus.SEND_OK
    finally:
        cluster.stop()
    assert not leftovers(root, ["broker-a"])


def test_a_refusal_names_who_may_do_it(shared_root):  # noqa: F811
    root, scratch = shared_root
    cluster = hostmq.LocalCluster(root, config=merge(TEST_CONFIG, {"access": {"group": str(GROUP)}})).start()
    code = """
import sys, hostmq
try:
    with hostmq.Admin(sys.argv[1]) as a:
        a.create_topic("not-mine", queues=1)
    print("CREATED")
except hostmq.PermissionDeniedError as e:
    print("REFUSED", e)
"""
    try:
        out = run_as(ATTACKER, ATTACKER, [GROUP], code, root, scratch=scratch)
        assert out.stdout.startswith("REFUSED"), out.stdout + out.stderr
        assert f"only the owner of {os.path.realpath(root)}" in out.stdout, out.stdout
        assert f"uid {ATTACKER}" in out.stdout, out.stdout
        with hostmq.Admin(root) as a:
            assert "not-mine" not in a.topics()
    finally:
        cluster.stop()
