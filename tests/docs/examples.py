"""The fenced code blocks of README.md and docs/*.md, as the examples test runs them.

A block is ```` ```python ```` / ```` ```py ```` or ```` ```sh ```` / ```` ```bash ```` / ```` ```shell ````;
other fences (diagrams, listings, TOML) are not programs. The line before a block may say what to do
with it:

* ``<!-- not-run: REASON -->`` — never run (a recipe for another machine, a signature listing, …);
  the reason is required, so every exception is written down where the reader sees it;
* ``<!-- run: cluster -->`` — the command that starts the cluster the other blocks use (the
  quickstart's ``hostmq up /tmp/mq``): the test starts it once, in the background, on a fresh root.

Paths in a block: ``/tmp/mq`` is the shared cluster's root, any other ``/tmp/NAME`` a fresh
directory of the block's own — so the examples read as a user types them and run on fresh roots.
"""
from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RUN_LANGS = {"python": "python", "py": "python", "sh": "sh", "bash": "sh", "shell": "sh"}
FENCE = re.compile(r"^(\s*)```+\s*([A-Za-z0-9_+-]*)\s*$")
MARK = re.compile(r"^\s*<!--\s*(not-run|run)\s*:\s*(.*?)\s*-->\s*$")
SHARED_ROOT = "/tmp/mq"
# aio.md's programs need an event loop and a cluster of their own: tests/aio/test_examples.py runs them
# as written. Everything else under docs/ is checked here.
EXEMPT = ("aio.md",)
EXEMPT_PREFIXES: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Block:
    path: str           # relative to the top of the checkout
    line: int           # 1-based line of the opening fence
    lang: str           # "python" or "sh"
    code: str
    mark: str           # "" | "not-run" | "run"
    mark_arg: str

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def pages() -> list[str]:
    out = ["README.md"]
    docs = os.path.join(TOP, "docs")
    for name in sorted(os.listdir(docs)):
        if name.endswith(".md") and name not in EXEMPT and not name.startswith(EXEMPT_PREFIXES):
            out.append(f"docs/{name}")
    return out


def blocks_of(rel: str, text: str | None = None) -> list[Block]:
    """Every runnable-language fenced block of one page, with the marker on the line before it."""
    if text is None:
        with open(os.path.join(TOP, rel), encoding="utf-8") as f:
            text = f.read()
    lines = text.splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2).lower()
        start = i
        i += 1
        body = []
        while i < len(lines) and not re.match(rf"^{re.escape(indent)}```+\s*$", lines[i]):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1
        if lang not in RUN_LANGS:
            continue
        prev = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        mm = MARK.match(prev)
        out.append(Block(rel, start + 1, RUN_LANGS[lang], "\n".join(body) + "\n",
                         mm.group(1) if mm else "", mm.group(2) if mm else ""))
    return out


def all_blocks() -> list[Block]:
    return [b for rel in pages() for b in blocks_of(rel)]


def localise(code: str, shared_root: str, scratch: str) -> str:
    """The block's paths on this run's directories: ``/tmp/mq`` → the shared root, ``/tmp/X`` → scratch/X."""
    code = re.sub(r"/tmp/(?!mq(?![\w.-]))([\w.-]+)", lambda m: os.path.join(scratch, m.group(1)), code)
    return re.sub(r"/tmp/mq(?![\w.-])", shared_root, code)


def interrupt(proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Stop a process group a test started as a user would (Ctrl-C: SIGINT), SIGKILL it if it is still
    there after ``timeout_s``."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
