"""The channel graph of an ONNX model, for structured pruning. Channels are axis 1 of [N, C, H, W]
and [N, C] float tensors. Layers (Conv with groups 1, Gemm and MatMul by an initializer) make their
output channels from weight rows and read their input channels through weight columns: there a
channel can start and end. BatchNormalization, elementwise ops, residual adds, Concat, depthwise
convs, pooling, Resize and flattens pass channels through (compiler/channels.py ties them); any
other use, a graph output, or a shared initializer pins them.

A removed channel must be exactly zero wherever a layer reads it, so the shrunk model equals the
zeroed one (`--zero-only`: weight rows, biases and BN scale/shift of the channel set to 0), and so
does the compiled zeroed model (RemoveZeroChannels). Ops that turn 0 into something else (Sigmoid,
adding a broadcast constant) pass channels through but make them nonzero, which pins them there.

Each node the pruning touches records `edits`: (initializer, axis, tensor whose channels index that
axis, whether --zero-only zeroes it), plus Conv `group` counts and Reshape/Resize shapes."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import onnx
from onnx import numpy_helper

from ..compiler.channels import ChannelTies

ZERO_KEEPING = {
    "Relu", "LeakyRelu", "Elu", "Selu", "Tanh", "HardSwish", "Gelu", "Identity", "Dropout", "Neg", "Abs", "Erf",
    "Softsign", "Mish", "PRelu", "Clip", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
    "ReduceMean", "ReduceMax", "Resize", "Upsample", "Squeeze", "Unsqueeze",
}  # fmt: skip
NONZERO_UNARY = {"Sigmoid", "HardSigmoid", "Exp", "Softplus", "Cos"}  # channels pass through, no longer zero
BINARY = {"Add", "Sub", "Mul", "Div", "Max", "Min"}
SPATIAL_AXES_OPS = {"ReduceMean", "ReduceMax", "Squeeze", "Unsqueeze"}


@dataclasses.dataclass
class Layer:
    name: str
    op: str  # Conv | Gemm | MatMul
    x: str  # input tensor
    y: str  # output tensor
    weight: str
    out_axis: int  # weight axis of the output channels
    bn_scale: str | None = None  # a BatchNormalization's scale right after it (--criterion bn-scale)


@dataclasses.dataclass
class Edit:
    init: str
    axis: int  # -1: a Reshape/Resize shape vector whose entry 1 becomes the channel count; -2: a Conv's group
    tensor: str
    zero: bool  # --zero-only zeroes these entries
    node: int = -1  # the Conv's index in graph.node, for a group count


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


class ChannelGraph:
    def __init__(self, model: onnx.ModelProto):
        self.model = onnx.shape_inference.infer_shapes(model)
        g = self.model.graph
        self.inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
        self.consts = dict(self.inits)
        for n in g.node:
            if n.op_type == "Constant" and _attr(n, "value") is not None:
                self.consts[n.output[0]] = numpy_helper.to_array(_attr(n, "value"))
        self.init_uses = Counter(i for n in g.node for i in n.input if i in self.inits)
        self.shapes = {}
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            t = vi.type.tensor_type
            if t.elem_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE):
                if t.HasField("shape"):
                    self.shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim)
        self.ties, self.zero = ChannelTies(), {}
        self.layers: dict[str, Layer] = {}
        self.edits: list[Edit] = []
        self.consumers = Counter(i for n in g.node for i in n.input)
        for i in g.input:
            self._opaque(i.name)
        for self._index, n in enumerate(g.node):
            if not (n.domain in ("", "ai.onnx") and self._visit(n)):
                for i in n.input:
                    self.ties.block(i)
                for o in n.output:
                    self._opaque(o)
        for o in g.output:
            self.ties.block(o.name)
        self._bn_scales()

    # ---------------------------------------------------------------- helpers
    def chan(self, t: str) -> tuple[int, int] | None:
        s = self.shapes.get(t)
        return (len(s), s[1]) if s is not None and len(s) in (2, 4) and s[1] > 0 else None

    def _known(self, t, rank=None) -> bool:
        return t in self.ties.ok and (rank is None or self.chan(t)[0] == rank)

    def _opaque(self, t: str) -> None:
        if self.chan(t) is not None and t not in self.ties.ok:
            self.ties.add(t, np.zeros(self.chan(t)[1], bool))
            self.zero[t] = False

    def _out(self, t: str, zero: bool) -> bool:
        if self.chan(t) is None:
            return False
        self.ties.add(t, np.ones(self.chan(t)[1], bool))
        self.zero[t] = zero
        return True

    def _own(self, name: str) -> bool:
        """An initializer this node alone reads (slicing it touches no other node)."""
        return name in self.inits and self.init_uses[name] == 1

    def _sink(self, x: str) -> None:
        if not self.zero.get(x, False):
            self.ties.block(x)

    def _per_channel(self, name: str, rank: int, c: int) -> int | None:
        """The axis of a constant operand that runs along the channels; None when it broadcasts
        over them; raises KeyError when it cannot be lined up."""
        a = self.consts[name]
        s = (1,) * (rank - a.ndim) + a.shape
        if len(s) != rank or s[1] not in (1, c):
            raise KeyError(name)
        return None if s[1] == 1 or c == 1 else a.ndim - rank + 1

    # ---------------------------------------------------------------- nodes
    def _visit(self, n) -> bool:
        try:
            return self._dispatch(n)
        except KeyError:  # a constant that does not line up with the channels, a shape not inferred
            return False

    def _dispatch(self, n) -> bool:
        op = n.op_type
        if op == "Conv":
            return self._conv(n)
        if op in ("Gemm", "MatMul"):
            return self._dense(n)
        if op == "BatchNormalization":
            return self._batchnorm(n)
        if op in ZERO_KEEPING or op in NONZERO_UNARY:
            return self._unary(n)
        if op in BINARY:
            return self._binary(n)
        if op == "Concat":
            return self._concat(n)
        if op in ("Flatten", "Reshape"):
            return self._flatten(n)
        return False

    def _conv(self, n) -> bool:
        x, w, y = n.input[0], n.input[1], n.output[0]
        b = n.input[2] if len(n.input) > 2 and n.input[2] else None
        if not (self._known(x, 4) and self._own(w) and self.inits[w].ndim == 4 and (b is None or self._own(b))):
            return False
        wt, g, cin = self.inits[w], int(_attr(n, "group", 1)), self.chan(x)[1]
        if g == 1 and wt.shape[1] == cin:
            self._sink(x)
            self._out(y, zero=True)
            self.layers[n.name or y] = Layer(n.name or y, "Conv", x, y, w, 0)
            self.edits += [Edit(w, 0, y, True), Edit(w, 1, x, False)] + ([Edit(b, 0, y, True)] if b else [])
            return True
        if g == cin and wt.shape[1] == 1 and wt.shape[0] % cin == 0 and self._out(y, zero=True):
            m = wt.shape[0] // cin
            self.ties.tie(x, np.arange(wt.shape[0]) // m, y, np.arange(wt.shape[0]))
            self.edits += [Edit(w, 0, y, True), Edit("", -2, x, False, self._index)] + (
                [Edit(b, 0, y, True)] if b else []
            )
            return True
        return False

    def _dense(self, n) -> bool:
        x, w, y = n.input[0], n.input[1], n.output[0]
        if not (self._known(x, 2) and self._own(w) and self.inits[w].ndim == 2):
            return False
        if n.op_type == "Gemm" and _attr(n, "transA", 0):
            return False
        out_axis = 0 if n.op_type == "Gemm" and _attr(n, "transB", 0) else 1
        c = n.input[2] if n.op_type == "Gemm" and len(n.input) > 2 and n.input[2] else None
        bias_axis = None
        if c is not None:
            if not self._own(c):
                return False
            bias_axis = self._per_channel(c, 2, self.inits[w].shape[out_axis]) if c in self.inits else None
        self._sink(x)
        self._out(y, zero=c is None or bias_axis is not None)
        self.layers[n.name or y] = Layer(n.name or y, n.op_type, x, y, w, out_axis)
        self.edits += [Edit(w, out_axis, y, True), Edit(w, 1 - out_axis, x, False)]
        if bias_axis is not None:
            self.edits.append(Edit(c, bias_axis, y, True))
        return True

    def _batchnorm(self, n) -> bool:
        x, y = n.input[0], n.output[0]
        params = list(n.input[1:5])
        if not (self._known(x) and all(self._own(p) for p in params)) or any(self.consumers[o] for o in n.output[1:]):
            return False
        self._out(y, zero=True)
        self.ties.identity(x, y)
        self.edits += [Edit(p, 0, y, i < 2) for i, p in enumerate(params)]  # scale and shift zeroed
        return True

    def _unary(self, n) -> bool:
        x, y, op = n.input[0], n.output[0], n.op_type
        if not self._known(x) or any(self.consumers[o] for o in n.output[1:]):
            return False
        rank, c = self.chan(x)
        cy = self.chan(y)
        if cy is None or cy[1] != c or (cy[0] != rank and op not in SPATIAL_AXES_OPS):
            return False
        if op in SPATIAL_AXES_OPS:  # only over H and W: the channel axis stays axis 1
            axes = _attr(n, "axes")
            if axes is None and len(n.input) > 1 and n.input[1]:
                axes = self.consts.get(n.input[1])
            r = cy[0] if op == "Unsqueeze" else rank
            if axes is None or any(int(a) % r < 2 for a in np.ravel(axes)):
                return False
        zero = self.zero[x] and op not in NONZERO_UNARY
        if op == "Clip":
            lo = self.consts.get(n.input[1]) if len(n.input) > 1 and n.input[1] else _attr(n, "min", -np.inf)
            hi = self.consts.get(n.input[2]) if len(n.input) > 2 and n.input[2] else _attr(n, "max", np.inf)
            if lo is None or hi is None:
                return False
            zero = zero and float(lo) <= 0 <= float(hi)
        if op == "PRelu":
            slope = n.input[1]
            if slope not in self.consts:
                return False
            axis = self._per_channel(slope, rank, c)
            if axis is not None:
                if not self._own(slope):
                    return False
                self.edits.append(Edit(slope, axis, y, False))
        if op in ("Resize", "Upsample") and len(n.input) > 3 and n.input[3]:
            if not self._own(n.input[3]):
                return False
            self.edits.append(Edit(n.input[3], -1, y, False))
        self._out(y, zero)
        self.ties.identity(x, y)
        return True

    def _binary(self, n) -> bool:
        y, op = n.output[0], n.op_type
        if self.chan(y) is None:
            return False
        rank, c = self.chan(y)
        tied, consts, other = [], [], False
        for i in n.input:
            s = self.shapes.get(i)
            if i in self.consts:
                try:
                    axis = self._per_channel(i, rank, c)
                except KeyError:
                    return False
                if axis is not None:
                    if not self._own(i):
                        return False
                    consts.append((i, axis))
                else:
                    other = True
            elif s is not None and len(s) == rank and s[1] == c and self._known(i):
                tied.append(i)
            elif s is not None and len(s) <= rank and ((1,) * (rank - len(s)) + s)[1] == 1:
                other = True
            else:
                return False
        zeros = [self.zero[t] for t in tied]
        if op in ("Add", "Sub"):
            zero = all(zeros) and not other
        elif op == "Mul":
            zero = any(zeros)
        elif op == "Div":
            zero = bool(tied) and tied[0] == n.input[0] and self.zero[tied[0]] and len(tied) == 1
        else:
            zero = all(zeros) and not other and not consts
        self._out(y, bool(tied) and zero)
        for t in tied:
            self.ties.identity(t, y)
        self.edits += [Edit(name, axis, y, op in ("Add", "Sub")) for name, axis in consts]
        return True

    def _concat(self, n) -> bool:
        y = n.output[0]
        if self.chan(y) is None:
            return False
        rank = self.chan(y)[0]
        if int(_attr(n, "axis", 1)) % rank != 1 or not all(self._known(i, rank) for i in n.input):
            return False
        self._out(y, all(self.zero[i] for i in n.input))
        off = 0
        for i in n.input:
            c = self.chan(i)[1]
            self.ties.tie(i, np.arange(c), y, off + np.arange(c))
            off += c
        return True

    def _flatten(self, n) -> bool:
        x, y = n.input[0], n.output[0]
        if not self._known(x, 4) or self.chan(y) is None or self.chan(y)[0] != 2:
            return False
        s = self.shapes[x]
        hw = s[2] * s[3]
        if hw <= 0 or self.chan(y)[1] != s[1] * hw:
            return False
        if n.op_type == "Flatten" and int(_attr(n, "axis", 1)) != 1:
            return False
        if n.op_type == "Reshape":
            if not self._own(n.input[1]):
                return False
            self.edits.append(Edit(n.input[1], -1, y, False))
        self._out(y, self.zero[x])
        self.ties.tie(x, np.arange(s[1] * hw) // hw, y, np.arange(s[1] * hw))
        return True

    def _bn_scales(self) -> None:
        """A layer whose output only a BatchNormalization reads: its scale ranks the channels."""
        for n in self.model.graph.node:
            if n.op_type == "BatchNormalization" and n.input[1] in self.inits:
                for layer in self.layers.values():
                    if layer.y == n.input[0] and self.consumers[layer.y] == 1:
                        layer.bn_scale = n.input[1]
