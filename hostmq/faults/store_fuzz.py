"""Store fuzz: damage one store file, recover, and check what recovery promises (issue 15).

Pristine stores with known messages are built once (tiny file sizes, so commitlog, consume-queue and
index files roll): one closed cleanly, one copied while open as a killed process leaves it (flushed
half-way only). Each case copies one of them, damages ONE file of one kind — a bit flip, a
truncation, or a zeroed range — creates ``abort`` (the last run "died"), reopens it (abnormal
recovery) and checks:

* no crash: opening, reading and closing raise nothing but HostMQError, and opening raises nothing;
* every record that lies wholly before the first damaged byte of the commitlog (all of them when
  another kind of file was damaged) is read back whole through its queue at its queue offset, and
  by its message id;
* no file appears outside the case's store directory.

The kinds: ``commitlog``, ``consumequeue``, ``index``, ``checkpoint`` and ``manifest``
(``consumequeues.json``, the one JSON file a MessageStore writes). The first damaged byte of a commitlog
file is where its content, padded with zeros to the file size (what a missing end reads as),
first differs from the pristine one. A case is replayed from ``(seed, case)`` alone.
"""
from __future__ import annotations

import os
import random
import shutil
import time
from dataclasses import dataclass

from .. import records as R
from ..errors import CorruptRecordError, HostMQError
from ..message import Message
from ..store.cq_manifest import MANIFEST_FILE
from ..store.message_store import MessageStore
from ..store.reader import GetStatus
from . import FuzzResult

KINDS = ("commitlog", "consumequeue", "index", "checkpoint", "manifest")
OPS = ("flip", "truncate", "zero")
CONFIG = {"commitlog_file_bytes": 16 * 1024, "consume_queue_file_entries": 16, "index_slots": 17,
          "index_entries": 64, "check_crc_on_recover": True}
TOPICS = ("F0", "F1", "F2")
QUEUES = 2
NO_DAMAGE = 1 << 62           # "first damaged commitlog byte" when the commitlog was not touched


@dataclass(frozen=True)
class Stored:
    """A record of the pristine store, as parsed from its commitlog files (independently of it)."""

    phys: int
    total: int
    topic: str
    queue_id: int
    queue_offset: int
    body: bytes
    msg_id: str


@dataclass(frozen=True)
class Damage:
    kind: str
    path: str           # relative to the store directory
    op: str
    start: int          # byte offset in the file (flip: the byte; truncate: the new size)
    length: int = 0     # zero: bytes zeroed
    bit: int = 0        # flip: which bit

    def __str__(self) -> str:
        what = {"flip": f"bit {self.bit} of byte {self.start}", "truncate": f"to {self.start} bytes",
                "zero": f"{self.length} bytes from {self.start}"}[self.op]
        return f"{self.op} {self.path}: {what}"


# -- the pristine store ---------------------------------------------------------------------------------
def build_pristine(path: str, seed: int, killed: bool = False) -> list[Stored]:
    """Make a store at ``path`` and return its records in commitlog order: closed cleanly, or (with
    ``killed``) as a process killed after dispatching everything leaves it, flushed half-way only."""
    rng = random.Random(seed)
    with MessageStore(path + ".building" if killed else path, CONFIG) as store:
        n = 0
        for rnd in range(60):
            if rnd == 30:
                store.flush()
            topic, qid = rng.choice(TOPICS), rng.randrange(QUEUES)
            k = rng.choice((1, 1, 1, 3, 7))
            msgs = [Message(topic, b"%s|%d|%05d|" % (topic.encode(), qid, n + j) + b"x" * rng.randrange(1, 400),
                            tags=f"t{j % 3}", keys=[f"k{n + j}"]) for j in range(k)]
            n += k
            if k == 1:
                store.put(msgs[0], queue_id=qid)
            else:
                store.put_batch(msgs, queue_id=qid)
        store.dispatch()
        if killed:          # the page cache holds every write: a copy is what a kill -9 leaves
            shutil.copytree(store.path, path, ignore=shutil.ignore_patterns("lock"))
    if killed:
        shutil.rmtree(path + ".building")
    return parse_commitlog(path)


def parse_commitlog(path: str) -> list[Stored]:
    """Every message record of the store's commitlog files, in order, with ``records`` only."""
    out = []
    d = os.path.join(path, "commitlog")
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            buf = f.read()
        pos = 0
        while pos < len(buf):
            try:
                kind, total = R.check_stored_record(buf, pos, len(buf), int(name) + pos)
            except CorruptRecordError:
                break
            if kind == R.RecordKind.BLANK:
                break
            h, topic, body, _ = R.decode_record(buf, pos)
            out.append(Stored(int(name) + pos, total, topic, h.queue_id, h.queue_offset, body,
                              R.encode_msg_id(h.store_host, int(name) + pos)))
            pos += total
    return out


def files_of(path: str, kind: str) -> list[str]:
    """Files of one kind in a store, relative to it, sorted."""
    if kind == "commitlog":
        return [os.path.join("commitlog", n) for n in sorted(os.listdir(os.path.join(path, "commitlog")))]
    if kind == "index":
        d = os.path.join(path, "index")
        return [os.path.join("index", n) for n in sorted(os.listdir(d))] if os.path.isdir(d) else []
    if kind == "consumequeue":
        root = os.path.join(path, "consumequeue")
        return sorted(os.path.relpath(os.path.join(dp, f), path) for dp, _, fs in os.walk(root) for f in fs)
    name = "checkpoint" if kind == "checkpoint" else MANIFEST_FILE
    return [name] if os.path.exists(os.path.join(path, name)) else []


# -- one case -------------------------------------------------------------------------------------------
def choose_damage(rng: random.Random, pristine: str, kind: str) -> Damage | None:
    files = files_of(pristine, kind)
    if not files:
        return None
    rel = rng.choice(files)
    size = os.path.getsize(os.path.join(pristine, rel))
    op = rng.choice(OPS)
    if op == "truncate":
        return Damage(kind, rel, op, rng.randrange(0, max(size, 1)))
    start = rng.randrange(0, max(size, 1))
    if op == "flip":
        return Damage(kind, rel, op, start, bit=rng.randrange(8))
    return Damage(kind, rel, op, start, length=rng.randrange(1, max(size - start, 1) + 1))


def apply_damage(store_dir: str, damage: Damage) -> int:
    """Damage the file; returns the first damaged commitlog offset (NO_DAMAGE for other kinds)."""
    path = os.path.join(store_dir, damage.path)
    with open(path, "r+b") as f:
        before = f.read()
        if damage.op == "flip" and damage.start < len(before):
            f.seek(damage.start)
            f.write(bytes([before[damage.start] ^ (1 << damage.bit)]))
        elif damage.op == "truncate":
            f.truncate(damage.start)
        elif damage.op == "zero":
            end = min(damage.start + damage.length, len(before))
            f.seek(damage.start)
            f.write(bytes(max(end - damage.start, 0)))
        f.seek(0)
        after = f.read()
    if damage.kind != "commitlog":
        return NO_DAMAGE
    after = after.ljust(len(before), b"\0")
    first = next((i for i, (a, b) in enumerate(zip(before, after)) if a != b), None)
    return NO_DAMAGE if first is None else int(os.path.basename(damage.path)) + first


def check_recovery(store_dir: str, truth: list[Stored], first_bad: int, config: dict = CONFIG) -> list[str]:
    """Open (abnormal recovery) and check the promises; one line per broken promise."""
    with open(os.path.join(store_dir, "abort"), "wb"):
        pass
    try:
        store = MessageStore(store_dir, config)
    except Exception as e:      # noqa: BLE001 - any exception at open is a failure; say which
        return [f"open {'refused' if isinstance(e, HostMQError) else 'crashed'}: {type(e).__name__}: {e}"]
    problems: list[str] = []
    try:
        keep = [r for r in truth if r.phys + r.total <= first_bad]
        problems += _check_queues(store, keep)
        for r in keep:
            try:
                m = store.view(r.msg_id)
                ok = m.body == r.body and m.queue_offset == r.queue_offset
            except HostMQError as e:
                ok, m = False, e
            if not ok:
                problems.append(f"record at {r.phys} not readable by id: {m}")
                break
    except Exception as e:      # noqa: BLE001 - a crash while reading is a failure
        problems.append(f"reading crashed: {type(e).__name__}: {e}")
    finally:
        try:
            store.close()
        except Exception as e:  # noqa: BLE001
            problems.append(f"close crashed: {type(e).__name__}: {e}")
    return problems


def _check_queues(store: MessageStore, keep: list[Stored]) -> list[str]:
    want: dict[tuple[str, int], dict[int, Stored]] = {}
    for r in keep:
        want.setdefault((r.topic, r.queue_id), {})[r.queue_offset] = r
    for (topic, qid), records in want.items():
        got: dict[int, tuple[int, bytes]] = {}
        off = 0
        while off <= max(records):
            try:
                g = store.get(topic, qid, off, max_count=64)
            except HostMQError as e:
                return [f"queue {topic}/{qid} at {off}: {e}"]
            if g.status != GetStatus.FOUND or g.next_offset <= off:
                break
            got.update((off + i, (m.commitlog_offset, m.body, m.queue_offset)) for i, m in enumerate(g.messages))
            off = g.next_offset
        for qoff, r in records.items():
            if got.get(qoff) != (r.phys, r.body, qoff):
                return [f"record at {r.phys} not readable as {topic}/{qid} offset {qoff} (got "
                        f"{got.get(qoff, (None,))[0]}; queue has {store.max_offset(topic, qid)} entries)"]
    return []


# -- the fuzzer -----------------------------------------------------------------------------------------
def run_case(workdir: str, pristine: str, truth: list[Stored], seed: int, case: int) -> tuple[str, list[str]]:
    """One case, replayable from ``(seed, case)``: its kind and its broken promises."""
    rng = random.Random(seed * 1_000_003 + case)
    kind = KINDS[case % len(KINDS)]
    damage = choose_damage(rng, pristine, kind)
    if damage is None:
        return kind, []
    store_dir = os.path.join(workdir, "case", "store")
    shutil.rmtree(os.path.dirname(store_dir), ignore_errors=True)
    shutil.copytree(pristine, store_dir)
    before = _outside(workdir)
    first_bad = apply_damage(store_dir, damage)
    problems = check_recovery(store_dir, truth, first_bad)
    if _outside(workdir) != before:
        problems.append(f"files appeared outside the store: {sorted(_outside(workdir) ^ before)}")
    return kind, [f"seed {seed} case {case} ({damage}): {p}" for p in problems]


def _outside(workdir: str) -> set[str]:
    parent = os.path.dirname(os.path.abspath(workdir))
    return {os.path.join(parent, n) for n in os.listdir(parent)} | \
        {os.path.join(workdir, n) for n in os.listdir(workdir)} | \
        {os.path.join(workdir, "case", n) for n in os.listdir(os.path.join(workdir, "case"))}


def run(workdir: str, cases: int, seed: int) -> list[FuzzResult]:
    """``cases`` cases spread evenly over the kinds, alternating the closed and the killed pristine
    store; one FuzzResult per kind."""
    os.makedirs(workdir, exist_ok=True)
    pristines = []
    for name in ("pristine", "pristine-killed"):
        path = os.path.join(workdir, name)
        shutil.rmtree(path, ignore_errors=True)
        pristines.append((path, build_pristine(path, seed, killed=name != "pristine")))
    results = {k: FuzzResult(f"store:{k}", 0) for k in KINDS}
    for case in range(cases):
        t0 = time.monotonic()
        pristine, truth = pristines[case // len(KINDS) % 2]
        kind, failures = run_case(workdir, pristine, truth, seed, case)
        r = results[kind]
        r.cases += 1
        r.failures += failures
        r.seconds += time.monotonic() - t0
    shutil.rmtree(os.path.join(workdir, "case"), ignore_errors=True)
    return list(results.values())
