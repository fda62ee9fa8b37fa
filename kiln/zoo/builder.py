"""A small ONNX graph builder for the zoo: deterministic weights (seeded), He-scaled, BatchNorm
with non-trivial statistics, opset 17."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class GraphBuilder:
    def __init__(self, name: str, seed: int = 0):
        self.name, self.rng = name, np.random.default_rng(seed)
        self.nodes, self.inits, self._n = [], [], 0

    def _id(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def const(self, value, hint: str = "c") -> str:
        name = self._id(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], hint: str | None = None, n_out: int = 1, **attrs):
        outs = [self._id(hint or op.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=self._id(op), **attrs))
        return outs[0] if n_out == 1 else outs

    def weight(self, shape, fan_in: int, gain: float = 2.0) -> str:
        return self.const((self.rng.standard_normal(shape) * np.sqrt(gain / fan_in)).astype(np.float32), "w")

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1, bias: bool = False) -> str:
        ins = [x, self.weight((cout, cin // group, k, k), cin // group * k * k)]
        if bias:
            ins.append(self.const((self.rng.standard_normal(cout) * 0.05).astype(np.float32), "b"))
        p = k // 2
        return self.node(
            "Conv", ins, "conv", kernel_shape=[k, k], strides=[stride, stride], pads=[p, p, p, p], group=group
        )

    def bn(self, x: str, c: int, gamma_scale: float = 1.0) -> str:
        r = self.rng
        gamma = (r.uniform(0.5, 1.5, c) * gamma_scale).astype(np.float32)
        beta = r.normal(0, 0.1, c).astype(np.float32)
        mean = r.normal(0, 0.1, c).astype(np.float32)
        var = r.uniform(0.5, 1.5, c).astype(np.float32)
        return self.node(
            "BatchNormalization",
            [x] + [self.const(v, n) for v, n in ((gamma, "gamma"), (beta, "beta"), (mean, "mean"), (var, "var"))],
            "bn",
            epsilon=1e-5,
        )

    def relu(self, x: str) -> str:
        return self.node("Relu", [x])

    def relu6(self, x: str) -> str:
        return self.node("Clip", [x, self.const(np.float32(0), "lo"), self.const(np.float32(6), "hi")], "relu6")

    def add(self, a: str, b: str) -> str:
        return self.node("Add", [a, b])

    def linear(self, x: str, din: int, dout: int) -> str:
        y = self.node("MatMul", [x, self.weight((din, dout), din, 1.0)])
        return self.node("Add", [y, self.const((self.rng.standard_normal(dout) * 0.02).astype(np.float32), "b")])

    def classifier(self, x: str, c: int, classes: int) -> str:
        x = self.node("GlobalAveragePool", [x], "gap")
        x = self.node("Flatten", [x], "flat", axis=1)
        w = self.weight((classes, c), c, 1.0)
        b = self.const(np.zeros(classes, np.float32), "fc_b")
        return self.node("Gemm", [x, w, b], "logits", transB=1)

    def model(
        self, inputs: list[tuple[str, list]], output: str, out_shape: list, out_name: str = "output"
    ) -> onnx.ModelProto:
        self.nodes.append(helper.make_node("Identity", [output], [out_name], name="output_identity"))
        g = helper.make_graph(
            self.nodes,
            self.name,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
            [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, out_shape)],
            self.inits,
        )
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="kiln.zoo")
        onnx.checker.check_model(m)
        return m
