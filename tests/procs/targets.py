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


def busy_until_stopped(config, stop) -> int:
    """As ``until_stopped``, but the main thread waits on Events all the time, in short waits: a
    signal handler that took an Event's lock would often find it held by this very thread."""
    with open(config["pidfile"], "a") as f:
        f.write(f"{os.getpid()}\n")
    import threading
    other = threading.Event()
    while not stop.is_set():
        other.wait(0.0005)
    with open(config["pidfile"] + ".stopped", "a") as f:
        f.write(f"{os.getpid()}\n")
    return 0
