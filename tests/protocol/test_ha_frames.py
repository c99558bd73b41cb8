"""Replication frames and the handshake's agreement rule (hostmq/protocol/ha.py), pure."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hostmq.errors import ProtocolError
from hostmq.protocol import ha

pytestmark = pytest.mark.timeout(60)


def test_frames_survive_any_cut_of_the_stream():
    stream = (ha.Hello(100, 1 << 20, ((40, 60, 7),)).encode() + ha.encode(ha.REPORT, 100)
              + ha.encode(ha.REPORT, 200))
    for cut in range(len(stream) + 1):
        r = ha.FrameReader(ha.SLAVE_KINDS)
        got = r.feed(stream[:cut]) + r.feed(stream[cut:])
        assert [(f.kind, f.offset) for f in got] == [(ha.HELLO, 100), (ha.REPORT, 100), (ha.REPORT, 200)]
        assert r.buffered_bytes == 0
    assert ha.Hello.decode(got[0]) == ha.Hello(100, 1 << 20, ((40, 60, 7),))


@pytest.mark.parametrize("frame", [
    ha.encode(ha.DATA, 0, b"x"),                                   # a master's frame sent to a master
    ha.HEADER.pack(ha.REPORT, 5, 1) + b"x",                         # a report with a body
    ha.HEADER.pack(99, 0, 0),                                       # no such kind
    ha.HEADER.pack(ha.HELLO, -1, 0),                                # a negative offset
    ha.HEADER.pack(ha.HELLO, 0, ha.MAX_CONTROL_BODY_BYTES + 1),     # longer than allowed: refused early
    ha.HEADER.pack(ha.OFFSETS, 0, ha.MAX_OFFSETS_BYTES + 1),        # a slave's offsets past their bound
    b"\x02\x00\x01\x00" + bytes(12),                                # padding not zero
])
def test_a_master_refuses_what_a_slave_may_not_send(frame):
    with pytest.raises(ProtocolError):
        ha.FrameReader(ha.SLAVE_KINDS).feed(frame)


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"version": 1}', b'{"version": 2, "file_bytes": 1, '
                                  b'"checkpoints": [], "auth": ""}',
                                  b'{"version": 1, "file_bytes": 0, "checkpoints": [], "auth": ""}',
                                  b'{"version": 1, "file_bytes": 8, "checkpoints": [[1, 2]], "auth": ""}',
                                  b'{"version": 1, "file_bytes": 8, "checkpoints": [[1, 2, -3]], "auth": ""}',
                                  b'{"version": 1, "file_bytes": 8, "checkpoints": [], "auth": 7}'])
def test_a_bad_hello_is_a_protocol_error(body):
    with pytest.raises(ProtocolError):
        ha.Hello.decode(ha.Frame(ha.HELLO, 0, body))


def test_only_the_holder_of_the_secret_answers_a_challenge():
    challenge = bytes(range(32))
    token = ha.auth_token(b"secret", challenge)
    assert ha.auth_ok(b"secret", challenge, token)
    assert not ha.auth_ok(b"other", challenge, token)
    assert not ha.auth_ok(b"secret", bytes(32), token)
    assert not ha.auth_ok(b"secret", challenge, "")
    hello = ha.Hello(5, 1 << 20, (), token)
    (f,) = ha.FrameReader(ha.SLAVE_KINDS).feed(hello.encode())
    assert ha.Hello.decode(f).auth == token


def test_a_welcome_round_trips():
    w = ha.Welcome(4096, 1 << 30, 8192, None)
    (f,) = ha.FrameReader(ha.MASTER_KINDS).feed(w.encode())
    assert ha.Welcome.decode(f) == w


# -- where master and slave agree ---------------------------------------------------------------------
def _log(records: list[bytes]) -> tuple[bytes, list[tuple[int, int, int]]]:
    """A commitlog of these records and each one's checkpoint."""
    out, cps, pos = b"", [], 0
    for r in records:
        cps.append((pos, len(r), ha.record_crc(r)))
        out += r
        pos += len(r)
    return out, cps


def _reader(log: bytes):
    return lambda phys, size: log[phys:phys + size] if phys + size <= len(log) else None


def test_a_slave_behind_an_identical_master_streams_on_from_its_end():
    master, cps = _log([b"a" * 10, b"b" * 20, b"c" * 30])
    hello = ha.Hello(30, 1 << 20, (cps[0], cps[1]))
    assert ha.agreed_start(hello, len(master), 0, _reader(master)) == (30, None)


def test_an_empty_slave_starts_at_the_masters_oldest_data():
    assert ha.agreed_start(ha.Hello(0, 1 << 20, ()), 500, 100, _reader(b"")) == (100, None)


def test_a_slave_ahead_of_its_master_is_cut_back_to_the_masters_end():
    slave, cps = _log([b"a" * 10, b"b" * 20, b"c" * 30])
    master = slave[:30]                         # the master lost its last record in recovery
    hello = ha.Hello(60, 1 << 20, (cps[0], cps[1], cps[2]))
    assert ha.agreed_start(hello, len(master), 0, _reader(master)) == (30, 30)


def test_a_master_that_wrote_other_records_after_losing_a_tail_is_found_out():
    """The master lost [30, 60) and wrote different records there since: offsets alone would agree."""
    slave, cps = _log([b"a" * 10, b"b" * 20, b"c" * 30])
    master, _ = _log([b"a" * 10, b"b" * 20, b"d" * 30, b"e" * 5])
    hello = ha.Hello(60, 1 << 20, (cps[0], cps[2]))
    assert ha.agreed_start(hello, len(master), 0, _reader(master)) == (10, 10)


def test_nothing_in_common_starts_over():
    slave, cps = _log([b"x" * 10])
    master, _ = _log([b"y" * 10, b"z" * 10])
    assert ha.agreed_start(ha.Hello(10, 1 << 20, tuple(cps)), len(master), 0, _reader(master)) == (0, 0)


def _tagged(bodies: list[bytes], gen: int, pos: int = 0) -> list[bytes]:
    """Records as a store writes them: each carries where and when it was written (a real record's
    phys offset and store timestamp), so two writes never produce the same bytes."""
    out = []
    for b in bodies:
        r = b"%d:%d:" % (gen, pos) + b
        out.append(r)
        pos += len(r)
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=12), min_size=1, max_size=12), st.integers(0, 12),
       st.lists(st.binary(min_size=1, max_size=12), max_size=6), st.data())
def test_the_agreed_point_is_always_a_prefix_both_hold(bodies, keep, extra, data):
    """The master kept a prefix of what the slave has and wrote other records after it; whichever
    checkpoints the slave reports, the master never streams onto bytes that differ from its own."""
    records = _tagged(bodies, 0)
    keep = min(keep, len(records))
    slave, cps = _log(records)
    kept_len = sum(len(r) for r in records[:keep])
    master, _ = _log(records[:keep] + _tagged(extra, 1, kept_len))
    chosen = data.draw(st.lists(st.sampled_from(cps), max_size=len(cps), unique=True))
    start, cut = ha.agreed_start(ha.Hello(len(slave), 1 << 20, tuple(chosen)), len(master), 0, _reader(master))
    kept = slave[:cut] if cut is not None else slave
    assert start == len(kept) and master[:start] == kept
