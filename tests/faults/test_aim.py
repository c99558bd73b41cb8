"""Aimed faults: the window predicates (pure), the look at the files, and stepping a real process."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys

import pytest

from hostmq import records as R
from hostmq.faults.aim import (WINDOWS, Facts, Targets, approaching, file_facts, in_window, proc_state,
                               step_into, step_s, wait_stopped)

pytestmark = pytest.mark.timeout(60)
FB = 1 << 20


def words(**over) -> dict:
    w = {n: 0 for n in R.STATE_WORD}
    w.update(write_pos=5000, committed_pos=5000, dispatched_pos=5000, flushed_pos=5000, flush_request_pos=0,
             intent_phys_start=4000, writer_waiting=1, dispatcher_waiting=1, flusher_waiting=1)
    w.update(over)
    return w


def facts(pool=False, sync=False, newest=0, copied=False, unpatched=False, **over) -> Facts:
    return Facts(words(**over), FB, sync, pool, newest, copied, unpatched)


def test_an_idle_broker_is_in_no_window():
    assert not any(in_window(w, facts()) for w in WINDOWS)
    with pytest.raises(ValueError):
        in_window("mid-lunch", facts())


def test_append_and_patch_windows():
    inside = dict(intent_valid=1, intent_phys_start=5000)
    assert not in_window("mid-append", facts(**inside))               # nothing copied yet
    assert in_window("mid-append", facts(copied=True, **inside))
    assert in_window("mid-append", facts(pool=True, **inside))        # the pool copies into its buffer
    assert not in_window("mid-patch", facts(copied=True, **inside))
    assert in_window("mid-patch", facts(copied=True, unpatched=True, **inside))
    assert not in_window("mid-journal", facts(copied=True, **inside))


def test_journal_roll_and_commit_windows():
    assert in_window("mid-journal", facts(intent_valid=1, intent_phys_start=4000))
    assert not in_window("mid-journal", facts(intent_valid=0, intent_phys_start=4000))
    roll = dict(intent_valid=1, intent_phys_start=FB - 300, write_pos=FB - 300, committed_pos=FB - 300)
    assert in_window("mid-roll", facts(newest=FB, **roll))
    assert in_window("mid-roll", facts(newest=FB, **{**roll, "write_pos": FB + 500}))    # published, journaling
    assert not in_window("mid-roll", facts(newest=0, **roll))
    assert not in_window("mid-roll", facts(newest=FB, **{**roll, "intent_valid": 0}))
    assert not in_window("mid-roll", facts(newest=FB, intent_valid=1, intent_phys_start=FB + 10, write_pos=FB + 10))
    assert in_window("mid-commit", facts(pool=True, committed_pos=4000))
    assert not in_window("mid-commit", facts(pool=False, committed_pos=4000))


def test_flush_and_dispatch_windows():
    assert in_window("mid-flush", facts(flusher_waiting=0, flushed_pos=4000))
    assert not in_window("mid-flush", facts(flusher_waiting=1, flushed_pos=4000))
    assert not in_window("mid-flush", facts(flusher_waiting=0, flushed_pos=4000, committed_pos=4000))
    assert in_window("mid-flush", facts(sync=True, flusher_waiting=0, flush_request_pos=5000, flushed_pos=4000))
    assert not in_window("mid-flush", facts(sync=True, flusher_waiting=0, flush_request_pos=4000, flushed_pos=4000))
    assert in_window("mid-dispatch", facts(dispatcher_waiting=0, dispatched_pos=100))
    assert not in_window("mid-dispatch", facts(dispatcher_waiting=0))


def test_a_roll_is_approached_only_near_a_file_end():
    assert not approaching("mid-roll", facts(write_pos=1000))
    assert approaching("mid-roll", facts(write_pos=FB - 100))
    assert approaching("mid-append", facts()) and not approaching("mid-commit", facts())
    assert step_s("mid-roll", facts(write_pos=FB - 100)) < step_s("mid-roll", facts(write_pos=FB - 20000)) \
        == step_s("mid-append", facts(write_pos=FB - 100))


def test_file_facts_look_at_the_record_at_write_pos(tmp_path):
    d = tmp_path / "commitlog"
    d.mkdir()
    data = bytearray(FB)
    done = R.encode_record(b"t", b"x", b"", phys_offset=0)
    data[:len(done)] = done
    (d / f"{0:020d}").write_bytes(bytes(data))
    assert file_facts(str(d), words(write_pos=len(done)), FB) == (0, False, False)   # zero past write_pos
    assert file_facts(str(d), words(write_pos=0), FB) == (0, True, False)            # complete record
    unpatched = R.encode_record(b"t", b"x", b"", phys_offset=0)
    data[len(done):len(done) + len(unpatched)] = unpatched
    (d / f"{0:020d}").write_bytes(bytes(data))
    assert file_facts(str(d), words(write_pos=len(done)), FB) == (0, True, True)
    (d / f"{FB:020d}").write_bytes(b"")
    assert file_facts(str(d), words(write_pos=len(done)), FB)[0] == FB
    assert file_facts(str(tmp_path / "none"), words(), FB) == (0, False, False)


@pytest.fixture
def sleeper():
    p = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.0001)"])
    yield p
    p.kill()
    p.wait(10)


def test_step_into_leaves_the_target_stopped_inside_the_window(sleeper):
    looks = []

    def look() -> Facts:
        looks.append(proc_state(sleeper.pid))
        return facts(intent_valid=1 if len(looks) >= 6 else 0)
    with Targets([sleeper.pid]) as t:
        res = step_into("mid-journal", t, look, 10.0, random.Random(1).uniform)
    assert res.hit and res.steps == 5 and "intent_valid=1" in res.detail
    assert proc_state(sleeper.pid) == "T"
    assert all(s == "T" for s in looks[1:])        # every look after the first was at a stopped process
    os.kill(sleeper.pid, signal.SIGCONT)


def test_step_into_gives_up_and_still_leaves_it_stopped(sleeper):
    with Targets([sleeper.pid]) as t:
        res = step_into("mid-journal", t, facts, 0.2, random.Random(1).uniform)
    assert not res.hit and res.steps > 0
    assert wait_stopped([sleeper.pid]) and proc_state(sleeper.pid) == "T"
    os.kill(sleeper.pid, signal.SIGCONT)


def test_proc_state_of_a_gone_process():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(10)
    assert proc_state(p.pid) == "X"
    assert wait_stopped([p.pid], 0.1)


def test_targets_hold_their_processes_by_pidfd_and_leave_out_what_does_not_belong(sleeper):
    """The harness signals broker children it read from the state words; by then a pid may name
    another process. Targets signal only the process they opened, and only if it still belongs."""
    assert Targets([sleeper.pid], belongs=lambda pid: False).pids == []
    assert Targets([0, -1]).pids == []              # kill(0) / kill(-1) would hit whole groups
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(30)                                   # reaped: its pid may be anyone's now
    with Targets([sleeper.pid, gone.pid]) as t:
        assert t.pids == [sleeper.pid]
        t.signal(signal.SIGSTOP)
        assert wait_stopped([sleeper.pid]) and proc_state(sleeper.pid) == "T"
        t.signal(signal.SIGCONT)
    held = Targets([sleeper.pid])
    sleeper.kill()
    sleeper.wait(10)
    held.signal(signal.SIGKILL)                     # the process it held is gone: nothing is signalled
    held.close()
