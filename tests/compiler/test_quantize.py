"""INT8: each integer op against a numpy reference of the same integer math, onnxruntime's own
int8 models (QDQ and QOperator) against onnxruntime, the calibrated flow, its accuracy gate and
its options; and fp16/bf16 mixed precision."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from helpers import make_model, mobilenet_block, ort_run, qdq_conv, qdq_runs_int8, rand
from onnx import helper

import kiln
from kiln.errors import OptionsError

I8 = np.int8


def _lowered_or_kept_float(report: dict, n: int) -> int:
    """n QDQ layers lowered to int8 kernels, except on a host whose int8 kernel is vpmaddubsw (AVX2,
    no VNNI), where 8-bit weights that could saturate it stay float (docs/int8-kernels.md); returns
    how many stayed float."""
    from kiln.target import Target

    kept = report.get("qdq_kept_float", 0)
    assert report["qdq_lowered"] + kept == n
    assert kept == 0 or "pmaddubsw" in Target.parse(None).caps.int8_path
    return kept


@pytest.mark.parametrize(
    "cin,cout,k,stride,pad,zx",
    [
        (32, 48, 3, 1, 1, 0),  # VNNI kernel, ReLU-style input (zero point 0)
        (32, 32, 3, 2, 1, 100),  # VNNI kernel, zero point padded explicitly, stride 2
        (16, 64, 1, 1, 0, 7),  # 1x1
        (8, 24, 3, 1, 1, 3),  # channels not multiples of 16: 8-channel blocks (the ymm kernel on AVX-512)
    ],
)
def test_integer_conv_matches_numpy(tmp_path, cin, cout, k, stride, pad, zx):
    model, x, ref = qdq_conv(cin, cout, k, stride, pad, zx, wmax=127)
    r = kiln.compile(model, tmp_path / "m.kiln", report_path=tmp_path / "r.json")
    if not _lowered_or_kept_float(r.report, 1):
        assert r.report["ops_after"].get("dequantize", 0) == 0  # no fake quantization left
    got = kiln.load(tmp_path / "m.kiln").run({"input": x})["output"]
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-5)


def _qdq_matmul_model():
    rng = np.random.default_rng(3)
    wq = rng.integers(-127, 128, (64, 32)).astype(I8)
    sw, sx, zx = np.float32(0.004), np.float32(0.03), 128
    nodes = [
        helper.make_node("QuantizeLinear", ["input", "sx", "zx"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xf"]),
        helper.make_node("DequantizeLinear", ["wq", "sw"], ["wf"]),
        helper.make_node("MatMul", ["xf", "wf"], ["output"]),
    ]
    x = rand(4, 64, seed=4)
    return (
        make_model(nodes, {"input": x}, ["output"], {"sx": sx, "zx": np.uint8(zx), "wq": wq, "sw": sw}),
        x,
        wq,
        sw,
        sx,
        zx,
    )


def test_integer_matmul_matches_numpy(tmp_path):
    model, x, wq, sw, sx, zx = _qdq_matmul_model()
    r = kiln.compile(model, tmp_path / "m.kiln")
    _lowered_or_kept_float(r.report, 1)
    xq = np.clip(np.round(x / sx) + zx, 0, 255).astype(np.int64)
    ref = ((xq - zx) @ wq.astype(np.int64)).astype(np.float64) * np.float64(sx) * np.float64(sw)
    np.testing.assert_allclose(kiln.load(tmp_path / "m.kiln").run({"input": x})["output"], ref, rtol=2e-6, atol=1e-5)


def test_integer_gemm_trans_b_matches_numpy(tmp_path):
    """A QDQ Gemm with transB (PyTorch's Linear, onnxruntime's quantizer: per-channel scales on the weights'
    axis 0) runs int8 like a MatMul; 1000 classes, a multiple of 8 and not of 16 (MobileNetV2-QDQ's head)."""
    rng = np.random.default_rng(5)
    wq = rng.integers(-127, 128, (1000, 64)).astype(I8)
    sw, sx, zx = rng.uniform(0.001, 0.01, 1000).astype(np.float32), np.float32(0.03), 9
    nodes = [
        helper.make_node("QuantizeLinear", ["input", "sx", "zx"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xf"]),
        helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wf"], axis=0),
        helper.make_node("Gemm", ["xf", "wf"], ["output"], transB=1),
    ]
    x = rand(2, 64, seed=6)
    inits = {"sx": sx, "zx": np.uint8(zx), "wq": wq, "sw": sw, "zw": np.zeros(1000, I8)}
    r = kiln.compile(make_model(nodes, {"input": x}, ["output"], inits), tmp_path / "m.kiln")
    _lowered_or_kept_float(r.report, 1)
    xq = np.clip(np.round(x / sx) + zx, 0, 255).astype(np.int64)
    ref = ((xq - zx) @ wq.T.astype(np.int64)).astype(np.float64) * np.float64(sx) * sw.astype(np.float64)
    np.testing.assert_allclose(kiln.load(tmp_path / "m.kiln").run({"input": x})["output"], ref, rtol=2e-6, atol=1e-5)


@pytest.mark.parametrize("op", ["conv2d", "matmul"])
def test_int8_kernels_use_vnni(tmp_path, op):
    """The uint8 x int8 kernels are tensorized: the generated code has vpdpbusd (tdpbusd for convs on
    an AMX host: tests/schedules/test_amx.py)."""
    pytest.importorskip("tvm")
    from kiln.compiler.executable import build_executable
    from kiln.compiler.optimize import optimize
    from kiln.compiler.options import CompileOptions
    from kiln.frontends.importer import import_onnx

    opts = CompileOptions.make()
    if "avx512vnni" not in opts.target.required_features():
        pytest.skip("this CPU has no AVX-512 VNNI")
    model = qdq_conv(32, 48, 3, 1, 1, 0, wmax=127)[0] if op == "conv2d" else _qdq_matmul_model()[0]
    opt = optimize(import_onnx(model).mod, opts)
    assert opt.report["kernels_unscheduled"] == 0
    asm = "".join(m.inspect_source("asm") for m in build_executable(opt.mod, opts, "test").mod.imports)
    amx = op == "conv2d" and opts.target.caps.int8_path == "amx-int8"
    assert ("tdpbusd" if amx else "vpdpbusd") in asm


def _ort_cnn(tmp_path):
    """A small CNN and onnxruntime's static int8 quantizations of it (QDQ and QOperator)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(0)
    nodes, inits, x = [], {}, "input"
    for i, (cin, cout, k) in enumerate([(16, 32, 3), (32, 32, 3), (32, 64, 1)]):
        inits[f"w{i}"] = (rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
        inits[f"b{i}"] = (rng.standard_normal(cout) * 0.1).astype(np.float32)
        nodes += [
            helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], pads=[k // 2] * 4),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"]),
        ]
        x = f"r{i}"
    inits["fc"] = (rng.standard_normal((64, 16)) * 0.2).astype(np.float32)
    nodes += [
        helper.make_node("GlobalAveragePool", [x], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["output"]),
    ]
    model = make_model(nodes, {"input": rand(1, 16, 16, 16)}, ["output"], inits)
    src = tmp_path / "cnn.onnx"
    onnx.save(model, src)
    samples = [{"input": rand(1, 16, 16, 16, seed=s)} for s in range(8)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(samples)

        def get_next(self):
            return next(self.it, None)

    out = {}
    for fmt in ("QDQ", "QOperator"):
        out[fmt] = tmp_path / f"cnn_{fmt}.onnx"
        quantize_static(
            str(src),
            str(out[fmt]),
            Reader(),
            quant_format=getattr(QuantFormat, fmt),
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
        )
    return src, out


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_onnxruntime_quantized_model_matches_onnxruntime_int8(tmp_path, fmt):
    _, models = _ort_cnn(tmp_path)
    model = onnx.load(models[fmt])
    r = kiln.compile(model, tmp_path / "q.kiln")
    _lowered_or_kept_float(r.report, 4)  # 3 convs + the matmul run as integer kernels
    m = kiln.load(tmp_path / "q.kiln")
    out_scale = None
    for seed in range(3):
        x = rand(1, 16, 16, 16, seed=100 + seed)
        ref = ort_run(model, {"input": x})[0]
        got = m.run({"input": x})["output"]
        # the output is dequantized from uint8: equal, or one quantization step apart where rounding ties differ
        step = out_scale or np.min(np.diff(np.unique(ref))) if np.unique(ref).size > 1 else 1.0
        out_scale = step
        assert np.abs(got - ref).max() <= step * 1.01 + 1e-7
        assert np.mean(got == ref) > 0.99


def _calib_cnn(tmp_path, n=12, classes=16, scale_first=None):
    rng = np.random.default_rng(1)
    nodes, inits, x = [], {}, "input"
    for i, (cin, cout) in enumerate([(3, 16), (16, 32), (32, 32)]):
        inits[f"w{i}"] = (rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(cin * 9)).astype(np.float32)
        inits[f"b{i}"] = (rng.standard_normal(cout) * 0.1).astype(np.float32)
        nodes += [
            helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1] * 4, name=f"conv{i}"),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        x = f"r{i}"
    inits["fc"] = (rng.standard_normal((32, classes)) * 0.5).astype(np.float32)
    nodes += [
        helper.make_node("GlobalAveragePool", [x], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["output"], name="fc"),
    ]
    model = make_model(nodes, {"input": rand(1, 3, 16, 16)}, ["output"], inits)
    data = np.random.default_rng(2).standard_normal((n, 3, 16, 16)).astype(np.float32)
    if scale_first is not None:
        data[: n - 4] *= scale_first
    np.savez(tmp_path / "calib.npz", input=data)
    return model, tmp_path / "calib.npz", data


def test_calibrated_int8_compile(tmp_path):
    model, calib, data = _calib_cnn(tmp_path)
    r = kiln.compile(
        model, tmp_path / "q.kiln", quantize="int8", calibration=calib, calib_samples=8, report_path=tmp_path / "r.json"
    )
    q = json.loads((tmp_path / "r.json").read_text())["quantization"]
    assert q["int8_layers"] == ["conv1", "conv2", "fc"]
    assert "conv0" in q["float_layers"] and "3->16" in q["float_layers"]["conv0"]  # the stem stays float, and says why
    acc = q["accuracy"]
    assert acc["held_out"] and acc["samples"] == 4 and q["calib_samples"] == 8
    assert acc["outputs"]["output"]["cosine"] > 0.999 and "top1_agreement" in acc["outputs"]["output"]
    assert len(acc["worst_layers"]) == 3 and {w["layer"] for w in acc["worst_layers"]} == {"conv1", "conv2", "fc"}
    assert r.manifest["quantization"]["int8_layers"] == 3 and r.manifest["compile_options"]["quantize"] == "int8"
    assert r.manifest["compile_options"]["calibration_sha256"] == q["calibration_sha256"]
    # the artifact's outputs are what the accuracy check measured: close to the float model's
    ref = ort_run(model, {"input": data[-1:]})[0]
    got = kiln.load(tmp_path / "q.kiln").run({"input": data[-1:]})["output"]
    assert np.abs(got - ref).max() < 0.05 * np.abs(ref).max()
    # int8 weights: the artifact is smaller than the float one
    f = kiln.compile(model, tmp_path / "f.kiln")
    assert r.report["weights_bytes"] < f.report["weights_bytes"]


@pytest.mark.parametrize("method", ["percentile", "entropy"])
def test_calibration_methods(tmp_path, method):
    model, calib, _ = _calib_cnn(tmp_path)
    r = kiln.compile(model, tmp_path / "q.kiln", quantize="int8", calibration=calib, calib_method=method)
    q = r.report["quantization"]
    assert q["calib_method"] == method and q["accuracy"]["outputs"]["output"]["cosine"] > 0.99


def test_keep_float(tmp_path):
    model, calib, _ = _calib_cnn(tmp_path)
    r = kiln.compile(model, tmp_path / "q.kiln", quantize="int8", calibration=calib, keep_float=["conv2"])
    q = r.report["quantization"]
    assert q["int8_layers"] == ["conv1", "fc"] and "keep-float" in q["float_layers"]["conv2"]


def test_accuracy_gate_fails_with_the_worst_layers(tmp_path):
    # calibrated on inputs 1000x smaller than the held-out ones: every activation saturates
    model, calib, _ = _calib_cnn(tmp_path, n=12, scale_first=1e-3)
    with pytest.raises(kiln.AccuracyError) as e:
        kiln.compile(
            model, tmp_path / "q.kiln", quantize="int8", calibration=calib, calib_samples=8, min_agreement=0.99
        )
    assert "below --min-agreement 0.99" in str(e.value) and "conv1" in str(e.value) and "--keep-float" in str(e.value)
    assert not (tmp_path / "q.kiln").exists()  # nothing half-written
    # the same data passes a gate it meets
    model, calib, _ = _calib_cnn(tmp_path, n=12)
    kiln.compile(model, tmp_path / "q.kiln", quantize="int8", calibration=calib, calib_samples=8, min_agreement=0.5)


def test_calibration_errors(tmp_path):
    model, _, _ = _calib_cnn(tmp_path)
    cases = [
        ({"wrong": np.zeros((2, 3, 16, 16), np.float32)}, "do not match the model inputs"),
        ({"input": np.zeros((2, 3, 8, 8), np.float32)}, "has shape [2, 3, 8, 8]"),
        ({"input": np.zeros((2, 3, 16, 16), np.int64)}, "is int64"),
    ]
    for arrays, msg in cases:
        np.savez(tmp_path / "bad.npz", **arrays)
        with pytest.raises(OptionsError, match=msg.replace("[", r"\[")):
            kiln.compile(model, tmp_path / "q.kiln", quantize="int8", calibration=tmp_path / "bad.npz")
    with pytest.raises(OptionsError, match="does not exist"):
        kiln.compile(model, tmp_path / "q.kiln", quantize="int8", calibration=tmp_path / "nothing.npz")
    (tmp_path / "empty").mkdir()
    with pytest.raises(OptionsError, match="no .npz files"):
        kiln.compile(model, tmp_path / "q.kiln", quantize="int8", calibration=tmp_path / "empty")


def test_calibration_folder(tmp_path):
    from kiln.compiler.quantize.calibration import load_calibration
    from kiln.runtime.artifact import TensorSpec

    d = tmp_path / "calib"
    d.mkdir()
    for i in range(3):
        np.savez(d / f"part{i}.npz", input=np.full((2, 3, 4, 4), i, np.float32))
    cs = load_calibration(d, [TensorSpec("input", (1, 3, 4, 4), "float32")])
    assert len(cs) == 6 and [float(cs.feed(i)["input"][0, 0, 0, 0]) for i in range(6)] == [0, 0, 1, 1, 2, 2]
    calib, held = cs.split(None)
    assert len(calib) == 5 and len(held) == 1
    calib, held = cs.split(6)
    assert len(calib) == 6 and held is None


def test_range_collectors():
    from kiln.compiler.quantize.calibration import RangeCollector

    x = np.random.default_rng(0).standard_normal(200_000).astype(np.float32)
    x[0] = 30.0  # one outlier
    ranges = {}
    for method in ("minmax", "percentile", "entropy"):
        c = RangeCollector(method)
        c.observe("t", x)
        if c.needs_histogram:
            c.observe_histogram("t", x)
        ranges[method] = c.ranges()["t"]
    assert ranges["minmax"][1] == 30.0
    assert 3 < ranges["percentile"][1] < 10 and 3 < ranges["entropy"][1] < 10  # both clip the outlier
    assert ranges["percentile"][0] < -3  # and keep the real tail


@pytest.mark.parametrize(
    "kwargs,where",
    [
        ({"quantize": "int4", "calibration": "x.npz"}, "--quantize"),
        ({"quantize": "int8"}, "--calibration"),
        ({"quantize": "int8", "calibration": "x.npz", "calib_method": "mse"}, "--calib-method"),
        ({"quantize": "int8", "calibration": "x.npz", "min_agreement": 2}, "--min-agreement"),
        ({"quantize": "int8", "calibration": "x.npz", "precision": "bf16"}, "--precision"),
        ({"calibration": "x.npz"}, "--quantize"),
        ({"precision": "fp8"}, "--precision"),
    ],
)
def test_quantize_option_errors(kwargs, where):
    from kiln.compiler.options import CompileOptions

    with pytest.raises(OptionsError) as e:
        CompileOptions.make(**kwargs)
    assert e.value.where == where and e.value.fix


@pytest.mark.parametrize("precision,dtype,tol", [("fp16", "float16", 5e-3), ("bf16", "bfloat16", 4e-2)])
def test_mixed_precision(tmp_path, precision, dtype, tol):
    model, _, data = _calib_cnn(tmp_path)
    r = kiln.compile(model, tmp_path / "m.kiln", precision=precision)
    bf16_kernels = precision == "bf16" and "avx512bf16" in r.manifest["cpu_features"]
    # where bf16 convs have kernels, the 3-channel stem (not a multiple of 16 channels) and the matmul have none:
    # they stay float32
    assert (r.report["mixed_precision_ops"], r.report["mixed_precision_kept"]) == ((2, 2) if bf16_kernels else (4, 0))
    # the 16- and 32-channel 3x3 convs: Winograd on reduced-precision weights (the 3-channel stem stays NCHW);
    # on AMX-BF16 they run direct on the tile kernel
    amx = bf16_kernels and "amx-bf16" in r.manifest["cpu_features"]
    assert r.report["winograd_convs"] == (0 if amx else 2)
    assert {w["dtype"] for w in r.manifest["weights"]} >= {dtype}
    ref = ort_run(model, {"input": data[:1]})[0]
    got = kiln.load(tmp_path / "m.kiln").run({"input": data[:1]})["output"]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * np.abs(ref).max())


@pytest.mark.parametrize("c", [48, 24])
def test_bf16_converts_the_convs_a_bf16_kernel_takes(tmp_path, c):
    """An inverted-residual block under --precision bf16: the depthwise conv stays float32 (TVM computes
    it in float32 registers anyway); the 1x1 expansion and projection run on the vdpbf16ps kernel when
    their channels are multiples of 16 (48), and stay float32 when they are not (24), where the depthwise
    conv and the projection are then fused into one float32 kernel."""
    m = mobilenet_block(c=c)
    r = kiln.compile(m, tmp_path / "m.kiln", precision="bf16")
    if "avx512bf16" in r.manifest["cpu_features"]:
        converted = {48: 2, 24: 0}[c]
        assert (r.report["mixed_precision_ops"], r.report["mixed_precision_kept"]) == (converted, 3 - converted)
        assert r.report["bf16_kernel_convs"] == converted and r.report["depthwise_fused"] == (1 if c == 24 else 0)
    else:  # no bf16 kernel: every non-grouped conv is converted (half the weight bytes), computed in float32 registers
        assert (r.report["mixed_precision_ops"], r.report["mixed_precision_kept"]) == (2, 1)
    x = rand(1, 16, 14, 14, seed=7)
    ref = ort_run(m, {"x": x})[0]
    got = kiln.load(tmp_path / "m.kiln").run({"x": x})["y"]
    np.testing.assert_allclose(got, ref, rtol=4e-2, atol=4e-2 * np.abs(ref).max())


def test_ort_qdq_depthwise_block_stays_blocked(tmp_path):
    """onnxruntime's QDQ MobileNet block (1x1 -> depthwise 3x3 -> 1x1): the depthwise conv stays float
    between Q/DQ pairs, which PropagateBlockedLayout moves the layout through (mobilenet_v2_qdq kept 59
    transforms when it stopped at them); only the model's input and output are transformed."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(1)
    w = lambda *s: (rng.standard_normal(s) / np.sqrt(np.prod(s[1:]))).astype(np.float32)
    inits = {"w0": w(32, 16, 1, 1), "w1": w(32, 1, 3, 3), "b1": w(32, 1)[:, 0], "w2": w(32, 32, 1, 1)}
    nodes = [
        helper.make_node("Conv", ["input", "w0"], ["c0"]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], group=32, pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["output"]),
    ]
    src, dst = tmp_path / "block.onnx", tmp_path / "block_qdq.onnx"
    onnx.save(make_model(nodes, {"input": rand(1, 16, 12, 12)}, ["output"], inits), src)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"input": rand(1, 16, 12, 12, seed=s)} for s in range(4)])

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8)
    model = onnx.load(dst)
    r = kiln.compile(model, tmp_path / "q.kiln")
    assert r.report["layout_transforms"] == 2 and r.report["conv_layouts"].get("NCHW", 0) == 0, r.report
    # the float depthwise conv writes the next layer's uint8 itself (FuseEpilogue's quantize tail)
    from kiln.compiler import CompileOptions, ir
    from kiln.compiler.optimize import optimize
    from kiln.frontends import import_onnx

    names = ir.kernels(optimize(import_onnx(model).mod, CompileOptions.make()).mod)
    if qdq_runs_int8():  # on AVX2 the 1x1 convs' 8-bit weights could saturate vpmaddubsw: they run in float there
        assert any(n.startswith("fused_relax_nn_conv2d_relax_add") and "quantize" in n for n in names), names
        standalone = [n for n in names if "conv2d" not in n and ("quantize" in n or "round" in n)]
        assert len(standalone) == 1, names  # the model input's only (ExpandQuantize writes it as its float ops)
    x = rand(1, 16, 12, 12, seed=9)
    ref = ort_run(model, {"input": x})[0]
    step = np.min(np.diff(np.unique(ref)))
    assert np.abs(kiln.load(tmp_path / "q.kiln").run({"input": x})["output"] - ref).max() <= 2 * step + 1e-6
