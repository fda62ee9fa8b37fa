"""ONNX -> ONNX rewrites of ops TVM's importer lacks, into ops it has. One op family per file;
REWRITES maps op type to its rewrite function (data, not branches)."""
from __future__ import annotations

import onnx

from .emitter import Emitter
from .rnn import decompose_gru, decompose_lstm

# op type -> rewrite(node, emitter, shapes, consts, where); a rewrite may return False to keep the node
REWRITES = {"LSTM": decompose_lstm, "GRU": decompose_gru}


def decompose(model: onnx.ModelProto, shapes: dict, consts: dict, where: str) -> int:
    """Rewrite every node in REWRITES in place; returns how many were rewritten."""
    g, out, count = model.graph, [], 0
    for node in g.node:
        fn = REWRITES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
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


__all__ = ["decompose", "REWRITES", "Emitter"]
