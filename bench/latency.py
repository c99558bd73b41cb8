"""Delivery latency of hostmq and of what it is measured against (issue 16), all in one run — the
same as ``hostmq bench --latency``; the bench itself is ``hostmq/bench/latency.py``.

    .venv/bin/python bench/latency.py [--quick] [--messages N] [--out DIR]    (default DIR: bench/results/latency)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hostmq.bench.latency import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
