"""One master per broker name (issue 27, attack 2 and item 3), under a producer's load:

* ``hostmq ha promote`` run while a restarted old master holds ``broker.lock`` but is still
  recovering (frozen there by SIGSTOP, ``faults/attacks_roles.py``) ends typed — refused, or the lock
  wait timing out naming the frozen pid, or run wholly before the old master read its role — and
  never leaves two masters;
* a master that sees a newer master of its name recorded steps down: one ERROR line an operator can
  alert on, sends refused (nothing stored), and it starts again as a slave.

At every sampled instant at most one instance of the name runs as a master, and a consumer reading
from the first offset sees every SEND_OK exactly once.
"""
from __future__ import annotations

import collections
import os
import signal
import threading

import pytest

import hostmq
from hostmq.live import group, role
from hostmq.broker.fencing import ALERT
from hostmq.live.runtime import BrokerRuntime
from hostmq.live.state import BrokerState
from hostmq.faults.attacks_roles import promote_during_recovery
from hostmq.root import RootPaths
from tests.e2e.conftest import consume_bodies
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(300)
NAME = "broker-a"


class Load:
    """A producer sending one message at a time until stopped, through every error: ``acked``
    holds the bodies answered SEND_OK, ``errors`` counts the typed errors by class name."""

    def __init__(self, root: str, topic: str) -> None:
        self.root, self.topic = root, topic
        self.acked: list[bytes] = []
        self.errors: collections.Counter = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with hostmq.Producer(self.root, retries=0) as p:
            i = 0
            while not self._stop.is_set():
                body = b"%08d" % i
                i += 1
                try:
                    r = p.send(hostmq.Message(self.topic, body), timeout=2.0)
                except hostmq.HostMQError as e:
                    self.errors[type(e).__name__] += 1
                    self._stop.wait(0.02)       # the broker is away: do not spin on it
                    continue
                if r.status == hostmq.SendStatus.SEND_OK:
                    self.acked.append(body)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive()


class MasterSampler:
    """Counts, every few ms, the instances of ``NAME`` that run as masters on the root."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.samples = 0
        self.most = 0
        self.seen_two: list[list[tuple[str, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            found = group.running(self.root, NAME)
            masters = [(inst, st.role_epoch) for inst, st in found if not st.is_slave]
            for _, st in found:
                st.close()
            self.samples += 1
            self.most = max(self.most, len(masters))
            if len(masters) > 1:
                self.seen_two.append(masters)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def _masters(root: str) -> list[tuple[str, int]]:
    found = group.running(root, NAME)
    out = [(inst, st.role_epoch) for inst, st in found if not st.is_slave]
    for _, st in found:
        st.close()
    return out


def _check_delivery(root: str, load: Load, topic: str, group_name: str) -> None:
    bodies = consume_bodies(root, topic, len(load.acked), group_name, linger_s=0.5)
    counts = collections.Counter(bodies)
    lost = [b for b in load.acked if counts[b] == 0]
    twice = [b for b in load.acked if counts[b] > 1]
    assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {lost[:5]}"
    assert not twice, f"{len(twice)} acknowledged messages delivered twice, e.g. {twice[:5]}"


def test_promote_during_a_recovering_master_never_makes_two_masters(cluster):
    c = cluster(slaves=1, broker={"role": "SYNC_MASTER", "ha_sync_timeout_ms": 700})
    root = c.root
    wait_until(lambda: len(_masters(root)) == 1 and group.running_slave(root, NAME), 30, "master and slave")
    sampler = MasterSampler(root)
    load = Load(root, "fenced")
    try:
        wait_until(lambda: len(load.acked) >= 400, 90, "acknowledged sends before the crash")
        c.signal_group(NAME, signal.SIGKILL)        # abnormal recovery at the next start
        c.processes[NAME].wait(30)
        attack = promote_during_recovery(c, NAME, 1)
        before = len(load.acked)
        wait_until(lambda: len(load.acked) >= before + 200, 90, "acknowledged sends after the attack")
    finally:
        load.stop()
        sampler.stop()
    # Promote's outcome is typed and says what it met.
    assert attack.window in ("starting", "deciding", "before-decision", "missed"), attack
    if attack.window == "starting":
        assert (attack.outcome, attack.error_type) == ("refused", "PromotionRefusedError"), attack
        assert f"the master {NAME} (pid {c.pid(NAME)}) is starting" in attack.error
    elif attack.window == "deciding":
        assert attack.outcome == "lock-timeout" and f"pid {c.pid(NAME)}" in attack.error, attack
    elif attack.window == "before-decision":
        assert attack.outcome == "promoted" and attack.promoted["demoted"] == [NAME], attack
    else:
        assert attack.outcome == "refused" and "runs on this root" in attack.error, attack
    # One master at every sampled instant, and the one expected now.
    assert sampler.samples > 100 and sampler.most == 1 and not sampler.seen_two, sampler.seen_two[:3]
    expected = ("broker-a.1", 1) if attack.outcome == "promoted" else (NAME, 0)
    assert _masters(root) == [expected]
    assert set(load.errors) <= {"ConnectError", "SendTimeout", "BrokerBusyError", "NoRouteError",
                                "NotMasterError"}, load.errors
    _check_delivery(root, load, "fenced", "g-fenced")


def test_a_master_that_sees_a_newer_master_recorded_steps_down(cluster):
    """What a second root's promotion or a stale record restore can still produce: the running
    master of epoch 0 finds a role record of epoch 1 naming another instance the master."""
    c = cluster(slaves=1, broker={"role": "SYNC_MASTER", "ha_sync_timeout_ms": 700})
    root = c.root
    wait_until(lambda: group.running_slave(root, NAME), 30, "the slave")
    load = Load(root, "stepdown")
    try:
        wait_until(lambda: len(load.acked) >= 300, 90, "acknowledged sends")
        assert c.stop_process("broker-a.1") == 0    # everything SEND_OK is on the slave (SYNC_MASTER)
        # What `hostmq ha promote` on a root this master cannot see would have recorded.
        slave_rt = BrokerRuntime(root, NAME, 1, hostmq.Config().with_overrides({"broker": {"role": "SLAVE"}}))
        role.save(slave_rt, role.RoleRecord("SYNC_MASTER", 1))
        wait_until(lambda: _masters(root) == [] and group.running_slave(root, NAME) is not None, 60,
                   "the old master to step down and run as a slave")
        c.start_broker("broker-a.1")                # the recorded master serves again
        wait_until(lambda: _masters(root) == [("broker-a.1", 1)], 30, "the newer master")
        before = len(load.acked)
        wait_until(lambda: len(load.acked) >= before + 100, 90, "acknowledged sends to the newer master")
    finally:
        load.stop()
    with open(os.path.join(root, "logs", f"{NAME}.log"), encoding="utf-8", errors="replace") as f:
        alerts = [line for line in f if ALERT in line]
    assert len(alerts) == 1 and "ERROR" in alerts[0], alerts
    assert f"{ALERT} {NAME}: {NAME} (epoch 0) steps down for broker-a.1 (epoch 1)" in alerts[0]
    assert role.load(BrokerRuntime(root, NAME, 0)) == role.RoleRecord("SLAVE", 1, 1)
    _check_delivery(root, load, "stepdown", "g-stepdown")
    assert RootPaths(root).instances() == [NAME, "broker-a.1"]


def test_a_fenced_master_refuses_every_send_with_not_master_error_and_stores_nothing(cluster):
    """The writer's side of a step-down, held open: with the state's ``fenced_epoch`` word set (what
    ``fencing.fence`` sets) every send is refused typed and nothing is stored; cleared, sends go on."""
    c = cluster()
    root = c.root
    with hostmq.Producer(root, retries=0) as p:
        assert p.send(hostmq.Message("fenced-writer", b"before")).status == hostmq.SendStatus.SEND_OK
        state = BrokerState.attach(BrokerRuntime(root, NAME).state_name)     # writable: the test fences it
        try:
            end = state.get("write_pos")
            state.set("fenced_epoch", 1)
            for i in range(5):
                with pytest.raises(hostmq.NotMasterError, match="no longer the master"):
                    p.send(hostmq.Message("fenced-writer", b"refused-%d" % i))
            with pytest.raises(hostmq.NotMasterError):
                p.send_batch([hostmq.Message("fenced-writer", b"refused-batch")] * 3)
            assert state.get("write_pos") == end
            state.set("fenced_epoch", 0)
        finally:
            state.close()
        assert p.send(hostmq.Message("fenced-writer", b"after")).status == hostmq.SendStatus.SEND_OK
    assert consume_bodies(root, "fenced-writer", 2, "g-fenced-writer", linger_s=0.3) == [b"before", b"after"]
