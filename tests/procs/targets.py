"""Process targets used by tests/test_process.py (run(config, stop) modules, as hostmq's own)."""
from __future__ import annotations

import os
import time


def until_stopped(config, stop) -> int:
    """Write our pid to config['pidfile'], then wait for SIGTERM; exit 0."""
    with open(config["pidfile"], "a") as f:
        f.write(f"{os.getpid()}\n")
    while not stop.wait(0.05):
        pass
    with open(config["pidfile"] + ".stopped", "a") as f:
        f.write(f"{os.getpid()}\n")
    return 0


def crash_soon(config, stop) -> int:
    with open(config["pidfile"], "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(0.05)
    return 3
