"""The Prometheus exporter and ``hostmq status --check / --watch`` (issue 17), against a real cluster."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest

import hostmq
from hostmq import Message
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(180)
parser = pytest.importorskip("prometheus_client.parser")

HOSTMQ = [sys.executable, "-m", "hostmq.cli.main"]


def _exporter(root: str) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen([*HOSTMQ, "exporter", root, "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()
    assert line.startswith("hostmq exporter: serving http://"), line
    return p, line.split()[3]


def _scrape(url: str) -> dict:
    """``{(name, labels as a sorted tuple): value}`` of every sample."""
    with urllib.request.urlopen(url, timeout=30) as r:
        text = r.read().decode()
    out = {}
    for fam in parser.text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _status_json(root: str) -> dict:
    r = subprocess.run([*HOSTMQ, "status", root, "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_metrics_agree_with_status_for_the_same_moment(cluster):
    c = cluster()
    root = c.root
    with hostmq.Producer(root) as p:
        for i in range(200):
            p.send(Message("metered", b"m%d" % i))
    pc = hostmq.PullConsumer(root, group="g-metered", consume_from=hostmq.ConsumeFrom.FIRST_OFFSET)
    try:
        pc.subscribe("metered", "*")
        got = []
        wait_until(lambda: (got.extend(pc.poll(timeout=0.2)), len(got) >= 50)[1], 30, "some messages")
        pc.commit()
    finally:
        pc.close()
    exporter, url = _exporter(root)
    try:
        # Quiet now: wait until nothing moves (dispatched and flushed caught up), then compare.
        wait_until(lambda: (lambda st: st["write_pos"] == st["dispatched_pos"] == st["flushed_pos"])(
            _status_json(root)["brokers"][0]["state"]), 30, "the broker to settle")
        m = _scrape(url)
        status = _status_json(root)
    finally:
        _stop(exporter)
    b = status["brokers"][0]
    st, lb = b["state"], (("broker", "broker-a"),)
    assert m[("hostmq_broker_up", lb)] == 1.0
    assert m[("hostmq_commitlog_write_position_bytes", lb)] == st["write_pos"] > 0
    assert m[("hostmq_messages_stored_total", lb)] == st["appended_records"] >= 200
    assert m[("hostmq_dispatch_lag_bytes", lb)] == st["write_pos"] - st["dispatched_pos"] == 0
    assert m[("hostmq_flush_latency_seconds_count", lb)] == sum(st["flush_histogram"]) > 0
    assert m[("hostmq_flush_latency_seconds_sum", lb)] > 0
    for proc in ("broker", "writer", "dispatcher", "flusher", "scheduler"):
        assert m[("hostmq_process_resident_memory_bytes", lb + (("process", proc),))] > 0
        assert m[("hostmq_heartbeat_age_seconds", lb + (("process", proc),))] >= 0
    for kind in ("commitlog", "consume_queue"):
        assert 0.0 < m[("hostmq_page_cache_resident_ratio", lb + (("kind", kind),))] <= 1.0
    lags = {k: v for k, v in m.items() if k[0] == "hostmq_consumer_lag_messages"}
    rows = status["groups"]["g-metered"]
    assert len(lags) == len(rows) > 0
    for r in rows:
        topic, rest = r["queue"].split("@")
        broker, qid = rest.split("#")
        key = ("hostmq_consumer_lag_messages", tuple(sorted({"group": "g-metered", "topic": topic,
                                                             "broker": broker, "queue": qid}.items())))
        assert lags[key] == r["lag"]
    assert sum(lags.values()) == sum(r["lag"] for r in rows) > 0


def test_a_stopped_broker_is_down_in_the_metrics(cluster):
    c = cluster()
    exporter, url = _exporter(c.root)
    try:
        assert _scrape(url)[("hostmq_broker_up", (("broker", "broker-a"),))] == 1.0
        assert c.stop_process("broker-a") == 0
        m = _scrape(url)
    finally:
        _stop(exporter)
    assert m[("hostmq_broker_up", (("broker", "broker-a"),))] == 0.0
    assert ("hostmq_commitlog_write_position_bytes", (("broker", "broker-a"),)) not in m


def _check(root: str, *args, config=None) -> tuple[int, str]:
    cmd = [*HOSTMQ, "status", root, "--check", *args] + (["--config", config] if config else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout.strip()


def test_status_check_exits_one_with_one_line_saying_why(cluster):
    # A killed broker stays registered (and so "down", not gone) for the two checks that see it.
    c = cluster(broker={"heartbeat_stale_s": 1.0}, namesrv={"broker_expiry_s": 30.0})
    root = c.root
    code, out = _check(root, config=c.config_file)
    assert (code, out.startswith("ok: 1 broker(s) up")) == (0, True), out
    with hostmq.Producer(root) as p:
        for i in range(20):
            p.send(Message("checked", b"x"))
    # One message read and committed: its queue's offset is known to the broker, the rest lag.
    pc = hostmq.PullConsumer(root, group="g-checked", consume_from=hostmq.ConsumeFrom.FIRST_OFFSET,
                             max_poll_records=1)
    try:
        pc.subscribe("checked", "*")
        wait_until(lambda: pc.poll(timeout=0.2), 30, "a message")
    finally:
        pc.close()
    wait_until(lambda: _check(root, "--max-lag", "0", config=c.config_file)[0] == 1, 30, "the lag to show")
    code, out = _check(root, "--max-lag", "0", config=c.config_file)
    assert code == 1 and len(out.splitlines()) == 1 and out.startswith("unhealthy: group g-checked lags"), out
    assert _check(root, "--max-lag", "1000", config=c.config_file)[0] == 0
    with hostmq.Admin(root) as a:
        pid = a.brokers()[0]["pids"]["writer"]
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(lambda: _check(root, config=c.config_file)[0] == 1, 30, "the stale heartbeat to show")
        code, out = _check(root, config=c.config_file)
        assert "writer heartbeat" in out and out.startswith("unhealthy: broker broker-a: "), out
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_until(lambda: _check(root, config=c.config_file)[0] == 0, 30, "healthy again")
    c.signal_group("broker-a", signal.SIGKILL)
    c.processes["broker-a"].wait(30)
    wait_until(lambda: _check(root, config=c.config_file)[0] == 1, 30, "the broker to be down")
    code, out = _check(root, config=c.config_file)
    assert out.startswith("unhealthy: broker broker-a is down"), out


def test_status_watch_redraws_until_interrupted(cluster):
    c = cluster()
    p = subprocess.Popen([*HOSTMQ, "status", c.root, "--watch", "--interval", "0.2"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    frames = 0
    try:
        while frames < 3:
            line = p.stdout.readline()
            assert line, p.stderr.read()
            frames += line.count("hostmq status — ")
    finally:
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
