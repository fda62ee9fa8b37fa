"""`kiln serve --workers N`: N server processes on one port (SO_REUSEPORT; the kernel spreads
connections), each with cores/N threads. The parent forwards SIGTERM/SIGINT and waits for all.
Processes, not threads: one TVM runtime per process runs one model call at a time."""

from __future__ import annotations

import signal
import subprocess
import sys

from ..errors import OptionsError
from ..runtime.hostinfo import physical_cores


def run_workers(argv: list[str], workers: int, port: int, threads: int | None) -> int:
    if port == 0:
        raise OptionsError(
            "--workers needs a fixed --port (workers share it)", where="--workers", fix="e.g. --port 8080"
        )
    per = threads or max(1, (physical_cores() - 1) // workers)  # one core left for the event loops
    cmd = [sys.executable, "-m", "kiln", "serve", *argv, "--workers", "1", "--reuse-port", "--threads", str(per)]
    procs = [subprocess.Popen(cmd) for _ in range(workers)]

    def forward(sig, _frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    codes = [p.wait() for p in procs]
    return max(codes, key=abs)
