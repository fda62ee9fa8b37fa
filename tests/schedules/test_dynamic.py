"""Kernels sized at run time get a default schedule (kiln/schedules/rules/dynamic.py): parallel, vectorized,
register-tiled matmuls, correct for any run-time size (tails of the row tile included). Regression
for FasterRCNN, whose box-head matmul on a run-time RoI count ran scalar and single-threaded: 13.4 s of
a 14.2 s run. The model here has the same shape of problem: NonZero picks the rows, a Gemm follows."""

import numpy as np
import pytest
import tvm
from helpers import make_model, ort_run
from onnx import helper
from tvm import relax, tirx

import kiln
from kiln.schedules.rules.apply import ApplyDefaultSchedules
from kiln.schedules.rules.dynamic import dynamic_tile

TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})  # AVX2 code: runs on any x86-64 host


def _dynamic_matmul_module(k: int, n: int, seed: int = 0):
    rows = tirx.Var("rows", "int64")
    r = np.random.default_rng(seed)
    w, b = r.standard_normal((k, n)).astype("float32"), r.standard_normal(n).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.add(relax.op.matmul(x, relax.const(w)), relax.const(b))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = bb.get()
    for p in (relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern()):
        mod = p(mod)
    return relax.transform.FuseTIR()(relax.transform.FuseOps()(mod)), w, b


def test_a_run_time_sized_matmul_is_scheduled_and_correct_for_every_size():
    mod, w, b = _dynamic_matmul_module(96, 48)
    p = ApplyDefaultSchedules(TARGET, 8)
    with TARGET:
        scheduled = p(mod)
    assert p.stats == {"kernels_scheduled": 1, "kernels_unscheduled": 0}
    assert p.by_kind == {"dynamic": 1}
    (kernel,) = [f for f in scheduled.functions.values() if isinstance(f, tirx.PrimFunc)]
    text = kernel.script()
    assert "T.parallel(" in text and "T.vectorized(T.int64(8))" in text and "_local" in text
    vm = relax.VirtualMachine(tvm.compile(scheduled, target=TARGET), tvm.cpu())
    for rows in (1, 7, 8, 9, 61):  # below, at and past the 8-row tile
        x = np.random.default_rng(rows).standard_normal((rows, 96)).astype("float32")
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_allclose(got, np.maximum(x @ w + b, 0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("seed,n", [(0, 64), (1, 64), (2, 91), (3, 1024)])  # 91: FasterRCNN's classes (padded)
def test_rows_picked_at_run_time_then_gemm_match_onnxruntime(tmp_path, seed, n):
    r = np.random.default_rng(seed)
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["m"], axes=[1], keepdims=0),
        helper.make_node("Greater", ["m", "t"], ["keep"]),
        helper.make_node("NonZero", ["keep"], ["idx2"]),
        helper.make_node("Squeeze", ["idx2", "ax0"], ["idx"]),
        helper.make_node("Gather", ["x", "idx"], ["picked"], axis=0),
        helper.make_node("Gemm", ["picked", "w", "b"], ["g"], transB=1),
        helper.make_node("Relu", ["g"], ["y"]),
    ]
    inits = {
        "t": np.array(2.6, "float32"),  # the median max of 128 normals: about half the rows
        "ax0": np.array([0], "int64"),
        "w": r.standard_normal((n, 128)).astype("float32"),
        "b": r.standard_normal(n).astype("float32"),
    }
    x = r.standard_normal((50, 128)).astype("float32")
    m = make_model(nodes, {"x": x}, ["y"], inits)
    res = kiln.compile(m, tmp_path / "m.kiln")
    assert res.report["kernels_unscheduled"] <= 1  # at most NonZero's own; the Gemm on picked rows is scheduled
    assert res.report["dense_packed_dynamic"] == 1  # weights packed by the register tile's columns
    got = kiln.load(tmp_path / "m.kiln").run({"x": x})["y"]
    want = ort_run(m, {"x": x})[0]
    assert got.shape == want.shape and 0 < want.shape[0] < 50
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_register_tile_fits_the_register_file():
    assert dynamic_tile(64, 32) == (6, 4)  # 1024 columns on AVX-512: 24 zmm accumulators
    assert dynamic_tile(64, 16) == (6, 2)  # on AVX2: 12 ymm
    assert dynamic_tile(23, 32) == (8, 1)  # a prime count of vectors: one wide (PackDenseWeights pads to 24)
    for vectors in range(1, 70):
        for regs in (16, 32):
            r, v = dynamic_tile(vectors, regs)
            assert vectors % v == 0 and r * v + v + 1 <= regs


def test_packed_run_time_matmul_uses_the_wide_tile():
    mod, w, b = _dynamic_matmul_module(128, 1024)
    p = ApplyDefaultSchedules(tvm.target.Target({"kind": "llvm", "mcpu": "znver4"}), 16, 32)
    scheduled = p(mod)
    (kernel,) = [f for f in scheduled.functions.values() if isinstance(f, tirx.PrimFunc)]
    text = kernel.script()
    assert "T.unroll(T.int64(6))" in text and "T.unroll(T.int64(4))" in text and "T.vectorized(T.int64(16))" in text
