"""The import contract (issue 28): hostmq's packages form layers, each importing only from below —

* L0 the ground: ``errors``, ``config``, ``root``, ``records`` (and its native codec, whose spec —
  ``records``' ``py_*`` references and ``record_check`` — sits on the same layer: a native module lives
  in the layer of the Python it mirrors), ``message`` and the small modules beside them (files, locks,
  logging, processes, the shared-memory layouts);
* L1 ``protocol/`` (the control schema, route records included), ``shm/`` (segments, rings, futex
  words), ``transport`` (the control server), ``remoting`` (its client) and ``access`` (who may
  reach a root's files, sockets and segments);
* L2 ``store/`` (commitlog, consume queues, index, readers, the tag filter) and ``live/`` (what a
  running broker publishes — state segment, role, group, role lock — and an instance's runtime paths);
* L3 ``semantics/`` (delay levels and schedule records, retry and DLQ topics, transaction records,
  system topics: RocketMQ's ``common``) and ``ingress/`` (a producer's end of the ring, which the
  broker's scheduler uses too);
* L4 ``namesrv/``, ``broker/``, ``client/`` — siblings that never import each other;
* L5 what assembles them: ``admin/`` (Admin, promotion), ``cluster``, ``cli/``, ``aio/``, ``spark/``, ``bench/``, ``faults/``, the
  exporter and ``hostmq`` itself (the public facade).

``KNOWN`` lists imports that break it while a move is under way (none now) — a ratchet: a new one
fails this test, and so does one that is gone but still listed (take it off the list). Imports inside ``if
TYPE_CHECKING:`` are annotations only and do not count.
"""
from __future__ import annotations

import ast
import pathlib
import re

import pytest

pytestmark = pytest.mark.timeout(60)

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "hostmq"
LAYERS = {
    0: {"errors", "config", "root", "records", "record_fields", "record_check", "message", "fsutil", "jsonfile",
        "locks", "logsetup", "shm_layouts", "process", "sdnotify", "waiting", "_codec"},
    1: {"protocol", "shm", "transport", "transport_outbox", "remoting", "access"},
    2: {"store", "live"},
    3: {"semantics", "ingress"},
    4: {"namesrv", "broker", "client"},
    5: {"admin", "aio", "cluster", "cli", "spark", "bench", "faults", "observe", "metrics", "metrics_http", "reference",
        "__main__", "hostmq"},
}
LAYER = {u: n for n, us in LAYERS.items() for u in us}
SIBLINGS_APART = 4          # the layer whose packages never import each other

# (importing module, imported unit): what the re-cut removes. Only ever shorter.
KNOWN: set[tuple[str, str]] = set()


def unit(module: str) -> str:
    """``hostmq.broker.writer`` → ``broker``; ``hostmq.records`` → ``records``; ``hostmq`` → ``hostmq``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _type_checking_only(tree: ast.AST) -> set[int]:
    skip = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and getattr(n.test, "id", getattr(n.test, "attr", None)) == "TYPE_CHECKING":
            skip |= {id(m) for b in n.body for m in ast.walk(b)}
    return skip


def _is_module(package_dir: pathlib.Path, dotted: list[str]) -> bool:
    path = package_dir.parent.joinpath(*dotted)
    return (path.with_suffix(".py").exists() or (path / "__init__.py").exists()
            or path.with_suffix(".c").exists())         # a native module: its source is beside it


def imports(package_dir: pathlib.Path = PACKAGE) -> list[tuple[str, str]]:
    """(module, imported hostmq module) for every import in the package, function-level ones included."""
    out = []
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = module if parts[-1] == "__init__" else module.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_only(tree)
        for n in ast.walk(tree):
            if id(n) in skip:
                continue
            if isinstance(n, ast.Import):
                targets = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                if n.level:
                    base = package.split(".")[:len(package.split(".")) - (n.level - 1)]
                    targets = [".".join(base + [n.module])] if n.module else \
                        [".".join(base + [a.name]) if _is_module(package_dir, base + [a.name]) else ".".join(base)
                         for a in n.names]     # ``from .. import __version__`` imports the package
                else:
                    targets = [n.module] if n.module else []
            else:
                continue
            out += [(module, t) for t in targets if t == "hostmq" or t.startswith("hostmq.")]
    return out


def violations(package_dir: pathlib.Path = PACKAGE) -> set[tuple[str, str]]:
    edges = imports(package_dir)
    units = {(unit(a), unit(b)) for a, b in edges}
    out = set()
    for a, b in edges:
        ua, ub = unit(a), unit(b)
        if ua == ub:
            continue
        la, lb = LAYER[ua], LAYER[ub]
        if lb > la or (lb == la == SIBLINGS_APART) or ((ub, ua) in units and lb == la):
            out.add((a, ub))
    return out


def test_every_package_and_module_has_a_layer():
    found = {unit(m) for m, _ in imports()} | {unit(t) for _, t in imports()}
    found |= {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
              if (p.suffix == ".py" or (p / "__init__.py").exists()) and p.stem != "__init__"}
    assert not found - set(LAYER), f"place these in LAYERS: {sorted(found - set(LAYER))}"


def test_imports_only_go_down_but_for_the_known_ones():
    got = violations()
    new, fixed = sorted(got - KNOWN), sorted(KNOWN - got)
    assert not new, f"imports against the layers (a lower layer, or a sibling of {SIBLINGS_APART}): {new}"
    assert not fixed, f"no longer imported — take them off KNOWN: {fixed}"


def test_the_walker_sees_relative_function_level_and_guarded_imports(tmp_path):
    """The contract is only as good as its walker: a relative import inside a function counts, one
    under ``if TYPE_CHECKING:`` does not, ``from .. import NAME`` of a non-module is the package."""
    pkg = tmp_path / "hostmq"
    (pkg / "store").mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '0'\n")
    (pkg / "store" / "__init__.py").write_text("")
    (pkg / "store" / "x.py").write_text(
        "from typing import TYPE_CHECKING\nfrom .. import __version__\nif TYPE_CHECKING:\n    from ..client import y\n"
        "def f():\n    from ..broker.state import BrokerState\n    return BrokerState\n")
    got = imports(pkg)
    assert ("hostmq.store.x", "hostmq.broker.state") in got and ("hostmq.store.x", "hostmq") in got
    assert not any(t.startswith("hostmq.client") for _, t in got)
    assert violations(pkg) == {("hostmq.store.x", "broker"), ("hostmq.store.x", "hostmq")}


def native_misplacements(package_dir: pathlib.Path = PACKAGE) -> dict[str, dict[str, int]]:
    """For each C source in the package: the Python modules it names as its references
    (``hostmq/….py`` in its text) that sit in another layer than the native module itself."""
    out = {}
    for src in sorted(package_dir.rglob("*.c")):
        native = unit(".".join(src.relative_to(package_dir.parent).with_suffix("").parts))
        mirrored = {unit(m[:-3].replace("/", ".")) for m in re.findall(r"hostmq/[\w/]+\.py", src.read_text())}
        wrong = {m: LAYER.get(m, -1) for m in mirrored if LAYER.get(m) != LAYER.get(native)}
        if wrong or native not in LAYER or not mirrored:
            out[native] = wrong
    return out


def test_native_modules_sit_in_the_layer_of_the_python_they_mirror():
    """A C module is a fast path of Python references (its spec, compared with it by the tests): it
    belongs to their layer, so a ground-floor codec never mirrors a broker module (issue 28)."""
    assert list(PACKAGE.rglob("*.c")), "hostmq/_codec.c at least"
    assert not native_misplacements(), native_misplacements()


def test_a_native_module_mirroring_a_higher_layer_is_found(tmp_path):
    pkg = tmp_path / "hostmq"
    pkg.mkdir()
    (pkg / "_codec.c").write_text("/* mirrors hostmq/records.py and hostmq/broker/validate.py */\n")
    assert native_misplacements(pkg) == {"_codec": {"broker": 4}}
