"""Matmuls whose row count is no multiple of a good register tile (197 tokens, primes, odd sequence lengths):
PackDenseWeights rounds the rows up to the tile and crops in the same kernel. A sweep over ragged shapes,
with the transformer epilogues (bias, GELU, residual add), checked against numpy and onnxruntime."""

import math

import numpy as np
import pytest
from helpers import make_model, ort_run, rand, target_cpu_flags
from onnx import helper

import kiln
from kiln.schedules.rules.tiles import ROUND_ROWS_GAIN, matmul_tile, rounded_rows


@pytest.mark.parametrize("registers", [16, 32])
@pytest.mark.parametrize("rows", [16, 17, 31, 50, 77, 128, 197, 257, 577, 1500, 2047])
def test_rounded_rows_gives_a_full_tile(rows, registers):
    vectors = 48  # 768 columns of 16 lanes
    rounded = rounded_rows(rows, vectors, registers)
    best = matmul_tile(None, vectors, registers)
    if rounded is None:  # a divisor of the rows tiles within ROUND_ROWS_GAIN of the best
        r, v = matmul_tile(rows, vectors, registers)
        assert rows % r == 0 and ROUND_ROWS_GAIN * r * v / (r + v) >= best[0] * best[1] / sum(best)
    else:  # a full tile as good as the best, padding no more rows than the best tile's would
        r, v = matmul_tile(rounded, vectors, registers)
        assert r * v / (r + v) == best[0] * best[1] / sum(best)
        assert rows < rounded < rows + r and rounded % r == 0 and rounded <= -(-rows // best[0]) * best[0]


def test_rounding_pads_the_fewest_rows_among_the_best_tiles():
    assert rounded_rows(31, 48, 32) == 32  # 4 x 6 zmm tiles; 6 x 4 would compute 36 rows
    assert rounded_rows(17, 48, 32) == 18  # 6 x 4; 4 x 6 would compute 20


def test_prime_rows_are_rounded_and_nice_rows_are_not():
    assert rounded_rows(197, 144, 32) == 198  # ViT-B/16's tokens: 6 x 4 zmm tiles
    assert rounded_rows(128, 144, 32) is None and rounded_rows(1500, 24, 32) is None


def _block(rows: int, k: int, n: int, epilogue: str):
    """[1, rows, k] x [k, n] + bias, then GELU (erf form, as torch exports it) or a residual add."""
    nodes = [helper.make_node("MatMul", ["input", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["y"])]
    inits = {"w": rand(k, n, seed=1) * 0.05, "b": rand(n, seed=2)}
    if epilogue == "gelu":
        nodes += [
            helper.make_node("Div", ["y", "sqrt2"], ["d"]),
            helper.make_node("Erf", ["d"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["e1"]),
            helper.make_node("Mul", ["y", "e1"], ["m"]),
            helper.make_node("Mul", ["m", "half"], ["output"]),
        ]
        inits |= {"sqrt2": np.float32(np.sqrt(2)), "one": np.float32(1), "half": np.float32(0.5)}
    else:
        nodes.append(helper.make_node("Add", ["y", "input"], ["output"]))  # k == n: the residual
    return make_model(nodes, {"input": rand(1, rows, k)}, ["output"], inits)


RAGGED = [(197, 256, 512, "gelu"), (17, 256, 256, "residual"), (257, 256, 256, "residual"), (31, 384, 1152, "gelu")]
RAGGED_IDS = ["vit_tokens", "17_rows", "257_rows", "31_rows"]


@pytest.mark.parametrize("rows, k, n, epilogue", RAGGED, ids=RAGGED_IDS)
def test_ragged_rows_match_numpy_and_onnxruntime(tmp_path, rows, k, n, epilogue):
    """TVM's schedule (the path of every target without AVX-512): rows rounded up to the tile, cropped."""
    m = _block(rows, k, n, epilogue)
    r = kiln.compile(m, tmp_path / "m.kiln", disabled_passes=("F32MatmulKernel",))
    assert r.report["dense_rows_rounded"] == 1
    _check_block(tmp_path, m, rows, k, n, epilogue, "matmul")


@pytest.mark.skipif("avx512f" not in target_cpu_flags(), reason="the fp32 matmul C kernel needs AVX-512 (avx512f)")
@pytest.mark.parametrize(
    "rows, k, n, epilogue",
    [*RAGGED, (1, 64, 48, "gelu"), (1500, 384, 1536, "gelu")],
    ids=[*RAGGED_IDS, "1_row", "whisper_ffn_up"],
)
def test_ragged_rows_on_the_fp32_kernel_match_numpy_and_onnxruntime(tmp_path, rows, k, n, epilogue):
    """AVX-512: Kiln's fp32 C kernel, the last rows on a tile of their own row count, the epilogue inside."""
    m = _block(rows, k, n, epilogue)
    r = kiln.compile(m, tmp_path / "m.kiln")
    assert r.report["f32_kernel_matmuls"] == 1 and r.report["dense_rows_rounded"] == 0
    assert r.report["bf16_matmul_epilogues_fused"] == 1
    _check_block(tmp_path, m, rows, k, n, epilogue, "f32_matmul")


def _check_block(tmp_path, m, rows, k, n, epilogue, kind):
    model = kiln.load(tmp_path / "m.kiln")
    info = model.manifest["buckets"][0]["kernel_info"]
    assert [v["kind"] for v in info.values()] == [kind]  # bias, GELU and the residual stay in the matmul's kernel
    x = rand(1, rows, k, seed=3)
    out = model.run({"input": x})["output"]
    assert out.shape == (1, rows, n)
    np.testing.assert_allclose(out, ort_run(m, {"input": x})[0], rtol=1e-4, atol=1e-4)
    y = x @ (rand(k, n, seed=1) * 0.05) + rand(n, seed=2)
    erf = np.vectorize(math.erf)
    expected = y + x if epilogue == "residual" else 0.5 * y * (1 + erf(y / np.sqrt(2)))
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_tiled_rows_are_left_alone(tmp_path):
    r = kiln.compile(_block(128, 256, 256, "residual"), tmp_path / "m.kiln", disabled_passes=("F32MatmulKernel",))
    assert r.report["dense_rows_rounded"] == 0


def _attention(seq: int, heads: int, dim: int):
    """softmax(Q K^T * scale) V over [1, heads, seq, dim], as the exporters write it (a Transpose of K)."""
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["ss"]),
        helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["output"]),
    ]
    feeds = {n: rand(1, heads, seq, dim, seed=i) for i, n in enumerate("qkv")}
    return make_model(nodes, feeds, ["output"], {"scale": np.float32(dim**-0.5)}), feeds


@pytest.mark.parametrize("seq", [197, 31, 77])
def test_attention_matmuls_of_prime_sizes_are_padded_to_full_tiles(tmp_path, seq):
    from kiln.schedules.rules.tiles import padded_tile

    rows, vectors, r, v = padded_tile(seq, -(-seq // 16), 32)
    assert r * v > 1 and (rows, vectors) != (seq, seq // 16)  # Q K^T: the scores tile badly unpadded
    m, feeds = _attention(seq, 4, 64)
    kiln.compile(m, tmp_path / "m.kiln", disabled_passes=("FuseAttention",))  # the matmuls as matmul_tiled has them
    model = kiln.load(tmp_path / "m.kiln")
    kinds = sorted(v["kind"] for v in model.manifest["buckets"][0]["kernel_info"].values())
    assert kinds.count("matmul") == 2
    np.testing.assert_allclose(model.run(feeds)["output"], ort_run(m, feeds)[0], rtol=1e-4, atol=1e-5)


def test_padded_attention_matmul_has_a_full_unpredicated_tile():
    """The scores' matmul (197 x 197 per head) gets a register tile of r x v vectors with no predicate in its
    update (padded rows and columns), where unpadded it had 1 x 1."""
    import kiln.compiler.build as build
    from kiln.compiler.flows import run_flow
    from kiln.compiler.options import CompileOptions
    from kiln.schedules.rules.tiles import padded_tile

    m, _ = _attention(197, 2, 64)
    opts = CompileOptions.make(target="llvm -mcpu=znver4", disabled_passes=("FuseAttention",))
    imported = build._import(m, opts.bucket_shapes()[0], opts, "test", "unused.kiln")
    mod = run_flow(imported, opts, "NCHWc", "test").mod
    _, _, r, v = padded_tile(197, 13, 32)
    scores = [f.script() for gv, f in mod.functions.items() if "multiply" in gv.name_hint and "matmul" in gv.name_hint]
    assert len(scores) == 1
    update = scores[0].split('T.sblock("matmul_update")')[1].split("T.sblock(")[0]
    assert "T.where" not in update
    assert f"T.unroll(T.int64({r}))" in scores[0] and f"T.unroll(T.int64({v}))" in scores[0]


@pytest.mark.parametrize("rows", [197, 17])
def test_int8_matmul_rows_rounded_match_onnxruntime_dynamic_quantization(tmp_path, rows):
    """onnxruntime's quantize_dynamic of [1, rows, 256] x [256, 512]: the int8 kernel over rows rounded up to
    its register tile (int8.rounded_rows), cropped, equal to onnxruntime's own int8 result."""
    from helpers import quantize_dynamic

    from kiln.schedules.rules.int8 import KERNELS, rounded_rows

    assert rounded_rows(rows, 512 // 16, KERNELS["avx512-vnni"].accumulators) is not None
    m = make_model(
        [helper.make_node("MatMul", ["input", "w"], ["output"])],
        {"input": rand(1, rows, 256)},
        ["output"],
        {"w": rand(256, 512, seed=1) * 0.05},
    )
    q = quantize_dynamic(m, tmp_path)
    kiln.compile(q, tmp_path / "q.kiln")
    x = rand(1, rows, 256, seed=4)
    out = kiln.load(tmp_path / "q.kiln").run({"input": x})["output"]
    ref = ort_run(q, {"input": x})[0]
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4 * np.abs(ref).max())
