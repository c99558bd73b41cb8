"""``hostmq`` command line: one subcommand per verb, a one-line error and a named exit code on misuse.

Global options (``--root``, ``--log-level``, ``--config``) are accepted before the command as well as
after it (``hostmq --root /tmp/mq status``); ``--root`` works on every command that takes a root, as
does the optional ``[ROOT]`` positional and ``$HOSTMQ_ROOT``. An unknown command or choice gets a
"did you mean" from the known ones.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import sys

from ..errors import HostMQError

from .common import EXIT_ERROR, EXIT_OK, EXIT_USAGE  # noqa: F401  (their home; main uses them)
# (flag, the dest a command's own option or positional uses): given before the command, each lands
# in "global_<dest>" and is then handed to the command's own.
GLOBALS = (("--root", "root"), ("--log-level", "log_level"), ("--config", "config"))


POSITIONAL_HELP = {"root": "root directory (default: --root, else $HOSTMQ_ROOT, else ~/.hostmq)",
                   "topic": "topic name"}


class Parser(argparse.ArgumentParser):
    """argparse with "did you mean" on an invalid choice (a mistyped command or value)."""

    def error(self, message: str):
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m:
            choices = re.findall(r"'([^']*)'", m.group(2)) or [c.strip() for c in m.group(2).split(",")]
            close = difflib.get_close_matches(m.group(1), choices, n=1)
            if close:
                message += f"; did you mean {close[0]!r}?"
        super().error(message)


def _walk(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield from _walk(sub)


def _add_root_option(parser: argparse.ArgumentParser) -> None:
    """``--root`` after the command, on every (sub)command with a ROOT positional."""
    for p in _walk(parser):
        for a in p._actions:            # the shared positionals say what they are in --help and docs/cli.md
            if a.help is None and a.dest in POSITIONAL_HELP and not a.option_strings:
                a.help = POSITIONAL_HELP[a.dest]
        dests = {a.dest for a in p._actions}
        if p is not parser and "root" in dests and "global_root" not in dests:
            p.add_argument("--root", dest="global_root", default=argparse.SUPPRESS, metavar="ROOT",
                           help="root directory, instead of the ROOT positional")


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__
    from ..logsetup import LEVELS
    from . import (bench, broker, consume, demo, dlq, exporter, faults, ha, namesrv, offsets, query, send,
                   status, systemd, topic, up)
    p = Parser(prog="hostmq", description="RocketMQ's design on one host.")
    p.add_argument("--version", action="version", version=f"hostmq {__version__}")
    p.add_argument("--root", dest="global_root", default=None, metavar="ROOT",
                   help="root directory for the command (default $HOSTMQ_ROOT, else ~/.hostmq)")
    p.add_argument("--log-level", dest="global_log_level", default=None, type=str.upper, choices=LEVELS,
                   help="for the servers and up: DEBUG, INFO, …")
    p.add_argument("--config", dest="global_config", default=None, metavar="FILE",
                   help="for the servers and up: TOML config file")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    demo.add_parser(sub)
    for verb in (up, namesrv, broker, send, consume, topic, status, query, offsets, dlq, ha, bench, faults, systemd,
                 exporter):
        verb.add_parser(sub)
    _add_root_option(p)
    return p


def apply_globals(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Hand each global option to the command's own; refuse one the command has no use for, or one
    given twice with two values."""
    for flag, dest in GLOBALS:
        given = getattr(args, f"global_{dest}", None)
        if given is None:
            continue
        if not hasattr(args, dest):
            parser.error(f"{flag} does not apply to 'hostmq {args.command}'")
        own = getattr(args, dest)
        if own is not None and own != given:
            parser.error(f"{flag} {given} and {dest.upper().replace('_', '-')} {own} disagree; give one")
        setattr(args, dest, given)


def what_to_do(e: HostMQError) -> str:
    """The next step, for the errors a user meets first (the client's message says what is wrong)."""
    m = re.match(r"no NameServer is running under (\S+)", str(e))
    if m:
        return f" (start the cluster: `hostmq up {m.group(1)}`, or its systemd units)"
    return ""


def root_taken_for_topic(args: argparse.Namespace) -> str:
    """The optional ROOT comes before required positionals, so a forgotten argument shifts the root into
    TOPIC (`hostmq send /tmp/mq events`: no body). A topic never holds a '/': say what happened."""
    topic = getattr(args, "topic", None)
    if isinstance(topic, str) and "/" in topic and getattr(args, "root", "") is None:
        return (f"{topic!r} is a path, not a topic: the arguments are 'hostmq {args.command} [ROOT] TOPIC …' "
                f"and one after the root is missing")
    return ""


def main(argv: list[str] | None = None) -> int:
    if os.environ.get("HOSTMQ_DIE_WITH_PARENT"):     # started by LocalCluster: die with it
        from ..process import set_parent_death_signal
        set_parent_death_signal()
    parser = build_parser()
    args = parser.parse_args(argv)
    apply_globals(parser, args)
    problem = root_taken_for_topic(args)
    if problem:
        parser.error(problem)
    try:
        return args.func(args)
    except HostMQError as e:
        print(f"hostmq: error: {e}{what_to_do(e)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
