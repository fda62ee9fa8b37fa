"""The builder `kiln tune` compiles candidates with: one worker process, started once per run and
reused, so a candidate costs its compile and not a pool start-up (MetaSchedule's LocalBuilder
starts a pool per batch), and with a time limit per candidate, enforced from this side: a
candidate whose LLVM code generation runs away (seen: a ResNet-50 candidate that held a `--budget`
run past its budget; benchmarks/history.md) is
killed with its worker, recorded as a failed build, and the next candidate gets a fresh worker.

The worker receives the candidate as TVM's JSON and the target as its dict, compiles it, and
exports the shared library into `out_dir` (one folder per artifact: MetaSchedule's runner deletes
the artifact's folder when it is done)."""

from __future__ import annotations

import multiprocessing as mp

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder

from ...errors import ResourceError
from .build_worker import compile_candidate, serve

BUILD_TIMEOUT_S = 30.0  # a candidate normally compiles in well under a second (MetaSchedule: 30 s too)
START_TIMEOUT_S = 120.0  # the worker's start-up (importing TVM) is not a candidate's fault


@derived_object
class WorkerBuilder(PyBuilder):
    def __init__(self, out_dir: str, timeout_s: float = BUILD_TIMEOUT_S, build=compile_candidate):
        super().__init__()
        self.out_dir, self.timeout_s, self.build_fn = out_dir, timeout_s, build
        self._proc = self._conn = None
        self._ready = False
        self.timeouts = 0

    def launch(self) -> None:
        """Spawn the worker (if it is not running) without waiting for it: its start-up (importing
        TVM, seconds) then overlaps whatever the caller does next; start() waits for it."""
        if self._proc is not None and self._proc.is_alive():
            return
        ctx = mp.get_context("spawn")  # never fork a process that holds TVM's thread pool
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=serve, args=(child, self.build_fn), daemon=True)
        self._proc.start()
        self._ready = False
        child.close()

    def start(self) -> None:
        """Start the worker (if it is not running) and wait until it is ready; ResourceError when it
        does not come up."""
        if self._ready and self._proc is not None and self._proc.is_alive():
            return
        self.launch()
        try:
            if not self._conn.poll(START_TIMEOUT_S):
                raise EOFError(f"no answer within {START_TIMEOUT_S:.0f} s")
            self._conn.recv()
            self._ready = True
        except (EOFError, OSError) as e:
            self.close()
            raise ResourceError(
                f"the build worker process did not start ({e or 'it exited'})",
                where="kiln tune",
                fix="check that the machine can start a Python process with TVM (memory, process limits) and retry; "
                "records tuned so far are kept",
            ) from None

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join()
        self._proc = self._conn = None
        self._ready = False

    def _build_one(self, bi) -> BuilderResult:
        try:
            self.start()  # again after a kill; called from MetaSchedule's C++ side, so no exception may escape
        except ResourceError as e:
            return BuilderResult(None, str(e))
        self._conn.send((tvm.ir.save_json(bi.mod), bi.target.export(), self.out_dir))
        if not self._conn.poll(self.timeout_s):
            self.timeouts += 1
            self.close()  # the next candidate gets a fresh worker
            return BuilderResult(None, f"build timed out after {self.timeout_s:.0f} s (killed)")
        try:
            status, value = self._conn.recv()
        except EOFError:  # the worker died (a crash in LLVM): a failed candidate, not a failed run
            self.close()
            return BuilderResult(None, "the build worker died")
        return BuilderResult(value, None) if status == "ok" else BuilderResult(None, value)

    def build(self, build_inputs):
        return [self._build_one(bi) for bi in build_inputs]

    def __del__(self):
        self.close()
