"""Which strings the index holds for a message, and their hashes (RocketMQ ``IndexService``).

Pure: the dispatcher's requests in, ``(key_hash, phys_offset, store_ts_ms)`` out. A message is
indexed under ``topic#uniq_key`` and ``topic#word`` for each space-separated word of its KEYS;
``key_hash = abs(String.hashCode)`` (0 when that overflows). Prepared and rolled-back transaction
messages are not indexed.
"""
from __future__ import annotations

import functools
from itertools import compress, repeat
from operator import itemgetter
from typing import Sequence

import numpy as np

from ..records import (KEY_SEPARATOR, SYSFLAG_TX_MASK, SYSFLAG_TX_PREPARED, SYSFLAG_TX_ROLLBACK,
                       java_string_hash, java_string_hash_many)
from .dispatch import DispatchRequest

INT32_MAX = (1 << 31) - 1

_SKIPPED_TX = frozenset((SYSFLAG_TX_PREPARED, SYSFLAG_TX_ROLLBACK))
_TOPIC, _PHYS, _TS, _KEYS, _UNIQ, _SYS_FLAG = (itemgetter(DispatchRequest._fields.index(f)) for f in (
    "topic", "phys_offset", "store_ts_ms", "keys", "uniq_key", "sys_flag"))


def index_key(topic: str, key: str) -> str:
    """The string stored for ``key`` of ``topic`` (RocketMQ ``IndexService.buildKey``)."""
    return f"{topic}#{key}"


def index_key_hash(key: str) -> int:
    """RocketMQ ``indexKeyHashMethod``: ``abs(hashCode)``, 0 when the abs overflows."""
    h = abs(java_string_hash(key))
    return 0 if h > INT32_MAX else h


@functools.lru_cache(maxsize=4096)
def prefix_hash(topic: str) -> int:
    """Java hash of ``topic + "#"`` as uint32 (cached): the start of every index key of a topic."""
    return java_string_hash(index_key(topic, "")) & 0xFFFFFFFF


_prefix_hash = prefix_hash


def _utf16_units(s: str) -> int:
    return len(s.encode("utf-16-le")) // 2


def index_key_hashes(topics: Sequence[str], keys: Sequence[str], owners: np.ndarray | None = None):
    """int32 array of ``index_key_hash(index_key(topics[owners[i]], keys[i]))`` (``owners`` None:
    ``topics[i]``), without building the strings: ``hash(p + k) = hash(p) * 31**len(k) + hash(k)``
    modulo 2**32, ``len`` in UTF-16 units."""
    if len(set(topics)) == 1:
        prefix = np.full(len(keys), _prefix_hash(topics[0]), dtype=np.uint32)
    else:
        prefix = np.fromiter(map(_prefix_hash, topics), dtype=np.uint32, count=len(topics))
        prefix = prefix if owners is None else prefix[owners]
    counter = len if all(map(str.isascii, keys)) else _utf16_units
    units = np.fromiter(map(counter, keys), dtype=np.uint32, count=len(keys))
    with np.errstate(over="ignore"):
        h = prefix * np.power(np.uint32(31), units) + java_string_hash_many(list(keys)).view(np.uint32)
    h = np.abs(h.view(np.int32))        # abs(-2**31) stays negative in int32: RocketMQ makes it 0
    h[h < 0] = 0
    return h


def collect_keys(reqs: Sequence[DispatchRequest], last_phys_offset: int, any_indexed: bool):
    """``(index strings, phys offsets, store times)`` of ``reqs``, one request at a time. Skipped:
    prepared and rolled-back transaction messages, and requests already indexed, i.e. below the last
    indexed phys offset (or equal to it, once anything was indexed)."""
    keys, phys_offsets, store_ts_ms = [], [], []
    for r in reqs:
        phys = r.phys_offset
        if phys < last_phys_offset or (phys == last_phys_offset and any_indexed):
            continue
        if (r.sys_flag & SYSFLAG_TX_MASK) in _SKIPPED_TX:
            continue
        n = len(keys)
        if r.uniq_key:
            keys.append(index_key(r.topic, r.uniq_key))
        keys.extend(index_key(r.topic, k) for k in r.keys.split(KEY_SEPARATOR) if k)
        if len(keys) > n:
            phys_offsets += [phys] * (len(keys) - n)
            store_ts_ms += [r.store_ts_ms] * (len(keys) - n)
            last_phys_offset, any_indexed = phys, True
    return keys, phys_offsets, store_ts_ms


def batch_keys(reqs: Sequence[DispatchRequest], last_phys_offset: int, any_indexed: bool):
    """:func:`collect_keys` by columns, hashed: ``(key_hashes, phys_offsets, store_ts_ms)`` arrays in
    entry order; None unless the phys offsets strictly increase (then one at a time is the rule)."""
    n = len(reqs)
    phys = np.fromiter(map(_PHYS, reqs), np.int64, n)
    if not (phys[1:] > phys[:-1]).all():
        return None
    keep = phys > last_phys_offset if any_indexed else phys >= last_phys_offset
    flags = list(map(_SYS_FLAG, reqs))
    if any(flags):
        tx = np.array(flags, dtype=np.int64) & SYSFLAG_TX_MASK
        keep &= (tx != SYSFLAG_TX_PREPARED) & (tx != SYSFLAG_TX_ROLLBACK)
    if not keep.all():
        kept = np.flatnonzero(keep)
        reqs, phys = list(map(reqs.__getitem__, kept.tolist())), phys[kept]
    words, owners = _words(reqs)
    hashes = index_key_hashes(list(map(_TOPIC, reqs)), words, owners)
    ts = np.fromiter(map(_TS, reqs), np.int64, len(reqs))
    if owners is None:
        return hashes, phys, ts
    order = np.argsort(owners, kind="stable")      # a request's unique id first, then its keys
    owners = owners[order]
    return hashes[order], phys[owners], ts[owners]


def _words(reqs: Sequence[DispatchRequest]) -> tuple[list[str], np.ndarray | None]:
    """Unique ids, then KEYS words, and the request of each (None: exactly one unique id each)."""
    words = list(map(_UNIQ, reqs))
    key_lists = list(map(_KEYS, reqs))
    if all(words) and not any(key_lists):
        return words, None
    n = len(reqs)
    per_request = np.fromiter(map(str.count, key_lists, repeat(KEY_SEPARATOR)), np.int64, n) + 1
    owners = np.concatenate([np.arange(n), np.repeat(np.arange(n), per_request)])
    words += KEY_SEPARATOR.join(key_lists).split(KEY_SEPARATOR)   # as many words as separators + 1
    present = np.fromiter(map(bool, words), dtype=bool, count=len(words))
    return list(compress(words, present.tolist())), owners[present]
