"""PackDenseWeights: a classifier's matmul (few rows, constant weights) reads its weights as one
contiguous stream per column tile; numerics against onnxruntime, and which matmuls it takes. F32MatmulKernel
(AVX-512 hosts) would take these matmuls first: disabled here (NO_C_KERNEL), so every host tests this pass."""

import numpy as np
import pytest
from helpers import make_model, ort_run, rand
from onnx import helper

import kiln

NO_C_KERNEL = ("F32MatmulKernel",)


def _classifier(rows: int, n: int):
    """Gemm (weights [N, K], transB) + bias -> Relu, on [rows, 64]."""
    nodes = [
        helper.make_node("Gemm", ["input", "w", "b"], ["g"], transB=1),
        helper.make_node("Relu", ["g"], ["output"]),
    ]
    return make_model(
        nodes, {"input": rand(rows, 64)}, ["output"], {"w": rand(n, 64, seed=1) * 0.2, "b": rand(n, seed=2)}
    )


@pytest.mark.parametrize(
    "rows, n, packed",
    # 16 rows by [64, 4096] (1 MB, past L2): the plain schedule streams its column strips from memory for
    # every row tile (ConvNeXt's last stage): packed
    [(1, 40, 1), (1, 48, 1), (8, 40, 0), (1, 36, 0), (16, 4096, 1)],
    ids=["1x40_by8", "1x48_by16", "8_rows_stay", "36_columns_stay", "16_rows_past_l2"],
)
def test_classifier_matmul_packed(tmp_path, rows, n, packed):
    m = _classifier(rows, n)
    r = kiln.compile(m, tmp_path / "m.kiln", disabled_passes=NO_C_KERNEL)
    assert r.report["dense_packed"] == packed
    ops = r.report["ops_after"]
    assert ops.get("matmul_packed", 0) == packed and ops.get("matmul", 0) == 1 - packed
    assert r.report["kernels"] == 1  # bias and ReLU fused into the (packed) matmul either way
    x = rand(rows, 64, seed=3)
    np.testing.assert_allclose(
        kiln.load(tmp_path / "m.kiln").run({"input": x})["output"], ort_run(m, {"input": x})[0], rtol=1e-5, atol=1e-5
    )


def test_disabling_the_pass_keeps_the_matmul(tmp_path):
    r = kiln.compile(_classifier(1, 40), tmp_path / "m.kiln", disabled_passes=("PackDenseWeights", *NO_C_KERNEL))
    assert r.report["dense_packed"] == 0 and r.report["ops_after"].get("matmul") == 1


@pytest.mark.parametrize("shape", [(64,), (2, 2, 64)], ids=["vector", "rows_in_two_dims"])
def test_matmul_of_any_rank_packed(tmp_path, shape):
    """MatMul of a vector, or of 4 rows spread over two leading dims, by [64, 40] weights."""
    m = make_model(
        [helper.make_node("MatMul", ["input", "w"], ["output"])],
        {"input": rand(*shape)},
        ["output"],
        {"w": rand(64, 40, seed=1)},
    )
    r = kiln.compile(m, tmp_path / "m.kiln", disabled_passes=NO_C_KERNEL)
    assert r.report["dense_packed"] == 1
    x = rand(*shape, seed=5)
    out = kiln.load(tmp_path / "m.kiln").run({"input": x})["output"]
    assert out.shape == shape[:-1] + (40,)
    np.testing.assert_allclose(out, ort_run(m, {"input": x})[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [129, 37, 8210])
def test_columns_with_no_vector_width_are_padded_once(tmp_path, n):
    # 40 rows (too many to pack) by 129/37/8210 columns (no vector width of 4 or more): the constant weights
    # are padded with zero columns at compile time and the real columns sliced after, in the same kernel;
    # the matmul schedule would otherwise copy the weights into a padded buffer on every call
    m = _classifier(40, n)
    r = kiln.compile(m, tmp_path / "m.kiln", disabled_passes=NO_C_KERNEL)
    assert r.report["dense_padded"] == 1 and r.report["dense_packed"] == 0 and r.report["kernels"] == 1
    x = rand(40, 64, seed=3)
    np.testing.assert_allclose(
        kiln.load(tmp_path / "m.kiln").run({"input": x})["output"], ort_run(m, {"input": x})[0], rtol=1e-5, atol=1e-5
    )
