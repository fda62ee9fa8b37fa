"""Standard-domain ONNX ops that TVM 0.27's importer lacks (or converts wrongly), rewritten into ops it
converts correctly.

Most of them are defined by ONNX itself as a function of simpler ops (the schema's function body:
Attention, the two losses, CenterCropPad, RMSNormalization, RotaryEmbedding, Swish, ...). For those
the rewrite is the body ONNX ships, inlined with the node's attributes and inputs: correct by the
spec's own definition, for every opset the schema covers. A context-dependent body (most of them) is
built from the node's input types; a body may call another function op (SoftmaxCrossEntropyLoss
calls NegativeLogLikelihoodLoss), which is inlined in turn; then the body's shape arithmetic is
folded with the pinned shapes (TVM takes shapes as values nowhere). Ops without a body are written
out by hand in standard_math.py.

The rewrite interface passes shapes but not element types, so the types come from ONNX's shape
inference over the model being decomposed (found on the caller's frame: decompose()'s `model`)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from .emitter import CURRENT_MODEL, Emitter

DEFAULT_DOMAINS = ("", "ai.onnx")
MAX_DEPTH = 4  # function bodies calling function ops, inlined this deep at most
FOLD_LIMIT = 1 << 16  # elements: a body's constants are shapes, scales and masks, not weights
NOT_FOLDED = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial", "Dropout"}
)


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


# ------------------------------------------------------------------------------------------ types

_TYPES: list = [None, None]  # [model, {value name: TypeProto}]: inference once per decompose() call


def _caller_model() -> onnx.ModelProto | None:
    """The model decompose() is rewriting (the rewrite interface passes shapes, not element types)."""
    return CURRENT_MODEL.get()


def _model_types(model: onnx.ModelProto | None) -> dict:
    if model is None:
        return {}
    if _TYPES[0] is not model:
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        except Exception:
            inferred = model
        g = inferred.graph
        types = {v.name: v.type for v in list(g.value_info) + list(g.input) + list(g.output)}
        for t in g.initializer:
            types.setdefault(t.name, helper.make_tensor_type_proto(t.data_type, list(t.dims)))
        _TYPES[:] = [model, types]
    return _TYPES[1]


def value_elem_type(name: str, consts: dict) -> int | None:
    """The element type of a value of the model decompose() is rewriting; inferred again once when the
    name is new since the last inference (a node emitted by an earlier round's rewrite)."""
    model = _caller_model()
    types = _model_types(model)
    if name not in types and name not in consts and model is not None:
        _TYPES[0] = None
        types = _model_types(model)
    return _elem_type(types, consts, name)


def _opset(model: onnx.ModelProto | None) -> int:
    if model is None:
        return onnx.defs.onnx_opset_version()
    return next((o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS), 1)


def _elem_type(types: dict, consts: dict, name: str) -> int | None:
    if name in consts:
        return helper.np_dtype_to_tensor_dtype(np.asarray(consts[name]).dtype)
    t = types.get(name)
    return t.tensor_type.elem_type if t is not None and t.HasField("tensor_type") else None


# ------------------------------------------------------------------------------------------ function bodies


def _function(node, types: dict, opset: int) -> onnx.FunctionProto | None:
    """The schema's function body for `node` at the model's opset, or None when ONNX defines none."""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain or "")
    except onnx.defs.SchemaError:
        return None
    plain = [v for v in schema.function_opset_versions if v <= opset]
    ctx = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    try:
        if plain and (not ctx or max(plain) >= max(ctx)):
            raw = schema.get_function_with_opset_version(max(plain))
        elif ctx:
            in_types = [types.get(i, onnx.TypeProto()) if i else onnx.TypeProto() for i in node.input]
            if any(i and not t.HasField("tensor_type") for i, t in zip(node.input, in_types)):
                return None  # the body depends on the input types, which are not known
            raw = schema.get_context_dependent_function_with_opset_version(
                max(ctx), node.SerializeToString(), [t.SerializeToString() for t in in_types]
            )
        else:
            return None
    except Exception:
        return None
    if not raw:
        return None
    return onnx.FunctionProto.FromString(raw)


def _inline(node, fn: onnx.FunctionProto, prefix: str) -> list[onnx.NodeProto]:
    """fn's nodes with its formal inputs/outputs replaced by the node's, every other value name
    prefixed, and attribute references resolved against the node's attributes (then fn's defaults)."""
    names = {f: (node.input[i] if i < len(node.input) else "") for i, f in enumerate(fn.input)}
    names.update({f: node.output[i] for i, f in enumerate(fn.output) if i < len(node.output) and node.output[i]})
    given = {a.name: a for a in node.attribute}
    defaults = {a.name: a for a in fn.attribute_proto}

    def rename(n: str) -> str:
        return names.get(n, prefix + n if n else "")

    def fix_graph(g: onnx.GraphProto) -> None:
        for v in list(g.input) + list(g.output) + list(g.value_info):
            v.name = rename(v.name)
        for t in g.initializer:
            t.name = rename(t.name)
        for n in g.node:
            fix_node(n)

    def fix_node(n: onnx.NodeProto) -> None:
        n.input[:] = [rename(x) for x in n.input]
        n.output[:] = [rename(x) for x in n.output]
        n.name = prefix + (n.name or n.op_type)
        attrs = []
        for a in n.attribute:
            if a.ref_attr_name:
                src = given.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                if src is None:
                    continue
                b = onnx.AttributeProto()
                b.CopyFrom(src)
                b.name = a.name
                a = b
            if a.type == onnx.AttributeProto.GRAPH:
                fix_graph(a.g)
            for g in a.graphs:
                fix_graph(g)
            attrs.append(a)
        del n.attribute[:]
        n.attribute.extend(attrs)

    out = []
    for n in fn.node:
        c = onnx.NodeProto()
        c.CopyFrom(n)
        fix_node(c)
        out.append(c)
    return out


def _infer_types(nodes: list, node, types: dict, opset: int, known: dict | None = None) -> dict:
    """Types (with shapes) of the values of an inlined body, the constants found so far given as
    initializers so that the shapes they decide are known too."""
    known = {k: v for k, v in (known or {}).items() if v.size <= FOLD_LIMIT}
    ins = [
        helper.make_value_info(i, types[i]) for i in dict.fromkeys(node.input) if i and i in types and i not in known
    ]
    inits = [onnx.numpy_helper.from_array(v, k) for k, v in known.items()]
    g = helper.make_graph(
        nodes, "body", ins, [helper.make_value_info(o, onnx.TypeProto()) for o in node.output if o], initializer=inits
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    try:
        m = onnx.shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
    except Exception:
        return types
    return {**types, **{v.name: v.type for v in m.graph.value_info}}


def _expand(node, types: dict, opset: int, prefix: str, depth: int = 0) -> list | None:
    fn = _function(node, types, opset)
    if fn is None:
        return None
    nodes = _inline(node, fn, prefix)
    if depth < MAX_DEPTH and any(n.op_type in FUNCTION_OPS and n.domain in DEFAULT_DOMAINS for n in nodes):
        inner = _infer_types(nodes, node, types, opset)
        out = []
        for k, n in enumerate(nodes):
            sub = (
                _expand(n, inner, opset, f"{prefix}{k}/", depth + 1)
                if n.op_type in FUNCTION_OPS and n.domain in DEFAULT_DOMAINS
                else None
            )
            out.extend(sub if sub is not None else [n])
        nodes = out
    return nodes


def _fold_node(n, inner: dict, known: dict, folded: dict, opset: int, evaluator) -> bool:
    """Fold one node when its outputs are known now; True when it was."""
    value = None
    if n.op_type in ("Shape", "Size") and n.input[0] in inner:
        t = inner[n.input[0]].tensor_type
        dims = (
            [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim] if t.HasField("shape") else [None]
        )
        if None not in dims:
            a = _attrs(n)
            shape = np.array(dims, np.int64)
            value = (
                [shape[a.get("start", 0) : a.get("end", len(dims))]]
                if n.op_type == "Shape"
                else [np.array(int(np.prod(dims)), np.int64)]
            )
    elif (
        n.op_type == "CastLike"
        and n.input[0] in known
        and n.input[1] in inner
        and inner[n.input[1]].tensor_type.elem_type
    ):  # only the target's type matters, not its value
        value = [known[n.input[0]].astype(helper.tensor_dtype_to_np_dtype(inner[n.input[1]].tensor_type.elem_type))]
    elif (
        n.op_type not in NOT_FOLDED
        and all(not i or i in known for i in n.input)
        and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute)
    ):
        try:
            value = evaluator(n, opsets={"": opset}).run(None, {i: known[i] for i in n.input if i})
        except Exception:
            value = None
    if value is None or len(value) != len(n.output) or any(np.asarray(v).size > FOLD_LIMIT for v in value):
        return False
    for o, v in zip(n.output, value):
        if o:
            known[o] = folded[o] = np.asarray(v)
    return True


def _fold(nodes: list, node, types: dict, consts: dict, opset: int) -> tuple[list, dict]:
    """Evaluate what the pinned shapes make constant (Shape, Size, Constant and every node whose
    inputs are all constant: a body's shape arithmetic, which TVM cannot take as values); returns
    the nodes left and the new constants. The model's own simplifier ran before the body existed."""
    from onnx.reference import ReferenceEvaluator

    known = {i: np.asarray(consts[i]) for i in node.input if i in consts}
    folded: dict = {}
    for _ in range(8):  # constants decide shapes, which make more constants
        inner = _infer_types(nodes, node, types, opset, known)
        kept = [n for n in nodes if not _fold_node(n, inner, known, folded, opset, ReferenceEvaluator)]
        if len(kept) == len(nodes):
            break
        nodes = kept
    for o in node.output:  # an output of the op itself that became constant: produced by an Identity
        if o in folded:
            folded[o + "/folded"] = folded.pop(o)
            kept.append(helper.make_node("Identity", [o + "/folded"], [o], name=o + "/folded"))
    return kept, folded


def function_body(node, em: Emitter, shapes, consts, where):
    """Any op of FUNCTION_OPS: its ONNX function body, inlined; the node is kept when ONNX gives none
    for this node (TVM's converter, where there is one, or preflight's verdict then stand)."""
    cond = FUNCTION_OPS[node.op_type]
    if cond is not None and not cond(node):
        return False
    model = _caller_model()
    types, opset = _model_types(model), _opset(model)
    nodes = _expand(node, types, opset, f"{em.prefix}/fn/")
    if not nodes:
        return False
    nodes, folded = _fold(nodes, node, types, consts, opset)
    consts.update(folded)
    em.nodes.extend(nodes)
    return True


def _extra_outputs(node) -> bool:
    """LayerNormalization: TVM returns a wrong (scalar) Mean and InvStdDev; the body is only needed
    when one of them is used."""
    return sum(1 for o in node.output if o) > 1


# op type -> None (always) or a predicate on the node (only then): ops inlined from their ONNX function
FUNCTION_OPS = {
    "Attention": None,  # TVM converts com.microsoft's Attention under this name (KeyError 'num_heads')
    "NegativeLogLikelihoodLoss": None,
    "SoftmaxCrossEntropyLoss": None,
    "CenterCropPad": None,
    "RMSNormalization": None,  # TVM's converter fails in the pipeline for axis 0 (a rank-0 read)
    "RotaryEmbedding": None,
    "Swish": None,
    "Celu": None,
    "LayerNormalization": _extra_outputs,
}


REWRITES = {op: function_body for op in FUNCTION_OPS}
