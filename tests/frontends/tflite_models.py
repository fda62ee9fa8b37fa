"""TFLite models made by code for the tests and the fuzzer: a flatbuffer written with LiteRT's own
schema (ai_edge_litert.schema_py_generated, its object API), and its full-integer version made by
LiteRT's own post-training quantizer (the calibration wrapper TFLiteConverter uses), so the int8
model is what a real converter emits: int8 I/O, per-channel conv weights, int32 biases."""

from __future__ import annotations

import numpy as np


class Graph:
    """One subgraph under construction: tensor(), op(), then finish() -> flatbuffer bytes."""

    def __init__(self, description: bytes = b"kiln test model"):
        from ai_edge_litert import schema_py_generated as fb

        self.fb = fb
        self.m = fb.ModelT()
        self.m.version, self.m.description = 3, description
        self.m.buffers, self.m.operatorCodes = [fb.BufferT()], []
        self.g = fb.SubGraphT()
        self.g.tensors, self.g.operators, self.g.name = [], [], b"main"
        self._codes: dict = {}

    def tensor(self, name: str, shape, data=None, dtype=None, signature=None) -> int:
        t = self.fb.TensorT()
        t.name, t.shape, t.type = name.encode(), list(shape), self.fb.TensorType.FLOAT32 if dtype is None else dtype
        if signature is not None:
            t.shapeSignature = list(signature)
        t.buffer = 0
        if data is not None:
            b = self.fb.BufferT()
            b.data = np.ascontiguousarray(data).tobytes()
            t.buffer = len(self.m.buffers)
            self.m.buffers.append(b)
        self.g.tensors.append(t)
        return len(self.g.tensors) - 1

    def op(self, kind: int, ins, outs, options_type: int = 0, options=None, custom: bytes | None = None) -> None:
        key = (kind, custom)
        if key not in self._codes:
            c = self.fb.OperatorCodeT()
            c.builtinCode, c.deprecatedBuiltinCode, c.version = kind, min(kind, 127), 1
            c.customCode = custom
            self._codes[key] = len(self.m.operatorCodes)
            self.m.operatorCodes.append(c)
        o = self.fb.OperatorT()
        o.opcodeIndex, o.inputs, o.outputs = self._codes[key], list(ins), list(outs)
        o.builtinOptionsType, o.builtinOptions = options_type, options
        self.g.operators.append(o)

    def finish(self, inputs, outputs) -> bytes:
        import flatbuffers

        self.g.inputs, self.g.outputs = list(inputs), list(outputs)
        self.m.subgraphs = [self.g]
        b = flatbuffers.Builder(1024)
        b.Finish(self.m.Pack(b), file_identifier=b"TFL3")
        return bytes(b.Output())


def cnn(seed: int = 0, batch_signature: int = 1) -> bytes:
    """conv 3x3/2 + ReLU -> depthwise 3x3 + ReLU6 -> residual add -> average pool -> FC -> softmax,
    on a 1x16x16x3 NHWC input (batch_signature=-1: a dynamic batch, as converters write it)."""
    rng = np.random.default_rng(seed)
    G = Graph()
    fb = G.fb
    w = lambda *s: (rng.standard_normal(s) * 0.3).astype(np.float32)
    x = G.tensor("input", (1, 16, 16, 3), signature=(batch_signature, 16, 16, 3))
    y1, y2, y3 = (G.tensor(n, (1, 8, 8, 8)) for n in ("conv", "dwconv", "residual"))
    c = fb.Conv2DOptionsT()
    c.padding, c.strideW, c.strideH, c.dilationWFactor, c.dilationHFactor = fb.Padding.SAME, 2, 2, 1, 1
    c.fusedActivationFunction = fb.ActivationFunctionType.RELU
    G.op(
        fb.BuiltinOperator.CONV_2D,
        [x, G.tensor("w1", (8, 3, 3, 3), w(8, 3, 3, 3)), G.tensor("b1", (8,), w(8))],
        [y1],
        fb.BuiltinOptions.Conv2DOptions,
        c,
    )
    d = fb.DepthwiseConv2DOptionsT()
    d.padding, d.strideW, d.strideH, d.depthMultiplier = fb.Padding.SAME, 1, 1, 1
    d.dilationWFactor = d.dilationHFactor = 1
    d.fusedActivationFunction = fb.ActivationFunctionType.RELU6
    G.op(
        fb.BuiltinOperator.DEPTHWISE_CONV_2D,
        [y1, G.tensor("w2", (1, 3, 3, 8), w(1, 3, 3, 8)), G.tensor("b2", (8,), w(8))],
        [y2],
        fb.BuiltinOptions.DepthwiseConv2DOptions,
        d,
    )
    G.op(fb.BuiltinOperator.ADD, [y1, y2], [y3], fb.BuiltinOptions.AddOptions, fb.AddOptionsT())
    y4 = G.tensor("pool", (1, 1, 1, 8))
    p = fb.Pool2DOptionsT()
    p.padding, p.strideW, p.strideH, p.filterWidth, p.filterHeight = fb.Padding.VALID, 8, 8, 8, 8
    G.op(fb.BuiltinOperator.AVERAGE_POOL_2D, [y3], [y4], fb.BuiltinOptions.Pool2DOptions, p)
    y5 = G.tensor("flat", (1, 8))
    r = fb.ReshapeOptionsT()
    r.newShape = [1, 8]
    shape = G.tensor("shape", (2,), np.array([1, 8], np.int32), fb.TensorType.INT32)
    G.op(fb.BuiltinOperator.RESHAPE, [y4, shape], [y5], fb.BuiltinOptions.ReshapeOptions, r)
    y6, y7 = G.tensor("logits", (1, 10)), G.tensor("probs", (1, 10))
    G.op(
        fb.BuiltinOperator.FULLY_CONNECTED,
        [y5, G.tensor("w3", (10, 8), w(10, 8)), G.tensor("b3", (10,), w(10))],
        [y6],
        fb.BuiltinOptions.FullyConnectedOptions,
        fb.FullyConnectedOptionsT(),
    )
    s = fb.SoftmaxOptionsT()
    s.beta = 1.0
    G.op(fb.BuiltinOperator.SOFTMAX, [y6], [y7], fb.BuiltinOptions.SoftmaxOptions, s)
    return G.finish([x], [y7])


def quantize_full_integer(model: bytes, samples: list[np.ndarray]) -> bytes:
    """LiteRT's post-training full-integer quantization (int8 activations, weights and I/O)."""
    from ai_edge_litert import _pywrap_tensorflow_lite_calibration_wrapper as cw

    c = cw.CalibrationWrapper(model, [], [])
    c.Prepare([list(samples[0].shape)])
    for s in samples:
        c.FeedTensor([s])
    i8, i32 = np.dtype(np.int8).num, np.dtype(np.int32).num
    return bytes(c.QuantizeModel(i8, i8, False, i8, i32, False, False))


def unsupported() -> bytes:
    """A graph with two builtins TVM 0.27 cannot convert and a custom op, around a supported ADD."""
    G = Graph()
    fb = G.fb
    x, upd = G.tensor("x", (4, 8)), G.tensor("upd", (1, 8))
    start = G.tensor("start", (2,), np.array([1, 0], np.int32), fb.TensorType.INT32)
    a, b, c, d = (G.tensor(n, (4, 8)) for n in ("dus", "dus2", "custom", "sum"))
    G.op(fb.BuiltinOperator.DYNAMIC_UPDATE_SLICE, [x, upd, start], [a])
    G.op(fb.BuiltinOperator.DYNAMIC_UPDATE_SLICE, [a, upd, start], [b])
    G.op(fb.BuiltinOperator.CUSTOM, [b], [c], custom=b"KilnMystery")
    G.op(fb.BuiltinOperator.ADD, [c, x], [d], fb.BuiltinOptions.AddOptions, fb.AddOptionsT())
    G.op(fb.BuiltinOperator.SKIP_GRAM, [d], [G.tensor("grams", (4, 8))])
    return G.finish([x, upd], [d])


def litert_run(model: bytes, feeds: list[np.ndarray]) -> list[np.ndarray]:
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_content=model)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), feeds):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]


def quantize_input(model: bytes, x: np.ndarray) -> np.ndarray:
    """x in the int8 domain of the model's first input (its scale and zero point)."""
    from ai_edge_litert.interpreter import Interpreter

    scale, zp = Interpreter(model_content=model).get_input_details()[0]["quantization"]
    return np.clip(np.round(x / scale) + zp, -128, 127).astype(np.int8)


def sparse_fp16_fc(seed: int = 0) -> tuple[bytes, np.ndarray]:
    """x(1x8) -> FULLY_CONNECTED with a float16 weight stored sparse (CSR rows): DENSIFY -> DEQUANTIZE ->
    float32, the pattern of MediaPipe's sparse detectors. Returns the model and its dense weight."""
    rng = np.random.default_rng(seed)
    dense = (rng.standard_normal((4, 8)) * (rng.random((4, 8)) < 0.4)).astype(np.float16)
    G = Graph()
    fb = G.fb
    rows, cols = np.nonzero(dense)
    segments = np.searchsorted(rows, np.arange(5)).astype(np.int32)
    sp = fb.SparsityParametersT()
    sp.traversalOrder, sp.blockMap = [0, 1], []
    d0, d1 = fb.DimensionMetadataT(), fb.DimensionMetadataT()
    d0.format, d0.denseSize = fb.DimensionType.DENSE, 4
    d1.format = fb.DimensionType.SPARSE_CSR
    seg, idx = fb.Int32VectorT(), fb.Int32VectorT()
    seg.values, idx.values = segments.tolist(), cols.astype(np.int32).tolist()
    d1.arraySegmentsType = d1.arrayIndicesType = fb.SparseIndexVector.Int32Vector
    d1.arraySegments, d1.arrayIndices = seg, idx
    sp.dimMetadata = [d0, d1]
    w16 = G.tensor("w_sparse", (4, 8), dense[rows, cols], fb.TensorType.FLOAT16)
    G.g.tensors[w16].sparsity = sp
    w16d, w32 = G.tensor("w_dense16", (4, 8), dtype=fb.TensorType.FLOAT16), G.tensor("w", (4, 8))
    G.op(fb.BuiltinOperator.DENSIFY, [w16], [w16d])
    G.op(fb.BuiltinOperator.DEQUANTIZE, [w16d], [w32])
    x, y = G.tensor("x", (1, 8)), G.tensor("y", (1, 4))
    b = G.tensor("b", (4,), np.zeros(4, np.float32))
    G.op(
        fb.BuiltinOperator.FULLY_CONNECTED, [x, w32, b], [y], fb.BuiltinOptions.FullyConnectedOptions,
        fb.FullyConnectedOptionsT(),
    )  # fmt: skip
    return G.finish([x], [y]), dense.astype(np.float32)


def conv_stack(seed: int = 0, size: int = 8, channels=(3, 16, 32, 32), classes: int = 16) -> bytes:
    """NHWC 1xSxSx3 -> 3x3 CONV_2D + RELU per channel step -> average pool -> FULLY_CONNECTED: channel
    counts Kiln's int8 kernels take (multiples of 16), for --quantize int8 on a float TFLite model."""
    rng = np.random.default_rng(seed)
    G = Graph()
    fb = G.fb
    x = y = G.tensor("input", (1, size, size, channels[0]))
    for i, (cin, cout) in enumerate(zip(channels, channels[1:])):
        w = (rng.standard_normal((cout, 3, 3, cin)) / np.sqrt(9 * cin)).astype(np.float32)
        out = G.tensor(f"conv{i}", (1, size, size, cout))
        c = fb.Conv2DOptionsT()
        c.padding, c.strideW, c.strideH, c.dilationWFactor, c.dilationHFactor = fb.Padding.SAME, 1, 1, 1, 1
        c.fusedActivationFunction = fb.ActivationFunctionType.RELU
        b = (rng.standard_normal(cout) * 0.1).astype(np.float32)
        ins = [y, G.tensor(f"w{i}", w.shape, w), G.tensor(f"b{i}", (cout,), b)]
        G.op(fb.BuiltinOperator.CONV_2D, ins, [out], fb.BuiltinOptions.Conv2DOptions, c)
        y = out
    pooled, flat = G.tensor("pool", (1, 1, 1, channels[-1])), G.tensor("flat", (1, channels[-1]))
    p = fb.Pool2DOptionsT()
    p.padding, p.strideW, p.strideH, p.filterWidth, p.filterHeight = fb.Padding.VALID, size, size, size, size
    G.op(fb.BuiltinOperator.AVERAGE_POOL_2D, [y], [pooled], fb.BuiltinOptions.Pool2DOptions, p)
    r = fb.ReshapeOptionsT()
    r.newShape = [1, channels[-1]]
    shape = G.tensor("shape", (2,), np.array([1, channels[-1]], np.int32), fb.TensorType.INT32)
    G.op(fb.BuiltinOperator.RESHAPE, [pooled, shape], [flat], fb.BuiltinOptions.ReshapeOptions, r)
    wfc = (rng.standard_normal((classes, channels[-1])) * 0.5).astype(np.float32)
    logits = G.tensor("logits", (1, classes))
    G.op(
        fb.BuiltinOperator.FULLY_CONNECTED,
        [flat, G.tensor("wfc", wfc.shape, wfc), G.tensor("bfc", (classes,), np.zeros(classes, np.float32))],
        [logits],
        fb.BuiltinOptions.FullyConnectedOptions,
        fb.FullyConnectedOptionsT(),
    )
    return G.finish([x], [logits])


def transpose_conv_bias(kernel: int, stride: int, same: bool, size: int = 5, seed: int = 0) -> bytes:
    """NHWC 1xSxSx4 -> MediaPipe's custom Convolution2DTransposeBias (OHWI weights 6xKxKx4, bias; the raw
    TfLiteTransposeConvParams struct as custom options) -> 1x(S*stride)x(S*stride)x6 (SAME) or VALID's size."""
    rng = np.random.default_rng(seed)
    G = Graph()
    fb = G.fb
    out = size * stride if same else (size - 1) * stride + kernel
    x, y = G.tensor("x", (1, size, size, 4)), G.tensor("y", (1, out, out, 6))
    w = (rng.standard_normal((6, kernel, kernel, 4)) * 0.3).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    ins = [x, G.tensor("w", w.shape, w), G.tensor("b", (6,), b)]
    G.op(fb.BuiltinOperator.CUSTOM, ins, [y], custom=b"Convolution2DTransposeBias")
    G.g.operators[-1].customOptions = list(np.array([1 if same else 2, stride, stride], "<i4").tobytes())
    return G.finish([x], [y])


def expand_dims(axis: int) -> bytes:
    """x(2x3) -> EXPAND_DIMS(axis, a constant) -> the same with a new unit dim, as numpy places it."""
    G = Graph()
    fb = G.fb
    x = G.tensor("x", (2, 3))
    shape = list(np.expand_dims(np.zeros((2, 3)), axis).shape)
    y = G.tensor("y", shape)
    a = G.tensor("axis", (), np.array(axis, np.int32), fb.TensorType.INT32)
    G.op(fb.BuiltinOperator.EXPAND_DIMS, [x, a], [y], fb.BuiltinOptions.ExpandDimsOptions, fb.ExpandDimsOptionsT())
    return G.finish([x], [y])


def dynamic_batch_reshape(channels: int = 8, via: str = "slice") -> bytes:
    """x(?x C) -> RESHAPE to [batch, 1, 1, C], the batch read at run time: SHAPE -> STRIDED_SLICE
    (shrink) -> PACK with constants, as TFLiteConverter writes a Keras reshape under a dynamic batch;
    via="split": SHAPE -> SPLIT (a multi-output op) -> CONCATENATION with [1, 1, C]."""
    G = Graph()
    fb = G.fb
    i32 = fb.TensorType.INT32
    x = G.tensor("x", (1, channels), signature=(-1, channels))
    shape, packed = G.tensor("shape", (2,), dtype=i32), G.tensor("s", (4,), dtype=i32)
    so = fb.ShapeOptionsT()
    so.outType = i32
    G.op(fb.BuiltinOperator.SHAPE, [x], [shape], fb.BuiltinOptions.ShapeOptions, so)
    if via == "split":
        parts = [G.tensor("batch", (1,), dtype=i32), G.tensor("chan", (1,), dtype=i32)]
        sp = fb.SplitOptionsT()
        sp.numSplits = 2
        axis = G.tensor("axis", (), np.array(0, np.int32), i32)
        G.op(fb.BuiltinOperator.SPLIT, [axis, shape], parts, fb.BuiltinOptions.SplitOptions, sp)
        rest = G.tensor("rest", (3,), np.array([1, 1, channels], np.int32), i32)
        co = fb.ConcatenationOptionsT()
        co.axis = 0
        G.op(fb.BuiltinOperator.CONCATENATION, [parts[0], rest], [packed], fb.BuiltinOptions.ConcatenationOptions, co)
    else:
        batch = G.tensor("batch", (), dtype=i32)
        ss = fb.StridedSliceOptionsT()
        ss.shrinkAxisMask = 1
        consts = [G.tensor(n, (1,), np.array([v], np.int32), i32) for n, v in (("b0", 0), ("e0", 1), ("s0", 1))]
        G.op(fb.BuiltinOperator.STRIDED_SLICE, [shape, *consts], [batch], fb.BuiltinOptions.StridedSliceOptions, ss)
        po = fb.PackOptionsT()
        po.valuesCount, po.axis = 4, 0
        dims = [G.tensor(f"d{k}", (), np.array(v, np.int32), i32) for k, v in enumerate((1, 1, channels))]
        G.op(fb.BuiltinOperator.PACK, [batch, *dims], [packed], fb.BuiltinOptions.PackOptions, po)
    y = G.tensor("y", (1, 1, 1, channels), signature=(-1, 1, 1, channels))
    G.op(fb.BuiltinOperator.RESHAPE, [x, packed], [y], fb.BuiltinOptions.ReshapeOptions, fb.ReshapeOptionsT())
    return G.finish([x], [y])
