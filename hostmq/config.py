"""Typed configuration: one frozen dataclass per component, every field documented with its unit.

``Config`` groups the sections ``namesrv``, ``broker`` and ``store``; the same keys are valid in
``ROOT/hostmq.toml`` and as the ``config=`` dict of ``LocalCluster`` / ``MessageStore``. Unknown keys
and values of the wrong type raise :class:`~hostmq.errors.ConfigError` naming the key.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .errors import ConfigError
from .waiting import IdleStrategy

ASYNC_FLUSH = "ASYNC_FLUSH"
SYNC_FLUSH = "SYNC_FLUSH"
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_DELAY_LEVEL_RE = re.compile(r"[0-9]+[smhd]")    # RocketMQ's units: seconds, minutes, hours, days


def _check_numbers(section: str, obj: Any) -> None:
    """Every count, size, duration and ratio of a section is a finite number ≥ 0."""
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not (0 <= v < math.inf):
            raise ConfigError(f"{section}.{f.name} must be a finite number ≥ 0, got {v!r}")


ROLES = ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE")
_TCP_RE = re.compile(r"tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):\d{1,5}")
MADVISE_NAMES = ("NORMAL", "SEQUENTIAL", "RANDOM", "WILLNEED", "DONTNEED")


@dataclass(frozen=True)
class NamesrvConfig:
    scan_interval_s: float = 10.0        # how often silent brokers are looked for
    broker_expiry_s: float = 120.0       # a broker silent this long is dropped from routes
    # -- control-path limits (issue 15) --
    register_max_pages: int = 1024            # pages one broker registration may span
    register_pending_bytes: int = 64 << 20    # topic data unfinished paged registrations may hold in all
    register_page_timeout_s: float = 30.0     # an unfinished registration without a new page this long is dropped
    max_brokers: int = 1024                   # broker addresses registered at once
    kv_max_chars: int = 16 << 20              # characters of KV config (namespaces, keys and values) in all

    def __post_init__(self) -> None:
        _check_numbers("namesrv", self)
        if min(self.register_max_pages, self.register_pending_bytes, self.max_brokers, self.kv_max_chars) < 1 \
                or not self.register_page_timeout_s > 0:
            raise ConfigError("namesrv.register_max_pages, register_pending_bytes, register_page_timeout_s, "
                              "max_brokers and kv_max_chars must be > 0")


@dataclass(frozen=True)
class BrokerConfig:
    register_interval_s: float = 30.0    # broker → every NameServer
    auto_create_topic: bool = True       # create a topic on its first send
    default_topic_queues: int = 4        # queues of an auto-created topic
    message_delay_level: str = DEFAULT_DELAY_LEVELS
    long_polling_s: float = 15.0         # longest a pull with nothing new is held
    transaction_check_interval_s: float = 60.0
    transaction_check_max: int = 15      # check-backs before a half message is given up
    transaction_timeout_s: float = 6.0   # a half message is first checked back once this old (RocketMQ transactionTimeOut)
    transaction_resolve_lease_s: float = 30.0   # a producer allowed to end a transaction has this long to store
                                         # its commit and op; if it dies first, the half is checked back after
    cluster_name: str = "DefaultCluster" # cluster the broker registers under
    session_slots: int = 256             # producer sessions (ingress rings) served at once
    waiter_slots: int = 256              # ignored: consumers now sleep on the broker's dispatch_seq futex
    offset_persist_interval_s: float = 5.0   # consumerOffset.json is rewritten this often (if changed)
    writer_idle: str = "auto"            # how the writer waits for frames: spin | yield | backoff | sleep | auto,
                                         # optionally ":" and a spin budget in µs ("backoff:50"); without one the
                                         # budget is writer_spin_s. auto: backoff where the process may use more
                                         # cores than the 4 hot-path processes, else sleep (docs/tuning.md)
    writer_spin_s: float = 50e-6         # the writer's spin budget before it blocks (idle) ...
    writer_busy_spin_s: float = 200e-6   # ... and within 2 ms of its last work (0: block only)
    dispatcher_idle: str = "auto"        # how the dispatcher waits for records (as writer_idle; budget dispatcher_spin_s)
    dispatcher_spin_s: float = 50e-6     # the dispatcher's spin budget before it blocks
    flusher_idle: str = "auto"           # how a SYNC_FLUSH flusher waits for requests (as writer_idle; budget writer_spin_s)
    dispatcher_nice: int = 10            # the dispatcher yields the CPU to producer ↔ writer hand-offs (0: no)
    writer_batch_bytes: int = 1 << 20    # ring bytes the writer takes from one producer per turn
    child_stop_timeout_s: float = 10.0   # a child that has not stopped this long after being told is killed
    heartbeat_stale_s: float = 10.0      # a child whose heartbeat is older is hung: systemd's watchdog is not fed
    # -- producer sessions: untrusted clients (issue 15) --
    max_sessions_per_client: int = 32    # sessions one client process (SO_PEERCRED pid) may hold at once
    max_session_connections: int = 512  # session-socket connections open at once (beyond: refused)
    session_handshake_timeout_s: float = 5.0  # a connection that has not opened a session by then is closed
    # -- control-path limits (issue 15) --
    max_held_pulls_per_client: int = 1024   # long polls one client connection may have held (RocketMQ popPollingSize)
    max_held_pulls: int = 16384             # long polls held in all (RocketMQ maxPopPollingSize is 100000)
    register_page_topics: int = 2000        # topics per REGISTER_BROKER page (RocketMQ splitRegistrationSize: 800)
    # -- what group members' requests may create (issue 27; the owner's requests are not counted) --
    max_groups_per_uid: int = 1000          # new consumer groups (each gets a retry topic) one uid's heartbeats,
                                            # send-backs and offset commits may introduce, per broker run
    max_groups: int = 10000                 # ... all non-owner uids together
    max_auto_topics_per_uid: int = 1000     # topics one uid's first sends may auto-create, per broker run
    max_auto_topics: int = 10000            # ... all non-owner uids together
    max_clients_per_uid: int = 1000         # client ids (heartbeats) of one uid known at once
    max_clients: int = 10000                # ... all non-owner uids together
    max_heartbeat_groups: int = 1024        # consumer + producer groups one heartbeat may name
    # -- replication (issue 18; RocketMQ's HAService) --
    role: str = "ASYNC_MASTER"              # ASYNC_MASTER | SYNC_MASTER | SLAVE (a broker id ≥ 1 is a SLAVE)
    ha_listen: str = ""                     # a master's replication listener, tcp://HOST:PORT (port 0: any; registered with
                                            # the NameServers); "": tcp://127.0.0.1:0 once a slave is configured (a
                                            # SYNC_MASTER, a promoted master, a slave of it on this root), else no port
    ha_master: str = ""                     # a slave's master, tcp://HOST:PORT ("": its HA address from the NameServers)
    ha_sync_timeout_ms: int = 3000          # SYNC_MASTER: a send waits this long for a slave's ack, else FLUSH_SLAVE_TIMEOUT
    ha_max_gap_bytes: int = 256 << 20       # SYNC_MASTER: a slave further behind is not in sync (SLAVE_NOT_AVAILABLE)
    ha_heartbeat_interval_s: float = 5.0    # both sides speak at least this often (RocketMQ haSendHeartbeatInterval)
    ha_housekeeping_s: float = 20.0         # a replication connection silent this long is closed (haHousekeepingInterval)
    ha_meta_interval_s: float = 10.0        # a master sends its topics and offsets this often (and when topics change)
    slave_read_enable: bool = False         # a consumer this far behind the master reads from a slave (RocketMQ slaveReadEnable):
    access_message_in_memory_max_ratio: float = 40.0   # ... more than this % of RAM (accessMessageInMemoryMaxRatio)

    def __post_init__(self) -> None:
        _check_numbers("broker", self)
        if not self.cluster_name or not self.cluster_name.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(f"broker.cluster_name must be letters, digits, '-' or '_', got {self.cluster_name!r}")
        if not 1 <= self.session_slots <= 65536 or not 1 <= self.waiter_slots <= 65536:
            raise ConfigError("broker.session_slots and broker.waiter_slots must be within 1..65536")
        if self.max_sessions_per_client < 1 or self.max_session_connections < 1:
            raise ConfigError("broker.max_sessions_per_client and broker.max_session_connections must be ≥ 1")
        if self.default_topic_queues < 1:
            raise ConfigError("broker.default_topic_queues must be ≥ 1")
        if self.transaction_check_interval_s <= 0 or self.transaction_resolve_lease_s <= 0:
            raise ConfigError("broker.transaction_check_interval_s and transaction_resolve_lease_s must be > 0")
        if not all(_DELAY_LEVEL_RE.fullmatch(x) for x in self.message_delay_level.split()):
            raise ConfigError(f"broker.message_delay_level must be space-separated durations such as "
                              f"'1s 5m 2h', got {self.message_delay_level!r}")
        if self.role not in ROLES:
            raise ConfigError(f"broker.role must be one of {', '.join(ROLES)}, got {self.role!r}")
        for key in ("ha_listen", "ha_master"):
            v = getattr(self, key)
            if v and not _TCP_RE.fullmatch(v):
                raise ConfigError(f"broker.{key} must be tcp://HOST:PORT, got {v!r}")
        if self.ha_heartbeat_interval_s <= 0 or self.ha_housekeeping_s <= self.ha_heartbeat_interval_s:
            raise ConfigError("broker.ha_housekeeping_s must exceed broker.ha_heartbeat_interval_s > 0")
        if not 0 < self.access_message_in_memory_max_ratio <= 100:
            raise ConfigError("broker.access_message_in_memory_max_ratio must be a percentage within (0, 100], "
                              f"got {self.access_message_in_memory_max_ratio!r}")
        if min(self.max_held_pulls_per_client, self.max_held_pulls, self.register_page_topics) < 1:
            raise ConfigError("broker.max_held_pulls_per_client, max_held_pulls and register_page_topics must be ≥ 1")
        for who in ("writer", "dispatcher", "flusher"):
            self.idle_strategy(who)             # a bad string fails here, naming its key
        caps = ("max_groups_per_uid", "max_groups", "max_auto_topics_per_uid", "max_auto_topics",
                "max_clients_per_uid", "max_clients", "max_heartbeat_groups")
        if min(getattr(self, k) for k in caps) < 1:
            raise ConfigError(f"broker.{', '.join(caps)} must be ≥ 1")

    def idle_strategy(self, who: str) -> IdleStrategy:
        """The idle strategy of the broker's ``writer``, ``dispatcher`` or ``flusher`` on this machine."""
        budget_s = self.dispatcher_spin_s if who == "dispatcher" else self.writer_spin_s
        return IdleStrategy.parse(getattr(self, f"{who}_idle"), spin_us=budget_s * 1e6, what=f"broker.{who}_idle")


# File sizes per store profile: "production" keeps RocketMQ's (a first root takes ~1.5 GB of disk:
# a 1 GiB commitlog file and a 400 MiB index file); "dev" makes a development root take tens of MB.
# A profile fills only the size keys the configuration does not set, and a store keeps the sizes it
# was created with (store.json), whatever the profile later says.
PROFILES: dict[str, dict[str, int]] = {
    "production": {"commitlog_file_bytes": 1 << 30, "consume_queue_file_entries": 300_000,
                   "index_slots": 5_000_000, "index_entries": 20_000_000},
    "dev": {"commitlog_file_bytes": 32 << 20, "consume_queue_file_entries": 30_000,
            "index_slots": 100_000, "index_entries": 400_000},
}


@dataclass(frozen=True)
class StoreConfig:
    profile: str = "production"                    # file sizes: "production" (RocketMQ's) or "dev" (PROFILES)
    commitlog_file_bytes: int = 1 << 30            # size of each commitlog mapped file
    consume_queue_file_entries: int = 300_000      # 20-byte entries per consume-queue file
    index_slots: int = 5_000_000                   # hash slots per index file
    index_entries: int = 20_000_000                # entries per index file
    message_index_enable: bool = True              # build the key / unique-id index
    flush_disk_type: str = ASYNC_FLUSH             # or SYNC_FLUSH (send returns after fsync)
    flush_interval_ms: int = 500                   # async commitlog flush period
    flush_least_pages: int = 4                     # async flush waits for this many dirty 4 KiB pages
    flush_thorough_interval_ms: int = 10_000       # ... unless this long passed since a full flush
    flush_cq_interval_ms: int = 1_000              # consume queue / index flush period
    flush_cq_least_pages: int = 2
    sync_flush_timeout_ms: int = 5_000             # SYNC_FLUSH: answer FLUSH_DISK_TIMEOUT after this
    max_message_bytes: int = 4 * 1024 * 1024       # largest body accepted
    max_properties_bytes: int = (1 << 15) - 1      # largest encoded properties accepted
    max_transfer_bytes: int = 256 * 1024           # most bytes one get() returns (at least one message)
    transient_store_pool_enable: bool = False      # append into mlocked buffers, commit them to the file
                                                   # (ASYNC_FLUSH only, as in RocketMQ; see store.transient_pool)
    transient_store_pool_size: int = 1             # buffers of one commitlog file each (RocketMQ: 5, but
                                                   # hostmq commits a file wholly before the next starts)
    commit_interval_ms: int = 200                  # pool: everything appended reaches the file this often
    commit_least_pages: int = 4                    # ... and as soon as this many 4 KiB pages wait
    warm_mapped_file: bool = False                 # pre-touch new mapped files
    preallocate_next_file: bool = False            # make the next commitlog file ahead of need (background)
    mlock_commitlog_head: bool = False             # mlock the commitlog file being written (warning if refused)
    preallocate_at_ratio: float = 0.5              # ... once the current one is this full
    # madvise per file kind (NORMAL | SEQUENTIAL | RANDOM | WILLNEED; cold commitlog also DONTNEED):
    madvise_commitlog_head: str = "NORMAL"         # the commitlog file being written (and read at its tail)
    madvise_commitlog_cold: str = "NORMAL"         # older commitlog files (lagging readers, lookups by id)
    madvise_consume_queue: str = "NORMAL"          # consume-queue files
    madvise_dontneed_consumed: bool = False        # DONTNEED commitlog files every consumer group has read
                                                   # past (checked every consumed_check_interval_s)
    consumed_check_interval_s: float = 5.0
    file_reserved_hours: float = 72.0              # commitlog files older than this may be deleted
    delete_when: str = "04"                        # hours (";"-separated) when expired files go
    disk_max_used_ratio: float = 0.75              # above this, expired files go at any hour
    disk_force_clean_ratio: float = 0.85           # above this, the oldest files go even if not expired
    disk_refuse_ratio: float = 0.90                # above this, writes are refused (StoreFullError)
    delete_files_batch_max: int = 10               # files deleted per cleanup pass
    check_crc_on_recover: bool = True              # verify body CRCs during abnormal recovery
    # -- data-path integrity (issue 15) --
    verify_consume_queues_on_recover: bool = True  # abnormal recovery checks every consume-queue entry
                                                   # against its record (reads each record's header)
                                                   # and rebuilds a queue from its first wrong entry
    dispatch_retry_interval_ms: int = 1_000        # a dispatcher stalled by a broken record or a disk
                                                   # error (ENOSPC, EIO) retries this often

    def __post_init__(self) -> None:
        _check_numbers("store", self)
        if self.profile not in PROFILES:
            raise ConfigError(f"store.profile must be one of {', '.join(PROFILES)}, got {self.profile!r}")
        if self.flush_disk_type not in (ASYNC_FLUSH, SYNC_FLUSH):
            raise ConfigError(f"store.flush_disk_type must be ASYNC_FLUSH or SYNC_FLUSH, "
                              f"got {self.flush_disk_type!r}")
        if self.commitlog_file_bytes < 4096:
            raise ConfigError("store.commitlog_file_bytes must be at least 4096")
        if self.consume_queue_file_entries < 1 or self.index_slots < 1 or self.index_entries < 2:
            raise ConfigError("store.consume_queue_file_entries and index_slots must be ≥ 1 and "
                              "index_entries ≥ 2 (entry 0 of an index file is never used)")
        if not 0 < self.max_message_bytes:
            raise ConfigError("store.max_message_bytes must be positive")
        if not 0 <= self.max_properties_bytes <= (1 << 15) - 1:
            raise ConfigError("store.max_properties_bytes must be within 0..32767")
        if self.transient_store_pool_size < 1:
            raise ConfigError("store.transient_store_pool_size must be at least 1")
        if not 0.0 < self.preallocate_at_ratio < 1.0:
            raise ConfigError("store.preallocate_at_ratio must be within (0, 1)")
        for name in ("madvise_commitlog_head", "madvise_commitlog_cold", "madvise_consume_queue"):
            allowed = MADVISE_NAMES if name == "madvise_commitlog_cold" else MADVISE_NAMES[:-1]
            if getattr(self, name) not in allowed:
                raise ConfigError(f"store.{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        for name in ("disk_max_used_ratio", "disk_force_clean_ratio", "disk_refuse_ratio"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ConfigError(f"store.{name} must be within (0, 1]")


    @property
    def commitlog_advice(self) -> tuple[str, str]:
        return self.madvise_commitlog_head, self.madvise_commitlog_cold

    @property
    def consume_queue_advice(self) -> tuple[str, str]:
        return self.madvise_consume_queue, self.madvise_consume_queue


@dataclass(frozen=True)
class LoggingConfig:
    level: str = "INFO"                  # DEBUG | INFO | WARNING | ERROR (--log-level and $HOSTMQ_LOG_LEVEL win)
    file: str = ""                       # "": stderr (the journal under systemd); relative: under ROOT/logs
    max_bytes: int = 64 << 20            # a log file is rotated at this size ...
    backups: int = 5                     # ... keeping this many old ones (file.1 … file.N)

    def __post_init__(self) -> None:
        _check_numbers("logging", self)
        if self.level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ConfigError(f"logging.level must be DEBUG, INFO, WARNING, ERROR or CRITICAL, got {self.level!r}")
        if self.max_bytes < 4096 or self.backups < 1:
            raise ConfigError("logging.max_bytes must be ≥ 4096 and logging.backups ≥ 1")
        if "\0" in self.file:
            raise ConfigError("logging.file must not contain NUL")


@dataclass(frozen=True)
class AccessConfig:
    group: str = ""                      # the group whose members may use the root (name or gid); "": the root's own

    def __post_init__(self) -> None:
        g = self.group.strip()
        if g and not (g.isdigit() or g.replace("-", "").replace("_", "").replace(".", "").isalnum()):
            raise ConfigError(f"access.group must be a group name or number, got {self.group!r}")


@dataclass(frozen=True)
class HAConfig:
    """Trust of replication links (issue 27; docs/trust-replication.md). Every link proves the root's
    ``ha.secret`` both ways and tags every frame; TLS adds encryption between hosts."""
    tls_cert: str = ""                   # PEM certificate this instance shows on replication links ("": no TLS)
    tls_key: str = ""                    # PEM private key of tls_cert
    tls_ca: str = ""                     # PEM CA bundle both ends verify the other's certificate against
    handshake_timeout_s: float = 5.0     # a connection without a complete, proven HELLO by then is closed
    pending_connections: int = 8         # unauthenticated connections held at once (a new one drops the oldest)
    bind_endpoint: bool = True           # proofs name the master's IP:PORT, so a relay is refused at the handshake;
                                         # false for links through NAT or a port forwarder without TLS
    accept_cut: bool = False             # operator's override: a slave accepts a cut of its log from a master
                                         # of an epoch it already followed, or below what it acknowledged to
                                         # a SYNC_MASTER (the cut records are kept in store/cut-*.bin)

    def __post_init__(self) -> None:
        _check_numbers("ha", self)
        tls = (self.tls_cert, self.tls_key, self.tls_ca)
        if any(tls) and not all(tls):
            raise ConfigError("ha.tls_cert, ha.tls_key and ha.tls_ca go together (mutual TLS): set all three or none")
        for key, path in zip(("tls_cert", "tls_key", "tls_ca"), tls):
            if path and not Path(path).is_file():
                raise ConfigError(f"ha.{key} names {path!r}, which is not a readable file")
        if not self.handshake_timeout_s > 0 or not 1 <= self.pending_connections <= 1024:
            raise ConfigError("ha.handshake_timeout_s must be > 0 and ha.pending_connections within 1..1024")

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)


@dataclass(frozen=True)
class Config:
    namesrv: NamesrvConfig = field(default_factory=NamesrvConfig)
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    access: AccessConfig = field(default_factory=AccessConfig)
    ha: HAConfig = field(default_factory=HAConfig)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "Config":
        """Build from ``{"store": {...}, ...}``; unknown sections or keys raise ConfigError."""
        if data is not None and not isinstance(data, Mapping):
            raise ConfigError(f"config must be a table of sections, got {type(data).__name__}")
        data = dict(data or {})
        sections = {f.name: f.type for f in dataclasses.fields(cls)}
        out = {}
        for name, value in data.items():
            if name not in sections:
                close = difflib.get_close_matches(str(name), list(sections), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"unknown config section {name!r}{hint}; expected one of {sorted(sections)}")
            out[name] = section_from_dict(_SECTION_TYPES[name], value, name)
        return cls(**out)

    @classmethod
    def load(cls, source: "Config | Mapping[str, Any] | str | Path | None") -> "Config":
        if source is None:
            return cls()
        if isinstance(source, Config):
            return source
        if isinstance(source, (str, Path)):
            try:
                with open(source, "rb") as f:
                    return cls.from_dict(tomllib.load(f))
            except OSError as e:
                raise ConfigError(f"cannot read config file {source}: {e.strerror}") from None
            except tomllib.TOMLDecodeError as e:
                raise ConfigError(f"config file {source} is not valid TOML: {e}") from None
        return cls.from_dict(source)

    def with_overrides(self, data: Mapping[str, Any] | None) -> "Config":
        """A copy with the given sections' keys replaced."""
        if not data:
            return self
        if not isinstance(data, Mapping):
            raise ConfigError(f"config overrides must be a table of sections, got {type(data).__name__}")
        base = {s: dataclasses.asdict(getattr(self, s)) for s in _SECTION_TYPES}
        for s, values in data.items():
            if s not in base:
                raise ConfigError(f"unknown config section {s!r}")
            if not isinstance(values, Mapping):
                raise ConfigError(f"config section {s!r} must be a table")
            if s == "store" and "profile" in values:
                # A new profile re-fills the sizes the old one gave (not those set explicitly).
                old = PROFILES.get(base[s]["profile"], {})
                for key, value in old.items():
                    if base[s].get(key) == value:
                        del base[s][key]
            base[s].update(values)
        return Config.from_dict(base)


_SECTION_TYPES = {"namesrv": NamesrvConfig, "broker": BrokerConfig, "store": StoreConfig,
                  "logging": LoggingConfig, "access": AccessConfig,
                  "ha": HAConfig}


def section_from_dict(kind: type, data: Any, name: str = ""):
    """Build one section dataclass from a mapping, checking keys and value types."""
    if isinstance(data, kind):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError(f"config section {name!r} must be a table, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(kind)}
    if kind is StoreConfig and isinstance(data.get("profile"), str) and data["profile"] in PROFILES:
        data = {**PROFILES[data["profile"]], **data}
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"did you mean {name}.{close[0]}? " if close else ""
            raise ConfigError(f"unknown key {name}.{key}; {hint}known: {', '.join(sorted(fields))}")
        kwargs[key] = _coerce(fields[key].default, value, f"{name}.{key}")
    try:
        return kind(**kwargs)
    except TypeError as e:
        raise ConfigError(f"bad config section {name!r}: {e}") from None


def _coerce(default: Any, value: Any, key: str) -> Any:
    want = type(default)
    if want is bool:
        if isinstance(value, bool):
            return value
    elif want is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif want is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:    # an int too large for a float
                pass
    elif want is str:
        if isinstance(value, str):
            return value
    else:
        return value
    raise ConfigError(f"{key} must be {want.__name__}, got {value!r}")


def store_config(config: "StoreConfig | Config | Mapping[str, Any] | None") -> StoreConfig:
    """Accept a StoreConfig, a Config, a flat dict of store keys, or ``{"store": {...}}``."""
    if config is None:
        return StoreConfig()
    if isinstance(config, StoreConfig):
        return config
    if isinstance(config, Config):
        return config.store
    if isinstance(config, Mapping) and set(config) <= set(_SECTION_TYPES):
        return Config.from_dict(config).store
    return section_from_dict(StoreConfig, config, "store")
