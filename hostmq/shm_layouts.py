"""Shared-memory layouts (hostmq.shm, the broker state segment, consumers' wake-up words), pure.

Part of hostmq/records.py's declarations — re-exported there and used as ``records.NAME`` — kept in
their own module only to keep each file readable. Every layout is declared once, here.
"""
from __future__ import annotations

import struct
import zlib

import numpy as np

# ---------------------------------------------------------------------------------------------
# Shared-memory layouts (hostmq.shm): segment header, ingress ring header, frame, completion
# ---------------------------------------------------------------------------------------------
# These layouts never leave the host, so unlike the store formats above they use the machine's
# NATIVE byte order: cursors and flags are published with aligned native int64 stores
# (``memoryview.cast("q")``, docs/internals.md fact 14), and every other field must agree with them.
#
# Segment header — the first 128 bytes of every hostmq shared-memory segment; the payload starts
# at SEGMENT_PAYLOAD_OFFSET (one page, so rings inside are page aligned)::
#
#     +0   magic "HOSTMQSG" (8, stored last)  | +8  layout_version u32   | +12 header_bytes u32 (4096)
#     +16  kind (16, ASCII, NUL padded: "ingress", …)
#     +32  owner_pid i64                      | +40 owner_start_ticks i64 (/proc/PID/stat field 22:
#                                                  clock ticks after boot, immune to wall-clock steps)
#     +48  boot_id (16, raw UUID of /proc/sys/kernel/random/boot_id)
#     +64  generation u64 (random per creation) | +72 size_bytes u64 (whole segment)
#     +80  created_ms i64 (wall clock)        | +88 reserved (40, zero)
#     +128 … +4096 unused                     | +4096 payload (size given to Segment.create)
SEGMENT_MAGIC = b"HOSTMQSG"
SEGMENT_HEADER = np.dtype([
    ("magic", "S8"), ("layout_version", "u4"), ("header_bytes", "u4"), ("kind", "S16"),
    ("owner_pid", "i8"), ("owner_start_ticks", "i8"), ("boot_id", "S16"), ("generation", "u8"),
    ("size_bytes", "u8"), ("created_ms", "i8"), ("reserved", "S40"),
])
assert SEGMENT_HEADER.itemsize == 128
assert SEGMENT_HEADER.fields["magic"][1] == 0     # published last with one aligned int64 store
SEGMENT_PAYLOAD_OFFSET = 4096
SEGMENT_KIND_BYTES = SEGMENT_HEADER.fields["kind"][0].itemsize

# Ingress ring (one per producer session) — the segment payload is::
#
#     +0    ring header (256, below)
#     +256  completion ring: completion_entries × COMPLETION (writer → producer)
#     +data_offset (page aligned)  data ring: data_bytes of FRAMEs (producer → writer)
#
# Ring header: one 64-byte line per writer so a cursor store never shares a cache line with the
# other side's cursor. Line 0 is written once by the creator before the segment's magic is
# published; line 1 only by the producer; line 2 only by the writer. Cursors are monotonic byte
# (data) or entry (completion) counters; the index into the ring is ``pos & (capacity - 1)``::
#
#     line 0 +0   data_offset u64 | data_bytes u64 | completion_offset u64 | completion_entries u64
#            +32  max_frame_bytes u64 | reserved (24)
#     line 1 +64  data_write_pos i64 | completion_read_pos i64 | producer_waiting i64 | producer_state i64
#            +96  reserved (32)
#     line 2 +128 data_read_pos i64 | completion_write_pos i64 | writer_waiting i64 | writer_state i64
#            +160 appended_data_pos i64 | staged_completion_pos i64 | reserved (16)
#     line 3 +192 reserved (64)
RING_KIND = "ingress"
#
# The writer's journal (line 2, +160/+168) makes a writer restart exactly-once: ``appended_data_pos``
# is the data position up to which frames are in the commitlog, ``staged_completion_pos`` the end of
# the completion entries written for them (published to the producer only up to
# ``completion_write_pos``, e.g. after a SYNC_FLUSH group commit). See hostmq.broker.writer.
RING_LAYOUT_VERSION = 2
RING_HEADER = np.dtype({
    "names": ["data_offset", "data_bytes", "completion_offset", "completion_entries", "max_frame_bytes",
              "data_write_pos", "completion_read_pos", "producer_waiting", "producer_state",
              "data_read_pos", "completion_write_pos", "writer_waiting", "writer_state",
              "appended_data_pos", "staged_completion_pos"],
    "formats": ["u8"] * 5 + ["i8"] * 10,
    "offsets": [0, 8, 16, 24, 32, 64, 72, 80, 88, 128, 136, 144, 152, 160, 168],
    "itemsize": 256,
})
assert RING_HEADER.itemsize == 256
# Index of each ring-header field in the header viewed as int64 words (``cast("q")``).
RING_WORD = {name: RING_HEADER.fields[name][1] // 8 for name in RING_HEADER.names}
assert all(RING_HEADER.fields[n][1] % 8 == 0 for n in RING_HEADER.names)
assert RING_HEADER.fields["data_write_pos"][1] // 64 != RING_HEADER.fields["data_read_pos"][1] // 64
RING_STATE_OPEN = 0
RING_STATE_CLOSED = 1        # producer_state: the producer closed its session cleanly
RING_STATE_DROPPED = 2       # writer_state: the writer found the ring corrupt and stopped reading it

# Frame — what a producer publishes into the data ring, 8-byte aligned, never split at the end::
#
#     +0  frame_bytes u32 (header + payload, exact; the next frame starts at align8(frame_bytes))
#     +4  kind u32 (FRAME_MESSAGE | FRAME_BATCH | FRAME_SKIP)   +8 seq i64 (producer's completion id)
#     +16 record_count u32                                      +20 flags u32 (producer ↔ writer hints)
#     +24 payload: record_count commitlog records back to back (QUEUEOFFSET/PHYSICALOFFSET left 0)
#
# A SKIP frame (record_count 0) pads from its position to the end of the ring; when fewer than
# FRAME_HEADER.size bytes remain before the end, both sides skip them without any header.
FRAME_HEADER = struct.Struct("=IIqII")
FRAME_HEADER_DTYPE = np.dtype([("frame_bytes", "u4"), ("kind", "u4"), ("seq", "i8"),
                               ("record_count", "u4"), ("flags", "u4")])
assert FRAME_HEADER.size == FRAME_HEADER_DTYPE.itemsize == 24
FRAME_ALIGN = 8
FRAME_MESSAGE = 1            # exactly one record
FRAME_BATCH = 2              # one or more records (a RocketMQ batch: one topic and queue)
FRAME_SKIP = 3               # padding to the end of the ring
FRAME_KINDS = (FRAME_MESSAGE, FRAME_BATCH, FRAME_SKIP)

# Completion — one per MESSAGE/BATCH frame, written by the writer in the producer's ring::
#
#     +0 seq i64 | +8 status i32 | +12 record_count i32 | +16 queue_offset i64 (first record)
#     +24 phys_offset i64 (first record) | +32 store_ts_ms i64
COMPLETION = np.dtype([("seq", "i8"), ("status", "i4"), ("record_count", "i4"), ("queue_offset", "i8"),
                       ("phys_offset", "i8"), ("store_ts_ms", "i8")])
assert COMPLETION.itemsize == 40
# status: >= 0 stored (values follow message.SendStatus order), < 0 refused (nothing stored).
COMPLETION_SEND_OK = 0
COMPLETION_FLUSH_DISK_TIMEOUT = 1
COMPLETION_FLUSH_SLAVE_TIMEOUT = 2
COMPLETION_SLAVE_NOT_AVAILABLE = 3
COMPLETION_BAD_RECORD = -1           # a record failed validation (check_record)
COMPLETION_STORE_FULL = -2           # disk above the refuse-writes ratio
COMPLETION_NOT_AVAILABLE = -3        # the broker cannot accept writes (shutting down, slave, …)
COMPLETION_NO_TOPIC = -4             # the topic does not exist on this broker, or the queue id is too big
COMPLETION_DISK_ERROR = -5           # the commitlog could not be written or made durable (EIO): restart needed
COMPLETION_NOT_MASTER = -6           # the broker stepped down: a newer epoch's master serves its name (NotMasterError)

# Broker state — one segment per running broker (``/hostmq.<hash12>.state.0``), created by the broker
# process before it starts its children and unlinked when it stops; clients map it read-only. Positions
# that other processes read are published here with aligned native int64 stores; each 64-byte line has
# ONE writer::
#
#     line 0 +0   (broker, once, before the magic) flush_disk_type (0 async, 1 sync) | session_slots |
#                 doorbell_fd (the broker's descriptor of the doorbell memfd, for /proc/PID/fd) |
#                 broker_pid | store_host (8 raw bytes) | commitlog_file_bytes | started_ms |
#                 consume_queue_file_entries
#     line 1 +64  (broker control) broker_state | sessions_version | topics_version | sessions_refused
#                 (session requests refused: over a cap, a bad or duplicate ring) | control_heartbeat_ms |
#                 consumers_version (bumped when a consumer group's members change) |
#                 offsets_reset_version (bumped when a group's offsets are reset to a timestamp) |
#                 consumed_below_pos (store.madvise_dontneed_consumed: every group has read past this
#                 commitlog offset; each process mapping the files before it drops them, 0 = off)
#     line 2 +128 (writer) write_pos | writer_pid | writer_waiting | last_store_ts_ms | writer_heartbeat_ms |
#                 appended_records | flush_request_pos | committed_pos
#     line 3 +192 (writer) intent_valid | intent_slot | intent_generation | intent_phys_start |
#                 intent_data_end | intent_cw_end | dispatch_wake | flush_wake (futex words the writer
#                 changes to wake the dispatcher / the flusher, hostmq.shm.futex)
#     line 4 +256 (dispatcher) dispatched_pos | dispatcher_pid | dispatcher_waiting | dispatch_seq |
#                 cq_flushed_pos | dispatched_records | dispatch_error_pos (commitlog offset of a record
#                 the dispatcher cannot parse, where dispatch stalls; -1 while there is none) |
#                 dispatcher_heartbeat_ms
#     line 5 +320 (flusher) flushed_pos | flusher_pid | flusher_waiting | flush_count | last_flush_ms |
#                 checkpoint_ms | flush_latency_us | flush_error (errno of a failed fdatasync, 0 = none;
#                 once set, flushed_pos never moves again in this run: fsyncgate)
#     line 6 +384 (broker, once, before the magic) index_slots | index_entries | queue_wakes (1: the
#                 writer wakes a queue's wake word as soon as a batch for it is readable — no transient
#                 store pool, ASYNC_FLUSH — so a tailing consumer need not sleep on dispatch_seq);
#                 (flusher) flusher_heartbeat_ms | flush_latency_sum_us (the flush histogram's sum, for
#                 Prometheus; its own line is full); (ha) ha_slaves (slaves connected and past the
#                 handshake) | master_end_pos (a slave: the master's commitlog end it last heard of);
#                 (writer) ha_wake (futex word: the writer adds one after each batch while a slave is
#                 connected; the ha process streams the new bytes)
#     Every child's *_heartbeat_ms (wall clock) moves at least every few hundred ms while its loop
#     runs; the broker withholds systemd's WATCHDOG=1 while one is stale (broker.heartbeat_stale_s).
#     line 7 +448 (scheduler) scheduler_pid | scheduler_heartbeat_ms | delayed_delivered | delayed_skipped |
#                 (ha: a master's replication process) ha_pid | ha_heartbeat_ms | ha_port (the bound TCP port, registered with the NameServers)
#                 | replicated_pos (the highest commitlog end a connected slave acknowledged)
#     line 8 +512 (broker, once, before the magic) role (ROLE_MASTER | ROLE_SLAVE: what this instance
#                 plays now, live/role.py — clients find a group's master by it, not by its directory) |
#                 role_epoch | registered_id (the id the NameServers know it by); (replica: a slave's
#                 writer) replica_connected (1 while it streams from a master past the handshake);
#                 (broker, once) slave_read_lag_bytes (a master with broker.slave_read_enable: a
#                 consumer whose next message is further than this behind write_pos reads it from a
#                 slave — RAM × access_message_in_memory_max_ratio; 0 = never); (broker) fenced_epoch
#                 (a master that saw a newer epoch's master of its name: that epoch; its writer refuses
#                 every send with COMPLETION_NOT_MASTER until the run ends — broker/fencing.py; 0 = serving) |
#                 (ha) confirmed_pos (a SYNC_MASTER's replication process: how far consumers may read —
#                 what an in-sync slave acknowledged, or the master's end while none is in sync; it never
#                 goes back; -1 while no replication process confirms: consumers read to the end) |
#                 confirm_wake (futex word: the ha process adds one whenever confirmed_pos moves)
#     +576  (writer) step_started_ns | step_woke_ns | step_cpu — measurement only: CLOCK_MONOTONIC ns
#                 at which the writer began the step whose queues it woke last, and at which it woke
#                 them (just before the futex wakes), and the CPU it woke them from plus one (0: not
#                 known); the latency bench splits a delivery with them | 5 × reserved
#     +640                      session table: session_slots × STATE_SLOT (broker control)
#     +640 + 64·S               writer attach table: session_slots × i64 generation (writer)
#     +640 + 72·S               flush latency histogram: FLUSH_HISTOGRAM_BUCKETS × i64 (flusher); bucket
#                               i counts commitlog flushes that took [2^(i-1), 2^i) µs (bucket 0: < 1 µs)
#     +640 + 72·S + 8·H         queue wake words: QUEUE_WAKE_WORDS × i64 (writer); the writer adds one to
#                               the word of every queue a batch appended to (``queue_wake_word``) and
#                               wakes its futex once the batch is readable
#
# ``write_pos`` is the end of the commitlog records the writer has finished (never a torn record
# below it); ``dispatched_pos`` the end of what consume queues and index cover; ``flushed_pos`` the end
# of what is on disk; ``committed_pos`` the end of what is in the commitlog files — with a transient
# store pool the writer appends into a buffer and commits to the files later, so dispatcher, flusher
# and readers stop at ``min(write_pos, committed_pos)`` (without a pool both are equal). Readers may
# see an older value, never a torn one (docs/internals.md fact 14). Consumers sleep on the futex of
# ``dispatch_seq`` (through their read-only mapping), which the dispatcher wakes after every publish,
# and on the queue wake words of the queues they read, which the writer wakes as soon as a batch is
# readable (consumers read records past ``dispatched_pos`` from the commitlog itself, store/tail.py);
# under SYNC_FLUSH they also sleep on ``flush_count``, which the flusher wakes after each flush.
BROKER_STATE_KIND = "broker"
BROKER_STATE_VERSION = 14         # 2: consumers_version, 3: offsets_reset_version, 4: scheduler line,
                                  # 5: committed_pos, 6: flush latency histogram and consumed_below_pos,
                                  # 7: futex wake-ups and memfd sessions (no waiter table), flush_error
                                  # 8: queue wake words (consumers read past dispatched_pos)
                                  # 9: dispatcher and flusher heartbeats, flush latency sum, replication
                                  # 10: role line (promotion), BROKER_STOPPED
                                  # 11: slave_read_lag_bytes (broker.slave_read_enable)
                                  # 12: fenced_epoch (a master stepping down, issue 27)
                                  # 13: confirmed_pos, confirm_wake (consumers of a SYNC_MASTER read
                                  #     what a slave holds: a failover cuts nothing they saw)
                                  # 14: step_started_ns, step_woke_ns (the writer's stamps, issue 29);
                                  #     step_cpu later took a reserved word of that line (measurement only:
                                  #     a reader that does not know it never reads it)
FLUSH_HISTOGRAM_BUCKETS = 32      # up to 2^31 µs (36 min): every flush fits
QUEUE_WAKE_WORDS = 64             # queues share wake words by hash: a wake-up is spurious 1 time in 64
_STATE_FIELDS = [
    (0, ["flush_disk_type", "session_slots", "doorbell_fd", "broker_pid", "store_host",
         "commitlog_file_bytes", "started_ms", "consume_queue_file_entries"]),
    (64, ["broker_state", "sessions_version", "topics_version", "sessions_refused", "control_heartbeat_ms",
          "consumers_version", "offsets_reset_version", "consumed_below_pos"]),
    (128, ["write_pos", "writer_pid", "writer_waiting", "last_store_ts_ms", "writer_heartbeat_ms",
           "appended_records", "flush_request_pos", "committed_pos"]),
    (192, ["intent_valid", "intent_slot", "intent_generation", "intent_phys_start", "intent_data_end",
           "intent_cw_end", "dispatch_wake", "flush_wake"]),
    (256, ["dispatched_pos", "dispatcher_pid", "dispatcher_waiting", "dispatch_seq", "cq_flushed_pos",
           "dispatched_records", "dispatch_error_pos", "dispatcher_heartbeat_ms"]),
    (320, ["flushed_pos", "flusher_pid", "flusher_waiting", "flush_count", "last_flush_ms", "checkpoint_ms",
           "flush_latency_us", "flush_error"]),
    (384, ["index_slots", "index_entries", "queue_wakes", "flusher_heartbeat_ms", "flush_latency_sum_us",
           "ha_slaves", "master_end_pos", "ha_wake"]),
    (448, ["scheduler_pid", "scheduler_heartbeat_ms", "delayed_delivered", "delayed_skipped",
           "ha_pid", "ha_heartbeat_ms", "ha_port", "replicated_pos"]),
    (512, ["role", "role_epoch", "registered_id", "replica_connected", "slave_read_lag_bytes",
           "fenced_epoch", "confirmed_pos", "confirm_wake"]),
    (576, ["step_started_ns", "step_woke_ns", "step_cpu"]),
]
# The heartbeat word of each process of a broker (wall-clock ms; the supervisor's own is the control
# loop's): the watchdog, ``hostmq status --check`` and the exporter read them.
STATE_HEARTBEATS = {"broker": "control_heartbeat_ms", "writer": "writer_heartbeat_ms",
                    "dispatcher": "dispatcher_heartbeat_ms", "flusher": "flusher_heartbeat_ms",
                    "scheduler": "scheduler_heartbeat_ms", "ha": "ha_heartbeat_ms"}
BROKER_STATE = np.dtype({
    "names": [n for _, names in _STATE_FIELDS for n in names],
    "formats": ["S8" if n == "store_host" else "i8" for _, names in _STATE_FIELDS for n in names],
    "offsets": [base + 8 * i for base, names in _STATE_FIELDS for i in range(len(names))],
    "itemsize": 640,
})
assert BROKER_STATE.itemsize == 640 and all(len(names) <= 8 for _, names in _STATE_FIELDS)
STATE_WORD = {name: BROKER_STATE.fields[name][1] // 8 for name in BROKER_STATE.names}
# BROKER_STOPPED: the last word of a stopped run — a broker that changes role starts again in the same
# process (same pid), so a reader of the old segment learns from this that it is gone.
BROKER_STARTING, BROKER_RUNNING, BROKER_STOPPING, BROKER_STOPPED = 0, 1, 2, 3
ROLE_MASTER, ROLE_SLAVE = 0, 1
FLUSH_ASYNC, FLUSH_SYNC = 0, 1
DEFAULT_SESSION_SLOTS = 256

# One row of the session table: a producer's ring the broker holds a descriptor of::
#
#     +0 state i64 (SLOT_FREE | SLOT_ACTIVE | SLOT_CLOSING) | +8 generation u64 (the ring segment's)
#     +16 owner_pid i64 (SO_PEERCRED of the session connection: the kernel's word, not the client's)
#     +24 fd i64 (the broker's descriptor of the ring memfd; the writer opens /proc/BROKER/fd/FD)
#     +32 name (32, ASCII, NUL padded: the label the producer gave its memfd, for diagnostics)
STATE_SLOT = np.dtype([("state", "i8"), ("generation", "u8"), ("owner_pid", "i8"), ("fd", "i8"),
                       ("name", "S32")])
assert STATE_SLOT.itemsize == 64
SLOT_FREE, SLOT_ACTIVE, SLOT_CLOSING = 0, 1, 2
STATE_SLOT_NAME_BYTES = STATE_SLOT.fields["name"][0].itemsize


def broker_state_bytes(session_slots: int) -> tuple[int, int, int, int, int]:
    """``(sessions_offset, attach_offset, histogram_offset, queue_wake_offset, total_bytes)`` of a broker
    state payload."""
    sessions = BROKER_STATE.itemsize
    attach = sessions + session_slots * STATE_SLOT.itemsize
    histogram = attach + session_slots * 8
    wake = histogram + FLUSH_HISTOGRAM_BUCKETS * 8
    return sessions, attach, histogram, wake, wake + QUEUE_WAKE_WORDS * 8


def queue_wake_word(topic_b: bytes, queue_id: int) -> int:
    """The queue wake word of a queue (writer and consumers compute the same; CRC32 is stable across
    processes, unlike ``hash``)."""
    return (zlib.crc32(topic_b) + queue_id) % QUEUE_WAKE_WORDS


def histogram_bucket(latency_us: int) -> int:
    """Bucket of a latency: 0 for < 1 µs, else i with 2^(i-1) ≤ latency < 2^i (capped at the last)."""
    return min(max(int(latency_us), 0).bit_length(), FLUSH_HISTOGRAM_BUCKETS - 1)


def histogram_percentile_us(counts, q: float) -> float:
    """Upper bound (µs) of the bucket holding the ``q``-th percentile; nan if the histogram is empty."""
    counts = [int(c) for c in counts]
    total = sum(counts)
    if not total:
        return float("nan")
    rank, seen = q / 100 * total, 0
    for i, c in enumerate(counts):
        seen += c
        if c and seen >= rank:
            return float(1 << i)
    return float(1 << (len(counts) - 1))


# Doorbell — one page in a memfd the broker creates (sealed) and passes to every producer it accepts;
# producers change word 0 and FUTEX_WAKE it after publishing a frame when the writer waits (the flusher
# does too when a group commit completes). It holds no data: anything a client writes there is only a
# spurious wake-up for the writer.
#
#     +0 writer_doorbell i64 | +8 reserved (4088)
DOORBELL_KIND = "doorbell"
DOORBELL_VERSION = 1
DOORBELL_BYTES = 4096
DOORBELL_WRITER_WORD = 0
