"""Every KILN_* environment variable Kiln reads, read here (docs/cli.md lists them). A knob read
deep inside a module is a knob nobody can find; one module keeps them named, documented and few."""

from __future__ import annotations

import os
from pathlib import Path

SHIPPED_TUNING_LOGS = Path(__file__).resolve().parents[1] / "tuning_logs"  # records Kiln ships, per target key
TUNING_LOGS = "KILN_TUNING_LOGS"  # another folder to look for shipped records in, or "none" (the test suite sets it)


def shipped_tuning_logs() -> Path | None:
    """The folder of shipped tuning records: tuning_logs/, the folder KILN_TUNING_LOGS names, or None ("none")."""
    env = os.environ.get(TUNING_LOGS)
    if env is None:
        return SHIPPED_TUNING_LOGS
    return None if env.strip().lower() == "none" else Path(env)
