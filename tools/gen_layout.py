#!/usr/bin/env python3
"""Write hostmq/include/record_layout.h (the C codec's layout constants) and hostmq/include/step_layout.h
(the writer's native step's) from hostmq/records.py.

The header is generated, never edited: records.py declares every binary layout once
(``NATIVE_LAYOUT``, ``records.codec_layout_header``) and the C codec includes what this writes. The
file is committed because pip compiles hostmq/_codec.c without running Python first.

    tools/gen_layout.py            rewrite the header (then rebuild the codec)
    tools/gen_layout.py --check    exit 1 if the committed header is stale
"""
from __future__ import annotations

import os
import sys

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TOP)
# The header is written from the Python declarations alone: a built codec that no longer agrees with
# them (the very case that needs a new header) would refuse the import, so it is kept out.
sys.modules["hostmq._codec"] = None   # type: ignore[assignment]

from hostmq import records  # noqa: E402


def main(argv: list[str]) -> int:
    for name, text in ((records.CODEC_LAYOUT_HEADER, records.codec_layout_header()),
                       (records.STEP_LAYOUT_HEADER, records.step_layout_header())):
        if write(name, text, "--check" in argv):
            return 1
    return 0


def write(name: str, text: str, check: bool) -> int:
    path = os.path.join(TOP, name)
    try:
        with open(path) as f:
            current = f.read()
    except FileNotFoundError:
        current = None
    if check:
        if current != text:
            print(f"{name} is stale: run tools/gen_layout.py", file=sys.stderr)
            return 1
        return 0
    if current != text:
        with open(path, "w") as f:
            f.write(text)
        print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
