"""Helpers shared by the CLI verbs: root and config resolution, foreground running."""
from __future__ import annotations

import logging
import os
import threading

from ..config import Config
from ..process import stop_on_signals
from ..root import RootPaths


def add_root_and_config(p) -> None:
    p.add_argument("root", nargs="?", default=None, help="root directory (default $HOSTMQ_ROOT or ~/.hostmq)")
    p.add_argument("--config", default=None, help="TOML config file (default ROOT/hostmq.toml if present)")


def load_config(root: str, config_file: str | None) -> Config:
    if config_file:
        return Config.load(config_file)
    default = RootPaths(root).config_file
    return Config.load(default) if os.path.exists(default) else Config()


def run_foreground(run, config) -> int:
    """Run a process module's ``run(config, stop)`` here; Ctrl-C and SIGTERM stop it cleanly."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stop = threading.Event()
    stop_on_signals(stop, ignore_sigint=False)
    return run(config, stop)
