"""The build flows as data, beside the pass pipeline (pipeline.PIPELINES). A flow turns the
imported model (frontends.importer.ImportedModel, whatever the frontend) into what the driver
builds: `run(imported, options, layout, where)` -> optimize.Optimized (the module, its lifted
weights, the report with the flow's own section, and artifact members beside the library and
weights). FLOWS is ordered: a compile takes the first flow whose `applies(options)` holds.
Adding a flow is adding a row."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..accel.vta.offload import vta_flow
from .optimize import Optimized, optimize
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
    "vta": Flow(lambda o: bool(o.target.accel), vta_flow, "an accelerator target: conv/dense chains offloaded"),
    "int8": Flow(lambda o: o.quantize, quantize_flow, "--quantize: calibrated post-training int8"),
    "plain": Flow(lambda o: True, plain_flow, "the pass pipeline as is"),
}


def select(options) -> str:
    """The first flow (in table order) these options ask for."""
    return next(name for name, f in FLOWS.items() if f.applies(options))


def run_flow(imported, options, layout: str, where: str) -> Optimized:
    """The build flow for these options."""
    return FLOWS[select(options)].run(imported, options, layout, where)
