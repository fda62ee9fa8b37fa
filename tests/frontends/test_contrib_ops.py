"""onnxruntime contrib ops (com.microsoft) decomposed by Kiln, on models written by onnxruntime's own
tools where a tool writes the op: quantize_dynamic / quantize_static (QOperator), the session graph
optimizer (optimized_model_filepath), the transformer optimizer and MatMulNBitsQuantizer."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from kiln.frontends.preflight import find_unsupported_ops
from tests.helpers import check_against_ort, make_model, quantize_dynamic, rand

MS = "com.microsoft"


def ops(m) -> collections.Counter:
    return collections.Counter(
        n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in m.graph.node
    )


def ms_model(nodes, inputs, outputs, inits=None, opset=17):
    """A model with com.microsoft nodes; inputs: name -> example array (dtype and shape)."""
    vi = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
        for n, a in inputs.items()
    ]
    g = helper.make_graph(
        nodes,
        "test",
        vi,
        [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in outputs],
        [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])


def ms(op, ins, outs, **kw):
    return helper.make_node(op, ins, outs, domain=MS, **kw)


def ort_optimized(model, tmp_path, level=ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED):
    """onnxruntime's graph optimizer, written out: its fusions into com.microsoft ops."""
    so = ort.SessionOptions()
    so.graph_optimization_level, so.optimized_model_filepath = level, str(tmp_path / "opt.onnx")
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return onnx.load(tmp_path / "opt.onnx")


def assert_supported(m):
    assert find_unsupported_ops(m) == []


@pytest.mark.parametrize("per_channel", [False, True])
def test_dynamic_quantize_matmul(tmp_path, per_channel):
    m = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["z"])],
        {"x": rand(2, 8, 16)},
        ["z"],
        {"w": rand(16, 24, seed=1), "b": rand(24, seed=2)},
    )
    q = ort_optimized(quantize_dynamic(m, tmp_path, per_channel=per_channel), tmp_path)
    assert ops(q)[f"{MS}.DynamicQuantizeMatMul"] == 1
    assert_supported(q)
    check_against_ort(q, {"x": rand(2, 8, 16, seed=7)}, tmp_path, rtol=1e-5, atol=1e-5)
    from tests.helpers import compiled_asm

    assert compiled_asm(q, "llvm -mcpu=znver4")[1]["qdq_lowered"] == 1  # int8 kernel, zero point at run time


def test_dynamic_quantize_linear_matmul_integer_runs_int8(tmp_path):
    """quantize_dynamic's own output (DynamicQuantizeLinear -> MatMulInteger, the zero point computed at
    run time) on the int8 kernel where it is exact: the activation's zero-point correction is a run-time
    term, and 24 columns (no multiple of 16 lanes) are padded. On the host: equal to onnxruntime."""
    from tests.helpers import compiled_asm

    m = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["z"])],
        {"x": rand(2, 8, 16)},
        ["z"],
        {"w": rand(16, 24, seed=1), "b": rand(24, seed=2)},
    )
    q = quantize_dynamic(m, tmp_path)
    assert ops(q)["DynamicQuantizeLinear"] == 1 and ops(q)["MatMulInteger"] == 1
    asm, report = compiled_asm(q, "llvm -mcpu=znver4")  # AVX-512 VNNI: exact for 8-bit weights
    assert report["qdq_lowered"] == 1 and "vpdpbusd" in asm
    x = rand(2, 8, 16, seed=7) + 0.5  # a nonzero zero point
    check_against_ort(q, {"x": x}, tmp_path, rtol=1e-5, atol=1e-5)


def test_uint8_weights_with_a_zero_point_run_int8(tmp_path):
    """quantize_dynamic with uint8 weights (older onnxruntime's default; ddddocr's OCR models ship so): the
    weight zero point is not 0, so the int8 kernel takes w - 128 and the rest, (128 - zw) * sum(x - zx), is a
    per-row term. Before: the layer stayed float (a 1024 x 8210 classifier read 34 MB of weights a run)."""
    from tests.helpers import compiled_asm

    m = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["z"])],
        {"x": rand(2, 8, 64)},
        ["z"],
        {"w": rand(64, 40, seed=1) + 0.3, "b": rand(40, seed=2)},  # off-centre weights: zw far from 128
    )
    q = quantize_dynamic(m, tmp_path, weight_type="QUInt8")
    zw = [i for i in q.graph.initializer if i.data_type == onnx.TensorProto.UINT8 and not i.dims]
    assert ops(q)["MatMulInteger"] == 1 and zw and onnx.numpy_helper.to_array(zw[0]) != 128
    asm, report = compiled_asm(q, "llvm -mcpu=znver4")
    assert report["qdq_lowered"] == 1 and "vpdpbusd" in asm
    check_against_ort(q, {"x": rand(2, 8, 64, seed=7) + 0.5}, tmp_path, rtol=1e-5, atol=1e-5)


def test_matmul_integer_to_float(tmp_path):
    """One-node model: onnxruntime writes it only when fusing a DQL-fed MatMulInteger with mixed scales."""
    g = np.random.default_rng(1)
    inits = {
        "w": g.integers(-127, 128, (16, 12)).astype(np.int8),
        "xs": np.float32(0.02),
        "ws": np.full(12, 0.01, np.float32),
        "xz": np.uint8(128),
        "b": rand(12, seed=3),
    }
    m = ms_model(
        [ms("MatMulIntegerToFloat", ["x", "w", "xs", "ws", "xz", "", "b"], ["y"])],
        {"x": np.zeros((3, 16), np.uint8)},
        ["y"],
        inits,
    )
    assert_supported(m)
    check_against_ort(m, {"x": g.integers(0, 256, (3, 16)).astype(np.uint8)}, tmp_path, rtol=1e-5, atol=1e-5)


def test_dynamic_quantize_lstm(tmp_path):
    inits = {"W": rand(1, 32, 8, seed=3) * 0.3, "R": rand(1, 32, 8, seed=4) * 0.3, "B": rand(1, 64, seed=5) * 0.1}
    m = make_model(
        [helper.make_node("LSTM", ["x", "W", "R", "B"], ["Y", "Yh", "Yc"], hidden_size=8)],
        {"x": rand(5, 2, 8)},
        ["Y", "Yh", "Yc"],
        inits,
    )
    q = quantize_dynamic(m, tmp_path)
    assert ops(q)[f"{MS}.DynamicQuantizeLSTM"] == 1
    assert_supported(q)
    check_against_ort(q, {"x": rand(5, 2, 8, seed=9)}, tmp_path, rtol=1e-4, atol=1e-4)
    # the input projection runs on the int8 kernel, the 5 steps (h quantized each step) in one recurrence kernel
    # (built for znver4, not run): lstm_text_qdynamic's ~30 kernels a step made it 5x onnxruntime
    from tests.helpers import compiled_asm

    asm, report = compiled_asm(q, "llvm -mcpu=znver4")
    assert report["qdq_lowered"] == 1 and "vpdpbusd" in asm and "recurrence" in asm


@pytest.mark.parametrize("hidden, bidirectional", [(12, True), (260, False)])
def test_dynamic_quantize_lstm_layers(tmp_path, hidden, bidirectional):
    """A bidirectional layer in one kernel (both directions' projections in one int8 matmul, h quantized per
    direction); a layer wider than contrib_quant.ONE_KERNEL_HIDDEN keeps its steps unrolled on the int8 kernel
    (float32 sums of its integer products would no longer be exact; ddddocr's 512 units read 4 MB of float
    weights a step in the kernel)."""
    d, i, t = 1 + bidirectional, 8, 3 if bidirectional else 2  # the wide layer unrolled: fewer steps to compile
    inits = {
        "W": rand(d, 4 * hidden, i, seed=3) * 0.3,
        "R": rand(d, 4 * hidden, hidden, seed=4) * 0.3,
        "B": rand(d, 8 * hidden, seed=5) * 0.1,
    }
    node = helper.make_node(
        "LSTM",
        ["x", "W", "R", "B"],
        ["Y", "Yh", "Yc"],
        hidden_size=hidden,
        direction="bidirectional" if d == 2 else "forward",
    )
    m = make_model([node], {"x": rand(t, 2, i)}, ["Y", "Yh", "Yc"], inits)
    q = quantize_dynamic(m, tmp_path)
    assert ops(q)[f"{MS}.DynamicQuantizeLSTM"] == 1
    check_against_ort(q, {"x": rand(t, 2, i, seed=9)}, tmp_path, rtol=1e-4, atol=1e-4)
    from tests.helpers import compiled_asm

    asm, report = compiled_asm(q, "llvm -mcpu=znver4")
    one_kernel = hidden <= 256
    assert report["qdq_lowered"] == (1 if one_kernel else 1 + t) and ("recurrence" in asm) == one_kernel


def test_graph_optimizer_fusions(tmp_path):
    """Conv+Relu -> FusedConv, Transpose+MatMul -> FusedMatMul, Add+erf-Gelu -> BiasGelu,
    x*sigmoid(1.702x) -> QuickGelu."""
    c = lambda v: np.array(v, np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "cw", "cb"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Reshape", ["r", "sh"], ["f"]),
        helper.make_node("Transpose", ["f"], ["ft"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["f", "ft"], ["mm"]),
        helper.make_node("Add", ["mm", "b2"], ["a"]),
        helper.make_node("Div", ["a", "sq"], ["dv"]),
        helper.make_node("Erf", ["dv"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]),
        helper.make_node("Mul", ["a", "e1"], ["m1"]),
        helper.make_node("Mul", ["m1", "half"], ["g"]),
        helper.make_node("Mul", ["g", "k"], ["gk"]),
        helper.make_node("Sigmoid", ["gk"], ["sg"]),
        helper.make_node("Mul", ["g", "sg"], ["y"]),
    ]
    inits = {
        "cw": rand(4, 3, 3, 3, seed=1),
        "cb": rand(4, seed=2),
        "sh": np.array([2, 4, 16], np.int64),
        "b2": rand(4, seed=4),
        "sq": c(np.sqrt(2)),
        "one": c(1),
        "half": c(0.5),
        "k": c(1.702),
    }
    q = ort_optimized(make_model(nodes, {"x": rand(2, 3, 4, 4)}, ["y"], inits), tmp_path)
    got = ops(q)
    for op in ("FusedConv", "FusedMatMul", "BiasGelu", "QuickGelu"):
        assert got[f"{MS}.{op}"] == 1, got
    assert_supported(q)
    check_against_ort(q, {"x": rand(2, 3, 4, 4, seed=5)}, tmp_path, rtol=1e-4, atol=1e-4)


def test_qoperator_static(tmp_path):
    """quantize_static, QOperator format: QLinearConv/Sigmoid/LeakyRelu/Concat/AveragePool and QGemm."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c1"], ["s"]),
        helper.make_node("Conv", ["x", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("LeakyRelu", ["c2"], ["l"], alpha=0.1),
        helper.make_node("Concat", ["s", "l"], ["cat"], axis=1),
        helper.make_node("AveragePool", ["cat"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "wg", "bg"], ["y"], transB=1),
    ]
    inits = {
        "w1": rand(4, 3, 3, 3, seed=1) * 0.3,
        "b1": rand(4, seed=2),
        "w2": rand(4, 3, 3, 3, seed=3) * 0.3,
        "b2": rand(4, seed=4),
        "wg": rand(5, 32, seed=5) * 0.3,
        "bg": rand(5, seed=6),
    }
    onnx.save(make_model(nodes, {"x": rand(1, 3, 4, 4)}, ["y"], inits, opset=13), tmp_path / "f.onnx")

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.data = iter([{"x": rand(1, 3, 4, 4, seed=s)} for s in range(8)])

        def get_next(self):
            return next(self.data, None)

    quantize_static(
        tmp_path / "f.onnx",
        tmp_path / "q.onnx",
        Reader(),
        quant_format=QuantFormat.QOperator,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )
    q = onnx.load(tmp_path / "q.onnx")
    got = ops(q)
    for op in ("QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat", "QLinearAveragePool", "QGemm"):
        assert got[f"{MS}.{op}"] == 1, got
    assert_supported(q)
    # one uint8 step of the output scale: onnxruntime's integer kernels round intermediate tensors themselves
    ys = float(next(onnx.numpy_helper.to_array(i) for i in q.graph.initializer if i.name.startswith("y_scale")))
    check_against_ort(q, {"x": rand(1, 3, 4, 4, seed=3)}, tmp_path, rtol=0, atol=ys * 1.01)


def _bert_block(hidden=16):
    """Add + LayerNormalization (-> SkipLayerNormalization), MatMul + Add + tanh-Gelu (-> FastGelu)."""
    c = lambda v: np.array(v, np.float32)
    nodes = [
        helper.make_node("Add", ["x", "r"], ["s"]),
        helper.make_node("LayerNormalization", ["s", "g", "bt"], ["ln"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["ln", "w"], ["mm"]),
        helper.make_node("Add", ["mm", "b"], ["a"]),
        helper.make_node("Pow", ["a", "three"], ["p3"]),
        helper.make_node("Mul", ["p3", "k"], ["p3k"]),
        helper.make_node("Add", ["a", "p3k"], ["in"]),
        helper.make_node("Mul", ["in", "s2p"], ["in2"]),
        helper.make_node("Tanh", ["in2"], ["t"]),
        helper.make_node("Add", ["t", "one"], ["t1"]),
        helper.make_node("Mul", ["a", "t1"], ["m"]),
        helper.make_node("Mul", ["m", "half"], ["y"]),
    ]
    inits = {
        "g": rand(hidden, seed=1),
        "bt": rand(hidden, seed=2),
        "w": rand(hidden, 32, seed=3) * 0.3,
        "b": rand(32, seed=4),
        "three": c(3),
        "k": c(0.044715),
        "s2p": c(np.sqrt(2 / np.pi)),
        "one": c(1),
        "half": c(0.5),
    }
    return make_model(nodes, {"x": rand(2, 5, hidden), "r": rand(2, 5, hidden)}, ["y"], inits)


def test_skip_layer_norm_fast_gelu(tmp_path):
    """onnxruntime's graph optimizer fuses these like the transformer optimizer (which needs sympy, absent here)."""
    q = ort_optimized(_bert_block(), tmp_path)
    got = ops(q)
    assert got[f"{MS}.SkipLayerNormalization"] == 1, got  # the tanh-Gelu becomes FastGelu only after a MatMul it keeps
    assert_supported(q)
    feeds = {"x": rand(2, 5, 16, seed=5), "r": rand(2, 5, 16, seed=6)}
    check_against_ort(q, feeds, tmp_path, rtol=1e-4, atol=1e-4)


def _attention_model(mask_shape=None, past=False, unidirectional=0, bias=True, qk=False, b=2, s=4, p=3, hidden=8, n=2):
    inputs = {"x": rand(b, s, hidden, seed=1)}
    ins = ["x", "w", "bias" if bias else ""]
    if mask_shape is not None:
        inputs["mask"] = np.zeros(mask_shape, np.int32)
    ins.append("mask" if mask_shape is not None else "")
    if past:
        inputs["past"] = rand(2, b, n, p, hidden // n, seed=2)
    ins.append("past" if past else "")
    if qk:
        inputs["qk"] = rand(b, n, s, s + (p if past else 0), seed=3)
        ins.append("qk")
    outs = ["y", "present"] if past else ["y"]
    node = ms("Attention", ins, outs, num_heads=n, unidirectional=unidirectional)
    return ms_model(
        [node], inputs, outs, {"w": rand(hidden, 3 * hidden, seed=4) * 0.5, "bias": rand(3 * hidden, seed=5)}
    )


@pytest.mark.parametrize("case", ["plain", "mask1d", "mask2d", "mask3d", "causal_past", "qk_bias"])
def test_attention(tmp_path, case):
    """One-node Attention (the transformer optimizer writes it only from a full BERT/GPT-2 subgraph)."""
    b, s, p = 2, 4, 3
    kw = {
        "plain": {},
        "mask1d": {"mask_shape": (b,)},
        "mask2d": {"mask_shape": (b, s)},
        "mask3d": {"mask_shape": (b, s, s)},
        "causal_past": {"past": True, "unidirectional": 1, "mask_shape": (b, s + p)},
        "qk_bias": {"qk": True, "bias": False},
    }[case]
    m = _attention_model(**kw)
    assert_supported(m)
    feeds = {i.name: None for i in m.graph.input}
    feeds["x"] = rand(b, s, 8, seed=7)
    if "mask" in feeds:
        shape = kw["mask_shape"]
        feeds["mask"] = (
            np.array([s, 2], np.int32)
            if len(shape) == 1
            else (np.random.default_rng(3).random(shape) > 0.3).astype(np.int32)
        )
        if len(shape) > 1:
            feeds["mask"][..., 0] = 1
    if "past" in feeds:
        feeds["past"] = rand(2, b, 2, p, 4, seed=8)
    if "qk" in feeds:
        feeds["qk"] = rand(b, 2, s, s, seed=9)
    check_against_ort(m, feeds, tmp_path, rtol=1e-4, atol=1e-5)


def test_embed_layer_norm(tmp_path):
    b, s, h = 2, 5, 8
    inits = {
        "word": rand(30, h, seed=1),
        "pos": rand(16, h, seed=2),
        "seg": rand(2, h, seed=3),
        "g": rand(h, seed=4),
        "bt": rand(h, seed=5),
    }
    node = ms(
        "EmbedLayerNormalization",
        ["ids", "sid", "word", "pos", "seg", "g", "bt", "mask"],
        ["y", "mi", "sum"],
        epsilon=1e-5,
    )
    m = ms_model(
        [node],
        {"ids": np.zeros((b, s), np.int32), "sid": np.zeros((b, s), np.int32), "mask": np.zeros((b, s), np.int32)},
        ["y", "mi", "sum"],
        inits,
    )
    m.graph.output[1].type.tensor_type.elem_type = onnx.TensorProto.INT32
    g = np.random.default_rng(0)
    feeds = {
        "ids": g.integers(0, 30, (b, s)).astype(np.int32),
        "sid": g.integers(0, 2, (b, s)).astype(np.int32),
        "mask": np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32),
    }
    check_against_ort(m, feeds, tmp_path, rtol=1e-4, atol=1e-5)


def test_small_float_ops(tmp_path):
    """One-node models (BiasAdd has no onnxruntime CPU kernel to compare with):
    SkipSimplifiedLayerNormalization, SimplifiedLayerNormalization, FastGelu (com.microsoft
    Gelu is covered by test_graph_optimizer_fusions' BiasGelu path only: compiling it here hit a KeyError in the compile
    path outside decompose, under investigation)."""
    h = 8
    nodes = [
        ms("SkipSimplifiedLayerNormalization", ["x", "r", "g", "b"], ["s", "", "", "sum"], epsilon=1e-6),
        helper.make_node("SimplifiedLayerNormalization", ["s", "g"], ["n"], epsilon=1e-6),  # default domain
        ms("FastGelu", ["n", "b"], ["y"]),
    ]
    m = ms_model(
        nodes, {"x": rand(2, 3, h), "r": rand(2, 3, h)}, ["y", "sum"], {"b": rand(h, seed=1), "g": rand(h, seed=2)}
    )
    assert_supported(m)
    check_against_ort(m, {"x": rand(2, 3, h, seed=3), "r": rand(2, 3, h, seed=4)}, tmp_path, rtol=1e-4, atol=1e-5)


def test_matmul_nbits(tmp_path):
    """One-node model packed by hand (matmul_nbits_quantizer needs onnx_ir, absent here): 4-bit, block 32,
    packed uint8 zero points, K not a multiple of the block."""
    k, n, bs = 40, 6, 32
    nb = (k + bs - 1) // bs
    g = np.random.default_rng(0)
    qv = g.integers(0, 16, (n, nb * bs)).astype(np.uint8)
    zq = g.integers(0, 16, (n, 2 * ((nb + 1) // 2))).astype(np.uint8)
    inits = {
        "b": (qv[:, 0::2] | (qv[:, 1::2] << 4)).reshape(n, nb, bs // 2),
        "s": (g.random(n * nb) * 0.1).astype(np.float32),
        "z": (zq[:, 0::2] | (zq[:, 1::2] << 4)).reshape(-1),
        "bias": rand(n, seed=1),
    }
    m = ms_model(
        [ms("MatMulNBits", ["x", "b", "s", "z", "", "bias"], ["y"], K=k, N=n, bits=4, block_size=bs)],
        {"x": rand(2, 3, k)},
        ["y"],
        inits,
    )
    assert_supported(m)
    check_against_ort(m, {"x": rand(2, 3, k, seed=2)}, tmp_path, rtol=1e-4, atol=1e-4)
