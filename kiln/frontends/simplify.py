"""ONNX-level simplification once input shapes are pinned: resolve run-time shape arithmetic
(Shape -> Gather -> Concat -> Reshape, computed pads), fold every deterministic node whose inputs
are all constants, inline `If` nodes whose condition became constant, and drop stale shape
annotations. TVM's importer needs these values as constants; real exporters compute them."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from ..errors import KilnWarning
from .onnx_load import to_array

NONDETERMINISTIC = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
)
MAX_FOLD_ELEMENTS = 1 << 24  # do not materialize constants beyond 64 MB of fp32
MAX_ROUNDS = 32


def simplify(model: onnx.ModelProto, where: str) -> tuple[onnx.ModelProto, dict[str, int]]:
    """Returns the simplified model (a new proto) and counts of what was done."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    del g.value_info[:]  # stale or wrong annotations from exporters: re-inferred below
    for out in g.output:
        out.type.tensor_type.ClearField("shape")
    consts = {i.name: to_array(i, where) for i in g.initializer}
    opsets = {(o.domain or ""): o.version for o in m.opset_import}
    stats = {"nodes_before": len(g.node), "folded": 0, "shapes_resolved": 0, "ifs_inlined": 0}
    for _ in range(MAX_ROUNDS):
        shapes = static_shapes(m)
        nodes, changed = [], False
        for node in g.node:
            done = _try_fold(node, consts, shapes, opsets, nodes, stats, where)
            changed |= done
            if not done:
                nodes.append(node)
        del g.node[:]
        g.node.extend(nodes)
        write_constants(g, consts)
        if not changed:
            break
    if any(n.op_type == "If" for n in g.node):
        _simplify_branches(m, consts, stats, where)
        write_constants(g, consts)
    stats["nodes_after"] = len(g.node)
    return m, stats


def _simplify_branches(m: onnx.ModelProto, consts: dict, stats: dict, where: str) -> None:
    """Fold inside the branches of the Ifs left (their condition is data), so shape arithmetic inside
    them (a VAD's per-sample-rate front end) is constant for TVM too."""

    def fold(sub):
        simple, sub_stats = simplify(sub, where)
        for k in ("folded", "shapes_resolved", "ifs_inlined"):
            stats[k] += sub_stats[k]
        return simple

    map_branches(m, consts, fold)


def map_branches(m: onnx.ModelProto, consts: dict, fn) -> None:
    """Apply fn (model -> model) to each branch of the graph's If nodes, in place: the branch as a model
    of its own whose inputs are the outer values it reads, with their inferred types and shapes, and
    whose initializers include the outer constants it reads."""
    typed = typed_values(m)
    for node in m.graph.node:
        if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
            continue
        for a in node.attribute:
            if a.type != onnx.AttributeProto.GRAPH:
                continue
            sub = branch_model(m, a.g, typed, consts)
            if sub is None:
                continue  # an outer value of unknown type: leave the branch as it is
            outer = outer_refs_of(a.g)
            done = fn(sub)
            del a.g.node[:]
            a.g.node.extend(done.graph.node)
            del a.g.initializer[:]
            a.g.initializer.extend(i for i in done.graph.initializer if i.name not in outer or i.name not in consts)
            del a.g.output[:]
            a.g.output.extend(done.graph.output)


def branch_model(m: onnx.ModelProto, g: onnx.GraphProto, typed: dict, consts: dict) -> onnx.ModelProto | None:
    """An If branch g of model m as a model of its own: its inputs are the outer values it reads, typed as
    in `typed` (typed_values of m), its initializers include the outer constants it reads; None when an
    outer value it reads has no known type."""
    outer = sorted(outer_refs_of(g))
    inputs = [
        onnx.helper.make_tensor_value_info(n, typed[n][0], typed[n][1]) for n in outer if n not in consts and n in typed
    ]
    if len(inputs) != len([n for n in outer if n not in consts]):
        return None
    inits = [numpy_helper.from_array(np.asarray(consts[n]), n) for n in outer if n in consts] + list(g.initializer)
    return onnx.helper.make_model(
        onnx.helper.make_graph(list(g.node), g.name, inputs, list(g.output), inits),
        opset_imports=list(m.opset_import),
        ir_version=m.ir_version,
    )


def outer_refs_of(g: onnx.GraphProto) -> set[str]:
    """Names a subgraph (and the subgraphs inside it) reads that it does not define."""
    own = {i.name for i in g.input} | {i.name for i in g.initializer} | {o for n in g.node for o in n.output if o}
    reads = {i for n in g.node for i in n.input if i}
    for n in g.node:
        for a in n.attribute:
            for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                reads |= outer_refs_of(sub)
    return reads - own


def typed_values(m: onnx.ModelProto) -> dict[str, tuple[int, list | None]]:
    """name -> (element type, dims or None) of every value ONNX's shape inference types."""
    try:
        inferred = onnx.shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
    except Exception:
        return {}
    out = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        t = vi.type.tensor_type
        if vi.type.WhichOneof("value") == "tensor_type" and t.elem_type:
            dims = (
                [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
                if t.HasField("shape")
                else None
            )
            out[vi.name] = (t.elem_type, dims)
    return out


def _try_fold(node, consts, shapes, opsets, out_nodes, stats, where) -> bool:
    if node.domain not in ("", "ai.onnx"):
        return False
    op = node.op_type
    if op == "Concat" and len(node.input) > 1:
        _drop_empty_inputs(node, consts, shapes)
    if op == "Constant":
        value = eval_node(node, consts, opsets, stats, where)
        if value is None:
            return False
        consts[node.output[0]] = value[0]
        return True
    if op in ("Shape", "Size") and node.input[0] in shapes:
        shp = shapes[node.input[0]]
        if op == "Size":
            consts[node.output[0]] = np.array(int(np.prod(shp)), dtype=np.int64)
        else:
            a = {at.name: at.i for at in node.attribute}
            r = len(shp)
            start, end = a.get("start", 0), a.get("end", r)
            consts[node.output[0]] = np.array(shp[slice(start, end)], dtype=np.int64)
        stats["shapes_resolved"] += 1
        return True
    if op == "If" and node.input[0] in consts:
        branch = "then_branch" if bool(np.asarray(consts[node.input[0]]).reshape(-1)[0]) else "else_branch"
        sub = next(a.g for a in node.attribute if a.name == branch)
        inline(node, sub, consts, out_nodes)
        stats["ifs_inlined"] += 1
        return True
    if op == "DequantizeLinear" and node.input[0] in consts and np.asarray(consts[node.input[0]]).dtype.kind in "iu":
        return (
            False  # quantized weights stay integer: the compiler's LowerQDQ pass turns DQ -> Conv into an integer conv
        )
    if op in NONDETERMINISTIC or any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute
    ):
        return False
    ins = [i for i in node.input if i]
    if not ins or not all(i in consts for i in ins):
        return False
    if any(np.asarray(consts[i]).size > MAX_FOLD_ELEMENTS for i in ins):
        return False
    if any(o in shapes and int(np.prod(shapes[o])) > MAX_FOLD_ELEMENTS for o in node.output):
        return False
    values = eval_node(node, consts, opsets, stats, where)
    if values is None:
        return False
    for name, val in zip(node.output, values):
        if name:
            consts[name] = val
    stats["folded"] += 1
    return True


def _drop_empty_inputs(node, consts, shapes) -> None:
    """A Concat of an empty value (a constant with a zero-size axis, or a value of static zero-size shape:
    a CastLike of such a constant, as CausalConvWithState's body pads with for kernel size 1) and something
    else is that something else: TVM would keep the empty constant, which its saved executable cannot load
    back ("Invalid DLTensor file format")."""

    def empty(i):
        return (i in consts and np.asarray(consts[i]).size == 0) or (i in shapes and 0 in shapes[i])

    keep = [i for i in node.input if not empty(i)]
    if keep and len(keep) < len(node.input):
        node.input[:] = keep


def eval_node(node, consts, opsets, stats, where) -> list[np.ndarray] | None:
    """The node's outputs on its constant inputs, by ONNX's reference evaluator; None where the
    evaluator cannot run it (its own gaps, e.g. opset-11 Unsqueeze with an axes attribute): the
    node then stays in the graph for TVM to compute, with one warning per op type."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            feeds = {i: consts[i] for i in node.input if i}
            ev = ReferenceEvaluator(_one_node_model(node, feeds, opsets))
            return [np.asarray(v) for v in ev.run(None, feeds)]
    except Exception as e:
        failed = stats.setdefault("fold_failed", {})
        if node.op_type not in failed:
            msg = str(e).strip().splitlines()
            warnings.warn(
                f"{where}: ONNX's reference evaluator cannot fold {node.op_type} node {node.name!r} "
                f"({type(e).__name__}: {msg[0][:200] if msg else ''}); it stays in the graph",
                KilnWarning,
                stacklevel=2,
            )
        nodes = failed.setdefault(node.op_type, [])
        if (node.name or node.output[0]) not in nodes:  # simplify retries it every round
            nodes.append(node.name or node.output[0])
        return None


def _one_node_model(node, feeds: dict, opsets: dict) -> onnx.ModelProto:
    """The node alone in a model of the graph's opsets: the evaluator then picks the op version the
    model declares (given a bare node it takes the newest, e.g. Unsqueeze-13 for an opset-11 one)."""
    ins = [
        onnx.helper.make_tensor_value_info(k, onnx.helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype), None)
        for k, v in feeds.items()
    ]
    outs = [onnx.helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output if o]
    g = onnx.helper.make_graph([node], "fold", ins, outs)
    return onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opsets.items()])


def inline(node, sub: onnx.GraphProto, consts, out_nodes) -> None:
    """Splice an If branch into the outer graph, renaming its locals to stay unique."""
    prefix = f"{node.name or node.output[0]}/"
    local = {i.name for i in sub.initializer} | {o for n in sub.node for o in n.output if o}
    rename = {n: prefix + n for n in local}
    for init in sub.initializer:
        consts[rename[init.name]] = to_array(init, "<subgraph>")
    for n in sub.node:
        c = onnx.NodeProto()
        c.CopyFrom(n)
        c.name = prefix + (n.name or n.op_type)
        c.input[:] = [rename.get(i, i) for i in n.input]
        c.output[:] = [rename.get(o, o) for o in n.output]
        for a in c.attribute:  # a nested branch reads this branch's locals by their old names
            for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                _rename_outer_refs(g, rename)
        out_nodes.append(c)
    for src, dst in zip(sub.output, node.output):
        out_nodes.append(
            onnx.helper.make_node("Identity", [rename.get(src.name, src.name)], [dst], name=prefix + "out/" + dst)
        )


def _rename_outer_refs(g: onnx.GraphProto, rename: dict) -> None:
    """Rename, in place, the values a subgraph reads from outside it (its own locals shadow them)."""
    own = {i.name for i in g.input} | {i.name for i in g.initializer} | {o for n in g.node for o in n.output if o}
    outer = {k: v for k, v in rename.items() if k not in own}
    for n in g.node:
        n.input[:] = [outer.get(i, i) for i in n.input]
        for a in n.attribute:
            for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                _rename_outer_refs(sub, outer)
    for o in g.output:
        if o.name in outer:
            o.name = outer[o.name]


def static_shapes(m: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    try:
        inferred = onnx.shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
    except Exception:
        return {}
    out = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        t = vi.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            out[vi.name] = tuple(d.dim_value for d in t.shape.dim)
    return out


def write_constants(g: onnx.GraphProto, consts: dict[str, np.ndarray]) -> None:
    """Keep as initializers exactly the constants still used; graph outputs that became constant
    are fed through an Identity so the importer still sees a node producing them."""
    used = {i for n in g.node for i in n.input} | _outer_refs(g)
    produced = {o for n in g.node for o in n.output}
    inputs = {i.name for i in g.input}
    for out in g.output:
        if out.name in consts and out.name not in produced:
            src = out.name + "/const"
            consts[src] = consts[out.name]
            g.node.append(onnx.helper.make_node("Identity", [src], [out.name], name=src))
            used.add(src)
    keep = [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items() if k in used and k not in produced]
    del g.initializer[:]
    g.initializer.extend(keep)
    kept = {i.name for i in keep}
    # initializers that were also listed as graph inputs (old exporters) stay listed only if kept
    real = [i for i in g.input if i.name not in {x for x in inputs if x in consts} or i.name in kept]
    del g.input[:]
    g.input.extend(real)


def _outer_refs(g: onnx.GraphProto) -> set[str]:
    """Names read by nodes inside subgraphs (they may refer to outer constants)."""
    refs = set()
    for n in g.node:
        for a in n.attribute:
            for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                refs |= {i for sn in sub.node for i in sn.input} | _outer_refs(sub)
    return refs
