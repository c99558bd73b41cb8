"""Group commit of topic changes (issue 27): topics.json is written at most once per interval, and a
request that changed topics is answered only after the write."""
from __future__ import annotations

import json
import os

import pytest

from hostmq.broker.topic_commits import TopicCommits
from hostmq.broker.topics import TopicTable
from hostmq.protocol.route_data import TopicConfig
from hostmq.transport import DEFER, Reply
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(60)


class Replies:
    """Stands in for the control socket: what was answered to which token, plus the hooks."""

    def __init__(self) -> None:
        self.sent: list[tuple[object, Reply]] = []
        self.hooks, self.timers = [], []

    def reply(self, token, reply) -> None:
        self.sent.append((token, reply))

    def add_batch_hook(self, fn) -> None:
        self.hooks.append(fn)

    def add_timer(self, interval_s, fn) -> None:
        self.timers.append(fn)


def on_disk(path: str) -> set[str]:
    with open(path) as f:
        return set(json.load(f)["topics"])


def test_a_flood_of_changes_is_one_write_per_interval_and_each_waits_for_it(tmp_path):
    path = str(tmp_path / "topics.json")
    table = TopicTable(path, autosave=False)
    published = []
    commits = TopicCommits(table, lambda: published.append(set(table.topics)), interval_s=0.2)
    server = Replies()
    commits.attach(server)
    answers = []
    for i in range(500):
        since = commits.changes
        table.put(TopicConfig(f"t{i}", 1, 1))
        commits.changed()
        answers.append(commits.reply_when_committed(f"token{i}", Reply(fields={"i": i}), since))
        commits.commit()                              # the batch hook after every request
    # Every request waited for a write; the first change was written by the hook of its own batch,
    # the rest wait for the interval.
    assert all(a is DEFER for a in answers)
    assert commits.writes == 1 and on_disk(path) == {"t0"}
    assert [t for t, _ in server.sent] == ["token0"]
    wait_until(lambda: commits.commit() or commits.writes == 2, 5, "the interval to pass")
    assert on_disk(path) == {f"t{i}" for i in range(500)} and len(published) == 2
    assert [t for t, _ in server.sent] == [f"token{i}" for i in range(500)]


def test_a_request_that_changed_nothing_is_answered_at_once(tmp_path):
    table = TopicTable(str(tmp_path / "topics.json"), autosave=False)
    commits = TopicCommits(table, lambda: None, interval_s=10.0)
    commits.attach(Replies())
    since = commits.changes
    assert commits.reply_when_committed("t", Reply(), since) == Reply()
    table.put(TopicConfig("a", 1, 1))
    commits.changed()
    commits.commit()                                   # written at once: no write in the last 10 s
    since = commits.changes
    assert commits.reply_when_committed("t", Reply(), since) == Reply()      # a later request, no change


def test_a_failed_write_answers_the_waiting_with_the_error_and_tries_again(tmp_path):
    path = str(tmp_path / "topics.json")
    table = TopicTable(path, autosave=False)
    commits = TopicCommits(table, lambda: None, interval_s=0.0)
    server = Replies()
    commits.attach(server)
    table.put(TopicConfig("a", 1, 1))
    since = commits.changes
    commits.changed()
    assert commits.reply_when_committed("t", Reply(), since) is DEFER
    os.mkdir(path + ".tmp")                            # where the new file is written first
    commits.commit()
    assert [t for t, _ in server.sent] == ["t"] and server.sent[0][1].code != 0
    assert "could not write its topics" in server.sent[0][1].remark and commits.dirty
    os.rmdir(path + ".tmp")
    commits.commit()
    assert not commits.dirty and on_disk(path) == {"a"}
