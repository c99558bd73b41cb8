"""The workload's message body and event-log codecs (pure, plus real files)."""
from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hostmq.faults.workload import EventLog, encode_body, message_key, parse_body, read_events

pytestmark = pytest.mark.timeout(60)

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789.-_", min_size=1, max_size=20)


@given(trial=st.integers(0, 10**6), producer=names, mode=st.sampled_from(["sync", "tx", "ordered"]),
       seq=st.integers(0, 2**31), okey=st.one_of(st.just(""), names), oseq=st.integers(-1, 10**6),
       size=st.integers(0, 300))
def test_body_round_trip(trial, producer, mode, seq, okey, oseq, size):
    body = encode_body(trial, producer, mode, seq, okey, oseq, size)
    assert len(body) >= size
    assert parse_body(body) == (trial, producer, mode, seq, okey, oseq)


@pytest.mark.parametrize("body", [b"", b"hello", b"hmqf|1|p|sync", b"hmqf|x|p|sync|1||-1|", b"xmqf|1|p|m|1||-1|",
                                  b"hmqf|1|\xff|sync|1||-1|"])
def test_other_bodies_are_not_harness_messages(body):
    assert parse_body(body) is None


def test_message_key_names_producer_and_seq():
    assert message_key("p1.2", 17) == "p1.2.17"


def test_read_events_returns_complete_lines_and_resumes(tmp_path):
    path = str(tmp_path / "w.log")
    log = EventLog(path)
    log.write({"e": "ack", "s": 1})
    log.write_many([{"e": "ack", "s": 2}, {"e": "fail", "s": 3}])
    with open(path, "ab") as f:
        f.write(b'{"e": "ack", "s"')          # a line cut short by a kill
    events, off = read_events(path)
    assert [e["s"] for e in events] == [1, 2, 3]
    assert off == os.path.getsize(path) - len(b'{"e": "ack", "s"')
    with open(path, "ab") as f:               # nobody completes it; the next incarnation has its own
        f.write(b"\n")
    log.write({"e": "ack", "s": 4})
    events, off2 = read_events(path, off)
    assert [e.get("s") for e in events] == [4]      # the broken line is skipped, not misread
    assert off2 == os.path.getsize(path)
    log.close()


def test_read_events_of_a_missing_file_is_empty(tmp_path):
    assert read_events(str(tmp_path / "nope.log"), 7) == ([], 7)
