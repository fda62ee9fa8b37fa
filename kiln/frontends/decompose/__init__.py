"""ONNX -> ONNX rewrites of ops TVM's importer lacks, into ops it has. One op family per file;
REWRITES maps op type to its rewrite function (data, not branches)."""
from __future__ import annotations

import onnx

from .contrib import DEFAULT_DOMAIN_REWRITES as CONTRIB_DEFAULT_REWRITES, REWRITES as MS_FLOAT_REWRITES
from .contrib_quant import REWRITES as MS_QUANT_REWRITES
from .emitter import Emitter
from .llm_ops import REWRITES as LLM_REWRITES
from .quant import CONTRIB_REWRITES, REWRITES as QUANT_REWRITES
from .rnn import decompose_gru, decompose_lstm, decompose_rnn
from .standard import REWRITES as STANDARD_REWRITES

# op type -> rewrite(node, emitter, shapes, consts, where); a rewrite may return False to keep the node
REWRITES = {"LSTM": decompose_lstm, "GRU": decompose_gru, "RNN": decompose_rnn, **QUANT_REWRITES}
REWRITES.update(STANDARD_REWRITES)  # standard ops TVM lacks or converts wrongly (standard.py)
REWRITES.update(LLM_REWRITES)  # LinearAttention, TensorScatter (llm_ops.py)
REWRITES.update(CONTRIB_DEFAULT_REWRITES)  # onnxruntime's SimplifiedLayerNormalization (default domain)
# contrib domains: domain -> {op type -> rewrite}
DOMAIN_REWRITES = {**CONTRIB_REWRITES,
                   "com.microsoft": {**CONTRIB_REWRITES["com.microsoft"], **MS_FLOAT_REWRITES, **MS_QUANT_REWRITES}}


def rewrite_for(node):
    if node.domain in ("", "ai.onnx"):
        return REWRITES.get(node.op_type)
    return DOMAIN_REWRITES.get(node.domain, {}).get(node.op_type)


def decompose(model: onnx.ModelProto, shapes: dict, consts: dict, where: str) -> int:
    """Rewrite every node in REWRITES in place; returns how many were rewritten."""
    g, out, count = model.graph, [], 0
    for node in g.node:
        fn = rewrite_for(node)
        if fn is None:
            out.append(node)
            continue
        em = Emitter(node.name or f"{node.op_type}_{count}", consts)
        if fn(node, em, shapes, consts, where) is False:
            out.append(node)
            continue
        out.extend(em.nodes)
        count += 1
    del g.node[:]
    g.node.extend(out)
    return count


__all__ = ["decompose", "rewrite_for", "REWRITES", "DOMAIN_REWRITES", "Emitter"]
