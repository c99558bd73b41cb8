"""``store/consumequeues.json``: which consume queues exist and how far each was flushed (issue 15).

Consume queues are derived from the commitlog, and a queue's files can go missing or lose entries
where nothing else would tell: a topic's whole directory deleted, a file's tail zeroed. The manifest
is what recovery compares the queues on disk with::

    {"version": 1, "queues": [[topic, queue_id, max_offset, end_phys_offset], …]}

``max_offset`` is the queue's entry count and ``end_phys_offset`` the commitlog offset just past the
record of its last entry, both as of the last consume-queue flush: every entry below ``max_offset`` was
on disk then. A queue on disk with fewer entries (while the commitlog still reaches
``end_phys_offset``), or missing altogether, lost entries and is rebuilt by re-dispatch.

Ownership: written only by the one writer of consume queues (the dispatcher, or the embedded store),
after flushing them, atomically and durably (``jsonfile.write_json``: temp file, fsync, rename, fsync of
the directory; the previous version stays as ``.bak``). An older version only under-states what
exists, so reading the ``.bak`` is always sound; a missing or unreadable manifest means "unknown",
and abnormal recovery then re-dispatches everything.
"""
from __future__ import annotations

import logging
import os

from ..errors import HostMQError
from ..jsonfile import read_json, write_json
from ..records import stored_topic

MANIFEST_FILE = "consumequeues.json"
VERSION = 1
log = logging.getLogger(__name__)

# (topic, queue_id) -> (max_offset, end_phys_offset)
Manifest = dict[tuple[str, int], tuple[int, int]]


def manifest_path(store_dir: str) -> str:
    return os.path.join(store_dir, MANIFEST_FILE)


def write_manifest(store_dir: str, queues: Manifest) -> None:
    rows = [[t, q, m, e] for (t, q), (m, e) in sorted(queues.items())]
    write_json(manifest_path(store_dir), {"version": VERSION, "queues": rows})


def read_manifest(store_dir: str) -> Manifest | None:
    """The manifest, or None if there is none or it cannot be read (every row is checked)."""
    try:
        data = read_json(manifest_path(store_dir))
    except HostMQError as e:
        log.warning("consume-queue manifest unreadable, treated as missing: %s", e)
        return None
    if data is None:
        return None
    return parse_manifest(data)


def parse_manifest(data) -> Manifest | None:
    """The manifest in decoded JSON, or None if anything in it is not what ``write_manifest`` writes."""
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("queues"), list):
        return None
    out: Manifest = {}
    for row in data["queues"]:
        if not (isinstance(row, list) and len(row) == 4 and isinstance(row[0], str)
                and all(type(v) is int and v >= 0 for v in row[1:])
                and stored_topic(row[0].encode("utf-8", "replace")) == row[0]):
            return None
        out[(row[0], row[1])] = (row[2], row[3])
    return out


def lost_entries(manifest: Manifest, key: tuple[str, int], max_offset: int, commitlog_end: int) -> bool:
    """Whether the queue ``key`` (``max_offset`` entries now, or -1 if it is missing) holds fewer
    entries than the manifest says were flushed, while the commitlog still holds their records."""
    known = manifest.get(key)
    return known is not None and known[0] > max(max_offset, 0) and known[1] <= commitlog_end
