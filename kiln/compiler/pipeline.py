"""The compile pipeline as data: an ordered list of named passes per target kind. `--disable-pass`
removes entries by name; `--opt-level` drops passes whose level is above it. Adding a pass is
adding a row."""
from __future__ import annotations

import dataclasses
from typing import Callable

from tvm import relax

from ..errors import OptionsError


@dataclasses.dataclass(frozen=True)
class PassSpec:
    name: str
    make: Callable  # () -> tvm pass
    opt_level: int  # runs when options.opt_level >= this
    required: bool = False  # cannot be disabled: the build needs it


# Relax-level passes, in order. Legalize/Annotate/FuseOps/FuseTIR are what TVM's own "zero"
# pipeline runs; tvm.compile does not fuse on CPU by itself (facts.md).
CPU_PIPELINE: list[PassSpec] = [
    PassSpec("DecomposeOpsForInference", relax.transform.DecomposeOpsForInference, 0, required=True),
    PassSpec("FoldConstant", relax.transform.FoldConstant, 1),
    PassSpec("LegalizeOps", relax.transform.LegalizeOps, 0, required=True),
    PassSpec("AnnotateTIROpPattern", relax.transform.AnnotateTIROpPattern, 0, required=True),
    PassSpec("FoldConstantTIR", relax.transform.FoldConstant, 1),
    PassSpec("FuseOps", relax.transform.FuseOps, 1),
    PassSpec("FuseTIR", relax.transform.FuseTIR, 1),
    PassSpec("DeadCodeElimination", relax.transform.DeadCodeElimination, 1),
]

PIPELINES = {"llvm": CPU_PIPELINE}


def pipeline_for(target_kind: str, opt_level: int, disabled: tuple[str, ...] = ()) -> list[PassSpec]:
    specs = PIPELINES[target_kind]
    names = [s.name for s in specs]
    unknown = [d for d in disabled if d not in names]
    if unknown:
        raise OptionsError(f"unknown pass name(s) {unknown}", fix=f"passes are: {', '.join(names)}")
    required = [d for d in disabled if next(s for s in specs if s.name == d).required]
    if required:
        raise OptionsError(f"pass(es) {required} cannot be disabled: the build needs them",
                           fix=f"optional passes are: {', '.join(s.name for s in specs if not s.required)}")
    return [s for s in specs if s.name not in disabled and s.opt_level <= opt_level]
