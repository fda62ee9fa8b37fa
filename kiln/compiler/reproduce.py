"""Crash reproducers, as IREE writes them: when a compile fails inside Kiln, find the smallest
subgraph of the (pinned, simplified) ONNX model that fails at the same stage, name its node, and
write it as an .onnx file beside the output with the command that fails on it.

The search: the shortest prefix of the graph (in its topological order) that already fails (the
prefix's dangling values are its outputs), by bisection; then that last node alone, its other inputs
made graph inputs. Each probe is a compile, so the search stops at a time budget and keeps the best
found."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from pathlib import Path

import onnx

from .._io import atomic_write_bytes


def reduce_failure(model: onnx.ModelProto, fails: Callable[[onnx.ModelProto], bool], budget_s: float) -> dict | None:
    """{"model": smallest failing model, "node": its last node's name, "op": op type, "nodes": count}."""
    deadline = time.monotonic() + budget_s
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        extractor = onnx.utils.Extractor(inferred)
    except Exception:
        return None
    nodes = list(model.graph.node)
    inits = {i.name for i in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in inits]
    cache: dict = {}

    graph_outputs = {o.name for o in model.graph.output}

    def prefix(k):
        """Nodes 0..k with every value they make that nothing among them reads (and the graph's outputs)."""
        read = {i for n in nodes[: k + 1] for i in n.input}
        outs = [o for n in nodes[: k + 1] for o in n.output if o and (o not in read or o in graph_outputs)]
        return _extract(extractor, inputs, outs)

    def probe(k, make=prefix):
        if (k, make) not in cache:
            cand = make(k)
            cache[(k, make)] = (cand, cand is not None and time.monotonic() < deadline and _quiet(fails, cand))
        return cache[(k, make)]

    lo, hi = 0, len(nodes) - 1
    if hi < 0 or not probe(hi)[1]:
        return None
    while lo < hi and time.monotonic() < deadline:
        mid = (lo + hi) // 2
        if probe(mid)[1]:
            hi = mid
        else:
            lo = mid + 1
    best = probe(hi)[0]

    def alone(k):
        n = nodes[k]
        feeds = [i for i in dict.fromkeys(n.input) if i and i not in inits]
        return _extract(extractor, feeds, [o for o in n.output if o])

    single, ok = probe(hi, alone)
    if ok:
        best = single
    return {
        "model": best,
        "node": nodes[hi].name or f"<unnamed {nodes[hi].op_type}>",
        "op": nodes[hi].op_type,
        "nodes": len(best.graph.node),
    }


def _extract(extractor, inputs, outputs) -> onnx.ModelProto | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return extractor.extract_model(list(inputs), list(outputs))
    except Exception:
        return None


def _quiet(fails, cand) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return bool(fails(cand))
        except Exception:
            return False


def write_reproducer(found: dict, output: str | Path, flags: list[str]) -> dict:
    out = Path(output)
    path = out.with_name(out.stem + ".repro.onnx")
    atomic_write_bytes(path, found["model"].SerializeToString())
    cmd = " ".join(["kiln", "compile", str(path), "-o", str(out.with_name(out.stem + ".repro.kiln")), *flags])
    return dict(found, path=str(path), command=cmd)


def compile_flags(options) -> list[str]:
    """The CLI flags that rebuild `options` for a pinned model (shapes and frozen inputs are baked in)."""
    flags = ["--target", f"'{options.target}'"]
    if options.layout != "NCHWc":
        flags += ["--layout", options.layout]
    if options.opt_level != 2:
        flags += ["--opt-level", str(options.opt_level)]
    for d in options.disabled_passes:
        flags += ["--disable-pass", d]
    if options.precision != "fp32":
        flags += ["--precision", options.precision]
    if options.quantize:
        flags += ["--quantize", options.quantize, "--calibration", str(options.calibration)]
    if options.tuning_db:
        flags += ["--tuning-db", options.tuning_db]
    return flags
