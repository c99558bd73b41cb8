"""``python -m hostmq``: the ``hostmq`` command, for environments without the console script on PATH."""
import sys

from .cli.main import main

if __name__ == "__main__":
    sys.exit(main())
