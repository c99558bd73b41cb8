"""Config JSON files written atomically (docs/internals.md: store formats): write a temp file,
fsync, keep the old file as ``.bak``, rename into place, fsync the directory. Reading falls back to
``.bak`` when the file is missing or torn, as RocketMQ's ``ConfigManager`` does.

Ownership: each file has one writing process (the broker's control loop for ``topics.json`` and
``consumerOffset.json``, a NameServer for its KV file); readers in other processes may read it at any
time and always see a whole file.
"""
from __future__ import annotations

import logging
import os
from typing import Any

import orjson

from .errors import ConfigError
from .fsutil import FILE_MODE, ensure_dir, fsync_dir

log = logging.getLogger(__name__)


def write_json(path: str, data: Any) -> None:
    """Replace ``path`` with ``data`` as JSON, atomically and durably; the previous file becomes ``.bak``."""
    directory = os.path.dirname(path) or "."
    ensure_dir(directory)
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    with os.fdopen(fd, "wb") as f:
        f.write(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
        f.flush()
        os.fsync(f.fileno())
    if os.path.exists(path):
        os.replace(path, path + ".bak")
    os.replace(tmp, path)
    fsync_dir(directory)


def read_json(path: str, default: Any = None) -> Any:
    """The JSON in ``path``, else in ``path.bak``, else ``default`` (both missing).

    ConfigError if a file exists but neither it nor the backup parses.
    """
    errors = []
    for candidate in (path, path + ".bak"):
        try:
            with open(candidate, "rb") as f:
                return orjson.loads(f.read())
        except FileNotFoundError:
            continue
        except (OSError, orjson.JSONDecodeError) as e:
            log.warning("cannot read %s: %s", candidate, e)
            errors.append(f"{candidate}: {e}")
    if errors:
        raise ConfigError(f"cannot read {path}: {'; '.join(errors)}")
    return default
