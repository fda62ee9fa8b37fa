"""The CUDA backend (NVIDIA GPUs): the graph clean-up, TVM's lowering and fusion, then tuned records or
dlight's GPU rules. No NCHWc layout and no CPU epilogue/legalization tricks (they are CPU schedules'
needs); the library has no thread pool, and Kiln ships no GPU records."""

from __future__ import annotations

from tvm import relax

from ...schedules.rules.apply import ApplyTuningDatabase
from ...schedules.rules.gpu import ApplyGPUSchedules
from ...target import Kind
from .. import passes as kp
from ..pipeline import PassSpec, Stage
from . import cpu
from .base import Backend
from .records import metaschedule_db, no_shipped_records

_SHARED_GRAPH = (
    "StaticDataflow",
    "ClipTakeIndices",
    "LowerQDQ",
    "FoldConstants",
    "CanonicalizeClip",
    "RemoveNoOps",
    "FoldBatchNorm",
    "RemoveZeroChannels",
    "DropDeadConvTaps",
    "ConvTransposeAsConv",
    "ResizeAsMatmul",
    "Quantize",
    "MixedPrecision",
    "DeadCode",
    "DecomposeOpsForInference",
)


def _cpu_row(name: str) -> PassSpec:
    return next(s for s in cpu.ROWS if s.name == name)


def _graph_row(name: str) -> PassSpec:
    """The CPU's graph row of that name; channel pruning keeps any channel count (no NCHWc block here)."""
    if name == "RemoveZeroChannels":
        return PassSpec(name, lambda o: kp.RemoveZeroChannels(1), 1)
    return _cpu_row(name)


GRAPH_ROWS: tuple[PassSpec, ...] = tuple(_graph_row(n) for n in _SHARED_GRAPH)
LOWER_ROWS: tuple[PassSpec, ...] = (
    PassSpec("LegalizeOps", lambda o: relax.transform.LegalizeOps(), 0, required=True, graph=False),
    *(_cpu_row(n) for n in ("AnnotateTIROpPattern", "FoldConstantTIR", "FuseOps", "FuseTIR", "DeadCodeElimination")),
)
SCHEDULE_ROWS: tuple[PassSpec, ...] = (
    # dlight defaults, no ledger of CPU rules: records apply as they are
    PassSpec("ApplyTuningDatabase", lambda o: ApplyTuningDatabase(o.tuning_db), 0, graph=False),
    PassSpec("GPUSchedules", lambda o: ApplyGPUSchedules(o.target.tvm()), 0, graph=False),  # kiln tune disables it
)
ROWS: tuple[PassSpec, ...] = GRAPH_ROWS + LOWER_ROWS + SCHEDULE_ROWS


class CUDABackend(Backend):
    kind = "cuda"
    target_kind = Kind.CUDA
    device = "cuda"
    schedule_row = "GPUSchedules"
    recurrence_kernel = False  # the recurrence kernel is CPU code
    thread_pool = False

    def rows(self, stage: Stage) -> tuple[PassSpec, ...]:
        by_stage = {Stage.GRAPH: GRAPH_ROWS, Stage.LOWER: LOWER_ROWS, Stage.SCHEDULE: SCHEDULE_ROWS}
        return by_stage[stage]

    def all_rows(self) -> list[PassSpec]:
        return list(ROWS)

    def tuning_db(self, path, target) -> str | None:
        return metaschedule_db(path, target, shipped=False)

    def tuning_records(self, tuning_db: str | None, target, root) -> str:
        return no_shipped_records(tuning_db, target, root)


CUDA = CUDABackend()
