"""The fault-injection run (issue 15): ``hostmq faults`` as a bench script.

    .venv/bin/python bench/faults.py [ROOT] [--trials N] [--kinds K,..] [--configs async,sync,pool]
                                     [--out DIR] [--fuzz-cases N] [--seed S]

Same options and code as ``hostmq faults`` (``hostmq/cli/faults.py``, ``hostmq.faults``); the results
go to ``bench/results/faults`` unless ``--out`` says otherwise. The full run the README quotes is

    .venv/bin/python bench/faults.py --trials 1000 --fuzz-cases 33400      # every kind, async + pool + sync
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hostmq.cli.main import main  # noqa: E402

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "faults")

if __name__ == "__main__":
    args = sys.argv[1:]
    if not any(a == "--out" or a.startswith("--out=") for a in args):
        args += ["--out", DEFAULT_OUT]
    sys.exit(main(["faults", *args]))
