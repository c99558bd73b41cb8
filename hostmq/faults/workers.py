"""The harness's side of the workload processes (``workload``): start, command, kill and restart one
worker slot across its incarnations.

A slot (``p0``, ``c0``, …) runs one process at a time; each (re)start is a new incarnation with its own
name (``p0.2``) and log file ``LOG_DIR/p0.2.log`` (stderr in ``p0.2.err``). Commands go to the worker's
stdin, answers come back on its stdout (read by a thread into a queue, so a stopped or killed worker
never blocks the harness).
"""
from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time


class WorkerHandle:
    """One worker slot (``p0``, ``c0``, …) across its incarnations: start, command, kill, restart."""

    def __init__(self, base: str, kind: str, root: str, log_dir: str, args: list[str]) -> None:
        self.base, self.kind, self.root, self.log_dir, self.args = base, kind, root, log_dir, args
        self.incarnation = 0
        self.proc: subprocess.Popen | None = None
        self.lines: queue.Queue = queue.Queue()

    @property
    def name(self) -> str:
        return f"{self.base}.{self.incarnation}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_paths(self) -> list[str]:
        """Every incarnation's log, oldest first."""
        return [os.path.join(self.log_dir, f"{self.base}.{i}.log") for i in range(1, self.incarnation + 1)]

    def start(self, timeout_s: float = 60.0) -> None:
        from ..errors import FaultHarnessError
        self.incarnation += 1
        name = self.name
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))] +
            [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
        with open(os.path.join(self.log_dir, f"{name}.err"), "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hostmq.faults.workload", self.kind, self.root, "--name", name,
                 "--log", os.path.join(self.log_dir, f"{name}.log"), *self.args],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env)
        self.lines = queue.Queue()
        threading.Thread(target=_pump, args=(self.proc.stdout, self.lines), daemon=True).start()
        if self.expect("ready", timeout_s) is None:
            self.kill()
            raise FaultHarnessError(f"worker {name} did not start within {timeout_s:.0f} s: {self.err_tail()}")

    def err_tail(self, lines: int = 5) -> str:
        try:
            with open(os.path.join(self.log_dir, f"{self.name}.err"), "rb") as f:
                return " | ".join(f.read().decode("utf-8", "replace").strip().splitlines()[-lines:])
        except OSError:
            return ""

    def expect(self, prefix: str, timeout_s: float) -> str | None:
        """The next stdout line starting with ``prefix`` within ``timeout_s`` (None: none came)."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                line = self.lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if line is None:            # stdout closed: the process is gone
                return None
            if line.startswith(prefix):
                return line

    def command(self, line: str) -> bool:
        try:
            self.proc.stdin.write((line + "\n").encode())
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, ValueError, OSError):
            return False

    def go(self, trial: int) -> bool:
        return self.command(f"go {trial}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = 9) -> None:
        if self.alive():
            try:
                os.kill(self.proc.pid, sig)
            except ProcessLookupError:
                pass
        if sig == 9 and self.proc is not None:
            self.proc.wait(30)

    def quit(self, timeout_s: float = 30.0) -> int | None:
        """Stop the worker cleanly (SIGKILL if it does not); its exit code."""
        if self.proc is None:
            return None
        self.command("quit")
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.returncode


def _pump(stream, lines: queue.Queue) -> None:
    for raw in stream:
        lines.put(raw.decode("utf-8", "replace").strip())
    lines.put(None)


