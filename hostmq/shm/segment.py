"""Shared-memory segments with an owner header (docs/internals.md facts 4-6): named POSIX ones, and sealed memfds.

A :class:`Segment` is one ``posix_ipc.SharedMemory`` object — or one anonymous ``memfd`` — mapped with
``mmap``. Its first page holds :data:`hostmq.records.SEGMENT_HEADER` (magic, layout version, kind tag,
owner pid, owner start ticks, boot id, generation, size); the payload the caller asked for starts at
:data:`~hostmq.records.SEGMENT_PAYLOAD_OFFSET` (4096) and is exposed as ``.buf`` (memoryview) and
``.u8`` (numpy uint8).

Ownership: the process that calls :meth:`Segment.create` owns the segment and is the only writer of
its header; it unlinks the segment on clean shutdown. Attachers only read the header. What a
segment's payload holds, and who writes which byte of it, is the business of the module that uses
it (``ring.py`` for ingress rings).

Creation order makes a half-made segment harmless: create with ``O_CREAT|O_EXCL``, ``posix_fallocate``
the whole size (ENOSPC now instead of a SIGBUS later), map, write the header and the caller's
``init`` bytes, and store the magic *last* with one aligned int64 store. An attacher that finds no
magic gets :class:`~hostmq.errors.SegmentError`; :func:`reclaim_stale` leaves such a segment alone
for ``grace_s`` (its creator may be between two of these steps) and unlinks it after that.

Memfd segments (:meth:`Segment.create_memfd`) are what a *client* shares with a server: a producer's
ingress ring. They have no name a third process could open, they vanish with the last descriptor
and mapping (a test run or a killed client leaves nothing in ``/dev/shm``), and they are *sealed*
against shrinking (``F_SEAL_SHRINK``): the creator keeps a writable descriptor, yet nobody can
truncate the memory under a server that mapped it — a truncated named segment would kill that
server with SIGBUS on its next access. :meth:`Segment.from_fd` refuses a descriptor that is not
sealed so, and maps exactly the size ``fstat`` reports.

Liveness: the owner is alive iff a process with the recorded pid exists, is not a zombie, started at
the recorded boot-relative clock tick (``/proc/PID/stat`` field 22: pid reuse; unlike a wall-clock
start time it does not move when the clock is stepped), and the boot id is the current one.
:func:`reclaim_stale` unlinks the named segments of dead owners together with any semaphore of the
*same name* left by older versions (POSIX semaphores live in ``/dev/shm/sem.<name>``).

Closing: :meth:`Segment.close` unmaps unless views handed out (``.buf`` slices, numpy arrays, frame
payloads) are still alive; then the mapping is released when the last of them is garbage collected
(never a dangling pointer). Closing never unlinks; :meth:`Segment.unlink` removes the name.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import secrets
import sys
import time
from typing import Callable, NamedTuple

import numpy as np
import posix_ipc

from .. import records as R
from ..errors import SegmentError, SegmentExistsError, SegmentNotFoundError

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
SEM_FILE_PREFIX = "sem."          # Linux names a semaphore /x as /dev/shm/sem.x
DEFAULT_PREFIX = "/hostmq."
DEFAULT_MODE = 0o640              # owner writes, the root's group maps read-only (hostmq/access.py), whatever the umask
_SEGMENT_GID: int | None = None   # the group new segments are given (set_segment_group), None: the process's
_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
MAX_MEMFD_BYTES = 1 << 31         # a client's segment larger than this is refused before mapping
MEMFD_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class SegmentInfo(NamedTuple):
    """A segment's header as read from shared memory."""

    name: str
    kind: str
    layout_version: int
    owner_pid: int
    owner_start_ticks: int
    boot_id: bytes
    generation: int
    size_bytes: int
    created_ms: int


def boot_id() -> bytes:
    """This boot's id (16 raw bytes); a segment from another boot cannot have a live owner."""
    with open(_BOOT_ID_PATH) as f:
        return bytes.fromhex(f.read().strip().replace("-", ""))


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """``(state, start ticks)`` of ``pid`` from ``/proc/PID/stat`` (fields 3 and 22), None if gone."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) is in parentheses and may itself hold spaces and parentheses.
    rest = raw[raw.rfind(b")") + 2:].split()
    return rest[0].decode("ascii", "replace"), int(rest[19])


def process_start_ticks(pid: int | None = None) -> int:
    """Boot-relative start time of ``pid`` (this process by default) in clock ticks; 0 if gone."""
    st = _proc_stat(os.getpid() if pid is None else pid)
    return st[1] if st is not None else 0


def process_alive(pid: int, start_ticks: int) -> bool:
    """True iff ``pid`` runs, is not a zombie, and started at ``start_ticks`` (not a reused pid)."""
    if pid <= 0:
        return False
    try:
        st = _proc_stat(pid)
    except PermissionError:          # exists, hidden from us (hidepid): treat as alive
        return True
    return st is not None and st[0] != "Z" and st[1] == start_ticks


def info_owner_alive(info: SegmentInfo) -> bool:
    return info.boot_id == boot_id() and process_alive(info.owner_pid, info.owner_start_ticks)


def _kind_bytes(name: str, kind: str) -> bytes:
    kb = kind.encode("ascii", "strict") if kind.isascii() else b""
    if not kb or len(kb) > R.SEGMENT_KIND_BYTES or b"\0" in kb:
        raise SegmentError(name, f"kind {kind!r} must be 1..{R.SEGMENT_KIND_BYTES} ASCII characters")
    return kb


def set_segment_group(gid: int | None) -> None:
    """Segments this process creates from now on belong to ``gid`` (a server: its root's group)."""
    global _SEGMENT_GID
    _SEGMENT_GID = gid


def _open_shm(name: str, flags: int = 0, mode: int = DEFAULT_MODE,
              read_only: bool = False) -> posix_ipc.SharedMemory:
    try:
        return posix_ipc.SharedMemory(name, flags, mode=mode, size=0, read_only=read_only)
    except posix_ipc.ExistentialError:
        if flags & posix_ipc.O_EXCL:
            raise SegmentExistsError(name, "already exists") from None
        raise SegmentNotFoundError(name, "does not exist") from None
    except (ValueError, posix_ipc.PermissionsError) as e:
        raise SegmentError(name, str(e)) from None


class Segment:
    """One mapped shared-memory segment; see the module docstring for the contract."""

    def __init__(self, name: str, mm: mmap.mmap, owner: bool, fd: int = -1) -> None:
        self.name = name
        self.is_owner = owner
        self.fd = fd                    # memfd segments: the descriptor (closed by close_fd / close)
        self._mm: mmap.mmap | None = mm
        self._hdr = np.frombuffer(mm, dtype=R.SEGMENT_HEADER, count=1)
        self.buf: memoryview = memoryview(mm)[R.SEGMENT_PAYLOAD_OFFSET:]
        self.u8: np.ndarray = np.frombuffer(mm, dtype=np.uint8, offset=R.SEGMENT_PAYLOAD_OFFSET)

    # -- creation and attachment ---------------------------------------------------------------
    @classmethod
    def create(cls, name: str, size: int, kind: str, version: int, *, mode: int = DEFAULT_MODE,
               init: Callable[["Segment"], None] | None = None) -> "Segment":
        """Create ``name`` (O_CREAT|O_EXCL) with ``size`` payload bytes and this process as owner.

        ``init(segment)`` runs before the magic is published, so whoever attaches sees its bytes.
        Raises SegmentExistsError, or SegmentError for no space (ENOSPC) or a bad name or kind.
        """
        kb = _kind_bytes(name, kind)
        if size < 0:
            raise SegmentError(name, f"negative size {size}")
        total = R.SEGMENT_PAYLOAD_OFFSET + size
        shm = _open_shm(name, posix_ipc.O_CREX, mode)
        try:
            os.fchmod(shm.fd, mode)             # exactly: the umask may have taken the group's bits
            if _SEGMENT_GID is not None and _SEGMENT_GID != os.getegid():
                os.fchown(shm.fd, -1, _SEGMENT_GID)
            try:
                os.posix_fallocate(shm.fd, 0, total)
            except OSError as e:
                why = "no space left in /dev/shm" if e.errno == errno.ENOSPC else os.strerror(e.errno)
                raise SegmentError(name, f"cannot allocate {total} bytes: {why}") from None
            mm = mmap.mmap(shm.fd, total)
        except BaseException:
            shm.close_fd()
            shm.unlink()
            raise
        shm.close_fd()
        seg = cls(name, mm, owner=True)
        try:
            seg._init_header(kb, version, total, init)
        except BaseException:
            seg.close()
            seg.unlink()
            raise
        return seg

    @classmethod
    def create_memfd(cls, name: str, size: int, kind: str, version: int, *,
                     init: Callable[["Segment"], None] | None = None) -> "Segment":
        """Create an anonymous segment (``memfd``, sealed against shrinking and growing) owned by this
        process; ``name`` only labels it (``/proc/PID/maps`` shows ``memfd:NAME``). The segment keeps
        its descriptor in ``.fd`` for passing to a server (``socket.send_fds``) until closed.

        Raises SegmentError for no memory (ENOSPC/ENOMEM) or a bad kind.
        """
        kb = _kind_bytes(name, kind)
        if size < 0:
            raise SegmentError(name, f"negative size {size}")
        total = R.SEGMENT_PAYLOAD_OFFSET + size
        try:
            fd = os.memfd_create(name.strip("/")[:200] or "hostmq", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except OSError as e:
            raise SegmentError(name, f"cannot create a memfd: {os.strerror(e.errno)}") from None
        try:
            try:
                os.posix_fallocate(fd, 0, total)    # the memory now, never a SIGBUS later
            except OSError as e:
                raise SegmentError(name, f"cannot allocate {total} bytes: {os.strerror(e.errno)}") from None
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, MEMFD_SEALS)
            mm = mmap.mmap(fd, total)
        except BaseException:
            os.close(fd)
            raise
        seg = cls(name, mm, owner=True, fd=fd)
        try:
            seg._init_header(kb, version, total, init)
        except BaseException:
            seg.close()
            raise
        return seg

    def _init_header(self, kind: bytes, version: int, total: int, init) -> None:
        h = self._hdr[0]
        h["layout_version"] = version
        h["header_bytes"] = R.SEGMENT_PAYLOAD_OFFSET
        h["kind"] = kind
        h["owner_pid"] = os.getpid()
        h["owner_start_ticks"] = process_start_ticks()
        h["boot_id"] = boot_id()
        h["generation"] = secrets.randbits(63)     # fits a signed int64 word too
        h["size_bytes"] = total
        h["created_ms"] = int(time.time() * 1000)
        if init is not None:
            init(self)
        words = memoryview(self._mm)[:8].cast("q")
        words[0] = int.from_bytes(R.SEGMENT_MAGIC, sys.byteorder, signed=True)
        words.release()

    @classmethod
    def from_fd(cls, fd: int, kind: str, version: int, *, name: str = "memfd") -> "Segment":
        """Map a segment from a descriptor a client passed (``fd`` stays the caller's to close).

        Refuses (SegmentError) anything that is not a memfd sealed against shrinking — a file the
        client could truncate would turn our next access into a SIGBUS — or whose header does not
        match the size ``fstat`` reports, its kind or layout version.
        """
        kb = _kind_bytes(name, kind)
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError:
            raise SegmentError(name, "is not a sealable memfd") from None
        if not seals & fcntl.F_SEAL_SHRINK:
            raise SegmentError(name, "is not sealed against shrinking (F_SEAL_SHRINK)")
        size = os.fstat(fd).st_size
        if not R.SEGMENT_PAYLOAD_OFFSET <= size <= MAX_MEMFD_BYTES:
            raise SegmentError(name, f"is {size} bytes (a segment has {R.SEGMENT_PAYLOAD_OFFSET} to "
                                     f"{MAX_MEMFD_BYTES})")
        try:
            mm = mmap.mmap(fd, size)
        except OSError as e:
            raise SegmentError(name, f"cannot map it: {os.strerror(e.errno)}") from None
        seg = cls(name, mm, owner=False)
        return seg._checked(kb, kind, version)

    @classmethod
    def attach(cls, name: str, kind: str, version: int, *, readonly: bool = False) -> "Segment":
        """Map an existing segment after checking its magic, kind and layout version (``readonly``:
        a read-only mapping, for processes that only observe the segment).

        Raises SegmentNotFoundError, or SegmentError naming what did not match.
        """
        kb = _kind_bytes(name, kind)
        mm = _map_existing(name, readonly)
        seg = cls(name, mm, owner=False)
        return seg._checked(kb, kind, version)

    def _checked(self, kb: bytes, kind: str, version: int) -> "Segment":
        """This attached segment, if its header is valid and of ``kind`` and ``version``; else closed
        and SegmentError naming what did not match."""
        try:
            info = self.info()
            if info.kind.encode() != kb:
                raise SegmentError(self.name, f"is a {info.kind!r} segment, expected {kind!r}")
            if info.layout_version != version:
                raise SegmentError(self.name, f"layout version {info.layout_version}, this code reads {version}")
        except BaseException:
            self.close()
            raise
        return self

    # -- header --------------------------------------------------------------------------------
    def info(self) -> SegmentInfo:
        """The header, validated (SegmentError if the magic or the size is wrong)."""
        return _decode_header(self.name, self._hdr[0], len(self._mm) if self._mm is not None else 0)

    @property
    def generation(self) -> int:
        return int(self._hdr[0]["generation"])

    @property
    def size(self) -> int:
        """Payload bytes (``len(self.buf)``)."""
        return len(self.buf)

    def array(self, dtype, count: int = -1, offset: int = 0) -> np.ndarray:
        """A numpy view of the payload at ``offset`` (built on the mapping itself, so it never pins
        ``.buf``; the mapping lives until the last such array is gone)."""
        return np.frombuffer(self._mm, dtype=dtype, count=count, offset=R.SEGMENT_PAYLOAD_OFFSET + offset)

    def owner_alive(self) -> bool:
        """True iff the recorded owner process still runs (same pid, start time and boot)."""
        return info_owner_alive(self.info())

    # -- lifetime ------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._mm is None

    def close_fd(self) -> None:
        """Close a memfd segment's descriptor (the mapping stays)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def close(self) -> None:
        """Unmap (deferred while caller-held views live). Idempotent; never unlinks."""
        self.close_fd()
        mm, self._mm = self._mm, None
        if mm is None:
            return
        self._hdr = self.u8 = None
        try:
            self.buf.release()
        except BufferError:       # a caller built an array on .buf itself and still holds it
            pass
        try:
            mm.close()
        except BufferError:
            log.debug("segment %s: views still alive; unmapped when they are collected", self.name)

    def unlink(self) -> None:
        """Remove the name (mapped views stay valid). Idempotent; nothing to do for a memfd."""
        if self.name.startswith("/"):
            unlink_segment(self.name)

    def __enter__(self) -> "Segment":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Segment({self.name!r}, size={self.size if not self.closed else '-'}, owner={self.is_owner})"


def _map_existing(name: str, readonly: bool = False) -> mmap.mmap:
    shm = _open_shm(name, read_only=readonly)
    try:
        size = os.fstat(shm.fd).st_size
        if size < R.SEGMENT_PAYLOAD_OFFSET:
            raise SegmentError(name, f"is {size} bytes, smaller than a segment header")
        return mmap.mmap(shm.fd, size, access=mmap.ACCESS_READ if readonly else mmap.ACCESS_WRITE)
    finally:
        shm.close_fd()


def _decode_header(name: str, h, mapped_bytes: int) -> SegmentInfo:
    if bytes(h["magic"]) != R.SEGMENT_MAGIC:
        raise SegmentError(name, "no hostmq segment magic (foreign, or its creator has not finished)")
    if int(h["size_bytes"]) != mapped_bytes or int(h["header_bytes"]) != R.SEGMENT_PAYLOAD_OFFSET:
        raise SegmentError(name, f"header says {int(h['size_bytes'])} bytes, mapping is {mapped_bytes}")
    try:
        kind = bytes(h["kind"]).decode("ascii")
    except UnicodeDecodeError:
        raise SegmentError(name, "kind tag is not ASCII") from None
    return SegmentInfo(name, kind, int(h["layout_version"]), int(h["owner_pid"]),
                       int(h["owner_start_ticks"]), bytes(h["boot_id"]).ljust(16, b"\0"),
                       int(h["generation"]), int(h["size_bytes"]), int(h["created_ms"]))


def read_info(name: str) -> SegmentInfo:
    """Header of any hostmq segment, whatever its kind (SegmentNotFoundError / SegmentError)."""
    mm = _map_existing(name, readonly=True)
    mapped = len(mm)
    try:
        hdr = np.frombuffer(mm, dtype=R.SEGMENT_HEADER, count=1).copy()    # copy: mm closes below
    finally:
        mm.close()
    return _decode_header(name, hdr[0], mapped)


def shm_free_bytes() -> int:
    """Free bytes in /dev/shm, to check at start-up (docs/internals.md fact 6) before creating big segments."""
    st = os.statvfs(SHM_DIR)
    return st.f_bavail * st.f_frsize


def unlink_segment(name: str) -> bool:
    """Unlink a segment name; False if it was already gone."""
    try:
        posix_ipc.unlink_shared_memory(name)
        return True
    except posix_ipc.ExistentialError:
        return False


def unlink_semaphore(name: str) -> bool:
    """Unlink a semaphore name; False if it was already gone."""
    try:
        posix_ipc.unlink_semaphore(name)
        return True
    except posix_ipc.ExistentialError:
        return False


def _entries(file_prefix: str) -> list[str]:
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(file_prefix))


def list_segments(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Names (``/hostmq.…``) of the shared-memory segments whose name starts with ``prefix``."""
    file_prefix = prefix.lstrip("/")
    return ["/" + n for n in _entries(file_prefix)]


def list_semaphores(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Names of the POSIX semaphores whose name starts with ``prefix``."""
    file_prefix = SEM_FILE_PREFIX + prefix.lstrip("/")
    return ["/" + n[len(SEM_FILE_PREFIX):] for n in _entries(file_prefix)]


def _age_s(name: str) -> float:
    try:
        return time.time() - os.stat(os.path.join(SHM_DIR, name.lstrip("/"))).st_mtime
    except FileNotFoundError:
        return 0.0


def reclaim_stale(prefix: str = DEFAULT_PREFIX, *, grace_s: float = 60.0,
                  orphan_semaphores: bool = False) -> list[str]:
    """Unlink segments under ``prefix`` whose owner is dead, with their same-name semaphores.

    A segment without a readable header (no magic) is unlinked only once older than ``grace_s``.
    With ``orphan_semaphores`` (for the holder of the broker lock, docs/internals.md fact 3) semaphores that have
    no segment of their name are unlinked too. Returns every name unlinked, segments first.
    """
    gone: list[str] = []
    sems: list[str] = []
    for name in list_segments(prefix):
        try:
            stale = not info_owner_alive(read_info(name))
        except SegmentNotFoundError:
            continue
        except SegmentError:
            stale = _age_s(name) > grace_s
        if stale and unlink_segment(name):
            log.info("reclaimed stale shared-memory segment %s", name)
            gone.append(name)
            if unlink_semaphore(name):
                sems.append(name)
    if orphan_semaphores:
        live = set(list_segments(prefix))
        for name in list_semaphores(prefix):
            if name not in live and name not in sems and unlink_semaphore(name):
                log.info("reclaimed orphan semaphore %s", name)
                sems.append(name)
    return gone + [s for s in sems if s not in gone]
