"""Issue 15 item 8: a broker with 100,000 topics registers them with a real NameServer (paged), and
its routes stay whole while it registers again after a change. Before: past ~1 MiB of topic config
the registration exceeded the frame limit and every route vanished at expiry."""
from __future__ import annotations

import os
import random
import threading

import pytest

import hostmq
from hostmq.broker.topics import TopicTable
from hostmq.remoting import RemotingClient
from hostmq.errors import NoRouteError
from hostmq.protocol.route_data import TopicConfig
from hostmq.protocol.codes import RequestCode
from hostmq.root import RootPaths, ipc_address

pytestmark = pytest.mark.timeout(300)

TOPICS = 100_000


def write_topics(root: str, broker: str, n: int) -> list[str]:
    """``n`` topics in the broker's topics table (its own file, as the broker writes it)."""
    config_dir = RootPaths(root).config_dir(broker)
    os.makedirs(config_dir, exist_ok=True)
    table = TopicTable(os.path.join(config_dir, "topics.json"))
    names = [f"bulk-{i:06d}-{random.randbytes(6).hex()}" for i in range(n)]
    for name in names:
        table.topics[name] = TopicConfig(name, 4, 4)
    table.data_version = 1
    table.save()
    return names


def route_queues(ns: RemotingClient, topic: str) -> int:
    f = ns.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}).fields
    return sum(q["read_queues"] for q in f["queue_datas"] if q["broker_name"] == "broker-a")


def test_100k_topics_register_and_their_routes_stay_whole_while_registering_again(cluster, root):
    names = write_topics(root, "broker-a", TOPICS)
    sample = random.sample(names, 300)
    # Registration every 0.5 s as in every e2e test; expiry long enough for a loaded machine.
    c = cluster(namesrv={"broker_expiry_s": 30.0}, broker={"register_interval_s": 0.5})
    with RemotingClient(ipc_address(RootPaths(c.root).namesrv_socket(0)), timeout_s=30.0) as ns:
        assert all(route_queues(ns, t) == 4 for t in sample)
        done = threading.Event()
        failures: list[str] = []

        def create():
            try:
                # 30 s like the route client above: on a loaded machine the NameServer may take
                # seconds over 100,000 topics' pages, and this test is about routes, not latency.
                with hostmq.Admin(c.root, timeout_s=30.0) as a:
                    a.create_topic("late-topic", queues=2)     # a new data version: all pages again
            except Exception as e:
                failures.append(repr(e))
            finally:
                done.set()

        t = threading.Thread(target=create)
        t.start()
        checks = 0
        while not done.is_set() or checks == 0:
            topic = sample[checks % len(sample)]
            try:
                assert route_queues(ns, topic) == 4, topic
            except NoRouteError:
                failures.append(f"{topic} lost its route during re-registration")
                break
            checks += 1
        t.join(60)
        assert not failures, failures
        assert route_queues(ns, "late-topic") == 2
        assert all(route_queues(ns, t) == 4 for t in random.sample(names, 1000))
        # Lists of every topic are far over a request's 1 MiB: a response may carry them.
        with hostmq.Admin(c.root, timeout_s=30.0) as a:
            assert len(a.topics()) >= len(names)
            assert a.brokers()[0]["alive"]
    assert all(p.poll() is None for p in c.processes.values())
