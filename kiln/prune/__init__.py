"""`kiln prune`: structured channel pruning of an ONNX model, ONNX in and ONNX out (a smaller valid
model with the same input and output names, for fine-tuning in the user's framework or for
`kiln compile`). Its own package, not a frontend: it never builds Relax, it rewrites the ONNX graph
(graph.py finds the channels, select.py ranks and picks them, surgery.py removes them, check.py
measures the damage with the INT8 accuracy report). Kiln itself does not train."""

from __future__ import annotations

import os

import onnx

from ..errors import OptionsError, UnsupportedModelError
from .graph import ChannelGraph
from .select import CRITERIA, choose
from .surgery import apply, flops, parameters

__all__ = ["CRITERIA", "prune_model"]

PRUNE_FIX = "prune less (--ratio), keep those layers whole with --keep LAYER, or fine-tune after pruning"


def _check_options(ratio, criterion, min_agreement, calibration) -> None:
    if not isinstance(ratio, (int, float)) or not 0 < ratio < 1:
        raise OptionsError(
            f"ratio {ratio!r} is outside (0, 1)",
            where="--ratio",
            fix="give the fraction of each layer's output channels to remove, e.g. --ratio 0.3",
        )
    if criterion not in CRITERIA:
        raise OptionsError(
            f"criterion {criterion!r} is not known", where="--criterion", fix=f"use {', '.join(CRITERIA)}"
        )
    if min_agreement is not None:
        if not 0 <= min_agreement <= 1:
            raise OptionsError(
                f"min-agreement {min_agreement!r} is outside [0, 1]", where="--min-agreement", fix="e.g. 0.98"
            )
        if calibration is None:
            raise OptionsError(
                "--min-agreement needs data to measure agreement on",
                where="--min-agreement",
                fix="give --calibration DATA (an .npz keyed by input name, samples stacked on the batch axis)",
            )


def _inputs(model: onnx.ModelProto):
    from ..frontends.shapes import graph_inputs
    from ..runtime.artifact import TensorSpec

    elem = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.INT64: "int64", onnx.TensorProto.INT32: "int32"}
    return [
        TensorSpec(
            vi.name,
            tuple(d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim),
            elem.get(vi.type.tensor_type.elem_type, "float32"),
        )
        for vi in graph_inputs(model)
    ]


def prune_model(
    model: str | os.PathLike | onnx.ModelProto,
    ratio: float,
    criterion: str = "l1",
    calibration: str | os.PathLike | None = None,
    min_agreement: float | None = None,
    keep=(),
    zero_only: bool = False,
    multiple: int = 8,
) -> tuple[onnx.ModelProto, dict]:
    """(the pruned model, the report). `multiple`: channel counts it divides stay multiples of it
    (8 by default: every pruned conv keeps a blocked layout on x86; 16 suits AVX-512, 1 prunes
    exactly the ratio). Raises OptionsError on bad options, UnsupportedModelError
    when nothing can be pruned, AccuracyError below min_agreement (nothing is returned then)."""
    from ..frontends.onnx_load import check_onnx, load_onnx

    where = "<model>" if isinstance(model, onnx.ModelProto) else str(model)
    _check_options(ratio, criterion, min_agreement, calibration)
    if not isinstance(multiple, int) or multiple < 1:
        raise OptionsError(
            f"multiple {multiple!r} is not a positive integer", where="--multiple", fix="e.g. 8, 16 or 1"
        )
    if isinstance(model, onnx.ModelProto):
        check_onnx(model, where)
    else:
        model = load_onnx(model)
    graph = _prunable_graph(model, where, keep)
    removed, info = choose(graph, ratio, criterion, keep, multiple)
    pruned = apply(graph, removed, zero_only)
    after = ChannelGraph(apply(graph, removed) if zero_only else pruned)  # zeroed: what RemoveZeroChannels makes of it
    report = _report(graph, after, removed, info, ratio, criterion, zero_only, multiple)
    if calibration is not None:
        from ..compiler.quantize.accuracy import check_agreement
        from ..compiler.quantize.calibration import load_calibration
        from .check import accuracy

        data = load_calibration(calibration, _inputs(model))
        layers = {n: l.y for n, l in graph.layers.items()}
        report["accuracy"] = accuracy(model, pruned, layers, removed, data, zero_only)
        check_agreement(
            report["accuracy"], min_agreement, where, subject="pruned model", fix=PRUNE_FIX, data="calibration samples"
        )
    return pruned, report


def _prunable_graph(model: onnx.ModelProto, where: str, keep) -> ChannelGraph:
    """The model's channel graph; UnsupportedModelError when no conv can be pruned, OptionsError when `keep`
    names a layer the graph does not have."""
    graph = ChannelGraph(model)
    ok = graph.ties.removable(keep_one=False)
    prunable = sorted(n for n, layer in graph.layers.items() if ok[layer.y].any())
    if not any(graph.layers[n].op == "Conv" for n in prunable):
        convs = sum(n.op_type == "Conv" for n in model.graph.node)
        raise UnsupportedModelError(
            f"no prunable conv: {convs} Conv node(s), none whose output channels can be removed",
            where=where,
            fix="kiln prune removes output channels of Conv (groups 1) layers whose weights are initializers and whose"
            " channels reach only other layers through elementwise ops, BatchNormalization, adds, Concat, pooling,"
            " Resize and flattens (not a model output)",
        )
    unknown = [k for k in keep if k not in graph.layers]
    if unknown:
        names = sorted(graph.layers)
        shown = ", ".join(names[:40]) + (f", ... ({len(names) - 40} more)" if len(names) > 40 else "")
        raise OptionsError(
            f"no layer named {', '.join(map(repr, unknown))}", where="--keep", fix=f"layers are: {shown}"
        )
    return graph


def _report(graph, after, removed: dict, info: dict, ratio, criterion, zero_only, multiple) -> dict:
    """prune_model's report, before its accuracy check: the options, and FLOPs, parameters and channels per
    layer before and after."""
    fb, fa = flops(graph), flops(after)
    return {
        "ratio": ratio,
        "criterion": criterion,
        "zero_only": zero_only,
        "multiple": multiple,
        "classes_removed": info["classes"],
        "criterion_fallback": info["criterion_fallback"],
        "flops_before": sum(fb.values()),
        "flops_after": sum(fa.values()),
        "parameters_before": parameters(graph),
        "parameters_after": parameters(after),
        "layers": [
            {
                "layer": name,
                "channels": [graph.ties.channels(l.y), graph.ties.channels(l.y) - len(removed.get(l.y, ()))],
                "flops": [fb.get(name, 0), fa.get(name, 0)],
            }
            for name, l in graph.layers.items()
        ],
        "accuracy": None,
    }
