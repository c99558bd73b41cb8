"""How every hostmq process logs: level, destination, format (README "Running in production").

The level is, first found: ``--log-level`` (the CLI exports it as ``HOSTMQ_LOG_LEVEL`` so that the
processes it starts — a broker's children, ``hostmq up``'s servers — inherit it), the
``HOSTMQ_LOG_LEVEL`` environment variable, the ``[logging] level`` of the configuration.

The destination: stderr, or with ``[logging] file`` a file rotated by size (``max_bytes``, ``backups``)
— one file per process, named after the file and the process (``hostmq.log`` → ``hostmq.namesrv-0.log``,
``hostmq.broker-a.log``, ``hostmq.broker-a.writer.log``), because size rotation is not safe with
several processes writing one file.
Under systemd (``JOURNAL_STREAM`` names our stderr) records go to stderr without a timestamp (the
journal stamps them) and with the ``<N>`` priority prefix journald reads, so ``journalctl -p warning``
works.
"""
from __future__ import annotations

import logging
import logging.handlers
import os
import sys

from .config import LoggingConfig
from .errors import ConfigError

LEVEL_ENV = "HOSTMQ_LOG_LEVEL"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_JOURNAL_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}


def check_level(level: str) -> str:
    up = str(level).upper()
    if up not in LEVELS:
        raise ConfigError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    return up


def chosen_level(cfg: LoggingConfig, cli_level: str | None = None, env=None) -> str:
    """``--log-level`` > ``HOSTMQ_LOG_LEVEL`` > ``[logging] level``."""
    env = os.environ if env is None else env
    return check_level(cli_level or env.get(LEVEL_ENV) or cfg.level)


def under_journal(stream=None, env=None) -> bool:
    """True when our stderr is the journal's stream (systemd sets ``JOURNAL_STREAM=dev:inode``)."""
    env = os.environ if env is None else env
    want = env.get("JOURNAL_STREAM", "")
    if not want:
        return False
    try:
        st = os.fstat((stream or sys.stderr).fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return want == f"{st.st_dev}:{st.st_ino}"


class JournalFormatter(logging.Formatter):
    """``<6>broker-a.writer hostmq.broker.writer INFO message``: journald's priority prefix, no timestamp."""

    def __init__(self, name: str) -> None:
        super().__init__(f"{name} %(name)s %(levelname)s %(message)s" if name else
                         "%(name)s %(levelname)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        prio = _JOURNAL_PRIORITY.get(record.levelno, 6)
        return "\n".join(f"<{prio}>{line}" for line in super().format(record).splitlines())


def log_file_for(path: str, root: str | None, name: str = "") -> str:
    """The file a process logs to: ``path`` (relative: under the root's ``logs/``), with ``.NAME``
    before the extension."""
    if root and not os.path.isabs(path):
        path = os.path.join(root, "logs", path)
    if name:
        stem, ext = os.path.splitext(path)
        path = f"{stem}.{name}{ext or '.log'}"
    return path


def configure(cfg: LoggingConfig, root: str | None = None, cli_level: str | None = None, name: str = "") -> None:
    """Set up the root logger of this process (replacing what was there). ``name`` (``broker-a``,
    ``broker-a.writer``) starts every line and names its log file."""
    level = chosen_level(cfg, cli_level)
    if cli_level:
        os.environ[LEVEL_ENV] = level           # the processes we start inherit it
    prefix = f"{name} " if name else ""
    if cfg.file:
        path = log_file_for(cfg.file, root, name)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        handler: logging.Handler = logging.handlers.RotatingFileHandler(path, maxBytes=cfg.max_bytes,
                                                                       backupCount=cfg.backups)
        handler.setFormatter(logging.Formatter(f"%(asctime)s {prefix}%(name)s %(levelname)s %(message)s"))
    elif under_journal():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JournalFormatter(name))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"%(asctime)s {prefix}%(name)s %(levelname)s %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)
