"""When to delete commitlog files and when to refuse writes (RocketMQ CleanCommitLogService).

Pure decisions, time and disk usage passed in. Files older than ``file_reserved_hours`` go at the
``delete_when`` hours, or at any hour once the disk is fuller than ``disk_max_used_ratio``; above
``disk_force_clean_ratio`` the oldest files go even if they have not expired; above
``disk_refuse_ratio`` writes are refused.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass


@dataclass(frozen=True)
class CleanDecision:
    delete_expired: bool      # delete files past the reserved time
    force: bool               # delete the oldest files even if not expired
    refuse_writes: bool       # the disk is too full to accept messages
    disk_ratio: float


def is_delete_hour(hour: int, delete_when: str) -> bool:
    """``delete_when`` is RocketMQ's ``deleteWhen``: hours like "04" or "04;16"."""
    for part in delete_when.split(";"):
        part = part.strip()
        if part.isdigit() and int(part) == hour:
            return True
    return False


def decide(hour: int, disk_ratio: float, delete_when: str, max_used_ratio: float,
           force_clean_ratio: float, refuse_ratio: float, manual: bool = False) -> CleanDecision:
    over = disk_ratio > max_used_ratio
    return CleanDecision(
        delete_expired=manual or over or is_delete_hour(hour, delete_when),
        force=disk_ratio > force_clean_ratio,
        refuse_writes=disk_ratio > refuse_ratio,
        disk_ratio=disk_ratio,
    )


def disk_used_ratio(path: str) -> float:
    u = shutil.disk_usage(path)
    return u.used / u.total if u.total else 0.0


def delete_expired_commitlog(mfq, cfg, covered_phys: int, now_ms: float | None, force: bool) -> list[str]:
    """RocketMQ CleanCommitLogService: delete the oldest commitlog files older than
    ``file_reserved_hours`` (the oldest ones anyway if ``force``), at most ``delete_files_batch_max``
    per pass, and never one the dispatcher has not covered (``covered_phys``) nor the last one."""
    gone: list[str] = []
    while len(gone) < cfg.delete_files_batch_max:
        first = mfq.first()
        if first is None or first.file_end_offset > covered_phys or first is mfq.last():
            break
        step = mfq.delete_expired_by_time(cfg.file_reserved_hours * 3_600_000, now_ms, force, 1)
        if not step:
            break
        gone += step
    return gone
