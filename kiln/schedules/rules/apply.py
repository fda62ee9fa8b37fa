"""ApplyDefaultSchedules: give every kernel of a module the registry's default schedule for the
target. A kernel no rule fits (every rule raised ScheduleError: "does not apply") keeps TVM's
default lowering; the pass counts both so the report can say how much of the model is scheduled.
Any other exception from a rule is a bug: it is never taken for "does not apply". The kernel it hit
is left unscheduled, named in a KilnWarning and in the report's rule_errors, and the rest of the model
keeps its schedules (a rule bug once took the default schedules off whole models; benchmarks/history.md);
with KILN_STRICT_RULES=1 (the test suite) it propagates."""

from __future__ import annotations

import warnings

import tvm
from tvm import s_tir, tirx

from ...counters import Counter
from ...env import strict_rules
from ...errors import KilnWarning
from .dynamic import dynamic
from .kinds import strip
from .recurrence import specialize
from .registry import FALLBACK, REGISTER_TILED, RULES, classify, target_family
from .rules import vectorize_leftovers

# the test suite sets it: a rule bug then fails the compile instead of leaving one kernel unscheduled


def first_rule_that_applies(func, family: str, lanes: int, registers: int = 16):
    """(kind, schedule) from the kind's rule, then its fallbacks (FALLBACK), each on a fresh
    schedule; (kind, None) when none applies. `registers`: the target's vector registers
    (caps.vector_registers), for the rules that size a register tile by them (REGISTER_TILED)."""
    first = s_tir.Schedule(func)
    try:
        kind, anchor = classify(first)
    except s_tir.ScheduleError:  # no blocks to schedule (TOPI's ir_builder kernels: NMS, sort): left as written
        return None, None
    anchor_name = first.get(anchor).name_hint if anchor is not None else None
    for k in (kind, *FALLBACK.get(kind, ())):
        rule = RULES.get((family, k))
        if rule is None:
            continue
        sch = s_tir.Schedule(func)  # a failed rule may leave its schedule half-transformed
        anchor = sch.get_sblock(anchor_name) if anchor_name else None
        try:
            if k in REGISTER_TILED:
                rule(sch, anchor, lanes, registers=registers)
            else:
                rule(sch, anchor, lanes)
            vectorize_leftovers(sch, lanes)
            return kind, sch
        except s_tir.ScheduleError:  # the rule does not fit this kernel: try the next, else leave it unscheduled
            continue  # anything else is a bug in the rule, and propagates
    return kind, None


def _dynamic(func, lanes: int, registers: int):
    """The run-time-sized kernel's schedule, or None when the rule does not fit it (block-less TOPI
    kernels such as NMS and sort, or loops it does not understand): it then keeps TVM's lowering."""
    sch = s_tir.Schedule(func)
    try:
        dynamic(sch, lanes, registers)
    except s_tir.ScheduleError:
        return None
    return sch


def _dims(func) -> list:
    """Every buffer extent of the kernel's parameters."""
    return [d for p in func.params if hasattr(p.ty, "shape") for d in p.ty.shape]


def _empty(func) -> bool:
    """Some buffer of the kernel has a static extent of 0: its loops run zero times (splitting them
    divides by zero in TVM)."""
    return any(isinstance(d, (int, tirx.IntImm)) and int(d) == 0 for d in _dims(func))


def is_static(func) -> bool:
    """Every buffer of the kernel has a static shape."""
    return all(isinstance(d, (int, tirx.IntImm)) for d in _dims(func))


FLOPS_ATTR = "kiln.flops"
TUNED_ATTR = "kiln.tuned"  # a kernel scheduled from a database record that beat its default schedule


# what ApplyDefaultSchedules counts in the report (kiln/counters.py)
DEFAULT_SCHEDULE_COUNTERS: tuple[Counter, ...] = (
    Counter("kernels_scheduled", int, "kernels given a schedule", always=True),
    Counter("kernels_unscheduled", int, "kernels left with no schedule", always=True),
    Counter("recurrence_kernels", int, "recurrence loops as Kiln's CPU kernel", always=True),
    Counter("rule_errors", list, "default rules that failed: kernel and error"),
)


@tvm.transform.module_pass(opt_level=2, name="DefaultSchedules")
class ApplyDefaultSchedules:
    COUNTERS = DEFAULT_SCHEDULE_COUNTERS

    def __init__(self, target, lanes: int, registers: int = 16):
        self.target, self.lanes, self.registers = target, lanes, registers
        self.stats = {"kernels_scheduled": 0, "kernels_unscheduled": 0}
        self.by_kind: dict[str, int] = {}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        family = target_family(self.target)
        out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
        for gv, func in mod.functions.items():
            if not isinstance(func, tirx.PrimFunc):
                continue
            rec = specialize(func, self.lanes, self.registers)  # written scheduled, for the frontend's lanes
            if rec is not None:
                out[gv] = rec
                self.stats["kernels_scheduled"] += 1
                self.stats["recurrence_kernels"] = self.stats.get("recurrence_kernels", 0) + 1
                continue
            if is_scheduled(func):
                continue
            if _empty(func):  # a zero-size output (a kernel-1 causal conv's empty state): nothing to schedule
                out[gv] = func.with_attr("tirx.is_scheduled", True)
                self.stats["kernels_scheduled"] += 1
                continue
            try:
                if is_static(func):
                    kind, sch = first_rule_that_applies(func, family, self.lanes, self.registers)
                else:  # sized at run time (detection heads): the rules read static extents, this one does not
                    kind, sch = "dynamic", _dynamic(func, self.lanes, self.registers)
            except Exception as e:  # a bug in a rule: this kernel stays unscheduled, named, not the whole model
                if strict_rules():
                    raise
                kind, sch = None, None
                self._rule_error(gv.name_hint, e)
            if sch is None:
                self.stats["kernels_unscheduled"] += 1
                continue
            out[gv] = keep_flops(func, sch.mod["main"].with_attr("tirx.is_scheduled", True))
            self.stats["kernels_scheduled"] += 1
            self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
        return out

    def _rule_error(self, kernel: str, e: Exception) -> None:
        detail = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
        self.stats.setdefault("rule_errors", []).append({"kernel": kernel, "error": detail[:300]})
        warnings.warn(
            f"the default schedule rule for kernel {kernel} failed ({detail[:200]}); that kernel is left "
            "unscheduled (correct, slower). This is a Kiln bug: please report the model",
            KilnWarning,
            stacklevel=2,
        )


# what ApplyTuningDatabase counts in the report (kiln/counters.py)
TUNING_COUNTERS: tuple[Counter, ...] = (
    Counter("stale_records", int, "tuning records tuned against an older default, skipped"),
    Counter("tuned_coverage", float, "share of kernels with a tuned record", always=True),
    Counter("tuned_default_kernels", int, "kernels whose best record is the default schedule"),
    Counter("tuned_faster_kernels", int, "kernels with a record faster than the default"),
    Counter("tuned_kernels", int, "kernels given a tuned record", always=True),
)


@tvm.transform.module_pass(opt_level=0, name="ApplyTuningDatabase")
class ApplyTuningDatabase:
    """Use the best record of every kernel the database has one for (the rest get DefaultSchedules).
    The database holds each workload's default schedule, measured (kiln tune's baseline), so a
    kernel's best record may be its default: stats tell them apart by the database's ledger of
    measured defaults, and such a kernel gets today's default rule rather than the recorded trace.
    A record that beat a default other than today's (stale_records: the rule improved since) is not
    applied either. tuned_kernels: call sites scheduled from the database; tuned_faster_kernels:
    those whose record beat the default; tuned_default_kernels: those whose best record is the
    default (or stale); tuned_coverage: the share of the model's FLOPs (a stand-in for its latency)
    on kernels whose record beat the default (a database without a ledger counts every record as
    faster)."""

    COUNTERS = TUNING_COUNTERS

    def __init__(self, db_dir: str | None, target=None, lanes: int = 16, registers: int = 16):
        self.db_dir = db_dir
        self.rule = (target_family(target), lanes, registers) if target is not None else None
        self.stats = {"tuned_kernels": 0, "tuned_faster_kernels": 0, "tuned_default_kernels": 0, "tuned_coverage": 0.0}
        self.stats["stale_records"] = 0

    def _stale(self, func, bare, ledger: dict) -> bool:
        """A record that beat a default the database measured, where today's default rule gives another
        schedule, never measured against it (the rule improved since the records were tuned): today's rule
        wins, as records are applied only where they beat the default. A database with no ledger: False."""
        from ..tuning.database import default_was_measured

        if self.rule is None or not ledger:
            return False
        _, sch = first_rule_that_applies(func, *self.rule)
        return sch is not None and not default_was_measured(self.db_dir, bare, sch.trace, ledger)

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        if not self.db_dir:
            return mod
        from tvm import relax

        from ...compiler.ir import kernels
        from ..tuning.database import best_is_default, database_for_compile, measured_defaults

        db = database_for_compile(self.db_dir)
        todo = {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}
        todo = {n: f for n, f in todo.items() if not is_scheduled(f)}
        bare = {name: strip(f) for name, f in todo.items()}  # the database keys kernels on their computation alone
        default = best_is_default(db, self.db_dir, bare)
        with db:
            mod = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(_replaced(mod, bare))
        # no record, or the best record is a default schedule: today's rule (DefaultSchedules), not the recorded
        # trace, which is the rule of the Kiln that tuned it (stale once a rule improves: the shipped AVX2 records
        # replayed the 8-pixel conv tile that conv_register_tile replaced)
        ledger = measured_defaults(self.db_dir) if self.rule is not None else {}  # read once, not per kernel
        stale = {n for n, d in default.items() if d is False and self._stale(todo[n], bare[n], ledger)}
        self.stats["stale_records"] = len(stale)
        mod = _replaced(
            mod, {n: f for n, f in todo.items() if not is_scheduled(mod[n]) or default.get(n) or n in stale}
        )
        total = tuned = 0.0
        for name in kernels(mod):
            f = mod[name]
            flops = estimated_flops(f)
            if default.get(name) or name in stale:
                self.stats["tuned_kernels"] += 1
                self.stats["tuned_default_kernels"] += 1
            elif is_scheduled(f) and name in default:  # scheduled here, from a record that beat the default
                # marked, for the profile's schedule column; the FLOPs of the computation, not of its padded schedule
                mod[mod.get_global_var(name)] = keep_flops(todo[name], f).with_attr(TUNED_ATTR, True)
                flops = estimated_flops(mod[name])
                self.stats["tuned_kernels"] += 1
                tuned += flops
                self.stats["tuned_faster_kernels"] += 1
            total += flops
        self.stats["tuned_coverage"] = round(tuned / total, 4) if total else 0.0
        return mod


def _replaced(mod: tvm.IRModule, funcs: dict) -> tvm.IRModule:
    """The module with the functions of these names replaced."""
    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    for name, f in funcs.items():
        out[out.get_global_var(name)] = f
    return out


def is_scheduled(func) -> bool:
    """The kernel comes scheduled (a tuned record, a rule, dlight, or Kiln's C kernels)."""
    return func.attrs is not None and "tirx.is_scheduled" in func.attrs


def keep_flops(before, after):
    """`after` (scheduled) with the FLOP estimate of `before` as an attribute where scheduling changed
    TVM's estimate: a tensorized block is opaque to it (an AMX conv read as its epilogue), a tuned
    schedule's padding adds work that is not the model's."""
    flops = estimated_flops(before)
    return after.with_attr(FLOPS_ATTR, int(flops)) if abs(estimated_flops(after) - flops) > 0.01 * flops else after


def estimated_flops(func) -> float:
    """TVM's FLOP estimate of one PrimFunc (the unscheduled one's, where keep_flops kept it), 0 when it
    cannot tell."""
    if func.attrs is not None and FLOPS_ATTR in func.attrs:
        return float(func.attrs[FLOPS_ATTR])
    try:
        return float(s_tir.analysis.estimate_tir_flops(tvm.IRModule({"main": func})))
    except Exception:
        return 0.0
