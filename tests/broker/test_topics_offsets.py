"""A broker's topic table (topics.json) and consumer offsets (consumerOffset.json), on real files."""
from __future__ import annotations

import json
import os
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hostmq.broker.offsets import OffsetTable
from hostmq.broker.topics import TopicTable, is_system_topic
from hostmq.errors import ConfigError, NoRouteError, ValidationError
from hostmq.protocol.route_data import PERM_READ, PERM_WRITE, TopicConfig

pytestmark = pytest.mark.timeout(60)


def test_topics_are_saved_and_reloaded_with_a_growing_data_version(tmp_path):
    path = str(tmp_path / "config" / "topics.json")
    t = TopicTable(path)
    assert t.topics == {} and t.data_version == 0
    assert t.put(TopicConfig("orders", 4, 4))
    v1 = t.data_version
    assert not t.put(TopicConfig("orders", 4, 4))          # no change, no rewrite
    assert t.data_version == v1
    assert t.put(TopicConfig("orders", 8, 8, order=True))
    assert t.data_version > v1
    assert t.put(TopicConfig("audit", 1, 1, PERM_READ))
    again = TopicTable(path)
    assert again.topics == t.topics and again.data_version == t.data_version
    assert again.get("orders") == TopicConfig("orders", 8, 8, order=True)
    on_disk = json.load(open(path))
    assert on_disk["topics"]["audit"] == {"read_queues": 1, "write_queues": 1, "perm": PERM_READ, "order": False}


def test_writable_queues_follow_permissions_and_deletion(tmp_path):
    t = TopicTable(str(tmp_path / "topics.json"))
    t.put(TopicConfig("rw", 2, 6))
    t.put(TopicConfig("ro", 4, 4, PERM_READ))
    assert t.writable_queues("rw") == 6
    assert t.writable_queues("ro") == 0                    # not writable
    assert t.writable_queues("missing") == 0
    assert t.delete("rw") and not t.delete("rw")
    assert t.writable_queues("rw") == 0
    assert "rw" not in TopicTable(t.path).topics
    assert set(t.registration()) == {"ro"}


def test_auto_create_uses_the_default_queues_and_respects_the_switch_and_system_topics(tmp_path):
    t = TopicTable(str(tmp_path / "topics.json"))
    made = t.auto_create("fresh", 3, enabled=True)
    assert made == TopicConfig("fresh", 3, 3, PERM_READ | PERM_WRITE, False)
    assert t.auto_create("fresh", 9, enabled=True) is made    # an existing topic is left as it is
    with pytest.raises(NoRouteError, match="auto_create_topic is disabled"):
        t.auto_create("other", 3, enabled=False)
    for system in ("SCHEDULE_TOPIC_XXXX", "%RETRY%g", "%DLQ%g", "RMQ_SYS_TRACE_TOPIC"):
        assert is_system_topic(system)
        with pytest.raises(ValidationError, match="system topic"):
            t.auto_create(system, 3, enabled=True)
    assert not is_system_topic("orders")
    assert set(TopicTable(t.path).topics) == {"fresh"}


def test_a_torn_topics_file_falls_back_to_the_backup_and_bad_content_is_a_typed_error(tmp_path):
    path = str(tmp_path / "topics.json")
    t = TopicTable(path)
    t.put(TopicConfig("a", 1, 1))
    t.put(TopicConfig("b", 1, 1))               # the file with a and b; .bak holds only a
    with open(path, "wb") as f:
        f.write(b'{"topics": {"a": ')                # torn
    assert set(TopicTable(path).topics) == {"a"}
    with open(path + ".bak", "wb") as f:
        f.write(b"garbage")
    with pytest.raises(ConfigError):
        TopicTable(path)
    with open(path, "w") as f:
        json.dump({"topics": {"bad name!": {"read_queues": 1, "write_queues": 1, "perm": 6, "order": False}}}, f)
    with pytest.raises(ValidationError):
        TopicTable(path)


def test_offsets_commit_persist_reload(tmp_path):
    path = str(tmp_path / "consumerOffset.json")
    o = OffsetTable(path)
    assert o.query("g", "t", 0) is None and not o.persist()        # nothing to write
    o.commit("g", "t", 0, 10)
    o.commit("g", "t", 1, 20)
    o.commit("h", "t", 0, 5)
    o.commit("g", "u@x", 0, 1)                    # '@' in a topic is allowed: the key splits at the last '@'
    assert o.persist() and not o.persist()
    assert o.persist(force=True)
    back = OffsetTable(path)
    assert back.offsets == o.offsets
    assert back.group_offsets("g") == {("t", 0): 10, ("t", 1): 20, ("u@x", 0): 1}
    assert back.groups() == ["g", "h"]
    assert json.load(open(path))["offset_table"]["t@g"] == {"0": 10, "1": 20}
    back.delete_topic("t")
    assert back.dirty and back.group_offsets("g") == {("u@x", 0): 1} and back.query("h", "t", 0) is None
    back.persist()
    assert OffsetTable(path).offsets == {("g", "u@x", 0): 1}


@pytest.mark.parametrize("args", [("", "t", 0, 1), ("g@h", "t", 0, 1), ("g", "", 0, 1), ("g", "t", -1, 1),
                                  ("g", "t", 0, -5), ("g", "t", True, 1), ("g", "t", 0, 1.5), (None, "t", 0, 1)])
def test_bad_offset_commits_are_refused_and_change_nothing(tmp_path, args):
    o = OffsetTable(str(tmp_path / "o.json"))
    o.commit("g", "t", 0, 3)
    o.persist()
    with pytest.raises(ValidationError):
        o.commit(*args)
    assert o.offsets == {("g", "t", 0): 3} and not o.dirty


def test_unusable_entries_in_an_offsets_file_are_skipped(tmp_path):
    path = str(tmp_path / "o.json")
    with open(path, "w") as f:
        json.dump({"offset_table": {"t@g": {"0": 4, "x": 1, "1": "7"}, "nogroup": {"0": 1}, "u@g": [1]}}, f)
    assert OffsetTable(path).offsets == {("g", "t", 0): 4}
    os.remove(path)
    assert OffsetTable(path).offsets == {}


def test_a_reset_sets_offsets_and_refuses_commits_from_clients_that_have_not_seen_it(tmp_path):
    o = OffsetTable(str(tmp_path / "o.json"))
    o.commit("g", "t", 0, 90)
    o.commit("g", "t", 1, 80)
    o.reset("g", "t", {0: 10, 1: 20}, version=3)
    assert o.group_offsets("g") == {("t", 0): 10, ("t", 1): 20}
    assert not o.accepts("g", 2) and o.accepts("g", 3) and o.accepts("g", 4)
    assert o.accepts("g", None)                      # a client that does not say is trusted
    assert o.accepts("other", 0)                      # other groups are unaffected


# -- topic names (RocketMQ TopicValidator rules, enforced when a topic enters the table) --------------
@pytest.mark.parametrize("name", ["a", "T" * 127, "Az09_-%|", "%RETRY%group", "orders-2024_eu|x"])
def test_topic_names_by_the_rules_are_accepted_and_survive_a_reload(tmp_path, name):
    t = TopicTable(str(tmp_path / "topics.json"))
    assert t.put(TopicConfig(name, 1, 1))
    assert TopicTable(t.path).get(name) == TopicConfig(name, 1, 1)


@pytest.mark.parametrize("name,why", [
    ("", "non-empty"), ("T" * 128, "128 characters; at most 127"), ("a b", "characters outside"),
    ("a.b", "characters outside"), ("caf\u00e9", "characters outside"), ("ok\n", "characters outside"),
    ("a/b", "characters outside"), (None, "non-empty string"), (7, "non-empty string"),
])
def test_bad_topic_names_are_refused_with_a_validation_error(tmp_path, name, why):
    t = TopicTable(str(tmp_path / "topics.json"))
    with pytest.raises(ValidationError, match=f"topic_name: .*{why}"):
        t.put(TopicConfig(name, 1, 1))
    if isinstance(name, str):                          # callers pass strings (protocol-checked)
        with pytest.raises(ValidationError, match=why):
            t.auto_create(name, 4, enabled=True)
    assert t.topics == {} and not os.path.exists(t.path)          # nothing stored, no file written


@pytest.mark.parametrize("queues,ok", [(0, False), (1, True), (1024, True), (1025, False), (-1, False)])
def test_auto_create_queue_counts_are_bounded(tmp_path, queues, ok):
    t = TopicTable(str(tmp_path / "topics.json"))
    if ok:
        assert t.auto_create("fresh", queues, enabled=True).write_queues == queues
        assert t.writable_queues("fresh") == queues
    else:
        with pytest.raises(ValidationError, match="read_queues"):
            t.auto_create("fresh", queues, enabled=True)
        assert t.get("fresh") is None and not os.path.exists(t.path)


def test_system_topics_are_refused_before_the_auto_create_switch_is_looked_at(tmp_path):
    t = TopicTable(str(tmp_path / "topics.json"))
    for name in ("TBW102", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT", "BenchmarkTest", "RMQ_SYS_TRANS_HALF_TOPIC",
                 "RMQ_SYS_anything", "%DLQ%x", "%RETRY%x"):
        with pytest.raises(ValidationError, match=f"topic '{name}' is a system topic"):
            t.auto_create(name, 4, enabled=False)
    assert not is_system_topic("TBW1020") and not is_system_topic("x%RETRY%") and not is_system_topic("DLQ")
    # ... but a system topic the broker created itself is returned as it is.
    t.put(TopicConfig("%RETRY%g", 1, 1))
    assert t.auto_create("%RETRY%g", 8, enabled=False) == TopicConfig("%RETRY%g", 1, 1)


def test_the_file_has_the_documented_shape_and_the_previous_version_is_kept_as_bak(tmp_path):
    path = str(tmp_path / "config" / "topics.json")
    t = TopicTable(path)
    t.put(TopicConfig("zeta", 2, 3, PERM_WRITE, order=True))
    first = json.load(open(path))
    t.put(TopicConfig("alpha", 1, 1))
    data = json.load(open(path))
    assert list(data["topics"]) == ["alpha", "zeta"] and data["data_version"] == t.data_version
    assert data["topics"]["zeta"] == {"read_queues": 2, "write_queues": 3, "perm": PERM_WRITE, "order": True}
    assert json.load(open(path + ".bak")) == first
    assert set(os.listdir(tmp_path / "config")) == {"topics.json", "topics.json.bak"}     # no temp file left


def test_data_version_only_grows_even_after_a_reload_from_a_future_version(tmp_path):
    path = str(tmp_path / "topics.json")
    with open(path, "w") as f:
        json.dump({"data_version": 10 ** 17, "topics": {"a": {"read_queues": 1, "write_queues": 1,
                                                              "perm": 6, "order": False}}}, f)
    t = TopicTable(path)
    assert t.data_version == 10 ** 17
    assert t.put(TopicConfig("b", 1, 1)) and t.data_version == 10 ** 17 + 1
    assert t.delete("a") and t.data_version == 10 ** 17 + 2
    assert not t.delete("a") and t.data_version == 10 ** 17 + 2       # nothing to delete: no change
    assert TopicTable(path).data_version == 10 ** 17 + 2
    # A fresh table's first change is time based (RocketMQ DataVersion): later than any earlier run's.
    fresh = TopicTable(str(tmp_path / "other.json"))
    before_us = time.time_ns() // 1000
    fresh.put(TopicConfig("x", 1, 1))
    assert fresh.data_version >= before_us


def test_an_unchanged_put_or_a_missing_delete_does_not_rewrite_the_file(tmp_path):
    path = str(tmp_path / "topics.json")
    t = TopicTable(path)
    t.put(TopicConfig("a", 1, 1))
    assert not os.path.exists(path + ".bak")
    assert not t.put(TopicConfig("a", 1, 1)) and not t.delete("nope")
    assert not os.path.exists(path + ".bak")                         # a rewrite would have made one


def test_registration_gives_every_topic_without_its_name_inside(tmp_path):
    t = TopicTable(str(tmp_path / "topics.json"))
    t.put(TopicConfig("a", 2, 3, PERM_READ | PERM_WRITE, True))
    t.put(TopicConfig("b", 1, 1, 0))
    assert t.registration() == {"a": {"read_queues": 2, "write_queues": 3, "perm": 6, "order": True},
                                "b": {"read_queues": 1, "write_queues": 1, "perm": 0, "order": False}}
    assert t.writable_queues("b") == 0                                # perm 0: neither read nor write


def test_writable_queues_is_the_larger_queue_count_of_a_writable_topic(tmp_path):
    t = TopicTable(str(tmp_path / "topics.json"))
    t.put(TopicConfig("more-read", 8, 2))
    t.put(TopicConfig("write-only", 1, 5, PERM_WRITE))
    assert t.writable_queues("more-read") == 8 and t.writable_queues("write-only") == 5


def test_a_missing_file_is_an_empty_table_and_a_missing_file_with_a_backup_uses_it(tmp_path):
    path = str(tmp_path / "topics.json")
    assert TopicTable(path).topics == {} and not os.path.exists(path)     # reading writes nothing
    t = TopicTable(path)
    t.put(TopicConfig("a", 1, 1))
    t.put(TopicConfig("b", 1, 1))
    os.remove(path)                                 # e.g. killed between the two renames of a rewrite
    assert set(TopicTable(path).topics) == {"a"}


@pytest.mark.parametrize("content,why", [
    ([], "expected an object with a 'topics' object"),
    ({"topics": []}, "expected an object"),
    ({"data_version": 1}, "expected an object"),
    ({"topics": {"a": 5}}, "topic 'a' must be an object"),
    ({"topics": {"a": ["read_queues", 1]}}, "topic 'a' must be an object"),
    ({"topics": {"a": {"read_queues": 1, "write_queues": 1, "perm": 6, "order": False, "x": 1}}}, "unknown field"),
    ({"topics": {"a": {"read_queues": 0}}}, "read_queues"),
    ({"topics": {"a": {"perm": 99}}}, "perm"),
    ({"topics": {"a": {"order": "yes"}}}, "order"),
    ({"topics": {}, "data_version": "7"}, "data_version"),
    ({"topics": {}, "data_version": None}, "data_version"),
    ({"topics": {}, "data_version": -1}, "data_version"),
])
def test_parseable_but_bad_topics_files_are_validation_errors(tmp_path, content, why):
    path = str(tmp_path / "topics.json")
    with open(path, "w") as f:
        json.dump(content, f)
    with pytest.raises(ValidationError, match=why):
        TopicTable(path)


def test_the_key_names_the_topic_in_the_file(tmp_path):
    path = str(tmp_path / "topics.json")
    with open(path, "w") as f:
        json.dump({"topics": {"a": {"topic_name": "b", "read_queues": 2}}}, f)
    t = TopicTable(path)
    assert t.get("a") == TopicConfig("a", 2, 4) and t.get("b") is None


# -- consumer offsets -------------------------------------------------------------------------------------
def test_committing_the_same_offset_again_is_not_a_change(tmp_path):
    o = OffsetTable(str(tmp_path / "o.json"))
    o.commit("g", "t", 0, 7)
    assert o.dirty and o.persist() and not o.dirty
    o.commit("g", "t", 0, 7)
    assert not o.dirty
    o.commit("g", "t", 0, 3)                          # going back (a reset, a rebalance) is a change
    assert o.dirty and o.query("g", "t", 0) == 3


def test_offsets_file_has_the_rocketmq_shape(tmp_path):
    path = str(tmp_path / "config" / "consumerOffset.json")
    o = OffsetTable(path)
    o.commit("billing", "orders", 1, 98)
    o.commit("billing", "orders", 0, 120)
    o.commit("audit", "orders", 10, 0)
    assert o.persist()
    assert json.load(open(path)) == {"offset_table": {"orders@billing": {"0": 120, "1": 98},
                                                      "orders@audit": {"10": 0}}}


def test_a_torn_offsets_file_falls_back_to_the_backup_else_is_a_config_error(tmp_path):
    path = str(tmp_path / "consumerOffset.json")
    o = OffsetTable(path)
    o.commit("g", "t", 0, 1)
    o.persist()
    o.commit("g", "t", 0, 2)
    o.persist()                                       # file: 2, .bak: 1
    with open(path, "wb") as f:
        f.write(b'{"offset_table": {"t@g": {"0": ')
    assert OffsetTable(path).offsets == {("g", "t", 0): 1}
    os.remove(path + ".bak")
    with pytest.raises(ConfigError, match="cannot read"):
        OffsetTable(path)
    os.remove(path)
    assert OffsetTable(path).offsets == {}            # both gone: a new broker, nothing committed


@pytest.mark.parametrize("content", [
    [], "x", 5, None, {"offset_table": [1, 2]}, {"offset_table": "t@g"}, {"offset_table": None}, {},
])
def test_an_offsets_file_of_the_wrong_shape_loads_as_empty(tmp_path, content):
    path = str(tmp_path / "o.json")
    with open(path, "w") as f:
        json.dump(content, f)
    o = OffsetTable(path)
    assert o.offsets == {} and not o.dirty


def test_entries_commit_would_refuse_are_skipped_on_load(tmp_path):
    path = str(tmp_path / "o.json")
    with open(path, "w") as f:
        json.dump({"offset_table": {
            "t@g": {"0": True, "1": -5, "\u00b2": 3, "2": 7, "3": 1.5, "4": None, "-1": 4, "5": 0},
            "t@": {"0": 1}, "@g": {"0": 1}, "a@b@g": {"0": 9}}}, f)
    assert OffsetTable(path).offsets == {("g", "t", 2): 7, ("g", "t", 5): 0, ("g", "a@b", 0): 9}


def test_deleting_a_topic_removes_it_from_every_group_and_nothing_else(tmp_path):
    o = OffsetTable(str(tmp_path / "o.json"))
    for g in ("g1", "g2"):
        for t in ("a", "b"):
            o.commit(g, t, 0, 1)
    o.persist()
    o.delete_topic("missing")
    assert not o.dirty
    o.delete_topic("a")
    assert o.offsets == {("g1", "b", 0): 1, ("g2", "b", 0): 1} and o.dirty


def test_a_reset_is_a_change_that_persists(tmp_path):
    path = str(tmp_path / "o.json")
    o = OffsetTable(path)
    o.commit("g", "t", 0, 50)
    o.persist()
    o.reset("g", "t", {0: 5, 3: 9}, version=2)
    assert o.dirty and o.persist()
    assert OffsetTable(path).offsets == {("g", "t", 0): 5, ("g", "t", 3): 9}
    assert not o.accepts("g", 1) and o.accepts("g", 2)
    with pytest.raises(ValidationError):
        o.reset("g", "t", {-1: 0}, version=3)
    assert o.accepts("g", 2)                          # a refused reset does not move the version


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["g", "h", "x-y"]), st.sampled_from(["t", "u@v", "%RETRY%g"]),
                          st.integers(0, 3), st.integers(0, 2 ** 62)), max_size=40),
       st.sets(st.sampled_from(["t", "u@v", "%RETRY%g", "none"]), max_size=2))
def test_offsets_reload_as_the_last_commit_of_every_queue(tmp_path, commits, deleted):
    path = str(tmp_path / f"o-{uuid.uuid4().hex}.json")
    o = OffsetTable(path)
    model: dict = {}
    for g, t, q, off in commits:
        o.commit(g, t, q, off)
        model[(g, t, q)] = off
    for t in deleted:
        o.delete_topic(t)
        model = {k: v for k, v in model.items() if k[1] != t}
    o.persist(force=True)
    back = OffsetTable(path)
    assert back.offsets == model
    for (g, t, q), off in model.items():
        assert back.query(g, t, q) == off
    assert back.groups() == sorted({g for g, _, _ in model})


def test_a_slave_follows_its_master_but_keeps_what_was_committed_on_it_until_the_master_has_it(tmp_path):
    path = str(tmp_path / "config" / "consumerOffset.json")
    t = OffsetTable(path, slave=True)
    master = {"offset_table": {"orders@g": {"0": 100, "1": 50}}}
    assert t.follow_master(master) == 2 and t.query("g", "orders", 0) == 100
    t.commit("g", "orders", 0, 180)                 # the master is down: a consumer commits here
    assert t.slave_commits == {("g", "orders", 0): 180}
    t.persist()
    again = OffsetTable(path, slave=True)           # a restarted slave still knows what to carry back
    assert again.slave_commits == {("g", "orders", 0): 180}
    # The master (before it took the carried offsets) still says 100 for queue 0, and was reset to
    # 10 on queue 1: the reset is taken, the slave's own commit is not undone.
    assert again.follow_master({"offset_table": {"orders@g": {"0": 100, "1": 10}}}) == 1
    assert again.query("g", "orders", 0) == 180 and again.query("g", "orders", 1) == 10
    # Once the master has it (carried back, the larger won), the slave lets it go.
    again.follow_master({"offset_table": {"orders@g": {"0": 180, "1": 10}}})
    assert again.slave_commits == {} and again.query("g", "orders", 0) == 180
    again.persist(force=True)
    assert "slave_commits" not in json.load(open(path))


def test_a_master_takes_only_the_larger_of_a_slaves_offsets(tmp_path):
    t = OffsetTable(str(tmp_path / "consumerOffset.json"))
    t.commit("g", "orders", 0, 100)
    t.commit("g", "orders", 1, 100)
    assert t.merge_larger({"offset_table": {"orders@g": {"0": 90, "1": 120}, "bad": {"x": -1}}}) == 1
    assert (t.query("g", "orders", 0), t.query("g", "orders", 1)) == (100, 120)
    t.commit("g", "orders", 0, 101)
    assert t.slave_commits == {}                    # a master keeps none
