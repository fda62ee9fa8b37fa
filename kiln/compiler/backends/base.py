"""The interface every target kind supplies (kiln/compiler/backends/<kind>): its pipeline rows per
stage, its build flow, its code generation and export, its tuner, its tuning-record selection and its
manifest section. The compile driver asks `backend_for(target)` once (CompileOptions.make does, and
the options carry the answer as `options.backend`); nothing outside the backends branches on the kind
of target. A new target kind is a `Kind` with its record in kiln/target.py and a module here whose
backend names it as its `target_kind` (and joins `backend_for`'s list)."""

from __future__ import annotations

from collections.abc import Callable

from ...target import Kind
from ..manifest import ManifestSection
from ..pipeline import STAGES, PassSpec, Stage, pass_names, select_rows


class Backend:
    """One target kind. Subclasses fill in `rows` and override what differs from a CPU build; the
    defaults here are the ones every LLVM/TVM backend shares (the plain or int8 flow, tvm.compile, the
    library exported with Kiln's C kernels)."""

    kind = ""  # the backend's name: cpu, cuda, vta, null
    target_kind: Kind | None = None  # the kiln.target.Kind it compiles for (None: chosen by name only, e.g. null)
    device = "cpu"  # the runtime device the manifest names (kiln.runtime.model.DEVICES)
    schedule_row = ""  # the row `kiln tune` disables: MetaSchedule searches what it would schedule
    recurrence_kernel = True  # LSTM/GRU loops as Kiln's CPU recurrence kernel (frontends.importer)
    thread_pool = True  # link the runtime's thread pool (kiln/runtime/pool.c) into the library

    def rows(self, stage: Stage) -> tuple[PassSpec, ...]:
        """This backend's pipeline rows of one stage, in order."""
        raise NotImplementedError

    def all_rows(self) -> list[PassSpec]:
        return [r for stage in STAGES for r in self.rows(stage)]

    def pass_names(self) -> list[str]:
        return pass_names(self.all_rows())

    def pipeline(self, opt_level: int, disabled: tuple[str, ...] = ()) -> list[PassSpec]:
        """The rows a compile runs at this opt level with these passes disabled."""
        return select_rows(self.all_rows(), opt_level, disabled)

    def check_options(self, target, quantize: str | None, buckets, layout: str) -> None:
        """Refuse options this target cannot build (an OptionsError); most accept all."""

    def precision_note(self, options) -> str | None:
        """Why --precision fp16/bf16 will not be faster here (None: it will, or the question is moot)."""
        return None

    def flow(self, options):
        """The build flow (kiln/compiler/flows.py) that turns the imported model into what is built."""
        from ..flows import default_flow

        return default_flow(options)

    def build(self, mod, options, where: str):
        """Code generation: the optimized module -> a TVM executable."""
        from ..executable import build_executable

        return build_executable(mod, options, where)

    def export(self, exe, options, where: str, mod) -> bytes:
        """The executable as the bytes of a shared library (with Kiln's C kernels `mod` calls)."""
        from ..export import c_kernels, export_library

        return export_library(
            exe, options.target.arch, where, c_kernels(mod, options.target.arch), pool=self.thread_pool
        )

    def tuning_db(self, path, target) -> str | None:
        """The tuning database folder a compile applies (`--tuning-db` resolved; None: none)."""
        from .records import metaschedule_db

        return metaschedule_db(path, target)

    def tuning_records(self, tuning_db: str | None, target, root) -> str:
        """The report's `tuning_records`: which records the compile applied, or why none."""
        from ...schedules.tuning.shipped import describe

        return describe(tuning_db, target, root)

    def tuning_target(self, target):
        """The target MetaSchedule measures on (the same, unless it lacks something the search needs)."""
        return target

    def tune(self, model, compile_options, opts, progress: Callable[[str], None], start: float | None) -> dict:
        """`kiln tune`: search the model's kernels' schedules into opts.db_root."""
        from ..tune import tune_kernels

        return tune_kernels(model, compile_options, opts, progress, start)

    def tune_summary(self, result: dict) -> str:
        from ...schedules.tuning.tuning import format_summary

        return format_summary(result)

    def compact_records(self, db) -> tuple[int, int]:
        from ...schedules.tuning.database import compact

        return compact(db)

    def manifest_section(self, options, members: dict) -> ManifestSection:
        return ManifestSection(self.device, options.target.required_features())
