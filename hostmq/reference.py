"""The reference pages generated from the code: docs/cli.md from the ``hostmq`` argparse parsers and
docs/config.md from the dataclasses of ``hostmq/config.py`` (their defaults and the comment beside
each field). ``python -m hostmq.reference DOCS_DIR`` writes both; tests/docs/test_reference.py fails
when the committed pages differ from what this renders, so the pages cannot drift from the code.

The rendering reads argparse's actions rather than ``format_help()``, whose layout changes between
Python versions and terminal widths.
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import re
import sys

from . import config as config_module

CLI_HEAD = """# `hostmq` command reference

Generated from the argparse parsers by `python -m hostmq.reference docs` — do not edit by hand
(tests/docs/test_reference.py fails when this page and the parsers differ). [cli-usage.md](cli-usage.md)
shows the commands at work; every command also has `--help`.

The root is the optional first positional (`hostmq status /tmp/mq`), or `--root ROOT`, else
`$HOSTMQ_ROOT`, else `~/.hostmq`. Misuse exits 2, an error exits 1 with one line on stderr
(`hostmq: error: …`).
"""
CONFIG_HEAD = """# Configuration reference

Generated from `hostmq/config.py` by `python -m hostmq.reference docs` — do not edit by hand
(tests/docs/test_reference.py fails when this page and the code differ). Sections of
`ROOT/hostmq.toml`, of `hostmq up --config FILE` and of the `config` dict given to `LocalCluster`;
an unknown key is a `ConfigError`, and names carry their units (`_bytes`, `_ms`, `_s`). A store's
file sizes are recorded in `store.json` when it is created and win over these settings afterwards.

Store profiles (`[store] profile`) fill the four file sizes the configuration does not set:

| profile | commitlog file | consume-queue file | index file | a first root on disk |
|---|---|---|---|---|
| `production` (the config default; `hostmq broker`, `LocalCluster`, the systemd units) | 1 GiB | 300,000 entries | 5,000,000 slots, 20,000,000 entries | ≈ 1.5 GB |
| `dev` (`hostmq up` and `tools/run.sh` on a new root) | 32 MiB | 30,000 entries | 100,000 slots, 400,000 entries | ≈ 40 MB |
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return action.metavar or action.dest.upper()
    arg = ""
    if action.nargs != 0:
        if action.choices:
            arg = " {" + ",".join(str(c) for c in action.choices) + "}"
        else:
            arg = " " + (action.metavar or action.dest.upper())
    return ", ".join(action.option_strings) + arg


def _default(action: argparse.Action) -> str:
    d = action.default
    if d in (None, False, argparse.SUPPRESS) or d == [] or action.nargs == 0:
        return ""
    return f"`{d}`"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help_of(parser: argparse.ArgumentParser, name: str) -> str:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                if choice.dest == name:
                    return choice.help or ""
    return ""


def _command(lines: list[str], path: str, parser: argparse.ArgumentParser, summary: str) -> None:
    lines += ["", f"## `{path}`", ""]
    if summary:
        lines += [summary[0].upper() + summary[1:] + ("" if summary.endswith(".") else "."), ""]
    actions = [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
    subs = _subparsers(parser)
    if actions:
        lines += ["| argument | default | meaning |", "|---|---|---|"]
        for a in actions:
            lines.append(f"| `{_cell(_flags(a))}` | {_cell(_default(a))} | {_cell(a.help or '')} |")
    for name, sub in subs.items():
        _command(lines, f"{path} {name}", sub, _help_of(parser, name))


def cli_markdown() -> str:
    from .cli.main import build_parser
    parser = build_parser()
    lines = [CLI_HEAD.rstrip("\n")]
    _command(lines, "hostmq", parser, parser.description or "")      # and every subcommand under it, once
    return "\n".join(lines) + "\n"


def _field_comments(kind: type) -> dict[str, str]:
    """The comment beside each field of a config dataclass, with its continuation lines."""
    src = inspect.getsource(kind).splitlines()
    out: dict[str, str] = {}
    last = None
    for line in src:
        m = re.match(r"^    (\w+): [^=]+=[^#]*(?:#\s?(.*))?$", line)
        if m:
            last = m.group(1)
            out[last] = (m.group(2) or "").strip()
            continue
        c = re.match(r"^\s+#\s?(.*)$", line)
        if c and last is not None and line.index("#") > 20 and out.get(last):
            out[last] += " " + c.group(1).strip()       # a comment continued under the previous one
        else:
            last = None
    return out


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int) and abs(v) >= 1 << 20 and v % (1 << 20) == 0:
        return f"{v:,} ({v >> 20} MiB)"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return repr(v)


def config_markdown() -> str:
    lines = [CONFIG_HEAD.rstrip("\n")]
    for section, kind in config_module._SECTION_TYPES.items():
        comments = _field_comments(kind)
        lines += ["", f"## `[{section}]`", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        for f in dataclasses.fields(kind):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            lines.append(f"| `{f.name}` | {type(default).__name__} | `{_cell(_value(default))}` | "
                         f"{_cell(comments.get(f.name, ''))} |")
    return "\n".join(lines) + "\n"


PAGES = {"cli.md": cli_markdown, "config.md": config_markdown}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    docs = argv[0] if argv else "docs"
    for name, render in PAGES.items():
        with open(os.path.join(docs, name), "w", encoding="utf-8") as f:
            f.write(render())
        print(f"wrote {os.path.join(docs, name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
