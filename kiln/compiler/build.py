"""The compile driver: a model -> one .kiln artifact, as a short sequence of stages with typed results,

  read (Source) -> import (Imported) -> optimize + build (Built: the flow, code generation and export,
  under the fallback ladder) -> package (Artifact: the manifest and members) -> write

one Imported and one Built per shape bucket. What differs between target kinds is the options'
backend's (kiln/compiler/backends), asked once in CompileOptions.make and handed down here."""

from __future__ import annotations

import dataclasses
import json
import os
import time
import warnings
from pathlib import Path

import onnx

from .._io import atomic_write_text
from ..env import reproducer_disabled, shipped_tuning_logs
from ..errors import CompileError, KilnWarning, PassError, tvm_errors
from ..frontends.importer import ImportedModel, import_onnx
from ..frontends.index_ranges import index_ranges
from ..frontends.shapes import check_shape_buckets
from ..frontends.sources import Source, load_source
from ..result import CompileResult
from ..runtime import artifact as art
from .autolayout import choose_layout
from .fallback import blame, frozen_names, with_fallback
from .flows import run_flow
from .kernel_info import for_manifest
from .limits import check_planned_memory, check_tensor_sizes, io_bytes
from .manifest import BucketEntry, ManifestParts, WeightPool, manifest, source_entry
from .optimize import Optimized, optimize
from .options import CompileOptions
from .reproduce import compile_flags, reduce_failure, write_reproducer
from .unaligned_inputs import unaligned_inputs


def _where(model) -> str:
    return str(model) if isinstance(model, str | os.PathLike) else "<model>"


def analyze_model(model, options: CompileOptions | None = None, **kwargs) -> dict:
    """The optimization report without building (what `kiln inspect --passes` prints)."""
    options = options or CompileOptions.make(**kwargs)
    t0 = time.perf_counter()
    imported = load_source(model).import_bucket(options.shapes, options)
    check_tensor_sizes(imported.mod, options.max_memory, _where(model))
    layout = options.layout if options.layout != "auto" else "NCHWc"
    report = optimize(imported.mod, options, layout=layout, where=_where(model)).report
    report["pass_seconds"] = {"import": round(time.perf_counter() - t0, 4), **report["pass_seconds"]}
    return report


@dataclasses.dataclass
class Imported:
    """One bucket's model imported to Relax, with the seconds the import took."""

    model: ImportedModel
    seconds: float


@dataclasses.dataclass
class Built:
    """One bucket built: the flow's result (module, weights, report, members) and its library's bytes."""

    imported: Imported
    optimized: Optimized
    library: bytes

    @property
    def report(self) -> dict:
        return self.optimized.report


@dataclasses.dataclass
class Artifact:
    """What is written: the manifest, the members (libraries, weights, a backend's own) and the report."""

    manifest: dict
    members: dict[str, bytes]
    report: dict


def compile_model(
    model: str | os.PathLike | onnx.ModelProto,
    output: str | os.PathLike,
    options: CompileOptions | None = None,
    report_path: str | os.PathLike | None = None,
    **kwargs,
) -> CompileResult:
    """Compile a model (an .onnx/.pt2/.tflite path, an onnx.ModelProto or a torch.export program; see
    frontends/sources.py) into the artifact `output`. kwargs build the options
    (target=, input_shapes=, opt_level=, disabled_passes=, layout=, shape_buckets=, bucket_policy=)
    when `options` is not given. With shape buckets, each bucket is its own function (its own
    library and memory plan) in the one artifact; identical weights are stored once."""
    options = options or CompileOptions.make(**kwargs)
    t0 = time.perf_counter()
    note = _precision_note(options)
    source = read_source(model, options)
    layout, layout_ms, built = options.layout, None, []
    for shapes in options.bucket_shapes():
        imported = import_stage(source, shapes, options, output)
        if layout == "auto":  # measured once, on the first bucket
            layout, layout_ms = choose_layout(imported.model.mod, options, source.where)
        built.append(build_stage(imported, options, layout, source, output, note))
    artifact = package(source, built, options, layout, layout_ms)
    return write(artifact, output, report_path, t0)


def _precision_note(options) -> str | None:
    """The backend's word on --precision (warned about here, and carried in the report)."""
    note = options.backend.precision_note(options)
    if note:
        warnings.warn(f"--precision {options.precision}: {note}", KilnWarning, stacklevel=3)
    return note


def read_source(model, options) -> Source:
    """Read and check the model once for every bucket, whatever its format; an ONNX model's buckets are
    all checked before any is built (naming --shape-buckets)."""
    source = load_source(model)
    if source.onnx is not None:
        check_shape_buckets(source.onnx, options)
    return source


def import_stage(source: Source, shapes, options, output) -> Imported:
    """One bucket's import: an ONNX model through Kiln's importer (a failure gets a reproducer), a .pt2 or
    .tflite through its own frontend; the tensor sizes checked against --max-memory."""
    t = time.perf_counter()
    if source.onnx is None:
        model = source.import_bucket(shapes, options)
    else:
        model = _import(source.onnx, shapes, options, source.where, output)
    seconds = time.perf_counter() - t
    check_tensor_sizes(model.mod, options.max_memory, source.where)
    return Imported(model, seconds)


def build_stage(imported: Imported, options, layout: str, source: Source, output, note) -> Built:
    """The backend's flow (optimize), its code generation and its export, retried down the fallback
    ladder (compiler/fallback.py) when a pass or the build fails; the bucket's report completed."""
    backend, where, model = options.backend, source.where, imported.model

    def attempt(opts, lay):
        opt = run_flow(model, opts, lay, where)  # the flow's members: opt.members
        check_planned_memory(opt.report, io_bytes(model.inputs + model.outputs), opts.max_memory, where)
        t = time.perf_counter()
        return opt, backend.build(opt.mod, opts, where), time.perf_counter() - t

    repro = None
    if source.onnx is not None:
        repro = _flow_reproducer(model.onnx_model, options, layout, where, output)
    (opt, exe, build_s), skipped = with_fallback(attempt, options, layout, where, source.onnx, repro)
    report = opt.report
    report["passes_skipped"] = report.get("passes_skipped", []) + skipped
    report["precision_note"] = note
    report["tuning_records"] = backend.tuning_records(options.tuning_db, options.target, shipped_tuning_logs())
    if skipped:
        report["layout"] = skipped[0]["layout"]
    with tvm_errors("Exporting the library", where):
        library = backend.export(exe, options, where, opt.mod)
    report["pass_seconds"] = {
        "import": round(imported.seconds, 4),
        **report["pass_seconds"],
        "tvm.compile": round(build_s, 4),
    }
    return Built(imported, opt, library)


def package(source: Source, built: list[Built], options, layout: str, layout_ms) -> Artifact:
    """The buckets as one artifact: one library per bucket, each distinct weight stored once, the
    backend's members (an accelerator's programs: the last bucket's) and the manifest."""
    weights, entries, members = WeightPool(), [], {}
    for i, b in enumerate(built):
        name = art.LIBRARY if i == 0 else f"model.b{i}.so"
        m = b.imported.model
        ids = weights.add_all(b.optimized.weights)
        info = for_manifest(b.optimized.mod, m.onnx_model, options.precision, options.target.caps)
        unaligned = tuple(unaligned_inputs(b.optimized.mod, len(m.inputs)))
        entries.append(BucketEntry(m.inputs, m.outputs, name, ids, b.report["kernels"], info, unaligned))
        members[name] = b.library
    report = _combined_report(built, entries, layout_ms)
    weights_blob, weights_index = art.pack_weights(weights.arrays)
    members[art.WEIGHTS] = weights_blob
    extra = built[-1].optimized.members
    members.update(extra)
    first = built[0].imported.model
    parts = ManifestParts(
        options,
        options.backend.manifest_section(options, extra),
        entries,
        weights_index,
        source_entry(source.where, first.opsets, source.manifest()),
        first.stats,
        report,
        layout,
        getattr(first, "structure", None),
        index_ranges(first.onnx_model) if first.onnx_model is not None else None,  # torch, TFLite: none yet
    )
    return Artifact(manifest(parts), members, report)


def _combined_report(built: list[Built], entries: list[BucketEntry], layout_ms) -> dict:
    """The first bucket's report; with several, each bucket's under `buckets`."""
    reports = [b.report for b in built]
    report = reports[0]
    if len(reports) > 1:
        report = dict(report, buckets=[{"name": e.name, **r} for e, r in zip(entries, reports)])
    if layout_ms is not None:
        report["layout_candidates_ms"] = layout_ms
    return report


def write(artifact: Artifact, output, report_path, t0: float) -> CompileResult:
    """The artifact (atomically), then the report with the compile's total seconds."""
    art.write_artifact(output, artifact.manifest, artifact.members)
    report = artifact.report
    report["pass_seconds"]["total"] = round(time.perf_counter() - t0, 4)
    if report_path is not None:
        atomic_write_text(report_path, json.dumps(report, indent=2))
    return CompileResult(Path(output), artifact.manifest, report)


def _import(model: onnx.ModelProto, shapes, options: CompileOptions, where: str, output):
    """import_onnx; TVM's importer failing on a model ONNX accepts is Kiln's bug (reproducer)."""
    try:
        return import_onnx(
            model,
            shapes,
            where,
            checked=True,
            frozen=options.freeze_inputs,
            recurrence_kernel=options.backend.recurrence_kernel,
        )
    except PassError as e:

        def simple():
            from ..frontends.importer import prepare_onnx

            return prepare_onnx(model, shapes, where, options.freeze_inputs)[0]

        def fails(cand, stage):
            try:
                import_onnx(cand, where=where, checked=True)
            except PassError as pe:
                return pe.stage == stage
            return False

        repro = reproducer(simple, fails, options, output)
        raise blame(e, model, where, repro, hint=_if_hint(model), frozen=frozen_names(options)) from None


def _if_hint(model: onnx.ModelProto) -> str | None:
    """Ifs on graph inputs compile both branches for the pinned shapes, and a branch onnxruntime never
    takes for these shapes may not be valid for them (a VAD's 8 kHz branch on a 16 kHz frame)."""
    from ..frontends.constant_inputs import graph_input_sources

    feeds = sorted({s for n in model.graph.node if n.op_type == "If" for s in graph_input_sources(model, n.input[0])})
    if not feeds:
        return None
    return (
        f"the model branches on input(s) {feeds} (If): both branches are compiled for the pinned shapes; if the "
        f"value is known when you deploy, --freeze-input {feeds[0]}=VALUE compiles only the branch taken"
    )


def _flow_reproducer(simple: onnx.ModelProto, options: CompileOptions, layout: str, where: str, output):
    """The reproducer of a failure in the flow or the build: a candidate fails when the same stage fails."""

    def fails(cand, stage):
        try:
            opt = run_flow(import_onnx(cand, where=where, checked=True), options, layout, where)
            if stage == "tvm.compile":
                options.backend.build(opt.mod, options, where)
        except CompileError as e:
            return getattr(e, "stage", None) == stage
        return False

    return reproducer(lambda: simple, fails, options, output)


def reproducer(simple, fails, options: CompileOptions, output):
    """reproduce(err, budget_s, write) for compiler/fallback.py: the smallest subgraph of the model
    `simple()` gives for which `fails(candidate, stage)` holds at err's stage, with these options
    (written beside the output when write). None when KILN_NO_REPRODUCER is set or err has no stage."""

    def reproduce(err, budget_s, write):
        stage = getattr(err, "stage", None)
        if reproducer_disabled() or stage is None:
            return None
        found = reduce_failure(simple(), lambda cand: fails(cand, stage), budget_s)
        return write_reproducer(found, output, compile_flags(options)) if found and write else found

    return reproduce
