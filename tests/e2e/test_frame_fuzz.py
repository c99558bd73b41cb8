"""Hostile control frames against a real broker and NameServer (issue 15: "random control frames
(hypothesis)"), and the frame fuzzer tool itself (hostmq.faults.frame_fuzz).

The hypothesis test sends each example over a DEALER, then a PING on the same connection: the server
answers one connection in order, so the PING's answer proves the example was handled and the server
lives. Every answer must be a well-formed response; at the end both processes are alive and the
broker's children were never restarted.
"""
from __future__ import annotations

import os
import random
import shutil

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostmq.remoting import RemotingClient
from hostmq.faults import FuzzResult, frame_fuzz
from hostmq.faults.frame_cases import FIELD_NAMES, Known, Raw, dump, make_case
from hostmq.protocol.codes import RequestCode, ResponseCode
from hostmq.protocol.frames import MAX_REQUEST_ID, decode, encode_request
from hostmq.root import RootPaths, ipc_address

pytestmark = pytest.mark.timeout(120)

SENTINEL = 1 << 62
CHILDREN = ("writer_pid", "dispatcher_pid", "flusher_pid", "scheduler_pid")

# --- strategies -----------------------------------------------------------------------------------------
names = st.sampled_from(["fuzz", "victim", "broker-a", "DefaultCluster", "%RETRY%victim", "SCHEDULE_TOPIC_XXXX",
                         "../../x", "", "x" * 300, "a = 1 AND (b > 2)", "ipc:///nowhere"])
edge_ints = st.sampled_from([0, -1, 1, 2**31 - 1, 2**31, 2**63 - 1, -2**63]) | st.integers(-5, 5000)
scalars = (st.none() | st.booleans() | edge_ints | st.floats(allow_nan=False) | names
           | st.text(max_size=30) | st.sampled_from([Raw("NaN"), Raw("1e999"), Raw(str(2**64)), Raw("-" + str(2**70))]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner,
                                                                                         max_size=5), max_leaves=25)
deep = st.sampled_from([10, 254, 255, 1024, 1025, 4000]).map(lambda n: Raw("[" * n + "]" * n))
codes = st.sampled_from(list(RequestCode)) | st.integers(0, 2**31 - 1)
fields = st.dictionaries(st.sampled_from(FIELD_NAMES), values | deep, max_size=10)


@st.composite
def structured(draw) -> list[bytes]:
    header = {"v": 1, "code": int(draw(codes)), "id": draw(st.integers(1, MAX_REQUEST_ID)), "resp": False,
              "remark": "", "f": draw(fields)}
    if draw(st.integers(0, 9)) == 0:                   # one header key wrong or missing
        key = draw(st.sampled_from(sorted(header)))
        if draw(st.booleans()):
            del header[key]
        else:
            header[key] = draw(values)
    bodies = draw(st.lists(st.binary(max_size=64), max_size=3))
    return [dump(header), *bodies]


raw = st.lists(st.binary(max_size=3000), min_size=1, max_size=6)
messages = structured() | raw


# --- helpers -------------------------------------------------------------------------------------------

def addresses(root: str) -> dict[str, str]:
    paths = RootPaths(root)
    return {"broker": ipc_address(paths.broker_socket("broker-a")), "namesrv": ipc_address(paths.namesrv_socket(0))}


def children(address: str) -> dict[str, int]:
    with RemotingClient(address, timeout_s=20.0) as c:
        st_ = c.request(RequestCode.GET_BROKER_RUNTIME_INFO).fields["state"]
    return {k: st_[k] for k in CHILDREN}


def send_and_confirm(dealer: zmq.Socket, frames: list[bytes], n: int) -> None:
    """Send ``frames``, then a PING; every answer up to the PING's must be a response."""
    dealer.send_multipart(frames)
    dealer.send_multipart(encode_request(RequestCode.PING, SENTINEL + n))
    while True:
        assert dealer.poll(20_000), "the server did not answer within 20 s"
        answer = decode(dealer.recv_multipart())
        assert answer.response
        if answer.request_id == SENTINEL + n:
            assert answer.code == ResponseCode.SUCCESS
            return


# --- tests ---------------------------------------------------------------------------------------------

def test_hostile_frames_get_answers_and_both_servers_survive(cluster):
    c = cluster()
    addr = addresses(c.root)
    before = children(addr["broker"])
    ctx = zmq.Context()
    dealers = {}
    for server, a in addr.items():
        d = dealers[server] = ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        d.connect(a)
    counter = iter(range(1, 1 << 30))

    @settings(max_examples=300, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                     HealthCheck.data_too_large])
    @given(server=st.sampled_from(sorted(addr)), frames=messages)
    def check(server, frames):
        send_and_confirm(dealers[server], frames, next(counter))

    try:
        check()
        assert next(counter) > 250, "hypothesis ran fewer examples than asked"
    finally:
        for d in dealers.values():
            d.close(0)
        ctx.term()
    assert all(p.poll() is None for p in c.processes.values())
    assert children(addr["broker"]) == before, "a broker child was restarted"


def test_the_frame_fuzzer_runs_clean_and_cleans_up(tmp_path):
    """``frame_fuzz.run`` on a long workdir (its root moves under /tmp and is removed afterwards)."""
    workdir = str(tmp_path / ("long-" * 12))
    before = set(os.listdir("/tmp"))
    results = frame_fuzz.run(workdir, cases=400, seed=7)
    assert [r.kind for r in results] == ["frames:broker", "frames:namesrv"]
    assert sum(r.cases for r in results) == 400
    assert all(isinstance(r, FuzzResult) and not r.failures for r in results), [r.failures for r in results]
    assert not {n for n in set(os.listdir("/tmp")) - before if n.startswith("hmqff-")}


def test_the_fuzzer_reports_a_dead_server(tmp_path):
    """Its health check is what finds crashes: a NameServer killed under it is a failure line."""
    root, made = frame_fuzz._short_dir(str(tmp_path), 1)
    target = frame_fuzz._Target(os.path.join(root, "r0"))
    try:
        rng = random.Random(1)
        batch = [(i, "broker", make_case(rng, target.known)) for i in range(20)]
        assert target.send_and_check(batch) == {}
        target.cluster.processes["namesrv-0"].kill()
        target.cluster.processes["namesrv-0"].wait(10)
        broken = target.send_and_check([(20, "namesrv", make_case(rng, Known()))])
        assert list(broken) == ["namesrv"] and "namesrv-0 exited with -9" in broken["namesrv"]
    finally:
        target.close()
        if made:
            shutil.rmtree(root)
