"""Consumer group offsets kept by a broker: ``config/consumerOffset.json`` (RocketMQ
``ConsumerOffsetManager``).

File shape (RocketMQ's ``offsetTable`` keyed ``topic@group``)::

    {"offset_table": {"orders@billing": {"0": 120, "1": 98}}, "slave_commits": {…same shape…}}

``slave_commits`` (a slave only): what consumers committed on this slave while its master was
down and the master has not caught up with yet — the replica carries them back to the master
when it reconnects (``broker/replica.py``), the larger offset winning there.

Ownership: the broker's control loop is the only writer; it rewrites the file (atomically, ``.bak``
kept) every ``offset_persist_interval_s`` when something changed, and at shutdown. A crash loses
at most that interval of commits: consumers then re-read a few messages (at-least-once).
"""
from __future__ import annotations

from ..errors import ValidationError
from ..jsonfile import read_json, write_json

OFFSETS_FILE = "consumerOffset.json"
TOPIC_GROUP_SEP = "@"
SLAVE_COMMITS = "slave_commits"


def parse_offset_table(data, section: str = "offset_table") -> dict[tuple[str, str, int], int]:
    """``{"offset_table": {"topic@group": {"qid": offset}}}`` → {(group, topic, qid): offset}; entries
    :meth:`OffsetTable.commit` would refuse are skipped (isdecimal, not isdigit: int("²") fails)."""
    table = data.get(section, {}) if isinstance(data, dict) else {}
    out = {}
    for key, queues in table.items() if isinstance(table, dict) else ():
        topic, sep, group = key.rpartition(TOPIC_GROUP_SEP)
        if not sep or not topic or not group or not isinstance(queues, dict):
            continue
        for qid, off in queues.items():
            if str(qid).isdecimal() and isinstance(off, int) and not isinstance(off, bool) and off >= 0:
                out[(group, topic, int(qid))] = off
    return out


def table_dict(offsets: dict[tuple[str, str, int], int]) -> dict[str, dict[str, int]]:
    """{(group, topic, qid): offset} → ``{"topic@group": {"qid": offset}}`` (the file's shape)."""
    table: dict[str, dict[str, int]] = {}
    for (g, t, q), o in sorted(offsets.items()):
        table.setdefault(f"{t}{TOPIC_GROUP_SEP}{g}", {})[str(q)] = o
    return table


class OffsetTable:
    def __init__(self, path: str, slave: bool = False) -> None:
        self.path = path
        self.slave = slave
        self.offsets: dict[tuple[str, str, int], int] = {}
        self.slave_commits: dict[tuple[str, str, int], int] = {}   # a slave: committed here, not yet on the master
        self.reset_versions: dict[str, int] = {}       # group → state word value of its last reset
        self.dirty = False
        data = read_json(path, {"offset_table": {}})
        self.offsets.update(parse_offset_table(data))
        if slave:
            self.slave_commits.update(parse_offset_table(data, SLAVE_COMMITS))

    def merge_larger(self, data) -> int:
        """Take offsets (``consumerOffset.json``'s shape) where they are ahead of this table's: a
        master taking what consumers committed on its slave while it was down. Returns how many
        offsets moved."""
        moved = 0
        for key, off in parse_offset_table(data).items():
            if off > self.offsets.get(key, -1):
                self.offsets[key] = off
                moved += 1
        self.dirty |= moved > 0
        return moved

    def follow_master(self, data) -> int:
        """A slave: take its master's offsets as they are (a reset there moves them back too),
        except those consumers committed here while the master was down and the master has not
        reached yet (the larger wins until it has). Returns how many offsets changed."""
        moved = 0
        for key, off in parse_offset_table(data).items():
            mine = self.slave_commits.get(key)
            if mine is not None:
                if off < mine:
                    continue
                del self.slave_commits[key]
            if self.offsets.get(key) != off:
                self.offsets[key] = off
                moved += 1
        self.dirty |= moved > 0
        return moved

    def reset(self, group: str, topic: str, offsets: dict[int, int], version: int) -> None:
        """Backtracking: set the group's offsets of ``topic`` and refuse, from now on, commits of
        that group from clients that have not seen reset ``version`` yet (they still hold the old
        positions and would undo the reset)."""
        for queue_id, offset in offsets.items():
            self.commit(group, topic, queue_id, offset)
        self.reset_versions[group] = version

    def accepts(self, group: str, seen_reset_version: int | None) -> bool:
        """Whether a commit from a client that has seen ``seen_reset_version`` may apply (None: a
        client that does not say; accepted)."""
        return seen_reset_version is None or seen_reset_version >= self.reset_versions.get(group, 0)

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        for name, v in (("group", group), ("topic", topic)):
            if not isinstance(v, str) or not v or TOPIC_GROUP_SEP in v and name == "group":
                raise ValidationError(f"{name} must be a non-empty string without '@', got {v!r}")
        if not isinstance(queue_id, int) or isinstance(queue_id, bool) or queue_id < 0:
            raise ValidationError(f"queue_id must be an int ≥ 0, got {queue_id!r}")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ValidationError(f"offset must be an int ≥ 0, got {offset!r}")
        key = (group, topic, queue_id)
        if self.offsets.get(key) != offset:
            self.offsets[key] = offset
            self.dirty = True
            if self.slave:
                self.slave_commits[key] = offset

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        return self.offsets.get((group, topic, queue_id))

    def group_offsets(self, group: str) -> dict[tuple[str, int], int]:
        return {(t, q): o for (g, t, q), o in self.offsets.items() if g == group}

    def groups(self) -> list[str]:
        return sorted({g for g, _, _ in self.offsets})

    def delete_topic(self, topic: str) -> None:
        for key in [k for k in self.offsets if k[1] == topic]:
            del self.offsets[key]
            self.slave_commits.pop(key, None)
            self.dirty = True

    def persist(self, force: bool = False) -> bool:
        """Rewrite the file if anything changed (or ``force``); True if written."""
        if not (self.dirty or force):
            return False
        data = {"offset_table": table_dict(self.offsets)}
        if self.slave_commits:
            data[SLAVE_COMMITS] = table_dict(self.slave_commits)
        write_json(self.path, data)
        self.dirty = False
        return True
