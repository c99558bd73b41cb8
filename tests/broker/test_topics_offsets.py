"""A broker's topic table (topics.json) and consumer offsets (consumerOffset.json), on real files."""
from __future__ import annotations

import json
import os

import pytest

from hostmq.broker.offsets import OffsetTable
from hostmq.broker.topics import TopicTable, is_system_topic
from hostmq.errors import ConfigError, NoRouteError, ValidationError
from hostmq.namesrv.route_data import PERM_READ, PERM_WRITE, TopicConfig

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
