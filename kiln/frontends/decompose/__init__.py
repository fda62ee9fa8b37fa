"""ONNX -> ONNX rewrites of ops TVM's importer lacks, into ops it has. One op family per file;
REWRITES maps op type to its rewrite function (data, not branches)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from .activations import REWRITES as ACTIVATION_REWRITES
from .contrib import DEFAULT_DOMAIN_REWRITES as CONTRIB_DEFAULT_REWRITES
from .contrib import REWRITES as MS_FLOAT_REWRITES
from .contrib_quant import REWRITES as MS_QUANT_REWRITES
from .control_flow import REWRITES as CONTROL_FLOW_REWRITES
from .deform_conv import REWRITES as DEFORM_CONV_REWRITES
from .emitter import CURRENT_MODEL, Emitter
from .llm_ops import REWRITES as LLM_REWRITES
from .low_precision import REWRITES as LOW_PRECISION_REWRITES
from .ml import ML_REWRITES
from .quant import CONTRIB_REWRITES
from .quant import REWRITES as QUANT_REWRITES
from .rnn import decompose_gru, decompose_lstm, decompose_rnn
from .runtime_scalars import REWRITES as RUNTIME_SCALAR_REWRITES
from .scalar_axes import REWRITES as SCALAR_AXES_REWRITES
from .sequences import REWRITES as SEQUENCE_REWRITES
from .standard import REWRITES as STANDARD_REWRITES
from .standard_math import REWRITES as MATH_REWRITES
from .standard_spatial import REWRITES as SPATIAL_REWRITES
from .tfidf import REWRITES as TFIDF_REWRITES

# op type -> rewrite(node, emitter, shapes, consts, where); a rewrite may return False to keep the node
REWRITES = {"LSTM": decompose_lstm, "GRU": decompose_gru, "RNN": decompose_rnn, **QUANT_REWRITES}
REWRITES.update(STANDARD_REWRITES)  # standard ops TVM lacks or converts wrongly (standard.py)
REWRITES.update(MATH_REWRITES)  # math, norms, layout ops TVM lacks or gets wrong (standard_math.py)
REWRITES.update(SPATIAL_REWRITES)  # ConvTranspose, Col2Im, MaxPool, Resize (standard_spatial.py)
REWRITES.update(DEFORM_CONV_REWRITES)  # DeformConv as GridSample taps and a grouped MatMul (deform_conv.py)
REWRITES.update(LLM_REWRITES)  # LinearAttention, TensorScatter (llm_ops.py)
REWRITES.update(CONTROL_FLOW_REWRITES)  # Loop/Scan with static trip counts, unrolled (control_flow.py)
REWRITES.update(SEQUENCE_REWRITES)  # SplitToSequence as Split + SequenceConstruct (sequences.py)
REWRITES.update(ACTIVATION_REWRITES)  # Elu with constants typed like its input (activations.py)
REWRITES.update(CONTRIB_DEFAULT_REWRITES)  # onnxruntime's SimplifiedLayerNormalization (default domain)
REWRITES.update(RUNTIME_SCALAR_REWRITES)  # Pad's fill value as a run-time input (runtime_scalars.py)
REWRITES.update(TFIDF_REWRITES)  # TfIdfVectorizer over integer tokens as slice compares (tfidf.py)
REWRITES.update(SCALAR_AXES_REWRITES)  # Unsqueeze's rank-0 constant axes as 1-D (scalar_axes.py)
REWRITES.update(LOW_PRECISION_REWRITES)  # fp16/bf16 Softmax: float32 steps, each rounded (low_precision.py)
# contrib domains: domain -> {op type -> rewrite}
DOMAIN_REWRITES = {
    **CONTRIB_REWRITES,
    "com.microsoft": {**CONTRIB_REWRITES["com.microsoft"], **MS_FLOAT_REWRITES, **MS_QUANT_REWRITES},
    **ML_REWRITES,
}  # ai.onnx.ml's tensor-arithmetic ops (ml.py)

MAX_ROUNDS = 8  # rounds beyond one per node: rewrites that emit rewritable nodes, nested (_decompose_rounds)
# ops whose outputs ONNX's shape inference leaves shapeless (a Loop's carried values): a rewrite reading
# them waits for the next round, when the unrolled nodes have inferred shapes
SHAPELESS_OUTPUTS = frozenset({"Loop", "Scan"})


def rewrite_for(node):
    if node.domain in ("", "ai.onnx"):
        return REWRITES.get(node.op_type)
    return DOMAIN_REWRITES.get(node.domain, {}).get(node.op_type)


def decompose(model: onnx.ModelProto, shapes: dict, consts: dict, where: str) -> int:
    """Rewrite every node in REWRITES in place; returns how many were rewritten. Nodes a rewrite emits
    that need a rewrite of another op type (an unrolled Loop body holding an LSTM) are rewritten in a
    next round, with shapes inferred again for them; nothing else is visited twice."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    token = CURRENT_MODEL.set(model)
    try:
        return _decompose_rounds(model, shapes, consts, where, opset)
    finally:
        CURRENT_MODEL.reset(token)


def _decompose_rounds(model, shapes, consts, where, opset) -> int:
    """Rounds until nothing is left to rewrite. A chain of contrib ops whose outputs ONNX cannot size takes a
    round per link (each waits for the shapes of the one before: an onnxruntime QOperator ResNet-18 has 8
    QLinearAdds, then QLinearGlobalAveragePool and QGemm, and stopped after 8 rounds with the last two left),
    so the bound grows with the graph. Every round rewrites something or leaves nothing to do: a node waits
    only on what a rewrite of the same round produced."""
    total, todo = 0, None
    for round_ in range(MAX_ROUNDS + len(model.graph.node)):
        if round_:
            shapes = _shapes_again(model, consts)
        count, todo = _decompose_once(model, shapes, consts, where, opset, total, todo)
        total += count
        if not todo:
            break
    return total


def _decompose_once(model, shapes, consts, where, opset, first, only) -> tuple[int, set]:
    """One pass over the nodes (only: names of the nodes to visit, None: all); returns the count and
    the names of emitted nodes still to rewrite."""
    g, out, count, todo, fresh = model.graph, [], 0, set(), set()
    for node in g.node:
        fn = rewrite_for(node) if only is None or node.name in only else None
        waits = bool(fresh.intersection(node.input))
        if waits:
            fresh.update(o for o in node.output if o)
        if fn is None:
            out.append(node)
            continue
        if waits:  # reads a value computed from an unrolled loop's: its shape is inferred next round
            node.name = node.name or f"{node.op_type}_waiting_{first + len(todo)}"
            out.append(node)
            todo.add(node.name)
            continue
        em = Emitter(node.name or f"{node.op_type}_{first + count}", consts)
        em.opset = opset  # for rewrites that emit opset-dependent forms (Unsqueeze's axes, control_flow.py)
        if fn(node, em, shapes, consts, where) is False:
            out.append(node)
            continue
        out.extend(em.nodes)
        count += 1
        nested = node.op_type in SHAPELESS_OUTPUTS  # an unrolled body may hold the same op (a Loop in a Loop)
        todo |= {n.name for n in em.nodes if n.name and (nested or n.op_type != node.op_type) and rewrite_for(n)}
        if node.op_type in SHAPELESS_OUTPUTS or any(o and o not in shapes for o in node.output):
            # outputs ONNX's shape inference could not size before the rewrite (a contrib op's: the first of two
            # stacked DynamicQuantizeLSTMs): what reads them is rewritten next round, with shapes inferred again
            fresh.update(o for o in node.output if o)
    del g.node[:]
    g.node.extend(out)
    return count, todo


def _shapes_again(model, consts) -> dict:
    """Static shapes of the rewritten graph, its new constants written as initializers for inference."""
    from ..simplify import static_shapes

    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {i.name for i in m.graph.initializer}
    used = {i for n in m.graph.node for i in n.input}
    m.graph.initializer.extend(
        numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items() if k in used and k not in have
    )
    return static_shapes(m)


__all__ = ["decompose", "rewrite_for", "REWRITES", "DOMAIN_REWRITES", "Emitter"]
