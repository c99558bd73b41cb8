"""Replication frames, the handshake's proofs, the frame MACs (hostmq/protocol/ha.py, ha_auth.py) and
the handshake's agreement rule, pure: two endpoints joined in memory."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
import orjson
from hypothesis import strategies as st

from hostmq.errors import ProtocolError
from hostmq.protocol import ha
from hostmq.protocol import ha_auth as A

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


_GOOD_HELLO = {"version": 2, "file_bytes": 8, "checkpoints": [], "nonce": "ab" * 32, "epoch": 0, "endpoint": "",
               "auth": ""}


@pytest.mark.parametrize("change", [{"version": 1}, {"file_bytes": 0}, {"checkpoints": [[1, 2]]},
                                    {"checkpoints": [[1, 2, -3]]}, {"auth": 7}, {"auth": "x" * 129},
                                    {"nonce": "ab"}, {"nonce": "zz" * 32}, {"nonce": None}, {"epoch": -1},
                                    {"epoch": True}, {"endpoint": 5}])
def test_a_bad_hello_is_a_protocol_error(change):
    with pytest.raises(ProtocolError):
        ha.Hello.decode(ha.Frame(ha.HELLO, 0, orjson.dumps({**_GOOD_HELLO, **change})))


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"version": 2}'])
def test_a_hello_that_is_no_object_is_a_protocol_error(body):
    with pytest.raises(ProtocolError):
        ha.Hello.decode(ha.Frame(ha.HELLO, 0, body))


def test_a_good_hello_round_trips():
    hello = ha.Hello(5, 1 << 20, ((0, 5, 9),), bytes(range(32)), 3, "127.0.0.1:10912", "f" * 64)
    (f,) = ha.FrameReader(ha.SLAVE_KINDS).feed(hello.encode())
    assert ha.Hello.decode(f) == hello
    assert ha.Hello.decode(ha.Frame(ha.HELLO, 0, orjson.dumps(_GOOD_HELLO))).nonce == bytes([0xab]) * 32


def test_a_welcome_round_trips():
    w = ha.Welcome(4096, 1 << 30, 8192, None, 2, True, "a" * 64)
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


# -- the mutual handshake and the tagged stream (protocol/ha_auth.py) --------------------------------
SECRET, NAME, EP = b"s" * 32, "broker-a", "127.0.0.1:10912"
NM, NS = bytes(range(32)), bytes(range(32, 64))


def _pair(secret_m: bytes = SECRET, secret_s: bytes = SECRET, nonce_m: bytes = NM, nonce_s: bytes = NS):
    """Each side's keys, derived as master and slave do after the handshake."""
    return A.session_keys(secret_m, nonce_m, nonce_s, NAME), A.session_keys(secret_s, nonce_m, nonce_s, NAME)


def test_each_side_proves_the_secret_over_both_nonces_the_name_the_epoch_and_the_endpoint():
    slave = A.proof(SECRET, A.SLAVE_LABEL, NM, NS, NAME, 0, EP)
    master = A.proof(SECRET, A.MASTER_LABEL, NM, NS, NAME, 1, EP)
    assert A.proof_ok(SECRET, slave, A.SLAVE_LABEL, NM, NS, NAME, 0, EP)
    assert A.proof_ok(SECRET, master, A.MASTER_LABEL, NM, NS, NAME, 1, EP)
    wrong = [(b"t" * 32, A.SLAVE_LABEL, NM, NS, NAME, 0, EP),          # another secret
             (SECRET, A.MASTER_LABEL, NM, NS, NAME, 0, EP),             # reflected: a slave's proof as a master's
             (SECRET, A.SLAVE_LABEL, bytes(32), NS, NAME, 0, EP),       # replayed to another master nonce
             (SECRET, A.SLAVE_LABEL, NM, bytes(32), NAME, 0, EP),       # ... or with another slave nonce
             (SECRET, A.SLAVE_LABEL, NM, NS, "broker-b", 0, EP),        # another broker name
             (SECRET, A.SLAVE_LABEL, NM, NS, NAME, 1, EP),              # another epoch
             (SECRET, A.SLAVE_LABEL, NM, NS, NAME, 0, "127.0.0.1:10913")]   # reached through a relay
    for args in wrong:
        assert not A.proof_ok(args[0], slave, *args[1:])
    assert not A.proof_ok(SECRET, "", A.SLAVE_LABEL, NM, NS, NAME, 0, EP)
    assert not A.proof_ok(SECRET, None, A.SLAVE_LABEL, NM, NS, NAME, 0, EP)


def test_a_relay_gets_no_proof_the_master_accepts():
    """A relay at 127.0.0.1:20000 passes the real master's nonce to a real slave: the slave's proof
    names the endpoint it reached (the relay), the master checks it against its own listener."""
    slave_proof = A.proof(SECRET, A.SLAVE_LABEL, NM, NS, NAME, 0, "127.0.0.1:20000")
    assert not A.proof_ok(SECRET, slave_proof, A.SLAVE_LABEL, NM, NS, NAME, 0, EP)


def test_both_sides_derive_the_same_keys_one_per_direction():
    m, s = _pair()
    assert m == s and m["master"] != m["slave"] and len(m["master"]) == 32
    other, _ = _pair(nonce_s=bytes(32))
    assert other["master"] != m["master"]


def _stream(kinds_bodies, key: bytes) -> list[bytes]:
    sealer = A.Sealer(key)
    return [ha.encode(k, o, b, sealer) for k, o, b in kinds_bodies]


_MASTER_FRAMES = [(ha.DATA, 100, b"x" * 40), (ha.BEAT, 140, ha.EPOCH.pack(2)), (ha.META, 0, b"{}"),
                  (ha.DATA, 140, b"y" * 7), (ha.BEAT, 147, ha.EPOCH.pack(2))]
_STREAM = frozenset((ha.DATA, ha.BEAT, ha.META))


def _read_all(data: bytes, key: bytes) -> tuple[list[ha.Frame], ProtocolError | None]:
    """Frames read one at a time until the stream ends or is refused."""
    r, got = ha.FrameReader(_STREAM, A.Opener(key)), []
    try:
        r.push(data)
        while (f := r.next()) is not None:
            got.append(f)
        r.finish()
    except ProtocolError as e:
        return got, e
    return got, None


def test_a_tagged_stream_reads_back_whole_and_in_any_cut():
    keys, _ = _pair()
    frames = _stream(_MASTER_FRAMES, keys["master"])
    data = b"".join(frames)
    got, err = _read_all(data, keys["master"])
    assert err is None and [(f.kind, f.offset, f.body) for f in got] == _MASTER_FRAMES
    for cut in range(len(data) + 1):
        r = ha.FrameReader(_STREAM, A.Opener(keys["master"]))
        assert len(r.feed(data[:cut]) + r.feed(data[cut:])) == len(_MASTER_FRAMES)
    assert ha.beat_epoch(got[1]) == 2


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_every_bit_flipped_frame_is_refused_with_a_typed_error(data):
    keys, _ = _pair()
    stream = b"".join(_stream(_MASTER_FRAMES, keys["master"]))
    bit = data.draw(st.integers(0, len(stream) * 8 - 1))
    bad = bytearray(stream)
    bad[bit // 8] ^= 1 << (bit % 8)
    got, err = _read_all(bytes(bad), keys["master"])
    assert isinstance(err, ProtocolError)
    frame_lengths = [len(f) for f in _stream(_MASTER_FRAMES, keys["master"])]
    untouched = next(i for i in range(len(frame_lengths)) if sum(frame_lengths[:i + 1]) * 8 > bit)
    assert [(f.kind, f.offset, f.body) for f in got] == _MASTER_FRAMES[:untouched]   # nothing forged got through


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_every_truncated_stream_is_refused_at_its_end(data):
    keys, _ = _pair()
    frames = _stream(_MASTER_FRAMES, keys["master"])
    stream = b"".join(frames)
    bounds = {sum(len(f) for f in frames[:i]) for i in range(len(frames) + 1)}
    cut = data.draw(st.integers(0, len(stream)).filter(lambda c: c not in bounds))
    got, err = _read_all(stream[:cut], keys["master"])
    assert isinstance(err, ProtocolError) and len(got) < len(_MASTER_FRAMES)


@pytest.mark.parametrize("order", [[0, 1, 1], [0, 0], [1, 0], [0, 2], [2, 3, 4], [0, 1, 3]],
                         ids=["replayed", "replayed-first", "reordered", "dropped", "started-late", "gap"])
def test_replayed_reordered_or_dropped_frames_are_refused(order):
    keys, _ = _pair()
    frames = _stream(_MASTER_FRAMES, keys["master"])
    got, err = _read_all(b"".join(frames[i] for i in order), keys["master"])
    assert isinstance(err, A.FrameAuthError)


def test_a_frame_reflected_to_its_sender_or_sealed_under_another_link_is_refused():
    m, _ = _pair()
    other, _ = _pair(nonce_m=bytes(32))
    report = ha.encode(ha.REPORT, 100, b"", A.Sealer(m["slave"]))
    with pytest.raises(A.FrameAuthError):                  # the master's own key: a reflection
        ha.FrameReader(frozenset((ha.REPORT,)), A.Opener(m["master"])).feed(report)
    with pytest.raises(A.FrameAuthError):                  # a frame of an earlier connection
        ha.FrameReader(frozenset((ha.REPORT,)), A.Opener(other["slave"])).feed(report)
    untagged = ha.encode(ha.REPORT, 100)
    with pytest.raises(ProtocolError):
        r = ha.FrameReader(frozenset((ha.REPORT,)), A.Opener(m["slave"]))
        r.feed(untagged + untagged)


def test_the_reader_switches_to_tags_between_two_frames_of_one_buffer():
    """A master's WELCOME and its first tagged DATA arrive in one read: the slave reads the WELCOME
    plain, sets the opener, and reads the DATA under it."""
    keys, _ = _pair()
    welcome = ha.Welcome(0, 1 << 20, 7, None, 0, False, "a").encode()
    data = ha.encode(ha.DATA, 0, b"x" * 7, A.Sealer(keys["master"]))
    r = ha.FrameReader(frozenset((ha.WELCOME,)))
    r.push(welcome + data)
    assert r.next().kind == ha.WELCOME
    r.accept, r.opener = _STREAM, A.Opener(keys["master"])
    assert r.next() == ha.Frame(ha.DATA, 0, b"x" * 7) and r.next() is None
