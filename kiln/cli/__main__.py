"""`python -m kiln.cli ...`, the same as `kiln ...` and `python -m kiln ...`."""

import sys

from . import entry

if __name__ == "__main__":  # not when a spawned worker process imports it
    sys.exit(entry())
