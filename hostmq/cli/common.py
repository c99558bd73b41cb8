"""Helpers shared by the CLI verbs: root and config resolution, foreground running."""
from __future__ import annotations

import datetime
import os
import threading

from .. import logsetup
from ..access import secure_root
from ..config import Config
from ..errors import ValidationError
from ..logsetup import LEVELS
from ..process import ignore_stop_signals, stop_on_signals
from ..root import RootPaths

EXIT_OK = 0             # every command's exit statuses (2: usage, argparse's own)
EXIT_ERROR = 1
EXIT_USAGE = 2


def add_root_and_config(p) -> None:
    p.add_argument("root", nargs="?", default=None, help="root directory (default $HOSTMQ_ROOT or ~/.hostmq)")
    p.add_argument("--config", default=None, help="TOML config file (default ROOT/hostmq.toml if present)")
    p.add_argument("--log-level", default=None, type=str.upper, choices=LEVELS,
                   help="DEBUG, INFO, … (default $HOSTMQ_LOG_LEVEL, else [logging] level, else INFO)")


def load_config(root: str, config_file: str | None) -> Config:
    if config_file:
        return Config.load(config_file)
    default = RootPaths(root).config_file
    return Config.load(default) if os.path.exists(default) else Config()


def raw_config(root: str, config_file: str | None) -> dict:
    """The config file's tables as written (``{}`` without one): what the user set, before defaults."""
    import tomllib
    path = config_file or RootPaths(root).config_file
    if not os.path.exists(path):
        return {}
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError):
        return {}                   # load_config has already said what is wrong with it


def run_foreground(run, config, cfg: Config, root: str, log_level: str | None = None, name: str = "") -> int:
    """Run a process module's ``run(config, stop)`` here, logging as ``cfg.logging`` says (``name``:
    this server in its lines and log file); Ctrl-C and SIGTERM stop it cleanly."""
    logsetup.configure(cfg.logging, root, log_level, name)
    secure_root(root, cfg.access.group)
    stop = threading.Event()
    stop_on_signals(stop, ignore_sigint=False)
    try:
        return run(config, stop)
    finally:
        ignore_stop_signals()


def print_table(rows: list[dict], columns: list[str], out=None) -> None:
    """Rows as aligned text columns (the header is the column names)."""
    import sys
    out = out or sys.stdout
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    out.write("  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip() + "\n")
    for row in cells:
        out.write("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() + "\n")


def print_json(data) -> None:
    import sys

    import orjson
    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2, default=str).decode() + "\n")


def body_text(body: bytes, limit: int = 200) -> str:
    """A body for a terminal: UTF-8 text as is, anything else as a bytes repr."""
    try:
        text = body.decode("utf-8")
        if text.isprintable() or all(ch.isprintable() or ch in "\t" for ch in text):
            return text if len(text) <= limit else text[:limit] + "…"
    except UnicodeDecodeError:
        pass
    r = repr(body[:limit])
    return r + ("…" if len(body) > limit else "")


def parse_time_ms(text: str, flag: str = "--timestamp") -> int:
    """Milliseconds since the epoch, or an ISO 8601 time (local time unless it names a zone)."""
    if text.isdigit():
        return int(text)
    try:
        return int(datetime.datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise ValidationError(f"{flag} {text!r} is neither milliseconds nor an ISO time "
                              "(ISO 8601, such as 2026-11-23T07:30:00)") from None


def iso_ms(ms: int) -> str:
    """A store time for people: ISO 8601 in UTC with milliseconds (``2026-11-23T07:30:00.123Z``)."""
    t = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
