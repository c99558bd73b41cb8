"""A broker's topics: ``ROOT/brokers/NAME/config/topics.json`` (RocketMQ ``TopicConfigManager``).

File shape::

    {"data_version": 7, "topics": {"orders": {"read_queues": 4, "write_queues": 4, "perm": 6, "order": false}}}

Ownership: the broker's control loop is the only writer (atomic rewrite, ``.bak`` kept). The writer
process reloads the file when the state segment's ``topics_version`` changes, to refuse records for
topics or queues that do not exist. ``data_version`` goes up with every change; it is what the
broker sends the NameServers so they replace their queue data.

Writes: a table made with ``autosave=False`` (the broker's) only marks itself ``dirty`` on a change
and is written by :meth:`TopicTable.flush`, which the broker calls at most every 50 ms however many
topics changed (``topic_commits``; each rewrite is the whole file plus an fsync, so one per change
made a flood of new topics quadratic). A crash between a change and its flush loses only changes no
client has been answered for.
"""
from __future__ import annotations

import dataclasses
import os
import time

from ..errors import NoRouteError, ValidationError
from ..jsonfile import read_json, write_json
from ..protocol.route_data import PERM_READ, PERM_WRITE, TopicConfig

from ..semantics.system_topics import is_system_topic

class TopicTable:
    """The topics of one broker, loaded from (and, for the owner, saved to) ``topics.json``."""

    def __init__(self, path: str, autosave: bool = True) -> None:
        self.path = path
        self.autosave = autosave          # False: changes wait for flush()
        self.dirty = False
        self.topics: dict[str, TopicConfig] = {}
        self.data_version = 0
        self._registration: tuple[int, dict] | None = None
        self.load()

    def load(self) -> None:
        self._take(read_json(self.path, {"data_version": 0, "topics": {}}))

    def replace(self, data) -> bool:
        """A slave: take its master's table (``topics.json``'s shape) as is; True if it changed.
        ValidationError (nothing changed) for a table that does not parse."""
        before = (self.data_version, self.topics)
        self._take(data)
        if (self.data_version, self.topics) == before:
            return False
        self.save()
        return True

    def _take(self, data) -> None:
        if not isinstance(data, dict) or not isinstance(data.get("topics"), dict):
            raise ValidationError(f"{self.path}: expected an object with a 'topics' object")
        version = data.get("data_version", 0)
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise ValidationError(f"{self.path}: data_version must be an int >= 0, got {version!r}")
        topics = {}
        for name, cfg in data["topics"].items():
            if not isinstance(cfg, dict):
                raise ValidationError(f"{self.path}: topic {name!r} must be an object, got {cfg!r}")
            topics[name] = TopicConfig.from_dict({**cfg, "topic_name": name})     # the key names it
        self.topics = topics
        self.data_version = version
        self._registration = None

    def save(self) -> None:
        write_json(self.path, {"data_version": self.data_version,
                               "topics": {n: _body(t) for n, t in self.topics.items()}})   # keys sorted there
        self.dirty = False

    def flush(self) -> bool:
        """Write the file if a change since the last write is not in it; True if it wrote."""
        if not self.dirty:
            return False
        self.save()
        return True

    # -- reading ----------------------------------------------------------------------------------
    def get(self, topic: str) -> TopicConfig | None:
        return self.topics.get(topic)

    def writable_queues(self, topic: str) -> int:
        """How many queue ids accept writes (0 if the topic is missing or not writable)."""
        t = self.topics.get(topic)
        if t is None or not t.perm & PERM_WRITE:
            return 0
        return max(t.write_queues, t.read_queues)

    def registration(self) -> dict[str, dict]:
        """``{topic: {read_queues, write_queues, perm, order}}`` as sent to the NameServers.

        Built once per data version (a broker may have 100,000 topics and registers every 30 s);
        callers must not change it.
        """
        if self._registration is None or self._registration[0] != self.data_version:
            self._registration = (self.data_version, {n: _body(t) for n, t in self.topics.items()})
        return self._registration[1]

    # -- changes (the control loop only) ----------------------------------------------------------
    def put(self, config: TopicConfig) -> bool:
        """Create or update a topic; True if anything changed (then the file is rewritten)."""
        if self.topics.get(config.topic_name) == config:
            return False
        self.topics[config.topic_name] = config
        self._changed()
        return True

    def delete(self, topic: str) -> bool:
        if self.topics.pop(topic, None) is None:
            return False
        self._changed()
        return True

    def auto_create(self, topic: str, queues: int, enabled: bool) -> TopicConfig:
        """The topic, created with ``queues`` read and write queues if missing and ``enabled``."""
        t = self.topics.get(topic)
        if t is not None:
            return t
        if is_system_topic(topic):
            raise ValidationError(f"topic {topic!r} is a system topic; it cannot be created by a send")
        if not enabled:
            raise NoRouteError(f"topic {topic!r} does not exist and auto_create_topic is disabled")
        t = TopicConfig(topic, queues, queues, PERM_READ | PERM_WRITE, False)
        self.put(t)
        return t

    def _changed(self) -> None:
        # A time-based version never goes backwards across broker restarts (RocketMQ DataVersion).
        self.data_version = max(self.data_version + 1, time.time_ns() // 1000)
        self.dirty = True
        if self.autosave:
            self.save()


_BODY_FIELDS = tuple(f.name for f in dataclasses.fields(TopicConfig) if f.name != "topic_name")


def _body(t: TopicConfig) -> dict:
    # Plain attribute reads: dataclasses.asdict deep-copies and costs ~8 µs a topic (a broker may have
    # 100,000 and rebuilds this on every topic change).
    return {name: getattr(t, name) for name in _BODY_FIELDS}


def topics_path(config_dir: str) -> str:
    return os.path.join(config_dir, "topics.json")
