"""The optimized module -> a TVM executable (tvm.compile for the options' target). Its own module
so that the build driver, --layout auto and the calibration builds share it without importing
each other.

The Relax pipeline is TVM's default one with its static memory planner guarded: TVM 0.27's
StaticPlanBlockMemory can give an If's two branches one storage token and allocate it in the then
branch only, so the else branch writes through an undefined storage (a segfault on the first run that
takes it; seen with a data-dependent If whose branches make tensors of one size). A planned function
that is not well formed is kept unplanned (each tensor from the VM's pooled allocator)."""

from __future__ import annotations

from ..errors import pass_errors


def _guarded_plan():
    import tvm
    from tvm import relax

    @tvm.transform.module_pass(opt_level=0, name="KilnStaticPlanBlockMemory")
    def plan(mod, _ctx):
        planned = relax.transform.StaticPlanBlockMemory()(mod)
        try:
            ok = relax.analysis.well_formed(planned) is not False
        except ValueError:  # TVM 0.27 raises (Var storage is not defined) rather than return False
            ok = False
        return planned if ok else mod

    return plan


def planning_passes() -> list:
    """TVM's default Relax pipeline up to and including the static memory planner (guarded): what the build
    runs, and what analysis.planned_storage reports on."""
    from tvm.relax import transform

    return [
        transform.RewriteDataflowReshape(),
        transform.ToNonDataflow(),
        transform.RemovePurityChecking(),
        transform.CallTIRRewrite(),
        _guarded_plan(),
    ]


def relax_pipeline():
    """tvm.relax.pipeline.default_build_pipeline's passes, StaticPlanBlockMemory guarded."""
    import tvm
    from tvm.relax import backend, transform

    return tvm.transform.Sequential(
        [
            backend.DispatchSampling(),
            backend.DispatchSortScan(),
            transform.LegalizeOps(),
            *planning_passes(),
            transform.RewriteCUDAGraph(),
            transform.LowerAllocTensor(),
            transform.KillAfterLastUse(),
            transform.LowerRuntimeBuiltin(),
            transform.ComputePrimValue(),
            transform.VMShapeLower(),
            transform.AttachGlobalSymbol(),
        ],
        name="KilnRelaxPipeline",
    )


def build_executable(mod, options, where: str):
    """tvm.compile for the target of `options` (a CompileOptions), Kiln's Relax pipeline."""
    import tvm

    with pass_errors("tvm.compile", where), options.target.tvm():
        return tvm.compile(mod, target=options.target.tvm(), relax_pipeline=relax_pipeline())
