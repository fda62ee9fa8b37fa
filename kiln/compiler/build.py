"""ONNX model -> one .kiln artifact: import, optimize (the report), build with TVM, export the
library, write the artifact (and the report) atomically."""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path

import onnx

from .. import __version__
from .._io import atomic_write_text
from ..env import shipped_tuning_logs
from ..errors import CompileError, KilnWarning, PassError, tvm_errors
from ..frontends.importer import import_onnx
from ..frontends.shapes import check_shape_buckets
from ..frontends.sources import load_source
from ..result import CompileResult
from ..runtime import artifact as art
from .autolayout import choose_layout
from .fallback import blame, with_fallback
from .flows import run_flow
from .kernel_info import for_manifest
from .limits import check_planned_memory, check_tensor_sizes, io_bytes
from .optimize import optimize
from .options import CompileOptions
from .reproduce import DISABLE_ENV, compile_flags, reduce_failure, write_reproducer


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
    import tvm

    options = options or CompileOptions.make(**kwargs)
    t0 = time.perf_counter()
    backend = options.backend  # asked once, in CompileOptions.make
    note = backend.precision_note(options)
    if note:
        warnings.warn(f"--precision {options.precision}: {note}", KilnWarning, stacklevel=2)
    source = load_source(model)  # read and checked once for every bucket, whatever its format
    where, model = source.where, source.onnx  # model: the ModelProto of an ONNX source, else None
    if model is not None:
        check_shape_buckets(model, options)  # every bucket before any is built, naming --shape-buckets
    layout, layout_ms = options.layout, None
    weights = _WeightPool()
    buckets, reports, first = [], [], None
    accel_members: dict = {}
    for i, shapes in enumerate(options.bucket_shapes()):
        t = time.perf_counter()
        if model is None:  # a .pt2 or .tflite: its own frontend
            imported = source.import_bucket(shapes, options)
        else:
            imported = _import(model, shapes, options, where, output)
        import_s = time.perf_counter() - t
        check_tensor_sizes(imported.mod, options.max_memory, where)
        if layout == "auto":
            layout, layout_ms = choose_layout(imported.mod, options, where)

        def attempt(opts, lay, imported=imported):
            opt = run_flow(imported, opts, lay, where)  # the flow's members: opt.members
            check_planned_memory(
                opt.report, io_bytes(imported.inputs + imported.outputs), opts.max_memory, where
            )  # before building
            t = time.perf_counter()
            return opt, backend.build(opt.mod, opts, where), time.perf_counter() - t

        repro = _reproducer(imported.onnx_model, options, layout, where, output) if model is not None else None
        (opt, exe, build_s), skipped = with_fallback(attempt, options, layout, where, model, repro)
        accel_members = opt.members
        report = opt.report
        report["passes_skipped"] = report.get("passes_skipped", []) + skipped
        report["precision_note"] = note
        report["tuning_records"] = backend.tuning_records(options.tuning_db, options.target, shipped_tuning_logs())
        if skipped:
            report["layout"] = skipped[0]["layout"]
        with tvm_errors("Exporting the library", where):
            library = backend.export(exe, options, where, opt.mod)
        report["pass_seconds"] = {
            "import": round(import_s, 4),
            **report["pass_seconds"],
            "tvm.compile": round(build_s, 4),
        }
        name = art.LIBRARY if i == 0 else f"model.b{i}.so"
        buckets.append(
            {
                "name": "+".join(f"{s.name}:{'x'.join(map(str, s.shape))}" for s in imported.inputs),
                "inputs": [s.to_json() for s in imported.inputs],
                "outputs": [s.to_json() for s in imported.outputs],
                "library": name,
                "weights": weights.add_all(opt.weights),
                "kernels": report["kernels"],
                "kernel_info": for_manifest(opt.mod, imported.onnx_model),
                "_blob": library,
            }
        )
        reports.append(report)
        first = first or imported
    report = (
        reports[0]
        if len(reports) == 1
        else dict(reports[0], buckets=[{"name": b["name"], **r} for b, r in zip(buckets, reports)])
    )
    if layout_ms is not None:
        report["layout_candidates_ms"] = layout_ms
    weights_blob, weights_index = art.pack_weights(weights.arrays)
    members = {b["library"]: b.pop("_blob") for b in buckets}
    members[art.WEIGHTS] = weights_blob
    members.update(accel_members)
    section = backend.manifest_section(options, accel_members)
    manifest = {
        "kiln_version": __version__,
        "tvm_version": tvm.__version__,
        "target": str(options.target),
        "target_dict": options.target.to_dict(),
        "arch": options.target.arch,
        "device": section.device,
        "cpu_features": section.cpu_features,
        "inputs": buckets[0]["inputs"],
        "outputs": buckets[0]["outputs"],
        "weights": weights_index,
        "buckets": buckets,
        "bucket_policy": options.bucket_policy,
        "entry": "main",
        "compile_options": dict(options.to_json(), layout_chosen=report.get("layout", layout)),
        "passes_skipped": report.get("passes_skipped", []),
        "source": {"file": Path(where).name, "opsets": first.opsets, **source.manifest()},
        "import_stats": first.stats,
        "kernels": report["kernels"],
        "quantization": _quant_summary(report.get("quantization")),
        "accelerator": section.accelerator,
        "created_unix": int(time.time()),
    }
    art.write_artifact(output, manifest, members)
    report["pass_seconds"]["total"] = round(time.perf_counter() - t0, 4)
    if report_path is not None:
        atomic_write_text(report_path, json.dumps(report, indent=2))
    return CompileResult(Path(output), manifest, report)


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

        def reproduce(err, budget_s, write):
            if os.environ.get(DISABLE_ENV):
                return None
            from ..frontends.importer import prepare_onnx

            simple, _ = prepare_onnx(model, shapes, where, options.freeze_inputs)

            def fails(cand):
                try:
                    import_onnx(cand, where=where, checked=True)
                except PassError as pe:
                    return pe.stage == err.stage
                return False

            found = reduce_failure(simple, fails, budget_s)
            return write_reproducer(found, output, compile_flags(options)) if found and write else found

        raise blame(e, model, where, reproduce, hint=_if_hint(model)) from None


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


def _reproducer(simple: onnx.ModelProto, options: CompileOptions, layout: str, where: str, output):
    """reproduce(err, budget_s, write) for compiler/fallback.py: the smallest subgraph of the imported
    model that fails at err's stage with these options (written beside the output when write)."""

    def reproduce(err, budget_s, write):
        stage = getattr(err, "stage", None)
        if os.environ.get(DISABLE_ENV) or stage is None:
            return None

        def fails(cand):
            try:
                opt = run_flow(import_onnx(cand, where=where, checked=True), options, layout, where)
                if stage == "tvm.compile":
                    options.backend.build(opt.mod, options, where)
            except CompileError as e:
                return getattr(e, "stage", None) == stage
            return False

        found = reduce_failure(simple, fails, budget_s)
        return write_reproducer(found, output, compile_flags(options)) if found and write else found

    return reproduce


def _quant_summary(q: dict | None) -> dict | None:
    """What the manifest says of a quantized compile (the report has the full accuracy check)."""
    if q is None:
        return None
    acc = q["accuracy"]
    return {
        "mode": q["mode"],
        "calib_method": q["calib_method"],
        "calib_samples": q["calib_samples"],
        "calibration_sha256": q["calibration_sha256"],
        "int8_layers": len(q["int8_layers"]),
        "float_layers": q["float_layers"],
        "accuracy": {"samples": acc["samples"], "held_out": acc["held_out"], "outputs": acc["outputs"]},
    }


class _WeightPool:
    """Weights of all buckets, each distinct array stored once (buckets of one model share them)."""

    def __init__(self):
        self.arrays, self._index = [], {}

    def add_all(self, arrays) -> list[int]:
        import hashlib

        import numpy as np

        ids = []
        for a in arrays:
            a = np.ascontiguousarray(a)
            key = (str(a.dtype), a.shape, hashlib.sha256(a.tobytes()).digest())
            if key not in self._index:
                self._index[key] = len(self.arrays)
                self.arrays.append(a)
            ids.append(self._index[key])
        return ids
