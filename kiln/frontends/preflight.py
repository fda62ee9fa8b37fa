"""Op-coverage preflight: scan the whole graph (subgraphs included) before converting anything and
report every unsupported op at once, with domain, type, opset, count and the first node's name."""

from __future__ import annotations

import functools

import onnx

from ..errors import UnsupportedModelError
from .decompose import DOMAIN_REWRITES, REWRITES
from .sequences import HANDLED as SEQUENCE_OPS

DEFAULT_DOMAINS = ("", "ai.onnx")
# Ops Kiln rewrites into supported ONNX ops itself before TVM sees the graph (see decompose/).
KILN_REWRITTEN = frozenset(REWRITES)
# Control flow TVM's importer builds itself (relax.If, run by the VM); an If whose condition is
# constant once shapes are pinned or inputs frozen is inlined by simplify.py instead.
CONTROL_FLOW = frozenset({"If"})
# Sequence and optional ops of static length are flattened into tensors by Kiln (sequences.py): SEQUENCE_OPS
# Microsoft contrib ops that TVM's importer converts and Kiln does not rewrite first: none. TVM 0.27's
# Attention/SkipLayerNormalization/EmbedLayerNormalization are incomplete (decompose/contrib.py says how),
# so Kiln rewrites those and the Gelu family itself (DOMAIN_REWRITES).
CONTRIB: dict[str, frozenset] = {"com.microsoft": frozenset()}


@functools.cache
def tvm_converted_ops() -> frozenset[str]:
    from tvm.relax.frontend.onnx import onnx_frontend

    return frozenset(onnx_frontend._get_convert_map())


def is_supported(domain: str, op_type: str) -> bool:
    if domain in DEFAULT_DOMAINS:
        return (
            op_type in CONTROL_FLOW
            or op_type in SEQUENCE_OPS
            or op_type in tvm_converted_ops()
            or op_type in KILN_REWRITTEN
        )
    return op_type in CONTRIB.get(domain, ()) or op_type in DOMAIN_REWRITES.get(domain, {})


def _walk(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _walk(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _walk(g)


def op_histogram(model: onnx.ModelProto) -> dict[str, int]:
    hist: dict[str, int] = {}
    for node in _walk(model.graph):
        key = node.op_type if node.domain in DEFAULT_DOMAINS else f"{node.domain}.{node.op_type}"
        hist[key] = hist.get(key, 0) + 1
    return dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))


def opsets(model: onnx.ModelProto) -> dict[str, int]:
    return {(o.domain or "ai.onnx"): o.version for o in model.opset_import}


def find_unsupported_ops(model: onnx.ModelProto) -> list[dict]:
    versions = opsets(model)
    found: dict[tuple[str, str], dict] = {}
    for node in _walk(model.graph):
        if is_supported(node.domain, node.op_type):
            continue
        domain = node.domain or "ai.onnx"
        entry = found.setdefault(
            (domain, node.op_type),
            {
                "domain": domain,
                "op_type": node.op_type,
                "opset": versions.get(domain),
                "count": 0,
                "first_node": node.name or f"<unnamed {node.op_type} -> {list(node.output)}>",
            },
        )
        entry["count"] += 1
    return list(found.values())


def check_supported(model: onnx.ModelProto, where: str) -> None:
    bad = find_unsupported_ops(model)
    if not bad:
        return
    listing = "; ".join(
        f"{b['domain']}::{b['op_type']} (opset {b['opset']}, {b['count']}x, first node {b['first_node']!r})"
        for b in bad
    )
    fix = "remove or replace these ops before export"
    if any(b["op_type"] in ("Loop", "Scan") for b in bad):
        fix = (
            "a Loop or Scan whose trip count is known can be unrolled before export (e.g. torch.onnx.export of a "
            "Python loop); freeze the inputs it depends on with --freeze-input NAME=VALUE if they are known"
        )
    raise UnsupportedModelError(f"{len(bad)} unsupported op type(s): {listing}", ops=bad, where=where, fix=fix)


def inspect_onnx(path) -> dict:
    """What `kiln inspect` says of an ONNX model: producer, opsets, inputs and outputs, ops, and the
    ops Kiln cannot compile."""
    from .onnx_load import load_onnx
    from .shapes import declared_dims, graph_inputs

    model = load_onnx(path)
    io = lambda vis: [{"name": v.name, "shape": declared_dims(v), "dtype": _elem_dtype(v)} for v in vis]
    return {
        "kind": "onnx",
        "path": str(path),
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "opsets": opsets(model),
        "inputs": io(graph_inputs(model)),
        "outputs": io(model.graph.output),
        "nodes": sum(op_histogram(model).values()),
        "op_histogram": op_histogram(model),
        "initializers": len(model.graph.initializer),
        "unsupported_ops": find_unsupported_ops(model),
    }


def _elem_dtype(vi) -> str:
    try:
        return str(onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
    except Exception:
        return "?"
