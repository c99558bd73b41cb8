"""Verification of a fault trial: what the workers logged against what the store holds.

Three parts:

* :func:`scan_commitlog` reads commitlog records straight from the files (``os.pread``, no map, no
  lock — the broker keeps running) between two physical offsets, checking every record with the one
  record codec (``records.decode_record``) and that its PHYSICALOFFSET is its position;
* :class:`Ledger` (pure, no I/O) is fed those records and the workers' log events and decides, per
  trial: lost (acknowledged, no copy under the real topic), duplicated (more copies than sends: one,
  or for a transaction one per COMMIT decision — the local one and each check-back answer),
  mismatched (the acknowledgement names another position / queue offset than the stored copy),
  unseen (no consumer received it), out of order (a consumer got an ordering key's messages out of
  order, or the store holds them out of order), phantom (a rolled-back transaction that was stored).
  After a failover (``failover``) the records the old master cut when it rejoined are read from its
  cut files (:func:`scan_cut_file`): an acknowledged message found only there is lost, unless its
  send was answered other than SEND_OK (a SYNC_MASTER stored it without a slave's copy, which a
  failover may drop) — those are counted apart, in the trial's details;
* :func:`check_reachable` looks each stored copy up the three ways a reader does: its consume-queue
  entry (``records.CQ_ENTRY`` read from the file), the index by its key (``IndexReader``) and its
  message id (``StoreReader.view``).

Message keys are ``(producer, seq)`` (``workload``), interned to ints (:meth:`Ledger.key`) so that a
run of a million messages keeps its sets small.
"""
from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from .. import records as R
from ..semantics.transaction import HALF_TOPIC
from ..errors import CorruptRecordError, HostMQError
from ..store.commitlog import SCHEDULE_TOPIC
from .workload import parse_body

REAL, SCHEDULE, HALF = "real", "schedule", "half"
MAX_DETAILS = 12                # failure descriptions kept per trial
# Where a verified trial found each acknowledged message (kept compactly for the end-of-run recheck).
EXPECTED = np.dtype([("key", "i8"), ("phys", "i8"), ("size", "i8"), ("queue_id", "i8"), ("queue_offset", "i8"),
                     ("store_ts_ms", "i8")])


@dataclass(frozen=True, slots=True)
class Stored:
    """One harness message found in the commitlog."""

    phys: int
    size: int
    kind: str                   # REAL, SCHEDULE or HALF
    queue_id: int
    queue_offset: int
    store_ts_ms: int
    msg_id: str
    trial: int
    producer: str
    mode: str
    seq: int
    okey: str
    oseq: int


def _record_kind(topic: str, real_topic: str) -> str | None:
    if topic == real_topic:
        return REAL
    if topic == SCHEDULE_TOPIC:
        return SCHEDULE
    if topic == HALF_TOPIC:
        return HALF
    return None


def scan_commitlog(commitlog_dir: str, file_bytes: int, start: int, end: int,
                   real_topic: str) -> tuple[list[Stored], list[str], int]:
    """Harness records in ``[start, end)``: ``(records, problems, position reached)``.

    A record that fails the codec, or whose PHYSICALOFFSET is not its position, is a problem (the
    scan continues at the next file: nothing after a bad record of a file can be trusted)."""
    out: list[Stored] = []
    problems: list[str] = []
    pos = start
    while pos < end:
        base = pos - pos % file_bytes
        stop = min(end, base + file_bytes)
        try:
            with open(os.path.join(commitlog_dir, f"{base:020d}"), "rb") as f:
                data = os.pread(f.fileno(), stop - pos, pos - base)
        except FileNotFoundError:
            problems.append(f"commitlog file {base:020d} missing below the end {end}")
            return out, problems, pos
        rel, nxt = 0, stop
        while rel < len(data):
            rec, size, why = _one_record(data, rel, pos + rel, real_topic)
            if why:
                problems.append(f"record at {pos + rel}: {why}")
            if size == 0:                       # the blank tail, or no structure to go on: next file
                nxt = base + file_bytes
                break
            if rec is not None:
                out.append(rec)
            rel += size
        pos = nxt
    return out, problems, max(start, min(pos, end))


def scan_cut_file(path: str, real_topic: str) -> tuple[list[Stored], list[str]]:
    """Harness records in a ``store/cut-FROM-TO.bin`` (``broker/truncation.py``): the whole records a
    rejoining slave cut from its commitlog, back to back (the blank ends of files left out, so each
    record's position is its own PHYSICALOFFSET). ``(records, problems)``."""
    with open(path, "rb") as f:
        data = f.read()
    out: list[Stored] = []
    problems: list[str] = []
    rel = 0
    while rel < len(data):
        rec, size, why = _one_record(data, rel, None, real_topic)
        if why:
            problems.append(f"{os.path.basename(path)}, record {rel} bytes in: {why}")
        if size == 0:
            break
        if rec is not None:
            out.append(rec)
        rel += size
    return out, problems


def _one_record(buf: bytes, rel: int, phys: int | None, real_topic: str) -> tuple[Stored | None, int, str]:
    """``(record or None, size, problem)``. Size 0: a blank record, or one whose structure is broken
    (nothing after it in the file can be found). A well-formed record with a wrong PHYSICALOFFSET is
    a problem but still counted: recovery keeps it (its CRC is fine) and readers reach it. ``phys``
    None: the record is not where it was stored (a cut file); its PHYSICALOFFSET is its position."""
    if len(buf) - rel >= R.SIZE_MAGIC.size and R.SIZE_MAGIC.unpack_from(buf, rel)[1] == R.BLANK_MAGIC_CODE:
        return None, 0, ""
    try:
        h, topic, body, props = R.decode_record(buf, rel, len(buf))
    except CorruptRecordError as e:
        return None, 0, e.why
    phys = h.phys_offset if phys is None else phys
    why = "" if h.phys_offset == phys else \
        f"PHYSICALOFFSET {h.phys_offset} is not its position (topic {topic}, queue {h.queue_id}, QUEUEOFFSET " \
        f"{h.queue_offset}): an append that never finished, kept"
    kind = _record_kind(topic, real_topic)
    parsed = parse_body(body) if kind else None
    if parsed is None:
        return None, h.total_size, why
    trial, producer, mode, seq, okey, oseq = parsed
    return Stored(phys, h.total_size, kind, h.queue_id, h.queue_offset, h.store_ts_ms,
                  R.encode_msg_id(h.store_host, phys), trial, producer, mode, seq, okey, oseq), h.total_size, why


# -- the ledger (pure) ------------------------------------------------------------------------------------
@dataclass
class TrialVerdict:
    """What verification found for one trial (counts of messages; ``details`` the first few, in words)."""

    trial: int
    acked: int = 0
    lost: int = 0
    duplicated: int = 0
    mismatched: int = 0
    unreachable: int = 0
    unseen: int = 0
    out_of_order: int = 0
    phantom: int = 0
    corrupt: int = 0
    details: list[str] = field(default_factory=list)

    COUNTS = ("lost", "duplicated", "mismatched", "unreachable", "unseen", "out_of_order", "phantom", "corrupt")

    def add(self, what: str, text: str, n: int = 1) -> None:
        setattr(self, what, getattr(self, what) + n)
        if len(self.details) < MAX_DETAILS:
            self.details.append(f"{what}: {text}")

    @property
    def failed(self) -> bool:
        return any(getattr(self, c) for c in self.COUNTS)


@dataclass
class _Book:
    """An open trial: its acknowledgements and what was found of them so far."""

    acks: dict = field(default_factory=dict)           # key → ack event
    real: dict = field(default_factory=dict)           # key → first Stored copy under the real topic
    aux: dict = field(default_factory=lambda: defaultdict(list))   # key → SCHEDULE / HALF copies
    received: set = field(default_factory=set)
    half_ids: dict = field(default_factory=dict)       # key → the half's msg id (txend)
    half_status: dict = field(default_factory=dict)    # key → the half's send status (txend)
    cut: dict = field(default_factory=dict)            # key → where a copy was cut ("cut-….bin at PHYS")
    rolled_back: set = field(default_factory=set)


class Ledger:
    """Everything a run has logged and stored, fed incrementally; decides each trial's verdict.

    ``open_trial(t)`` before the trial's events arrive; ``add_events`` / ``add_stored`` as they are
    read; ``missing(t)`` while waiting for stragglers (delay messages, check-backs, the consumer);
    ``verdict(t)`` closes it. Duplicates and order violations are found as records and receipts
    arrive and are charged to the next verdict.
    """

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self.copies: dict[str, dict[int, int]] = {REAL: {}, SCHEDULE: {}, HALF: {}}
        self.commits: dict[int, int] = defaultdict(int)     # tx key → COMMIT decisions
        self.books: dict[int, _Book] = {}
        self._order: dict[tuple[str, str], tuple[int, set]] = {}
        self._store_order: dict[str, int] = {}
        self.pending = TrialVerdict(-1)                      # findings not charged to a trial yet
        self.verified: list[np.ndarray] = []                 # EXPECTED rows of every closed trial
        self._names: dict[int, str] = {}

    def key(self, producer: str, seq: int) -> int:
        i = self._ids.setdefault(producer, len(self._ids))
        return (i << 32) | (seq & 0xFFFFFFFF)

    def open_trial(self, trial: int) -> None:
        self.books.setdefault(trial, _Book())

    # -- feeding ---------------------------------------------------------------------------------------
    def add_events(self, events: list[dict]) -> None:
        for ev in events:
            kind = ev.get("e")
            if kind == "recv":
                self._receipt(ev)
                continue
            if "p" not in ev or "s" not in ev:
                continue
            key = self.key(ev["p"], ev["s"])
            book = self.books.get(ev.get("t"))
            if kind in ("local", "check") and ev.get("a") == "COMMIT":
                self.commits[key] += 1
            if book is None:
                continue
            if kind == "ack":
                book.acks[key] = ev
            elif kind == "local" and ev.get("a") == "ROLLBACK":
                book.rolled_back.add(key)
            elif kind == "txend":
                book.half_ids[key] = ev.get("id")
                book.half_status[key] = ev.get("st", "SEND_OK")

    def _receipt(self, ev: dict) -> None:
        if ev.get("s", -1) < 0:
            return
        key = self.key(ev["p"], ev["s"])
        book = self.books.get(ev.get("t"))
        if book is not None:
            book.received.add(key)
        if not ev.get("k"):
            return
        top, seen = self._order.get((ev["c"], ev["k"]), (-1, set()))
        o = ev["o"]
        if o not in seen:
            if o < top:
                self.pending.add("out_of_order", f"consumer {ev['c']} got {ev['k']} #{o} after #{top} "
                                                 f"(trial {ev['t']}, queue {ev['q']} offset {ev['qo']})")
            seen.add(o)
            self._order[(ev["c"], ev["k"])] = (max(top, o), seen)

    def add_stored(self, records: list[Stored], problems: list[str] = ()) -> None:
        for p in problems:
            self.pending.add("corrupt", p)
        for r in records:
            key = self.key(r.producer, r.seq)
            n = self.copies[r.kind][key] = self.copies[r.kind].get(key, 0) + 1
            allowed = max(1, self.commits.get(key, 0)) if r.kind == REAL and r.mode == "tx" else 1
            if n > allowed:
                self.pending.add("duplicated", f"{r.kind} copy #{n} of {r.producer}.{r.seq} ({r.mode}, trial "
                                               f"{r.trial}) at {r.phys}, queue {r.queue_id} offset {r.queue_offset}")
            elif r.kind == REAL and r.okey:
                top = self._store_order.get(r.okey, -1)
                if r.oseq < top:
                    self.pending.add("out_of_order", f"stored {r.okey} #{r.oseq} after #{top} at {r.phys}")
                self._store_order[r.okey] = max(top, r.oseq)
            book = self.books.get(r.trial)
            if book is None:
                continue
            if r.kind == REAL:
                book.real.setdefault(key, r)
            else:
                book.aux[key].append(r)

    def add_cut(self, records: list[Stored], problems: list[str], where: str) -> None:
        """Records a rejoining slave cut from its commitlog (``scan_cut_file`` of ``where``): an
        acknowledged message that is only there is lost — unless its send was not answered SEND_OK
        (SLAVE_NOT_AVAILABLE, FLUSH_SLAVE_TIMEOUT: a SYNC_MASTER stored it without a slave's copy,
        so a failover may drop it), which :meth:`verdict` counts apart."""
        for p in problems:
            self.pending.add("corrupt", p)
        for r in records:
            book = self.books.get(r.trial)
            if book is not None:
                book.cut.setdefault(self.key(r.producer, r.seq), f"{where} at {r.phys}")

    # -- deciding --------------------------------------------------------------------------------------
    def missing(self, trial: int) -> tuple[int, int]:
        """``(acknowledged not stored yet, stored-and-acknowledged not received yet)`` of an open trial."""
        book = self.books[trial]
        not_stored = sum(1 for k, ack in book.acks.items() if k not in book.real and not _may_be_cut(book, k, ack))
        not_received = sum(1 for k in book.acks if k in book.real and k not in book.received)
        return not_stored, not_received

    def records(self, trial: int) -> list[Stored]:
        """The real-topic copies of the trial's acknowledged messages (for :func:`check_reachable`)."""
        book = self.books[trial]
        return [book.real[k] for k in book.acks if k in book.real]

    def verdict(self, trial: int, unreachable: list[str] = ()) -> TrialVerdict:
        book = self.books.pop(trial)
        v, self.pending = self.pending, TrialVerdict(-1)
        v.trial = trial
        for text in unreachable:
            v.add("unreachable", text)
        dropped = 0
        for key, ack in book.acks.items():
            v.acked += 1
            what = f"{ack['p']}.{ack['s']} ({ack['m']}, acked {ack.get('id')} queue {ack.get('q')} offset {ack.get('qo')})"
            rec = book.real.get(key)
            if rec is None:
                if _may_be_cut(book, key, ack):
                    dropped += 1
                else:
                    cut = book.cut.get(key)
                    v.add("lost", what + (f", {_status(book, key, ack)}: only in {cut}" if cut else ""))
                continue
            why = _mismatch(ack, rec, book, key)
            if why:
                v.add("mismatched", f"{what}: {why}")
            if key not in book.received:
                v.add("unseen", what)
        for key in book.rolled_back:
            if key in book.real and not self.commits.get(key):
                r = book.real[key]
                v.add("phantom", f"rolled-back {r.producer}.{r.seq} stored at {r.phys}")
        if dropped:
            v.details.insert(0, f"cut: {dropped} acknowledged but not SEND_OK (stored without a slave's copy) "
                                f"were only on the killed master, kept in its cut file")
        found = [(k, r.phys, r.size, r.queue_id, r.queue_offset, r.store_ts_ms)
                 for k, r in ((k, book.real.get(k)) for k in book.acks) if r is not None]
        self.verified.append(np.array(found, dtype=EXPECTED))
        return v

    def name(self, key: int) -> str:
        """``producer.seq`` of a key."""
        if len(self._names) != len(self._ids):
            self._names = {i: p for p, i in self._ids.items()}
        return f"{self._names[key >> 32]}.{key & 0xFFFFFFFF}"

    def allowed_copies(self, keys: np.ndarray) -> np.ndarray:
        """Real-topic copies each key may have: 1, or a transaction's COMMIT decisions."""
        return np.array([max(1, self.commits.get(int(k), 0)) for k in keys], dtype=np.int64)


def _status(book: _Book, key: int, ack: dict) -> str:
    """How the send was answered (a transaction: its half's send; unknown counts as SEND_OK)."""
    return book.half_status.get(key, "SEND_OK") if ack["m"] == "tx" else ack.get("st", "SEND_OK")


def _may_be_cut(book: _Book, key: int, ack: dict) -> bool:
    """A copy was cut (a failover) and the send was not answered SEND_OK: no slave had to hold it."""
    return key in book.cut and _status(book, key, ack) != "SEND_OK"


def _mismatch(ack: dict, rec: Stored, book: _Book, key: int) -> str:
    """Why the acknowledgement disagrees with the stored copy ('' if it does not)."""
    mode = ack["m"]
    if mode == "tx":
        half = book.half_ids.get(key)
        if half and half.upper() not in {r.msg_id.upper() for r in book.aux.get(key, ()) if r.kind == HALF}:
            return f"the half {half} is not in the commitlog"
        return ""
    if mode == "delay":
        if str(ack["id"]).upper() not in {r.msg_id.upper() for r in book.aux.get(key, ()) if r.kind == SCHEDULE}:
            return "no schedule-topic copy at the acknowledged id"
        return ""
    if str(ack["id"]).upper() != rec.msg_id.upper() or ack["q"] != rec.queue_id or ack["qo"] != rec.queue_offset:
        return f"stored as {rec.msg_id} queue {rec.queue_id} offset {rec.queue_offset}"
    return ""


# -- reachability (reads the store files) -------------------------------------------------------------------
INDEX_WINDOW_MS = 5000          # index entries keep store time in seconds: look a little around it


def check_reachable(store_dir: str, config, records: list[Stored], topic: str, limit_phys: int,
                    queues: bool = True) -> list[str]:
    """One line per way a stored copy cannot be reached: its consume-queue entry (unless ``queues`` is
    False), its key in the index, its message id. ``config`` is the store's ``StoreConfig`` (file
    sizes); ``limit_phys`` how far the broker says records are stored."""
    from ..store.index import IndexReader
    from ..store.readonly import StoreReader
    from .workload import message_key
    problems = check_queues(store_dir, config.consume_queue_file_entries, topic, records) if queues else []
    index = IndexReader(store_dir, config.index_slots, config.index_entries)
    try:
        for r in records:
            found = index.query(topic, message_key(r.producer, r.seq), 8, r.store_ts_ms - INDEX_WINDOW_MS,
                                r.store_ts_ms + INDEX_WINDOW_MS)
            if r.phys not in found:
                problems.append(f"{r.producer}.{r.seq} at {r.phys}: not found by key (index gave {found[:3]})")
    finally:
        index.close()
    reader = StoreReader(store_dir, config, limit_phys=limit_phys, scan_queues=False)
    try:
        for r in records:
            try:
                m = reader.view(r.msg_id)
                parsed = parse_body(m.body)
                ok = m.commitlog_offset == r.phys and parsed is not None and (parsed[1], parsed[3]) == (r.producer, r.seq)
            except HostMQError as e:
                ok, m = False, e
            if not ok:
                problems.append(f"{r.producer}.{r.seq} at {r.phys}: not found by id {r.msg_id} ({m})")
    finally:
        reader.close()
    return problems


def check_public(admin, records: list[Stored], topic: str) -> list[str]:
    """The same lookups through the public API (``Admin.view_message``, ``Admin.query_by_key``)."""
    from .workload import message_key
    out = []
    for r in records:
        what = f"{r.producer}.{r.seq} at {r.phys}"
        try:
            if admin.view_message(r.msg_id).commitlog_offset != r.phys:
                out.append(f"{what}: Admin.view_message({r.msg_id}) returned another message")
        except HostMQError as e:
            out.append(f"{what}: Admin.view_message({r.msg_id}): {e}")
        try:
            found = admin.query_by_key(topic, message_key(r.producer, r.seq), r.store_ts_ms - INDEX_WINDOW_MS,
                                       r.store_ts_ms + INDEX_WINDOW_MS)
            if r.phys not in [m.commitlog_offset for m in found]:
                out.append(f"{what}: Admin.query_by_key did not find it")
        except HostMQError as e:
            out.append(f"{what}: Admin.query_by_key: {e}")
    return out


def check_queues(store_dir: str, per_file: int, topic: str, records: list[Stored]) -> list[str]:
    """One line per record whose consume-queue entry does not point at it."""
    if not records:
        return []
    bad, found = queue_mismatches(store_dir, per_file, topic, np.array([r.queue_id for r in records]),
                                  np.array([r.queue_offset for r in records]), np.array([r.phys for r in records]),
                                  np.array([r.size for r in records]))
    out = []
    for i in np.flatnonzero(bad):
        r, (phys, size) = records[i], found[i]
        out.append(f"{r.producer}.{r.seq}: no consume-queue entry {r.queue_id}/{r.queue_offset}" if phys < 0 else
                   f"{r.producer}.{r.seq}: consume-queue entry {r.queue_id}/{r.queue_offset} points at {phys} "
                   f"({size} B), the record is at {r.phys}")
    return out


def queue_mismatches(store_dir: str, per_file: int, topic: str, queue_ids: np.ndarray, queue_offsets: np.ndarray,
                     phys: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised consume-queue lookup: ``(bad mask, (phys, size) found per row; -1 where no entry)``.
    Each consume-queue file is read once (``records.CQ_ENTRY``)."""
    found = np.full((len(phys), 2), -1, dtype=np.int64)
    first = queue_offsets - queue_offsets % per_file
    for qid in np.unique(queue_ids):
        for start in np.unique(first[queue_ids == qid]):
            rows = np.flatnonzero((queue_ids == qid) & (first == start))
            path = os.path.join(store_dir, "consumequeue", topic, str(int(qid)), f"{int(start) * R.CQ_ENTRY.itemsize:020d}")
            ents = np.fromfile(path, dtype=R.CQ_ENTRY) if os.path.exists(path) else np.zeros(0, R.CQ_ENTRY)
            i = queue_offsets[rows] - start
            have = i < len(ents)
            found[rows[have], 0] = ents["phys_offset"][i[have]]
            found[rows[have], 1] = ents["size"][i[have]]
    return (found[:, 0] != phys) | (found[:, 1] != sizes), found


def recheck(expected: np.ndarray, scanned_keys: np.ndarray, scanned_phys: np.ndarray, allowed, name) -> TrialVerdict:
    """The end-of-run check: every ``expected`` row (``EXPECTED``, where a trial found an acknowledged
    message) is still at its position in a new full scan (``scanned_*``: the real-topic records), and
    no key has more copies than ``allowed(keys)``. ``name(key)`` spells a key for the details."""
    v = TrialVerdict(0)
    v.acked = len(expected)
    order = np.argsort(scanned_phys, kind="stable")
    sp, sk = scanned_phys[order], scanned_keys[order]
    at = np.minimum(np.searchsorted(sp, expected["phys"]), max(len(sp) - 1, 0))
    ok = (sp[at] == expected["phys"]) & (sk[at] == expected["key"]) if len(sp) else np.zeros(len(expected), bool)
    for row in expected[~ok]:
        v.add("lost", f"{name(int(row['key']))} is no longer at {int(row['phys'])}")
    keys, counts = np.unique(scanned_keys, return_counts=True)
    over = counts > allowed(keys)
    for k, c in zip(keys[over], counts[over]):
        v.add("duplicated", f"{name(int(k))} is stored {int(c)} times")
    return v
