"""The build flows as data, beside the pass pipeline (kiln/compiler/pipeline.py). A flow turns the
imported model (frontends.importer.ImportedModel, whatever the frontend) into what the driver
builds: `run(imported, options, layout, where)` -> optimize.Optimized (the module, its lifted
weights, the report with the flow's own section, and artifact members beside the library and
weights). A backend picks its flow (`Backend.flow`): these are the ones every LLVM/TVM backend
shares, in order (the first whose `applies(options)` holds); an accelerator brings its own."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from .optimize import Optimized, optimize
from .precision_flow import precision_flow
from .quantize.flow import quantize_flow


@dataclasses.dataclass(frozen=True)
class Flow:
    applies: Callable  # (CompileOptions) -> bool
    run: Callable[..., Optimized]  # (imported, options, layout, where) -> Optimized
    about: str


def plain_flow(imported, options, layout: str, where: str) -> Optimized:
    """The pipeline as is: no calibration, no extra members."""
    return optimize(imported.mod, options, layout=layout, where=where)


FLOWS: dict[str, Flow] = {
    "int8": Flow(lambda o: o.quantize, quantize_flow, "--quantize: calibrated post-training int8"),
    "reduced": Flow(
        lambda o: o.precision != "fp32" and o.calibration is not None,
        precision_flow,
        "--precision bf16|fp16 --calibration: mixed precision, checked against float32 on the samples",
    ),
    "plain": Flow(lambda o: True, plain_flow, "the pass pipeline as is"),
}


def default_flow(options) -> Flow:
    """The first shared flow (in table order) these options ask for."""
    return next(f for f in FLOWS.values() if f.applies(options))


def run_flow(imported, options, layout: str, where: str) -> Optimized:
    """The build flow of the options' backend."""
    return options.backend.flow(options).run(imported, options, layout, where)
