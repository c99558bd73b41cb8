"""The pure parts of the Spark connector: option parsing, partition splitting, rate limiting."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from hostmq.spark.options import (EARLIEST, LATEST, OptionError, decode_offsets, encode_offsets, parse_offsets,
                                  read_options, write_options)

pytestmark = pytest.mark.timeout(60)


def test_offsets_json_flat_applies_to_every_topic_nested_names_one():
    flat = parse_offsets('{"broker-a": {"0": 12, "3": -2}}', "startingOffsets", ("a", "b"), LATEST)
    assert flat.for_queue(("a", "broker-a", 0)) == 12 and flat.for_queue(("b", "broker-a", 3)) == EARLIEST
    assert flat.for_queue(("a", "broker-b", 0)) == LATEST
    nested = parse_offsets('{"b": {"broker-a": {"1": 7}}}', "startingOffsets", ("a", "b"), EARLIEST)
    assert nested.for_queue(("b", "broker-a", 1)) == 7 and nested.for_queue(("a", "broker-a", 1)) == EARLIEST
    assert parse_offsets(" Latest ", "x", ("a",), EARLIEST).default == LATEST


@pytest.mark.parametrize("raw, needle", [
    ("{", "not JSON"), ("[]", "non-empty object"), ("{}", "non-empty object"),
    ('{"broker-a": {"q": 1}}', "not a number"), ('{"broker-a": {"0": -3}}', "int ≥ 0"),
    ('{"broker-a": {"0": 1.5}}', "int ≥ 0"), ('{"broker-a": {"0": true}}', "int ≥ 0"),
    ('{"zz": {"broker-a": {"0": 1}}}', "not among the topics"), ('{"broker-a": 5}', "map queue ids"),
])
def test_bad_offsets_json_names_the_option(raw, needle):
    with pytest.raises(OptionError) as e:
        parse_offsets(raw, "startingOffsets", ("a",), EARLIEST)
    assert "startingOffsets" in str(e.value) and needle in str(e.value)


def test_ending_offsets_refuse_earliest():
    with pytest.raises(OptionError, match="endingOffsets"):
        read_options({"root": "/r", "topic": "a", "endingOffsets": "earliest"}, streaming=False)
    with pytest.raises(OptionError, match="endingOffsets"):
        read_options({"root": "/r", "topic": "a", "endingOffsets": '{"b": {"0": -2}}'}, streaming=False)


def test_read_options_defaults_and_checks():
    o = read_options({"root": "/r", "topic": " a , b ,a"}, streaming=True)
    assert o.topics == ("a", "b") and o.starting.default == LATEST and o.fail_on_data_loss and o.arrow
    assert read_options({"root": "/r", "topic": "a"}, streaming=False).starting.default == EARLIEST
    assert read_options({"path": "/r", "topic": "a", "failOnDataLoss": "FALSE"}, streaming=False).fail_on_data_loss is False
    for opts, name in [({"topic": "a"}, "root"), ({"root": "/r"}, "topic"), ({"root": "/r", "topic": "a b"}, "topic"),
                       ({"root": "/r", "topic": "a", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
                       ({"root": "/r", "topic": "a", "startingTimestamp": "yesterday"}, "startingTimestamp"),
                       ({"root": "/r", "topic": "a", "expressionType": "REGEX"}, "expressionType"),
                       ({"root": "/r", "topic": "a", "expressionType": "SQL92", "expression": "a >"}, "expression"),
                       ({"root": "/r", "topic": "a", "group": "g@x"}, "group"),
                       ({"root": "/r", "topic": "a", "maxOffsetsPerTrigger": "-5"}, "maxOffsetsPerTrigger")]:
        with pytest.raises(OptionError) as e:
            read_options(opts, streaming=True)
        assert f"'{name}'" in str(e.value)
    with pytest.raises(OptionError, match="maxOffsetsPerTrigger"):
        read_options({"root": "/r", "topic": "a", "maxOffsetsPerTrigger": "5"}, streaming=False)
    with pytest.raises(OptionError, match="endingOffsets"):
        read_options({"root": "/r", "topic": "a", "endingOffsets": "latest"}, streaming=True)
    with pytest.raises(OptionError, match="'root'"):
        write_options({"topic": "a"})


def test_row_filters():
    tag = read_options({"root": "/r", "topic": "a", "expression": "x || y"}, streaming=False).row_filter()
    assert tag("x", {}) and tag("y", {}) and not tag("z", {}) and not tag(None, {})
    assert read_options({"root": "/r", "topic": "a", "expression": "*"}, streaming=False).row_filter() is None
    sql = read_options({"root": "/r", "topic": "a", "expressionType": "sql92", "expression": "n > 3"},
                       streaming=False).row_filter()
    assert sql(None, {"n": "4"}) and not sql(None, {"n": "3"}) and not sql(None, {})


offsets = st.dictionaries(st.tuples(st.sampled_from(["t1", "t2"]), st.sampled_from(["broker-a", "broker-b"]),
                                    st.integers(0, 40)), st.integers(0, 2**62), max_size=20)


@given(offsets)
def test_stream_offsets_round_trip_with_sorted_string_keys(d):
    enc = encode_offsets(d)
    assert decode_offsets(enc) == d
    for brokers in enc.values():
        for queues in brokers.values():
            assert all(isinstance(k, str) for k in queues)
    import orjson
    assert decode_offsets(orjson.loads(orjson.dumps(enc))) == d


pyspark = pytest.importorskip("pyspark", reason="the spark extra is not installed")
from hostmq.spark.source import prorate, split_ranges  # noqa: E402


def test_split_ranges_chunks_each_queue():
    parts = split_ranges({("t", "b", 0): (5, 30), ("t", "b", 1): (0, 0), ("t", "a", 2): (0, 10)}, 10)
    assert [(p.broker, p.queue_id, p.start, p.end) for p in parts] == [
        ("a", 2, 0, 10), ("b", 0, 5, 15), ("b", 0, 15, 25), ("b", 0, 25, 30)]


@given(st.dictionaries(st.integers(0, 9), st.tuples(st.integers(0, 1000), st.integers(0, 1000)), min_size=1),
       st.integers(1, 3000))
def test_prorate_never_exceeds_the_limit_and_takes_all_it_may(ranges, limit):
    starts = {("t", "b", q): min(a, b) for q, (a, b) in ranges.items()}
    ends = {("t", "b", q): max(a, b) for q, (a, b) in ranges.items()}
    got = prorate(starts, ends, limit)
    taken = {k: got[k] - starts[k] for k in ends}
    backlog = sum(ends[k] - starts[k] for k in ends)
    assert all(0 <= taken[k] <= ends[k] - starts[k] for k in ends)
    assert sum(taken.values()) == min(limit, backlog)


def test_prorate_is_proportional_to_backlog():
    got = prorate({("t", "b", 0): 0, ("t", "b", 1): 0}, {("t", "b", 0): 300, ("t", "b", 1): 100}, 40)
    assert got == {("t", "b", 0): 30, ("t", "b", 1): 10}


def test_a_null_property_value_is_left_out_and_a_reserved_name_is_kept_for_the_producer_to_refuse():
    # issue 31: a SQL NULL in the properties map is no value (RocketMQ's encoder leaves a null value
    # out too); names are checked by the producer (hostmq.ReservedPropertyError), not dropped here.
    writer = pytest.importorskip("hostmq.spark.writer", reason="the spark extra is not installed")
    cols = ("body", "properties")
    m = writer.row_message({"body": b"x", "properties": {"a": "1", "b": None}}, cols, "t")
    assert m.properties == {"a": "1"}
    assert writer.row_message({"body": b"x", "properties": {"TAGS": "t"}}, cols, "t").properties == {"TAGS": "t"}
