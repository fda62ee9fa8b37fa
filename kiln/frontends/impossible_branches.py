"""If branches that cannot run for the pinned shapes. TVM's importer compiles both branches of an If on
data (relax.If) for the input shapes pinned; a voice-activity detector that branches on its sample rate
has an 8 kHz branch whose Reshape/MatMul cannot type-check for 16 kHz frames, so the import failed,
where onnxruntime runs the model (it only evaluates the branch taken). When the import fails, each
branch of each top-level If on data is imported alone; where exactly one fails, the If is replaced by
the other branch, inlined, after a KilnAssert on its condition (tvm_assert.py): a run-time error naming
the condition if an input ever selects the dropped branch. A compile-time warning says what was dropped.
A pruned model that still fails to import is not used: the original error stands."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import warnings

import onnx

from ..errors import KilnWarning
from . import simplify
from .constant_inputs import graph_input_sources
from .tvm_assert import DOMAIN, OP_TYPE

BRANCHES = ("then_branch", "else_branch")
METADATA = "# Metadata omitted. Use show_meta=True in script() method to show it."  # TVM's IR printer's note


@dataclasses.dataclass
class Pruned:
    node: str  # the If's name
    dropped: str  # "then_branch" / "else_branch"
    sources: list[str]  # the graph inputs its condition is computed from
    error: str  # why the dropped branch cannot be imported


def prune(model: onnx.ModelProto, convert, where: str) -> tuple[onnx.ModelProto, list[Pruned]]:
    """A copy of model with the impossible branches dropped (convert(model) raises where TVM's importer
    cannot take a model), and what was dropped; the model itself when nothing was."""
    ifs = [(k, n) for k, n in enumerate(model.graph.node) if n.op_type == "If" and n.domain in ("", "ai.onnx")]
    if not ifs:
        return model, []
    typed = simplify.typed_values(model)
    consts = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    plan = {}  # index of the If in the graph's nodes -> what is dropped
    for k, node in ifs:
        errors = {a.name: _fails(model, a.g, typed, consts, convert) for a in node.attribute if a.name in BRANCHES}
        bad = [b for b, e in errors.items() if e is not None]
        if len(bad) == 1 and len(errors) == 2:
            plan[k] = Pruned(node.name or node.output[0], bad[0], [], errors[bad[0]])
    if not plan:
        return model, []
    out = onnx.ModelProto()
    out.CopyFrom(model)
    pruned = _rewrite(out, plan, consts)
    for p in pruned:
        p.sources = sorted(graph_input_sources(model, _cond_of(model, p.node)))
    return out, pruned


def _fails(model, g, typed, consts, convert) -> str | None:
    """Why the branch g cannot be imported alone (TVM's last message line), None when it can (or when it
    cannot be checked alone: an outer value of unknown type)."""
    sub = simplify.branch_model(model, g, typed, consts)
    if sub is None or any(not _static(vi) for vi in sub.graph.input):
        return None
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # TVM prints "Error converting operator ..." too
            convert(sub)
    except Exception as e:
        cause = e.__cause__ or e  # TVM's own error, not the PassError around it
        lines = [ln.replace(METADATA, "").strip() for ln in str(cause).strip().splitlines()]
        lines = [ln for ln in lines if ln]
        return f"{type(cause).__name__}: {lines[-1][:300] if lines else ''}"
    return None


def _static(vi) -> bool:
    t = vi.type.tensor_type
    return t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim)


def _cond_of(model, name: str) -> str:
    return next(n.input[0] for n in model.graph.node if n.op_type == "If" and (n.name or n.output[0]) == name)


def _rewrite(model: onnx.ModelProto, plan: dict, consts: dict) -> list[Pruned]:
    """Replace (in place) each If in plan by a KilnAssert on its condition and its other branch inlined."""
    g, nodes, done = model.graph, [], []
    for k, node in enumerate(list(g.node)):
        p = plan.get(k)
        if p is None:
            nodes.append(node)
            continue
        keep = BRANCHES[1 - BRANCHES.index(p.dropped)]
        nodes.append(_assert_node(node, p, keep, model))
        simplify.inline(node, next(a.g for a in node.attribute if a.name == keep), consts, nodes)
        done.append(p)
    del g.node[:]
    g.node.extend(nodes)
    simplify.write_constants(g, consts)
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(DOMAIN, 1))
    return done


def _assert_node(node, p: Pruned, keep: str, model) -> onnx.NodeProto:
    srcs = sorted(graph_input_sources(model, node.input[0])) or [node.input[0]]
    taken = keep.split("_")[0]
    message = (
        f"this artifact was compiled for inputs where {', '.join(f'`{s}`' for s in srcs)} selects the {taken} branch "
        f"of If node {p.node!r} (condition {node.input[0]!r} {'true' if taken == 'then' else 'false'}); these inputs "
        f"select the other branch, which cannot run for the input shapes compiled ({p.error})"
    )
    return onnx.helper.make_node(
        OP_TYPE,
        [node.input[0]],
        [f"{p.node}/kiln_assert"],
        name=f"{p.node}/kiln_assert",
        domain=DOMAIN,
        expect=int(taken == "then"),
        message=message,
    )


def warn(pruned: list[Pruned], where: str) -> None:
    for p in pruned:
        feeds = ", ".join(p.sources) or "its condition"
        warnings.warn(
            f"{where}: If node {p.node!r}: its {p.dropped.split('_')[0]} branch cannot run for the pinned input "
            f"shapes ({p.error}); only the other branch is compiled, and a run whose {feeds} select(s) the dropped "
            f"branch raises an error (if the value is known when you deploy, --freeze-input "
            f"{p.sources[0] if p.sources else 'NAME'}=VALUE compiles the branch taken)",
            KilnWarning,
            stacklevel=3,
        )
