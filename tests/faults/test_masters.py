"""The fault run's split-brain column: MasterWatch counts samples with two running masters of a name
(real state segments of this process, as a broker publishes them)."""
from __future__ import annotations

import os
import time

import pytest

from hostmq.live.state import BrokerState
from hostmq.faults.masters import MasterWatch
from hostmq.root import shm_name
from hostmq.shm import unlink_segment

pytestmark = pytest.mark.timeout(60)


def publish(root: str, instance: str, slave: bool, epoch: int = 0) -> BrokerState:
    os.makedirs(os.path.join(root, "brokers", instance), exist_ok=True)
    name = shm_name(root, instance, "state")
    unlink_segment(name)                        # a run before this one that failed half-way
    return BrokerState.create(name, store_host=b"\0" * 8, commitlog_file_bytes=1 << 20,
                              consume_queue_file_entries=1000, index_slots=101, index_entries=400,
                              sync_flush=False, start_pos=0, last_store_ts_ms=0, slave=slave, role_epoch=epoch)


@pytest.fixture
def states(tmp_path):
    made: list[BrokerState] = []
    root = str(tmp_path)

    def make(instance: str, slave: bool, epoch: int = 0) -> BrokerState:
        st = publish(root, instance, slave, epoch)
        made.append(st)
        return st
    yield root, made, make
    for st in made:
        st.close()
        st.unlink()


def test_one_master_and_its_slave_is_no_split(states):
    root, _, make = states
    make("broker-a", slave=False)
    make("broker-a.1", slave=True)
    assert MasterWatch(root, "broker-a").sample() == [("broker-a", 0)]


def test_two_running_masters_are_sampled_newest_epoch_first(states):
    root, _, make = states
    make("broker-a", slave=False, epoch=0)
    make("broker-a.1", slave=False, epoch=1)
    assert MasterWatch(root, "broker-a").sample() == [("broker-a.1", 1), ("broker-a", 0)]


def test_a_stopped_run_is_not_a_master(states):
    root, made, make = states
    make("broker-a", slave=False)
    old = make("broker-a.1", slave=False, epoch=1)
    from hostmq import records as R
    old.set("broker_state", R.BROKER_STOPPED)       # what a run that ended leaves behind
    assert MasterWatch(root, "broker-a").sample() == [("broker-a", 0)]


def test_the_watch_counts_split_samples_until_taken(states):
    root, _, make = states
    make("broker-a", slave=False)
    make("broker-a.1", slave=True)
    watch = MasterWatch(root, "broker-a", interval_s=0.005).start()
    try:
        deadline = time.monotonic() + 10
        samples = 0
        while samples < 5 and time.monotonic() < deadline:
            n, split, words = watch.take()
            samples += n
            assert split == 0 and words == []
            time.sleep(0.01)
        assert samples >= 5
        make("broker-a.2", slave=False, epoch=1)    # a second master appears
        deadline = time.monotonic() + 10
        split, words = 0, []
        while not split and time.monotonic() < deadline:
            time.sleep(0.01)
            _, split, words = watch.take()
        assert split >= 1
        assert "2 masters of broker-a" in words[0] and "broker-a.2 (epoch 1)" in words[0]
    finally:
        watch.stop()
