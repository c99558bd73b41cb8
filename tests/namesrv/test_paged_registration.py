"""Paged broker registration: the pure assembly (hostmq.namesrv.assembly), the NameServer's handler
over it (hostmq.namesrv.server.NamesrvService, called directly with a clock the test passes in), and
the broker's pagination (hostmq.broker.registration.paginate)."""
from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hostmq.broker.registration import PAGE_BYTES, paginate
from hostmq.config import NamesrvConfig
from hostmq.errors import BrokerBusyError, ValidationError
from hostmq.namesrv.assembly import ASSEMBLY_OVERHEAD_BYTES, PagedRegistrations
from hostmq.namesrv.server import NamesrvService
from hostmq.protocol.codes import RequestCode
from hostmq.protocol.frames import MAX_HEADER_BYTES, Frame, encode_request

pytestmark = pytest.mark.timeout(60)

ID = ("c1", "broker-a", 0, None, 7)
A = "ipc:///r/brokers/broker-a/broker.sock"


# --- assembly ------------------------------------------------------------------------------------------

def test_pages_in_order_assemble_and_leave_nothing_pending():
    p = PagedRegistrations(max_pages=8, max_pending_bytes=1 << 20, timeout_ms=1000)
    assert p.add(A, ID, 1, 0, 3, b"a", 0) is None
    assert p.add(A, ID, 1, 1, 3, b"b", 1) is None
    assert p.pending_bytes == ASSEMBLY_OVERHEAD_BYTES + len(A) + 2
    assert p.add(A, ID, 1, 2, 3, b"c", 2) == [b"a", b"b", b"c"]
    assert len(p) == 0 and p.pending_bytes == 0


@pytest.mark.parametrize("page,rid,ident,pages", [
    (2, 1, ID, 3),                             # skipped a page
    (1, 2, ID, 3),                             # another registration's page
    (1, 1, ("c1", "broker-a", 0, None, 8), 3),  # another data version
    (1, 1, ID, 4),                             # another page count
])
def test_a_page_that_does_not_continue_is_refused_and_the_registration_dropped(page, rid, ident, pages):
    p = PagedRegistrations(8, 1 << 20, 1000)
    p.add(A, ID, 1, 0, 3, b"a", 0)
    with pytest.raises(ValidationError, match="from page 0"):
        p.add(A, ident, rid, page, pages, b"x", 1)
    assert len(p) == 0 and p.pending_bytes == 0
    with pytest.raises(ValidationError, match="no registration in progress"):
        p.add(A, ID, 1, 1, 3, b"b", 2)


@pytest.mark.parametrize("page,pages", [(0, 1), (0, 9), (3, 3), (-1, 3)])
def test_page_numbers_out_of_range_are_refused(page, pages):
    with pytest.raises(ValidationError):
        PagedRegistrations(8, 1 << 20, 1000).add(A, ID, 1, page, pages, b"a", 0)


def test_the_pending_bytes_budget_refuses_with_busy_and_frees_what_it_dropped():
    p = PagedRegistrations(8, max_pending_bytes=3 * ASSEMBLY_OVERHEAD_BYTES, timeout_ms=1000)
    p.add("a", ID, 1, 0, 2, b"x" * ASSEMBLY_OVERHEAD_BYTES, 0)
    with pytest.raises(BrokerBusyError, match="register_pending_bytes"):
        p.add("b", ID, 1, 0, 2, b"y" * ASSEMBLY_OVERHEAD_BYTES, 0)
    assert len(p) == 1
    assert p.add("a", ID, 1, 1, 2, b"z", 1) == [b"x" * ASSEMBLY_OVERHEAD_BYTES, b"z"]
    assert p.pending_bytes == 0
    many = PagedRegistrations(8, 64 * ASSEMBLY_OVERHEAD_BYTES, 1000)
    with pytest.raises(BrokerBusyError):           # empty pages from endless addresses cost too
        for i in range(100):
            many.add(f"addr-{i}", ID, 1, 0, 2, b"{}", 0)
    assert many.pending_bytes <= 64 * ASSEMBLY_OVERHEAD_BYTES


def test_a_stalled_registration_expires_and_a_new_page_0_replaces_it():
    p = PagedRegistrations(8, 1 << 20, timeout_ms=1000)
    p.add(A, ID, 1, 0, 3, b"a", 0)
    p.add(A, ID, 2, 0, 2, b"new", 10)               # the broker started again
    assert p.add(A, ID, 2, 1, 2, b"end", 20) == [b"new", b"end"]
    p.add(A, ID, 3, 0, 2, b"a", 100)
    assert p.expire(1100) == [] and p.expire(1101) == [A] and p.pending_bytes == 0


# --- the NameServer's handler ---------------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.ms


def cfg(queues=4) -> dict:
    return {"read_queues": queues, "write_queues": queues, "perm": 6, "order": False}


def reg(svc, topics, version, page=None, pages=None, rid=1, address=A):
    fields = {"cluster": "c1", "broker_name": "broker-a", "broker_id": 0, "address": address,
              "ha_address": "", "data_version": version, "topics": topics}
    if pages is not None:
        fields.update(page=page, pages=pages, registration_id=rid)
    return svc.register_broker(Frame(RequestCode.REGISTER_BROKER, 1, fields, (), False)).fields


def routed(svc) -> set[str]:
    return set(svc.table.all_topics())


def test_routes_switch_only_when_the_last_page_arrives():
    clock = Clock()
    svc = NamesrvService(NamesrvConfig(), clock_ms=clock)
    reg(svc, {"old": cfg(), "kept": cfg()}, version=1)
    pages = [{"kept": cfg(2), "new1": cfg()}, {"new2": cfg()}, {"new3": cfg()}]
    for i, page in enumerate(pages[:-1]):
        clock.ms += 1000
        assert reg(svc, page, 2, i, 3)["complete"] is False
        assert routed(svc) == {"old", "kept"}        # the old routes stay whole meanwhile
        assert svc.table.broker_live(A).last_update_ms == clock.ms     # and alive
    assert reg(svc, pages[-1], 2, 2, 3)["complete"] is True
    assert routed(svc) == {"kept", "new1", "new2", "new3"}
    assert svc.table.topic_route("kept").queue_datas[0].read_queues == 2
    assert svc.pending.pending_bytes == 0
    # The same version again: page 0 says unchanged, and nothing else is needed.
    answer = reg(svc, pages[0], 2, 0, 3, rid=2)
    assert answer["complete"] and answer["unchanged"] and len(svc.pending) == 0


def test_a_bad_topic_in_any_page_is_refused_and_changes_nothing():
    svc = NamesrvService(NamesrvConfig(), clock_ms=Clock())
    reg(svc, {"old": cfg()}, version=1)
    assert reg(svc, {"a": cfg()}, 2, 0, 2)["complete"] is False
    with pytest.raises(ValidationError):
        reg(svc, {"bad topic!": cfg()}, 2, 1, 2)
    with pytest.raises(ValidationError):
        reg(svc, {"b": {"read_queues": "4", "write_queues": 4}}, 3, 0, 2)
    assert routed(svc) == {"old"}


def test_the_scan_drops_a_registration_that_stopped_half_way():
    clock = Clock()
    svc = NamesrvService(NamesrvConfig(register_page_timeout_s=5.0), clock_ms=clock)
    reg(svc, {"a": cfg()}, 1, 0, 2)
    clock.ms += 5001
    svc.scan()
    assert len(svc.pending) == 0 and svc.pending.pending_bytes == 0
    with pytest.raises(ValidationError, match="no registration in progress"):
        reg(svc, {"b": cfg()}, 1, 1, 2)


# --- pagination -----------------------------------------------------------------------------------------

def test_100k_topics_page_into_frames_that_fit():
    topics = {f"topic-{i:06d}-" + "x" * 100: cfg() for i in range(100_000)}
    pages = paginate(topics, max_topics=2000)
    assert [n for p in pages for n in p] == list(topics)
    for i, page in enumerate(pages):
        frames = encode_request(RequestCode.REGISTER_BROKER, 1, {
            "cluster": "c1", "broker_name": "b" * 255, "broker_id": 0, "address": "ipc://" + "/r" * 60,
            "ha_address": "", "data_version": 2**62, "topics": page, "page": i, "pages": len(pages),
            "registration_id": 2**62})
        assert len(frames[0]) <= MAX_HEADER_BYTES
    assert max(len(orjson.dumps(p)) for p in pages) <= PAGE_BYTES


@settings(max_examples=100, deadline=None)
@given(names=st.lists(st.text(min_size=1, max_size=40), unique=True, max_size=60),
       max_topics=st.integers(1, 10), max_bytes=st.integers(1, 400))
def test_pages_keep_every_topic_in_order_within_both_limits(names, max_topics, max_bytes):
    topics = {n: cfg() for n in names}
    pages = paginate(topics, max_topics, max_bytes)
    assert [n for p in pages for n in p] == names and all(pages[1:])
    for p in pages:
        assert len(p) <= max_topics
        assert len(p) <= 1 or len(orjson.dumps(p)) <= max_bytes
