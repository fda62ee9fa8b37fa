"""Test helpers: build one-node ONNX models, compile them with Kiln and compare with onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import kiln

NP2ONNX = {
    np.dtype("float32"): TensorProto.FLOAT,
    np.dtype("int64"): TensorProto.INT64,
    np.dtype("int32"): TensorProto.INT32,
    np.dtype("bool"): TensorProto.BOOL,
}


def make_model(
    nodes, inputs: dict, outputs: list[str], inits: dict | None = None, opset: int = 17, in_shapes: dict | None = None
) -> onnx.ModelProto:
    """inputs: name -> example array (its dtype and, unless in_shapes overrides, its shape)."""
    in_shapes = in_shapes or {}
    g = helper.make_graph(
        nodes,
        "test",
        [
            helper.make_tensor_value_info(n, NP2ONNX[a.dtype], in_shapes.get(n, list(a.shape)))
            for n, a in inputs.items()
        ],
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(m)  # fills in the output types onnxruntime requires


def ort_run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    # onnxruntime's u8 x s8 kernels on CPUs without VNNI (AVX2, AVX-512 before Cascade Lake) use vpmaddubsw,
    # whose int16 pair sums saturate: with 8-bit weights its results are then wrong (MatMulInteger off by
    # 2.7 on Zen 3). This option selects its exact kernels; Kiln's integer kernels are exact, so the
    # reference is too. On VNNI hosts it changes nothing.
    so.add_session_config_entry("session.x64quantprecision", "1")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def compile_and_run(model, feeds: dict, tmp_path, input_shapes=None, **kw) -> dict[str, np.ndarray]:
    path = tmp_path / "m.kiln"
    kiln.compile(model, path, input_shapes=input_shapes, **kw)
    return kiln.load(path).run(feeds)


def check_against_ort(model, feeds: dict, tmp_path, input_shapes=None, rtol=1e-4, atol=1e-4, **kw) -> dict:
    ours = compile_and_run(model, feeds, tmp_path, input_shapes, **kw)
    refs = ort_run(model, feeds)
    names = [o.name for o in model.graph.output]
    assert list(ours) == names
    for name, ref in zip(names, refs):
        assert ours[name].shape == ref.shape, (name, ours[name].shape, ref.shape)
        assert ours[name].dtype == ref.dtype, (name, ours[name].dtype, ref.dtype)
        np.testing.assert_allclose(ours[name], ref, rtol=rtol, atol=atol, err_msg=name)
    return ours


def check_runs_against_ort(model, feeds_list, tmp_path, rtol=0.0, atol=0.0) -> list[tuple]:
    """Compile once with the inputs left to run time, then each feeds of feeds_list against onnxruntime: output "y"
    of the same shape, dtype and values (to rtol/atol; exact by default). Returns the output shapes."""
    import kiln

    kiln.compile(model, tmp_path / "m.kiln")
    art = kiln.load(tmp_path / "m.kiln")
    shapes = []
    for feeds in feeds_list:
        ours, ref = art.run(feeds)["y"], ort_run(model, feeds)[0]
        assert ours.shape == ref.shape and ours.dtype == ref.dtype, (feeds, ours.shape, ref.shape)
        np.testing.assert_allclose(ours, ref, rtol=rtol, atol=atol)
        shapes.append(ref.shape)
    return shapes


def compiled_asm(model, spec: str) -> tuple[str, dict]:
    """The model compiled for target `spec` (not run): its kernels' assembly, and the compile report."""
    from kiln.compiler.executable import build_executable
    from kiln.compiler.optimize import optimize
    from kiln.compiler.options import CompileOptions
    from kiln.frontends.importer import import_onnx

    opts = CompileOptions.make(target=spec)
    opt = optimize(import_onnx(model).mod, opts)
    exe = build_executable(opt.mod, opts, "test")
    return "".join(m.inspect_source("asm") for m in exe.mod.imports), opt.report


def quantize_dynamic(model, tmp_path, weight_type="QInt8", **kw) -> onnx.ModelProto:
    """onnxruntime's quantize_dynamic of `model` (written to and read back from tmp_path)."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic as qd

    onnx.save(model, tmp_path / "f.onnx")
    qd(tmp_path / "f.onnx", tmp_path / "q.onnx", weight_type=getattr(QuantType, weight_type), **kw)
    return onnx.load(tmp_path / "q.onnx")


def aligned(values: np.ndarray, offset: int = 0) -> np.ndarray:
    """A copy of values whose data starts `offset` bytes past a 64-byte boundary: run() takes an input of
    COPY_BELOW bytes or more that is 64-byte aligned over DLPack as it is, and stages any other."""
    raw = np.empty(values.size + 128 // values.itemsize, values.dtype)
    start = (-raw.ctypes.data % 64 + offset) // values.itemsize
    out = raw[start : start + values.size].reshape(values.shape)
    out[...] = values
    assert out.ctypes.data % 64 == offset
    return out


def rand(*shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def mobilenet_block(stride=1, multiplier=1, c=32, batch=1):
    """1x1 expand -> ReLU6 -> 3x3 depthwise -> bias -> ReLU6 -> 1x1 project (+ residual)."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["e"]),
        helper.make_node("Clip", ["e", "lo", "hi"], ["e6"]),
        helper.make_node("Conv", ["e6", "wd", "bd"], ["d"], group=c, pads=[1, 1, 1, 1], strides=[stride, stride]),
        helper.make_node("Clip", ["d", "lo", "hi"], ["d6"]),
        helper.make_node("Conv", ["d6", "w2", "b2"], ["p"]),
    ]
    if stride == 1 and multiplier == 1:
        nodes.append(helper.make_node("Add", ["p", "x"], ["y"]))
    else:
        nodes.append(helper.make_node("Relu", ["p"], ["y"]))
    inits = {
        "w1": rand(c, 16, 1, 1, seed=1) * 0.3,
        "b1": rand(c, seed=2),
        "wd": rand(c * multiplier, 1, 3, 3, seed=3) * 0.3,
        "bd": rand(c * multiplier, seed=4),
        "w2": rand(16, c * multiplier, 1, 1, seed=5) * 0.3,
        "b2": rand(16, seed=6),
        "lo": np.array(0, np.float32),
        "hi": np.array(6, np.float32),
    }
    return make_model(nodes, {"x": rand(batch, 16, 14, 14)}, ["y"], inits)


def bf16_block(c=32, hw=8):
    """A bottleneck with a projection shortcut, on hw x hw (every conv on the vdpbf16ps kernel, none Winograd):
    c1 (no bias) -> ReLU; c2 3x3 + bias; proj 1x1 + bias; add -> ReLU (read by c3 and by the last add);
    c3 -> ReLU6 -> c4; add with the block's output -> the graph output (float32)."""
    conv = lambda i, o, w, k=1, bias=True: helper.make_node(
        "Conv",
        [i, w, w + "_b"] if bias else [i, w],
        [o],
        kernel_shape=[k, k],
        pads=[k // 2] * 4,
    )
    nodes = [
        conv("x", "c1", "w1", bias=False),
        helper.make_node("Relu", ["c1"], ["r1"]),
        conv("r1", "c2", "w2", k=3),
        conv("x", "p", "wp"),
        helper.make_node("Add", ["c2", "p"], ["a"]),
        helper.make_node("Relu", ["a"], ["r2"]),
        conv("r2", "c3", "w3"),
        helper.make_node("Clip", ["c3", "lo", "hi"], ["r3"]),
        conv("r3", "c4", "w4"),
        helper.make_node("Add", ["c4", "r2"], ["y"]),
    ]
    inits = {
        "w1": rand(c, c, 1, 1, seed=1) * 0.2,
        "w2": rand(c, c, 3, 3, seed=2) * 0.1,
        "wp": rand(c, c, 1, 1, seed=3) * 0.2,
        "w3": rand(c, c, 1, 1, seed=4) * 0.2,
        "w4": rand(c, c, 1, 1, seed=5) * 0.2,
    }
    inits.update({f"{w}_b": rand(c, seed=10 + i) for i, w in enumerate(("w2", "wp", "w3", "w4"))})
    inits.update(
        lo=np.array(0.0, np.float32), hi=np.array(0.5, np.float32)
    )  # a clip that cuts (ReLU6's bounds at this scale)
    return make_model(nodes, {"x": rand(1, c, hw, hw)}, ["y"], inits)


def default_caps():
    """The capabilities of the target a compile gets when none is given (KILN_TARGET, else the host)."""
    from kiln.target import Target

    return Target.parse(None).caps


def qdq_runs_int8() -> bool:
    """The default target runs an onnxruntime-quantized (QDQ) file's 8-bit weights on an int8 kernel: not AVX2's
    vpmaddubsw, whose int16 pair sums 8-bit weights can saturate (such layers run in float there:
    kiln.schedules.rules.int8.qdq_float_reason), nor a CPU with no int8 kernel."""
    from kiln.schedules.rules.int8 import int8_kernel

    kernel = int8_kernel(default_caps())
    return kernel is not None and kernel.weight_max >= 127


def target_cpu_flags() -> frozenset[str]:
    """The CPU flags (/proc/cpuinfo names) of what the default compile targets AND this host runs: the host's own
    where KILN_TARGET is unset; under KILN_TARGET (CI standing in for another CPU, e.g. `llvm -mcpu=znver3` on a
    Zen 4 host) only the host's flags the target may use, so a test that compiles for the default target and expects
    a kernel of some ISA (the AVX-512 C kernels, vdpbf16ps) follows the target, not the host."""
    from kiln.env import default_target
    from kiln.runtime.hostinfo import LLVM_TO_CPUINFO, host_cpu_flags

    flags = host_cpu_flags()
    if default_target() is None:
        return flags
    allowed = {LLVM_TO_CPUINFO.get(f, f) for f in default_caps().isa_features}
    return frozenset(f for f in flags if f in allowed)


def host_without_amx():
    """This host's target with AMX switched off (the same target where the host has none): for tests of the
    AVX-512 paths that AMX would take over on Sapphire/Emerald Rapids."""
    from kiln.target import Target

    host = Target.host()
    if not host.caps.amx:
        return host
    mattr = tuple(a for a in host.mattr if "amx" not in a) + ("-amx-tile", "-amx-int8", "-amx-bf16")
    return host.with_cpu(mattr=mattr)


def qdq_conv(cin=32, cout=48, k=3, stride=1, pad=1, zx=0, wmax=64, hw=10, seed=0):
    """QuantizeLinear -> DQ -> Conv(DQ(int8 W, per-channel)): and the exact integer result, float64."""
    rng = np.random.default_rng(seed)
    wq = rng.integers(-wmax, wmax + 1, (cout, cin, k, k)).astype(np.int8)
    sw = rng.uniform(0.001, 0.01, cout).astype(np.float32)
    sx = np.float32(0.05)
    nodes = [
        helper.make_node("QuantizeLinear", ["input", "sx", "zx"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xf"]),
        helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wf"], axis=0),
        helper.make_node("Conv", ["xf", "wf"], ["output"], strides=[stride, stride], pads=[pad] * 4),
    ]
    x = rand(1, cin, hw, hw, seed=seed + 1)
    inits = {"sx": sx, "zx": np.uint8(zx), "wq": wq, "sw": sw, "zw": np.zeros(cout, np.int8)}
    model = make_model(nodes, {"input": x}, ["output"], inits)
    xq = np.clip(np.round(x / sx) + zx, 0, 255).astype(np.int64) - zx
    xp = np.pad(xq, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (hw + 2 * pad - k) // stride + 1
    acc = np.zeros((1, cout, oh, oh), np.int64)
    for a in range(k):
        for b in range(k):
            patch = xp[:, :, a : a + stride * oh : stride, b : b + stride * oh : stride]
            acc += np.einsum("nchw,oc->nohw", patch, wq[:, :, a, b].astype(np.int64))
    return model, x, acc * (np.float64(sx) * sw.astype(np.float64)).reshape(1, -1, 1, 1)


# a small text model for sequence-bucket tests (tests/runtime/test_sequence_buckets.py, tests/serve)
HIDDEN, VOCAB = 32, 50


def text_encoder() -> onnx.ModelProto:
    """Embedding, then one attention head whose keys are masked by attention_mask ((1 - mask) * -1e9, as BERT's
    exporters write it), then a residual: [1, seq] token ids and mask -> [1, seq, HIDDEN]."""
    rng = np.random.default_rng(0)
    w = {n: rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32) * 0.2 for n in ("wq", "wk", "wv")}
    inits = [numpy_helper.from_array(v, k) for k, v in w.items()] + [
        numpy_helper.from_array(rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32), "emb"),
        numpy_helper.from_array(np.float32(HIDDEN**-0.5), "scale"),
        numpy_helper.from_array(np.float32(1), "one"),
        numpy_helper.from_array(np.float32(-1e9), "big"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
    ]
    n = helper.make_node
    nodes = [
        n("Gather", ["emb", "input_ids"], ["x"]),
        n("MatMul", ["x", "wq"], ["q"]),
        n("MatMul", ["x", "wk"], ["k"]),
        n("MatMul", ["x", "wv"], ["v"]),
        n("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        n("MatMul", ["q", "kt"], ["s"]),
        n("Mul", ["s", "scale"], ["ss"]),
        n("Cast", ["attention_mask"], ["mf"], to=TensorProto.FLOAT),
        n("Sub", ["one", "mf"], ["inv"]),
        n("Mul", ["inv", "big"], ["neg"]),
        n("Unsqueeze", ["neg", "axis1"], ["m3"]),
        n("Add", ["ss", "m3"], ["sm"]),
        n("Softmax", ["sm"], ["p"], axis=-1),
        n("MatMul", ["p", "v"], ["a"]),
        n("Add", ["a", "x"], ["output"]),
    ]
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "seq"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, "seq"])
    out = helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, "seq", HIDDEN])
    g = helper.make_graph(nodes, "text", [ids, mask], [out], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def batchable_conv() -> onnx.ModelProto:
    """A 3x3 conv 3 -> 4 channels on 8x8 inputs with a symbolic batch: the serving integrations' model."""
    nodes = [helper.make_node("Conv", ["input", "w"], ["output"], pads=[1, 1, 1, 1])]
    return make_model(
        nodes,
        {"input": rand(1, 3, 8, 8)},
        ["output"],
        {"w": rand(4, 3, 3, 3, seed=3)},
        in_shapes={"input": ["N", 3, 8, 8]},
    )
