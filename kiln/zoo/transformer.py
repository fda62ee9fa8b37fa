"""A small transformer encoder (BERT-style post-norm: multi-head attention, LayerNorm, GELU FFN).
Batch and sequence are symbolic and the head reshapes are computed from Shape at run time, the way
PyTorch's exporter writes them, so compiling it exercises Kiln's shape resolution."""

from __future__ import annotations

import math

import numpy as np

from .builder import GraphBuilder


def _dyn_reshape(b: GraphBuilder, x: str, tail: list[int]) -> str:
    """Reshape x [B, S, ...] to [B, S, *tail] with B and S read from Shape(x) at run time."""
    shp = b.node("Shape", [x], "shape")
    bs = b.node("Slice", [shp, b.const(np.array([0], np.int64)), b.const(np.array([2], np.int64))], "bs")
    new = b.node("Concat", [bs, b.const(np.array(tail, np.int64), "tail")], "newshape", axis=0)
    return b.node("Reshape", [x, new], "reshape")


def _layernorm(b: GraphBuilder, x: str, d: int) -> str:
    g = b.const(b.rng.uniform(0.8, 1.2, d).astype(np.float32), "ln_g")
    beta = b.const(b.rng.normal(0, 0.05, d).astype(np.float32), "ln_b")
    return b.node("LayerNormalization", [x, g, beta], "ln", axis=-1, epsilon=1e-5)


def _gelu(b: GraphBuilder, x: str) -> str:
    erf = b.node("Erf", [b.node("Div", [x, b.const(np.float32(math.sqrt(2.0)))])])
    one = b.node("Add", [erf, b.const(np.float32(1.0))])
    return b.node("Mul", [b.node("Mul", [x, one]), b.const(np.float32(0.5))], "gelu")


def transformer_encoder(
    d_model: int = 128,
    heads: int = 4,
    layers: int = 2,
    ffn: int = 512,
    seq: int | None = None,
    batch: int | None = None,
    seed: int = 0,
):
    b = GraphBuilder("transformer_encoder", seed)
    dh = d_model // heads
    x = "input"
    for _ in range(layers):
        q, k, v = (_dyn_reshape(b, b.linear(x, d_model, d_model), [heads, dh]) for _ in range(3))
        q = b.node("Transpose", [q], perm=[0, 2, 1, 3])
        kt = b.node("Transpose", [k], perm=[0, 2, 3, 1])
        v = b.node("Transpose", [v], perm=[0, 2, 1, 3])
        scores = b.node("Div", [b.node("MatMul", [q, kt]), b.const(np.float32(math.sqrt(dh)))], "scores")
        attn = b.node("Softmax", [scores], "attn", axis=-1)
        ctx = b.node("Transpose", [b.node("MatMul", [attn, v])], perm=[0, 2, 1, 3])
        ctx = _dyn_reshape(b, ctx, [d_model])
        x = _layernorm(b, b.add(x, b.linear(ctx, d_model, d_model)), d_model)
        h = b.linear(_gelu(b, b.linear(x, d_model, ffn)), ffn, d_model)
        x = _layernorm(b, b.add(x, h), d_model)
    dims = [batch or "batch", seq or "seq", d_model]
    return b.model([("input", dims)], x, dims)
