"""FuseAttention: softmax(Q Kᵀ * scale + mask) V as one streaming-softmax kernel. Numerics against onnxruntime
at odd sequence lengths with no mask, a padding mask (as Hugging Face builds it: finfo.min on padded keys) and
a causal mask; which chains it takes and leaves; both builds (AVX-512, AVX2) of the C kernel."""

import numpy as np
import pytest
from helpers import make_model, ort_run, rand
from onnx import helper

import kiln
from kiln.runtime.hostinfo import host_cpu_flags

NEG = np.float32(np.finfo(np.float32).min)


def _attention(
    seq: int, heads: int = 2, dim: int = 64, mask: str = "none", keys: int | None = None, scale="mul", guard=False
):
    """[1, heads, seq, dim] attention as the TorchScript exporter writes it; mask: none, padding ([1, 1, 1, keys]
    input), causal ([1, 1, seq, keys] constant) or heads ([1, heads, 1, keys] input)."""
    keys = keys or seq
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul" if scale == "mul" else "Div", ["s", "scale"], ["ss"]),
    ]
    inputs = {"q": rand(1, heads, seq, dim, seed=1), "k": rand(1, heads, keys, dim, seed=2)}
    inputs["v"] = rand(1, heads, keys, dim, seed=3)
    inits = {"scale": np.float32(dim**-0.5 if scale == "mul" else dim**0.5)}
    scores = "ss"
    if mask != "none":
        if mask == "causal":
            inits["mask"] = np.triu(np.full((1, 1, seq, keys), NEG), k=keys - seq + 1)
        else:
            shape = (1, 1, 1, keys) if mask == "padding" else (1, heads, 1, keys)
            rng = np.random.default_rng(4)
            inputs["mask"] = np.where(rng.random(shape) < 0.3, NEG, np.float32(0)).astype(np.float32)
        nodes.append(helper.make_node("Add", ["mask", "ss"] if guard else ["ss", "mask"], ["sm"]))
        scores = "sm"
    nodes.append(helper.make_node("Softmax", [scores], ["p"], axis=-1))
    if guard:  # BERT's exports: where(isnan(p), 0, p)
        inits["zero"] = np.float32(0)
        nodes += [helper.make_node("IsNaN", ["p"], ["nan"]), helper.make_node("Where", ["nan", "zero", "p"], ["pg"])]
    nodes.append(helper.make_node("MatMul", ["pg" if guard else "p", "v"], ["output"]))
    return make_model(nodes, inputs, ["output"], inits), inputs


def _check(tmp_path, model, feeds, fused: int = 1, target=None):
    kw = {"target": target} if target else {}
    r = kiln.compile(model, tmp_path / "m.kiln", **kw)
    assert r.report["attention_fused"] == fused
    out = kiln.load(tmp_path / "m.kiln").run(feeds)["output"]
    np.testing.assert_allclose(out, ort_run(model, feeds)[0], rtol=1e-4, atol=2e-5)
    return r


needs_x86 = pytest.mark.skipif(
    not {"avx2", "fma"} <= host_cpu_flags(), reason="running the attention kernel needs AVX2 and FMA (or AVX-512)"
)


@needs_x86
@pytest.mark.parametrize("mask", ["none", "padding", "causal", "heads"])
@pytest.mark.parametrize("seq", [197, 31, 5])
def test_fused_attention_matches_onnxruntime(tmp_path, seq, mask):
    model, feeds = _attention(seq, mask=mask)
    r = _check(tmp_path, model, feeds)
    assert r.report["ops_after"].get("softmax", 0) == 0


@needs_x86
@pytest.mark.parametrize("mask_shape", [(2, 1, 1, 40), (2, 3, 1, 40), (1, 3, 1, 40), (2, 1, 40, 40)])
def test_batch_of_two_with_masks_per_batch_and_head(tmp_path, mask_shape):
    """[2, 3, 40, 32]: the mask broadcasts over heads, over batch, or not at all (the kernel's mask strides)."""
    rng = np.random.default_rng(5)
    feeds = {n: rand(2, 3, 40, 32, seed=i) for i, n in enumerate("qkv")}
    feeds["mask"] = np.where(rng.random(mask_shape) < 0.3, NEG, np.float32(0)).astype(np.float32)
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Add", ["s", "mask"], ["sm"]),
        helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["output"]),
    ]
    _check(tmp_path, make_model(nodes, feeds, ["output"]), feeds)


@needs_x86
def test_nan_guarded_probabilities_and_mask_first(tmp_path):
    model, feeds = _attention(37, heads=3, dim=32, mask="padding", guard=True)
    _check(tmp_path, model, feeds)


@needs_x86
def test_cross_attention_more_keys_than_queries_and_divide_scale(tmp_path):
    model, feeds = _attention(7, heads=3, dim=32, keys=150, scale="div", mask="padding")
    _check(tmp_path, model, feeds)


@needs_x86
def test_the_avx2_build_matches_too(tmp_path):
    model, feeds = _attention(77, mask="causal")
    _check(tmp_path, model, feeds, target="llvm -mcpu=haswell")


def test_probabilities_read_elsewhere_are_not_fused(tmp_path):
    model, feeds = _attention(16)
    model.graph.output.append(helper.make_tensor_value_info("p", 1, None))  # the attention weights as an output
    r = kiln.compile(model, tmp_path / "m.kiln", target="llvm -mcpu=znver4")
    assert r.report["attention_fused"] == 0


def test_value_width_not_a_vector_multiple_is_left_alone(tmp_path):
    model, feeds = _attention(16, dim=20)  # DV 20: no whole vectors
    r = kiln.compile(model, tmp_path / "m.kiln", target="llvm -mcpu=znver4")
    assert r.report["attention_fused"] == 0


@pytest.mark.parametrize(
    "target, isa",
    [
        ("llvm -mcpu=znver4", "avx512"),
        ("llvm -mcpu=haswell", "avx2"),
        ("llvm -mcpu=sandybridge", None),  # AVX without FMA
        ("llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1", None),
    ],
)
def test_kernel_build_per_target(target, isa):
    from kiln.compiler.passes.fuse_attention import kernel_isa
    from kiln.target import Target

    assert kernel_isa(Target.parse(target).caps) == isa


@needs_x86
@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_key_block_agrees_with_the_c_build(isa):
    import ctypes

    from kiln.compiler.passes.fuse_attention import KERNELS
    from kiln.schedules.kernels import build

    function, source, _, kb = KERNELS[isa]
    if isa == "avx512" and "avx512f" not in host_cpu_flags():
        pytest.skip("loading the AVX-512 build needs AVX-512F")
    _, so = build(source)
    assert getattr(ctypes.CDLL(so), f"{function}_key_block")() == kb


@needs_x86
def test_rank_three_heads_folded_into_batch(tmp_path):
    feeds = {n: rand(6, 50, 64, seed=i) for i, n in enumerate("qkv")}
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["output"]),
    ]
    _check(tmp_path, make_model(nodes, feeds, ["output"]), feeds)
