import sys

from .cli import entry

if __name__ == "__main__":  # not when a spawned worker process imports it
    sys.exit(entry())
