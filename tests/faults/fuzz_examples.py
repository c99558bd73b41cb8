"""Stand-in fuzzers for testing the harness's fuzzer runner (registered only inside a test)."""
from __future__ import annotations

from hostmq.faults import FuzzResult


def ok(workdir: str, cases: int, seed: int) -> list[FuzzResult]:
    with open(f"{workdir}/ran", "w") as f:
        f.write(f"{cases} {seed}")
    return [FuzzResult("example:a", cases), FuzzResult("example:b", cases, ["case 3 broke"])]


def boom(workdir: str, cases: int, seed: int) -> list[FuzzResult]:
    raise RuntimeError("the fuzzer itself is broken")
