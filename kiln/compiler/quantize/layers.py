"""Which ops of a float model quantize, named after their ONNX nodes (LayerNames: int8 and the
accelerator name layers the same way), and a visitor that walks them in one fixed order (calibration
taps, the rewrite and the accuracy taps all see the same layers).

A layer is a conv2d (groups 1, NCHW/OIHW) or a matmul by a constant 2-D weight, in float32. The
target's int8 kernel (schedules/rules/int8.py) needs output channels in blocks of its lanes (16 on AVX-512, or
8 on its ymm sibling; 8 on AVX2, 4 on NEON; 16 when no target is given) and input channels in steps of 4
(schedules/int8.conv_blocks); other layers stay float with a reason. A stem (fewer than 4 input
channels, which the int8 kernel takes padded) stays float too: the first layer is the one quantization
hurts most, and an imported QDQ model that quantizes its own stem still runs it int8. On a target
with no int8 kernel faster than its float32 code, every layer stays float and says why."""

from __future__ import annotations

import dataclasses

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst

from ...schedules.rules.int8 import (
    MIN_CHANNELS,
    Int8Kernel,
    conv_blocks,
    int8_kernel,
    kernel_for_channels,
    why_no_kernel,
)
from .cost import slower_reason

OPS = {"relax.nn.conv2d": "Conv", "relax.matmul": "MatMul"}
CHANNEL_BLOCK = 16


@dataclasses.dataclass(frozen=True)
class Layer:
    index: int
    name: str
    op: str  # "conv2d" | "matmul"
    reason: str | None  # why it stays float; None when it quantizes


def _onnx_names(onnx_model) -> dict[str, list[str]]:
    """ONNX node names (or output names) of Conv and MatMul/Gemm-by-initializer nodes, in graph
    order: the importer emits their Relax calls in the same order."""
    out = {"Conv": [], "MatMul": []}
    if onnx_model is None:
        return out
    inits = {i.name for i in onnx_model.graph.initializer}
    for n in onnx_model.graph.node:
        name = n.name or n.output[0]
        if n.op_type == "Conv":
            out["Conv"].append(name)
        elif n.op_type in ("MatMul", "Gemm") and len(n.input) > 1 and n.input[1] in inits:
            out["MatMul"].append(name)
    return out


def candidate(call) -> str | None:
    """The layer kind of a call ('conv2d'/'matmul') or None when it is not a layer at all."""
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op) or call.op.name not in OPS:
        return None
    if call.op.name == "relax.matmul":
        w = call.args[1]
        if not isinstance(w, GenericConst) or len(w.value.shape) != 2:
            return None  # activation x activation (attention) is not a weight layer
    return call.op.name.removeprefix("relax.nn.").removeprefix("relax.")


class LayerNames:
    """Names layers (calls `candidate` accepts) in graph order after their ONNX nodes: the importer
    emits the Relax calls of Conv and MatMul/Gemm-by-initializer nodes in the same order. A layer
    past the ONNX nodes (or with no ONNX model) is "<kind>_<k>", e.g. "conv2d_3", "matmul_0"."""

    def __init__(self, onnx_model=None):
        self.onnx = _onnx_names(onnx_model)
        self.seen = {"Conv": 0, "MatMul": 0}

    def next(self, call) -> str:
        """The name of `call`, the next layer of its kind in graph order."""
        onnx_kind = OPS[call.op.name]
        k = self.seen[onnx_kind]
        self.seen[onnx_kind] += 1
        names = self.onnx[onnx_kind]
        return names[k] if k < len(names) else f"{candidate(call)}_{k}"


def why_float(call, kernel: Int8Kernel | None = None) -> str | None:
    """Why a layer stays float (None: it quantizes) for the target's int8 kernel (None: blocks of CHANNEL_BLOCK)."""
    block = kernel.lanes if kernel is not None else CHANNEL_BLOCK
    x, w = call.args[0], call.args[1]
    if str(x.ty.dtype) != "float32":
        return f"input is {x.ty.dtype}, not float32"
    if not isinstance(w, GenericConst):
        return "weight is not a constant"
    if call.op.name == "relax.nn.conv2d":
        a = call.attrs
        if a.data_layout != "NCHW" or a.kernel_layout != "OIHW":
            return f"layout {a.data_layout}/{a.kernel_layout} (quantization runs on NCHW/OIHW)"
        if int(a.groups) != 1:
            return "grouped/depthwise conv: memory-bound, no int8 kernel (stays float)"
        o, i = int(w.value.shape[0]), int(w.value.shape[1])
        if i < MIN_CHANNELS:
            return f"channels {i}->{o}: a stem stays float (the layer quantization hurts most)"
        fits = conv_blocks(kernel, i, o) is not None if kernel is not None else not (i % block or o % block)
        if not fits:
            return f"channels {i}->{o}: no int8 dot-product kernel takes these blocks of {block}"
    else:
        k, n = (int(s) for s in w.value.shape)
        fits = kernel_for_channels(kernel, n) is not None if kernel is not None else n % block == 0
        if k % 4 or not fits:
            return f"matmul {k}x{n}: K not a multiple of 4 or N of {block}"
    return None


class LayerMutator(relax.PyExprMutator):
    """Visits main's layers in binding order; subclasses override on_layer(call, layer) and return
    the expression that replaces the call (they need the @relax.expr_functor.mutator decorator too).
    Taps: emit_tap(expr) makes a value an extra output."""

    def __init__(self, mod, onnx_model=None, keep_float=(), caps=None):
        super().__init__(mod)
        # the target's int8 kernel decides the channel block, and whether int8 is faster at all
        self.int8 = int8_kernel(caps) if caps is not None else None
        self.no_kernel = why_no_kernel(caps) if caps is not None and self.int8 is None else None
        self.names = LayerNames(onnx_model)
        self.keep_float = set(keep_float)
        self.layers: list[Layer] = []
        self.taps: list[tuple[str, relax.Var]] = []

    def visit_call_(self, call):
        call = super().visit_call_(call)
        kind = candidate(call)
        if kind is None:
            return call
        name = self.names.next(call)
        reason = (
            "kept float (--keep-float)" if name in self.keep_float else why_float(call, self.int8) or self.no_kernel
        )
        if reason is None and self.int8 is not None:
            reason = slower_reason(call, self.int8)
        layer = Layer(len(self.layers), name, kind, reason)
        self.layers.append(layer)
        return self.on_layer(call, layer)

    def on_layer(self, call, layer: Layer):
        return call

    def emit_tap(self, name: str, expr) -> relax.Var:
        v = self.builder_.emit_output(expr)
        self.taps.append((name, v))
        return v

    def run(self, mod: tvm.IRModule) -> tvm.IRModule:
        """The module with main rewritten; taps, if any, are appended to main's outputs as
        (original outputs, (tap, ...))."""
        main = self.visit_expr(mod["main"])
        if self.taps:
            main = with_taps(main, [v for _, v in self.taps])
        out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
        out["main"] = main
        return relax.transform.Normalize()(out)


def with_taps(func: relax.Function, taps: list) -> relax.Function:
    body = func.body
    new_body = relax.SeqExpr(body.blocks, relax.Tuple([body.body, relax.Tuple(taps)]))
    ret = relax.TupleType([body.body.ty, relax.TupleType([v.ty for v in taps])])
    return relax.Function(func.params, new_body, ret, func.is_pure, func.attrs)


def weight_array(call) -> np.ndarray:
    return call.args[1].value.numpy()
