"""No valid model refused by an optional optimization. A compile that fails in a pass or in TVM's
build after Kiln's passes is retried down a ladder (the blocked layout off, then every optional
graph pass, then every optional pass); the first rung that builds wins, with a warning naming the
failure and `passes_skipped` in the report. When no rung builds, the model is blamed only if ONNX's
checker or shape inference rejects it too; otherwise it is Kiln's bug: an InternalError naming
the stage and node, with a reproducer (see reproduce.py)."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable

import onnx

from ..errors import CompileError, InternalError, KilnWarning, ModelLoadError, UnsupportedModelError
from ..frontends.constant_inputs import runtime_shape_sources
from ..frontends.freeze import FLAG

# rows whose output the user asked for: skipping them would change what the model computes
SEMANTIC_ROWS = frozenset({"Quantize", "MixedPrecision", "LowerQDQ"})


@dataclasses.dataclass(frozen=True)
class Rung:
    name: str
    what: str  # for the warning: "compiled without <what>"
    disable: Callable  # options -> rows to disable (beyond the user's)
    layout: str | None = None


def _optional(options, graph: bool | None) -> tuple[str, ...]:
    rows = options.backend.pipeline(options.opt_level, options.disabled_passes)
    return tuple(
        dict.fromkeys(
            s.name
            for s in rows
            if not s.required and s.name not in SEMANTIC_ROWS and (graph is None or s.graph == graph)
        )
    )


LADDER = (
    Rung("layout", "the blocked layout (--layout NCHW)", lambda o: (), layout="NCHW"),
    Rung("graph", "Kiln's optional graph passes", lambda o: _optional(o, graph=True), layout="NCHW"),
    Rung("all", "every optional pass", lambda o: _optional(o, graph=None), layout="NCHW"),
)


def with_fallback(
    attempt: Callable,
    options,
    layout: str,
    where: str,
    model: onnx.ModelProto | None,
    reproduce: Callable | None = None,
):
    """attempt(options, layout) -> result (raises CompileError on a pass or build failure). Returns
    (result, skipped) where skipped lists what the fallback turned off (empty when none was needed)."""
    try:
        return attempt(options, layout), []
    except CompileError as e:
        first = e
    tried = set()
    for rung in LADDER:
        disabled = tuple(dict.fromkeys(options.disabled_passes + rung.disable(options)))
        key = (disabled, rung.layout or layout)
        if key in tried or key == (options.disabled_passes, layout):
            continue
        tried.add(key)
        try:
            result = attempt(dataclasses.replace(options, disabled_passes=disabled), rung.layout or layout)
        except CompileError:
            continue
        node = reproduce(first, budget_s=20.0, write=False) if reproduce else None
        skip = {
            "rung": rung.name,
            "passes": [d for d in disabled if d not in options.disabled_passes],
            "layout": rung.layout or layout,
            "failed_in": getattr(first, "stage", "build"),
            "error": getattr(first, "detail", first.what),
            "node": node.get("node") if node else None,
        }
        at = f" at node {skip['node']!r}" if skip["node"] else ""
        warnings.warn(
            f"{where}: {skip['failed_in']} failed{at} ({skip['error'][:300]}); compiled without {rung.what} "
            "instead: the artifact is correct but may be slower (please report the model)",
            KilnWarning,
            stacklevel=2,
        )
        return result, [skip]
    raise blame(first, model, where, reproduce, frozen=frozen_names(options))


def frozen_names(options) -> set[str]:
    """The names of the inputs the compile froze (--freeze-input; CompileOptions holds them parsed)."""
    return {f.name for f in options.freeze_inputs}


def blame(
    err: CompileError,
    model: onnx.ModelProto | None,
    where: str,
    reproduce: Callable | None,
    hint: str | None = None,
    frozen=(),
):
    """The model's fault only if ONNX itself rejects it; an UnsupportedModelError naming the inputs to
    freeze when shapes are computed from input values (frozen: the names already frozen), as TVM cannot
    always follow those; else an InternalError with a reproducer (and the hint, when the caller knows a
    likelier cause than a bug)."""
    invalid = _onnx_rejects(model) if model is not None else None
    if invalid:
        return ModelLoadError(
            f"{err.what}; ONNX's own checks reject the model too: {invalid}",
            where=where,
            fix="fix the model (onnxruntime would refuse it as well) and re-export it",
        )
    shaped = runtime_shape_sources(model, frozen) if model is not None else {}
    if shaped:
        return _runtime_shapes_error(err, shaped, where)
    stage = getattr(err, "stage", "build")
    found = reproduce(err, budget_s=90.0, write=True) if reproduce else None
    node = found.get("node") if found else None
    repro = found.get("path") if found else None
    at = f" at node {node!r}" if node else ""
    fix = (
        f"{hint}; otherwise " if hint else ""
    ) + "this is a bug in Kiln, not in your model: rerun with --debug for the trace and report it"
    if repro:
        fix += f" with {repro} ({found['nodes']} node(s)), which fails the same way: {found['command']}"
    return InternalError(
        f"internal error in {stage}{at}: {getattr(err, 'detail', err.what)}",
        stage=stage,
        node=node,
        reproducer=repro,
        where=where,
        fix=fix,
    )


def _runtime_shapes_error(err: CompileError, shaped: dict, where: str) -> UnsupportedModelError:
    """The compile failed on a model whose shapes are computed from input values: what TVM said, and which
    inputs to freeze (run-time shapes compile op by op, but not every chain of them)."""
    stage = getattr(err, "stage", "build")
    listing = "; ".join(f"{name!r} (into {', '.join(ops)})" for name, ops in sorted(shaped.items()))
    feeds = sorted(shaped)
    return UnsupportedModelError(
        f"shapes computed at run time from the values of input(s) {listing}: {stage} could not follow them "
        f"({getattr(err, 'detail', err.what)[:300]})",
        ops=[{"op_type": ops[0], "input": name, "sources": [name]} for name, ops in sorted(shaped.items())],
        where=where,
        fix=f"if these inputs are known when you deploy, freeze them: {FLAG} {feeds[0]}=VALUE (repeatable), "
        "which makes every shape static; if the compile still fails with them frozen, that failure is a Kiln "
        "bug: it then reports as an internal error with a reproducer",
    )


def _onnx_rejects(model: onnx.ModelProto) -> str | None:
    """ONNX's strict shape inference on the model (its checker already passed when it was loaded)."""
    if model.ByteSize() >= 2**31 - 1:
        return None
    try:
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except Exception as e:  # the checker's and shape inference's own errors
        msg = str(e).strip().splitlines()
        return f"{type(e).__name__}: {msg[0] if msg else ''}"[:400]
    return None
