"""Parent side: keeps one worker process, sends it cases, and turns a dead worker into a `crash`
and a silent one (past the time bound) into a `hang`, then starts a fresh worker."""

from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Executor:
    def __init__(self, timeout_s: float = 60.0):
        self.timeout_s = timeout_s
        self.proc: subprocess.Popen | None = None

    def _start(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fuzz.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=ROOT,
            env=env,
        )

    def run(self, kind: str, payload: bytes) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        k = kind.encode()
        try:
            self.proc.stdin.write(struct.pack("<I", len(k)) + k + struct.pack("<I", len(payload)) + payload)
            self.proc.stdin.flush()
        except BrokenPipeError:
            return self._dead()
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout_s)
        if not ready:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            return {"outcome": "hang", "detail": f"no answer within {self.timeout_s} s"}
        line = self.proc.stdout.readline()
        if not line:
            return self._dead()
        return json.loads(line)

    def _dead(self) -> dict:
        code = self.proc.wait()
        self.proc = None
        return {"outcome": "crash", "detail": f"worker died with exit code {code}"}

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(30)
        self.proc = None
