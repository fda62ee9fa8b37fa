"""FuseBF16MatmulEpilogue: the GELU (any exporter's spelling), residual add and bf16 cast after a bf16 matmul run
in its C kernel's epilogue. A transformer FFN (matmul, bias, GELU, matmul, bias, residual) in three spellings of
GELU against a float64 reference with the kernel's bf16 roundings and against onnxruntime fp32."""

import math

import ml_dtypes
import numpy as np
import pytest
from helpers import make_model, ort_run, rand, target_cpu_flags
from onnx import helper

import kiln

needs_bf16 = pytest.mark.skipif(
    "avx512_bf16" not in target_cpu_flags(), reason="running it needs AVX512-BF16 (host and target)"
)
K, H = 64, 128
F = np.float32
CONSTS = {"sq2": F(1.4142135381698608), "one": F(1.0), "half": F(0.5), "three": F(3.0), "c": F(0.044715)}
CONSTS |= {"s2pi": F(0.7978845608028654), "near": F(1.5)}


def _gelu_nodes(form: str) -> list:
    """a1 -> g: the TorchScript exporter's erf GELU, the dynamo exporter's, GPT-2's tanh form, or a near miss."""
    mk = helper.make_node
    if form == "relu":
        return [mk("Relu", ["a1"], ["g"])]
    if form in ("erf", "near"):
        return [
            mk("Div", ["a1", "sq2" if form == "erf" else "near"], ["d"]),
            mk("Erf", ["d"], ["e"]),
            mk("Add", ["e", "one"], ["e1"]),
            mk("Mul", ["a1", "e1"], ["g0"]),
            mk("Mul", ["g0", "half"], ["g"]),
        ]
    if form == "erf_dynamo":  # 0.5 * x first, the constant on the left
        return [
            mk("Mul", ["half", "a1"], ["h0"]),
            mk("Mul", ["a1", "sq2inv"], ["d"]),
            mk("Erf", ["d"], ["e"]),
            mk("Add", ["one", "e"], ["e1"]),
            mk("Mul", ["h0", "e1"], ["g"]),
        ]
    return [  # GPT-2's NewGELUActivation
        mk("Mul", ["a1", "half"], ["h0"]),
        mk("Pow", ["a1", "three"], ["p"]),
        mk("Mul", ["c", "p"], ["cp"]),
        mk("Add", ["a1", "cp"], ["s"]),
        mk("Mul", ["s", "s2pi"], ["s2"]),
        mk("Tanh", ["s2"], ["t"]),
        mk("Add", ["one", "t"], ["t1"]),
        mk("Mul", ["h0", "t1"], ["g"]),
    ]


def _ffn(form: str, rows: int):
    """The FFN; form gpt2_gemm: GPT-2's export, whose Gemms on [rows, K] are reshaped around the GELU (tanh)."""
    mk = helper.make_node
    if form == "gpt2_gemm":
        nodes = [mk("Reshape", ["input", "flat"], ["x2"]), mk("Gemm", ["x2", "w1", "b1"], ["m1"])]
        nodes += [mk("Reshape", ["m1", "shape3"], ["a1"]), *_gelu_nodes("tanh"), mk("Reshape", ["g", "flatH"], ["g2"])]
        nodes += [mk("Gemm", ["g2", "w2", "b2"], ["m2"]), mk("Reshape", ["m2", "shapeK"], ["a2"])]
        nodes.append(mk("Add", ["input", "a2"], ["output"]))
    else:
        nodes = [mk("MatMul", ["input", "w1"], ["m1"]), mk("Add", ["b1", "m1"], ["a1"]), *_gelu_nodes(form)]
        nodes += [mk("MatMul", ["g", "w2"], ["m2"]), mk("Add", ["m2", "b2"], ["a2"])]
        nodes.append(mk("Add", ["a2", "input"], ["output"]))
    used = {i for n in nodes for i in n.input}
    shapes = {"flat": [rows, K], "shape3": [1, rows, H], "flatH": [rows, H], "shapeK": [1, rows, K]}
    inits = {k: np.array(v, np.int64) for k, v in shapes.items() if k in used}
    inits |= {"w1": rand(K, H, seed=1) * 0.2, "b1": rand(H, seed=2), "w2": rand(H, K, seed=3) * 0.1}
    inits |= {"b2": rand(K, seed=4)}
    inits |= {k: np.array(v) for k, v in (CONSTS | {"sq2inv": F(1 / math.sqrt(2))}).items() if k in used}
    return make_model(nodes, {"input": rand(1, rows, K)}, ["output"], inits)


def _bf16(a):
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def _reference(x, form: str):
    """float64 with the kernel's roundings: x, the weights and the GELU's output in bf16."""
    a1 = _bf16(x) @ _bf16(rand(K, H, seed=1) * 0.2) + rand(H, seed=2)
    if form == "relu":
        g = np.maximum(a1, 0)
    elif form in ("tanh", "gpt2_gemm"):
        g = 0.5 * a1 * (1 + np.tanh(math.sqrt(2 / math.pi) * (a1 + 0.044715 * a1**3)))
    else:
        g = 0.5 * a1 * (1 + np.vectorize(math.erf)(a1 / (1.5 if form == "near" else math.sqrt(2))))
    return _bf16(g) @ _bf16(rand(H, K, seed=3) * 0.1) + rand(K, seed=4) + x


@needs_bf16
@pytest.mark.parametrize(
    "form, rows", [("erf", 20), ("erf_dynamo", 7), ("tanh", 37), ("near", 20), ("gpt2_gemm", 24), ("relu", 9)]
)
def test_ffn_epilogues_match_a_bf16_reference_and_onnxruntime(tmp_path, form, rows):
    m = _ffn(form, rows)
    r = kiln.compile(m, tmp_path / "m.kiln", precision="bf16")
    assert r.report["bf16_kernel_matmuls"] == 2
    # the first matmul takes its GELU and writes bf16 for the second, which adds the residual; a near miss of
    # GELU (x / 1.5) stays a TVM kernel, so only the residual is fused
    assert r.report["bf16_matmul_epilogues_fused"] == (1 if form == "near" else 2)
    x = rand(1, rows, K, seed=9)
    out = kiln.load(tmp_path / "m.kiln").run({"input": x})["output"]
    ref = _reference(x, form)
    # a GELU value within an ulp of a bf16 rounding boundary may round the other way: 1 bf16 ulp of one input
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-3 * np.abs(ref).max())
    fp32 = ort_run(m, {"input": x})[0]
    assert float((out.ravel() @ fp32.ravel()) / np.linalg.norm(out) / np.linalg.norm(fp32)) > 0.9999


def test_the_epilogue_is_in_the_kernel_not_tvm(tmp_path):
    """Structural (any host): the two matmul kernels and the graph input's cast to bf16, nothing else: no erf,
    tanh, add or cast kernel between the matmuls."""
    for form in ("erf", "tanh"):
        r = kiln.compile(_ffn(form, 20), tmp_path / f"{form}.kiln", precision="bf16", target="llvm -mcpu=znver4")
        assert r.report["bf16_matmul_epilogues_fused"] == 2
        kernels = r.manifest["buckets"][0]["kernel_info"]
        assert sorted(v["kind"] for v in kernels.values()) == ["bf16_matmul", "bf16_matmul", "injective"], kernels
        assert [v["ops"] for v in kernels.values() if v["kind"] == "injective"] == [[]]  # the input's cast
