"""The VTA backend: a simulated VTA-compatible FPGA accelerator (kiln/accel/vta, the device model)
beside the host CPU. The CPU's pipeline, with conv/dense chains offloaded by its own flow (offload.py:
partition, calibrate, generate each layer's program), its own tuning records keyed by the accelerator
configuration (tune.py), and the programs as artifact members the runtime finds through the
manifest's accelerator kind."""

from __future__ import annotations

from ....errors import OptionsError
from ....target import Kind
from ...pipeline import PassSpec, Stage
from .. import cpu
from ..base import ManifestSection
from ..records import no_shipped_records

# strided 1x1 convs keep their stride: the accelerator's convs stride in hardware, and a CPU slice between two
# offloaded layers would break their int8 hand-off. The row stays (a no-op here) so that --disable-pass accepts
# the same names on every LLVM target.
KEEP_STRIDE = PassSpec("SubsampleStridedPointwise", lambda o: None, 2)
# the CPU's int8 choices that are not the accelerator's: its first conv stays on the CPU as it is (no space-to-depth
# blocks), and its residual adds run in its ALU epilogue on int8 hand-offs of their own (no Int8Residuals)
OWN_ROWS = {
    r.name: r
    for r in (
        KEEP_STRIDE,
        PassSpec("SpaceToDepthStem", lambda o: None, 2),
        PassSpec("Int8Residuals", lambda o: None, 2),
        PassSpec("HoistQuantize", lambda o: None, 2),
    )
}


def _graph_row(spec: PassSpec) -> PassSpec:
    """The CPU's row, or this backend's own where they differ."""
    return OWN_ROWS.get(spec.name, spec)


class VTABackend(cpu.CPUBackend):
    kind = "vta"
    target_kind = Kind.VTA_SIM

    def rows(self, stage: Stage) -> tuple[PassSpec, ...]:
        return tuple(_graph_row(s) for s in super().rows(stage))

    def all_rows(self) -> list[PassSpec]:
        return [_graph_row(s) for s in cpu.ROWS]

    def check_options(self, target, quantize: str | None, buckets, layout: str) -> None:
        """The accelerator runs int8 convolutions: a calibrated int8 compile of one shape."""
        if quantize != "int8" or buckets or layout == "auto":
            raise OptionsError(
                f"target {target.kind} runs int8 convolutions: it needs --quantize int8 --calibration DATA"
                + (" and no shape buckets or --layout auto" if buckets or layout == "auto" else ""),
                where="--target",
                fix=f"kiln compile MODEL --target {target.kind} --quantize int8 --calibration DATA.npz",
            )

    def flow(self, options):
        from ...flows import Flow
        from .offload import vta_flow

        return Flow(lambda o: True, vta_flow, "an accelerator target: conv/dense chains offloaded")

    def tuning_db(self, path, target) -> str | None:
        from ....accel.vta.records import resolve_db

        return resolve_db(path, target.vta_config())  # keyed by the accelerator's configuration

    def tuning_records(self, tuning_db: str | None, target, root) -> str:
        return no_shipped_records(tuning_db, target, root)

    def tune(self, model, compile_options, opts, progress, start) -> dict:
        """The accelerator's layers, measured by its simulator's cycle count."""
        from .tune import tune

        return tune(model, compile_options, opts, progress)

    def tune_summary(self, result: dict) -> str:
        from .tune import format_summary

        return format_summary(result)

    def compact_records(self, db) -> tuple[int, int]:
        from ....accel.vta.records import compact

        return compact(db)

    def manifest_section(self, options, members: dict) -> ManifestSection:
        from ....accel.vta import runtime as vta_rt

        target = options.target
        accelerator = {
            "kind": target.kind.value,
            "board": target.spec.board,
            "config": target.spec.config,
            "members": list(vta_rt.MEMBERS),
            "digest": vta_rt.digest(members),
        }
        return ManifestSection(self.device, target.required_features(), accelerator)


VTA = VTABackend()
