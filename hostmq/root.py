"""Resolve a hostmq root ("connect by path"): the directory that *is* an installation."""
from __future__ import annotations

import os

DEFAULT_ROOT = "~/.hostmq"


def resolve_root(root: str | os.PathLike | None = None) -> str:
    """``root``, else ``$HOSTMQ_ROOT``, else ``~/.hostmq`` — as an absolute real path."""
    chosen = root if root is not None else os.environ.get("HOSTMQ_ROOT") or DEFAULT_ROOT
    return os.path.realpath(os.path.expanduser(os.fspath(chosen)))


def broker_store_dir(root: str, broker: str) -> str:
    """``ROOT/brokers/NAME/store`` (DESIGN §3)."""
    return os.path.join(root, "brokers", broker, "store")
