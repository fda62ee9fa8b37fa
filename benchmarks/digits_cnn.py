"""A small CNN for scikit-learn's digits (8x8 grey images, 10 classes), trained here in numpy
(im2col convolutions, Adam), and exported to ONNX. Used by benchmarks/quantize.py."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def load_digits_split(seed: int = 0):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]  # [N, 1, 8, 8] in [0, 1]
    y = d.target.astype(np.int64)
    idx = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    return (x[idx[:cut]], y[idx[:cut]]), (x[idx[cut:]], y[idx[cut:]])


def _im2col(x, k=3, pad=1):
    b, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    cols = np.stack([xp[:, :, i : i + h, j : j + w] for i in range(k) for j in range(k)], axis=2)  # [B, C, k*k, H, W]
    return cols.transpose(0, 3, 4, 1, 2).reshape(b, h, w, c * k * k)


def _col2im(dcols, shape, k=3, pad=1):
    b, c, h, w = shape
    d = dcols.reshape(b, h, w, c, k * k).transpose(0, 3, 4, 1, 2)
    dx = np.zeros((b, c, h + 2 * pad, w + 2 * pad), dcols.dtype)
    for n, (i, j) in enumerate((i, j) for i in range(k) for j in range(k)):
        dx[:, :, i : i + h, j : j + w] += d[:, :, n]
    return dx[:, :, pad : pad + h, pad : pad + w]


class DigitsCNN:
    """conv 1->16 3x3, ReLU, conv 16->32 3x3, ReLU, 2x2 max pool, fc 512->64, ReLU, fc 64->10."""

    def __init__(self, seed: int = 0):
        r = np.random.default_rng(seed)
        he = lambda *s: (r.standard_normal(s) * np.sqrt(2.0 / np.prod(s[1:]))).astype(np.float32)
        self.p = {
            "w1": he(16, 1, 3, 3),
            "b1": np.zeros(16, np.float32),
            "w2": he(32, 16, 3, 3),
            "b2": np.zeros(32, np.float32),
            "w3": he(64, 512).T.copy(),
            "b3": np.zeros(64, np.float32),
            "w4": he(10, 64).T.copy(),
            "b4": np.zeros(10, np.float32),
        }

    def _forward(self, x):
        p, c = self.p, {}
        c["x1"] = _im2col(x)
        a1 = np.maximum(c["x1"] @ p["w1"].reshape(16, -1).T + p["b1"], 0).transpose(0, 3, 1, 2)
        c["a1"], c["x2"] = a1, _im2col(a1)
        a2 = np.maximum(c["x2"] @ p["w2"].reshape(32, -1).T + p["b2"], 0).transpose(0, 3, 1, 2)  # [B, 32, 8, 8]
        b = len(x)
        win = a2.reshape(b, 32, 4, 2, 4, 2).transpose(0, 1, 2, 4, 3, 5).reshape(b, 32, 4, 4, 4)
        c["a2"], c["arg"] = a2, win.argmax(-1)
        f = win.max(-1).reshape(b, 512)
        c["f"] = f
        h = np.maximum(f @ p["w3"] + p["b3"], 0)
        c["h"] = h
        return h @ p["w4"] + p["b4"], c

    def logits(self, x):
        return self._forward(x)[0]

    def train(self, x, y, epochs: int = 25, batch: int = 64, lr: float = 2e-3, seed: int = 0):
        r = np.random.default_rng(seed)
        m = {k: np.zeros_like(v) for k, v in self.p.items()}
        v = {k: np.zeros_like(v) for k, v in self.p.items()}
        t = 0
        for _ in range(epochs):
            order = r.permutation(len(x))
            for s in range(0, len(x), batch):
                i = order[s : s + batch]
                g = self._grads(x[i], y[i])
                t += 1
                for k in self.p:
                    m[k] = 0.9 * m[k] + 0.1 * g[k]
                    v[k] = 0.999 * v[k] + 0.001 * g[k] ** 2
                    self.p[k] -= lr * (m[k] / (1 - 0.9**t)) / (np.sqrt(v[k] / (1 - 0.999**t)) + 1e-8)
        return self

    def _grads(self, x, y):
        p = self.p
        out, c = self._forward(x)
        b = len(x)
        e = np.exp(out - out.max(1, keepdims=True))
        d = e / e.sum(1, keepdims=True)
        d[np.arange(b), y] -= 1
        d /= b
        g = {"w4": c["h"].T @ d, "b4": d.sum(0)}
        dh = (d @ p["w4"].T) * (c["h"] > 0)
        g["w3"], g["b3"] = c["f"].T @ dh, dh.sum(0)
        df = (dh @ p["w3"].T).reshape(b, 32, 4, 4)
        dwin = np.zeros((b, 32, 4, 4, 4), np.float32)
        np.put_along_axis(dwin, c["arg"][..., None], df[..., None], axis=-1)
        da2 = dwin.reshape(b, 32, 4, 4, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(b, 32, 8, 8) * (c["a2"] > 0)
        d2 = da2.transpose(0, 2, 3, 1)  # [B, H, W, 32]
        g["w2"] = (d2.reshape(-1, 32).T @ c["x2"].reshape(-1, 144)).reshape(32, 16, 3, 3)
        g["b2"] = d2.sum((0, 1, 2))
        da1 = _col2im(d2 @ p["w2"].reshape(32, -1), c["a1"].shape) * (c["a1"] > 0)
        d1 = da1.transpose(0, 2, 3, 1)
        g["w1"] = (d1.reshape(-1, 16).T @ c["x1"].reshape(-1, 9)).reshape(16, 1, 3, 3)
        g["b1"] = d1.sum((0, 1, 2))
        return g

    def to_onnx(self) -> onnx.ModelProto:
        p = self.p
        nodes = [
            helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], pads=[1] * 4, name="conv1"),
            helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
            helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1] * 4, name="conv2"),
            helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
            helper.make_node("MaxPool", ["r2"], ["mp"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
            helper.make_node("Flatten", ["mp"], ["f"], name="flatten"),
            helper.make_node("Gemm", ["f", "w3", "b3"], ["h"], name="fc1"),
            helper.make_node("Relu", ["h"], ["hr"], name="relu3"),
            helper.make_node("Gemm", ["hr", "w4", "b4"], ["logits"], name="fc2"),
        ]
        g = helper.make_graph(
            nodes,
            "digits_cnn",
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 1, 8, 8])],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
            [numpy_helper.from_array(v, k) for k, v in p.items()],
        )
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        return m
