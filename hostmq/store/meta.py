"""``store.json``: the file sizes a store was created with, so another configuration never misreads it.

A commitlog file's name is the offset of its first byte and every file has ``commitlog_file_bytes``;
consume-queue files hold ``consume_queue_file_entries`` entries; index files ``index_slots`` slots and
``index_entries`` entries. Reading files of one size with another would make recovery delete the
"wrong-size" files or find nothing in them, so the sizes are recorded when the store is created
(``store.json``, written atomically by the one process that holds the store lock) and from then on
*the store's* sizes are used whatever the configuration says; a configuration that differs is logged
and ignored. A store made before this file existed has its sizes inferred from its files once.

Format: ``{"version": 1, "commitlog_file_bytes": …, "consume_queue_file_entries": …,
"index_slots": …, "index_entries": …}``.
"""
from __future__ import annotations

import dataclasses
import logging
import os

from ..config import StoreConfig
from ..errors import ConfigError
from ..jsonfile import read_json, write_json

log = logging.getLogger(__name__)

META_FILE = "store.json"
VERSION = 1
SIZE_KEYS = ("commitlog_file_bytes", "consume_queue_file_entries", "index_slots", "index_entries")
CQ_ENTRY_BYTES = 20


def read_sizes(path: str) -> dict[str, int] | None:
    """The sizes recorded in ``path/store.json`` (ConfigError if the file is not ours), or None."""
    meta = read_json(os.path.join(path, META_FILE))
    if meta is None:
        return None
    if not isinstance(meta, dict) or meta.get("version") != VERSION:
        raise ConfigError(f"{os.path.join(path, META_FILE)} is not a store description of version {VERSION}")
    out = {}
    for k in SIZE_KEYS:
        v = meta.get(k)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ConfigError(f"{os.path.join(path, META_FILE)}: {k} must be a positive integer, got {v!r}")
        out[k] = v
    return out


def infer_sizes(path: str) -> dict[str, int]:
    """File sizes of an existing store without ``store.json``, from its files (commitlog and consume
    queues are all of one size; index files cannot say how they split slots and entries)."""
    over = {}
    cl = os.path.join(path, "commitlog")
    names = sorted(n for n in os.listdir(cl) if len(n) == 20 and n.isdecimal()) if os.path.isdir(cl) else []
    sizes = {n: os.path.getsize(os.path.join(cl, n)) for n in names}
    if len(set(sizes.values())) > 1:
        raise ConfigError(f"the commitlog files in {cl} have different sizes ({sorted(set(sizes.values()))}); "
                          f"cannot tell which size the store was written with — nothing was changed")
    if sizes and next(iter(sizes.values())) > 0:
        over["commitlog_file_bytes"] = next(iter(sizes.values()))
    cq_root = os.path.join(path, "consumequeue")
    for d, _, files in os.walk(cq_root) if os.path.isdir(cq_root) else ():
        sized = [f for f in files if len(f) == 20 and f.isdecimal()]
        if sized:
            size = os.path.getsize(os.path.join(d, sized[0]))
            if size and size % CQ_ENTRY_BYTES == 0:
                over["consume_queue_file_entries"] = size // CQ_ENTRY_BYTES
                break
    return over


def effective_config(path: str, cfg: StoreConfig, *, record: bool = True) -> StoreConfig:
    """``cfg`` with the store's own file sizes; ``record``: write ``store.json`` if it is missing (the
    caller holds the store lock)."""
    recorded = read_sizes(path)
    if recorded is None:
        recorded = {k: getattr(cfg, k) for k in SIZE_KEYS}
        recorded.update(infer_sizes(path))
        if record:
            write_json(os.path.join(path, META_FILE), {"version": VERSION, **recorded})
    differ = {k: (getattr(cfg, k), v) for k, v in recorded.items() if getattr(cfg, k) != v}
    if differ:
        log.warning("store %s was created with %s; the configured %s are ignored (file sizes of an "
                    "existing store never change)", path, ", ".join(f"{k}={v}" for k, (_, v) in differ.items()),
                    ", ".join(f"{k}={c}" for k, (c, _) in differ.items()))
        return dataclasses.replace(cfg, **recorded)
    return cfg
