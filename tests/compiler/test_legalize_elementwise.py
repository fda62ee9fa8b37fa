"""Kiln's CPU legalization of elementwise ops TVM lowers to code that does not vectorize.

Round and QuantizeLinear legalize to tirx.round (ties to even, like ONNX) and vectorize: topi's
te.nearbyint has no TVectorizable in TVM 0.27, so its loop stayed scalar and LLVM vectorized the loop
around it with gathers (ResNet-50 int8's quantize kernels at 13 GB/s). The kernel's assembly:
tests/schedules/test_rules.py::test_blocked_quantize_is_vectorized_without_gathers."""

import re

import numpy as np
from helpers import check_against_ort, compile_and_run, compiled_asm, make_model
from onnx import helper


def _ties(shape, seed=0):
    """Values with many exact .5 ties (both signs), where half-to-even and half-away differ."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-40, 40, shape) + 0.5 * rng.integers(0, 2, shape)).astype(np.float32)


def test_round_and_quantize_match_onnxruntime_on_ties(tmp_path):
    x = _ties((1, 32, 8, 16))
    nodes = [
        helper.make_node("Round", ["x"], ["r"]),
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
    ]
    m = make_model(nodes, {"x": x}, ["r", "q"], {"s": np.float32(0.5), "z": np.uint8(128)}, opset=13)
    out = check_against_ort(m, {"x": x}, tmp_path, rtol=0, atol=0)
    assert np.array_equal(out["r"], np.round(x))  # numpy rounds half to even too


def test_sigmoid_and_silu_match_onnxruntime_over_the_whole_range(tmp_path):
    """Sigmoid by fast_exp, from -100 to 100: within 1e-6 (abs + rel) of onnxruntime (whose MLAS logistic flushes to 0
    below -18), and within 1e-5 relative of the exact value everywhere (0 and 1 at the ends, no NaN)."""
    x = np.concatenate([np.linspace(-100, 100, 2001), [-1e30, 1e30, 0.0]]).astype(np.float32).reshape(1, -1)
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["silu"])]
    m = make_model(nodes, {"x": x}, ["s", "silu"], opset=13)
    out = check_against_ort(m, {"x": x}, tmp_path, rtol=1e-6, atol=1e-6)
    with np.errstate(over="ignore"):
        exact = 1 / (1 + np.exp(-x.astype(np.float64)))
    np.testing.assert_allclose(out["s"], exact, rtol=1e-5, atol=1e-30)
    np.testing.assert_allclose(out["silu"][:, :-3], (x * exact)[:, :-3], rtol=1e-5, atol=1e-30)
    assert out["s"][0, -3] == 0.0 and out["s"][0, -2] == 1.0


def test_sigmoid_calls_no_libm():
    """Structural (compiled for znver4, not run): TVM's own sigmoid became one expf call per element."""
    x = np.zeros((1, 64, 32), np.float32)
    m = make_model([helper.make_node("Sigmoid", ["x"], ["s"])], {"x": x}, ["s"], opset=13)
    asm, _ = compiled_asm(m, "llvm -mcpu=znver4")
    assert "vfmadd" in asm and "expf" not in asm


def _gelu_pow_model(x):
    """ONNX Gelu (opset 20, both approximations) and GPT-2's tanh GELU written with Pow(x, 3)."""
    nodes = [
        helper.make_node("Gelu", ["x"], ["g"]),
        helper.make_node("Gelu", ["x"], ["gt"], approximate="tanh"),
        helper.make_node("Pow", ["x", "three"], ["p3"]),
        helper.make_node("Pow", ["x", "two"], ["p2"]),
        helper.make_node("Pow", ["x", "k"], ["pk"]),  # not an integer power: TVM's own lowering (powf)
    ]
    inits = {"three": np.float32(3.0), "two": np.float32(2.0), "k": np.float32(0.3)}
    return make_model(nodes, {"x": x}, ["g", "gt", "p3", "p2", "pk"], inits, opset=20)


def test_gelu_and_integer_powers_match_onnxruntime(tmp_path):
    x = np.linspace(0, 12, 2401).astype(np.float32).reshape(1, -1)  # x ** 0.3 of a negative x is NaN
    x = np.concatenate([-x[:, ::-1], x], axis=1)
    out = check_against_ort(_gelu_pow_model(x), {"x": x}, tmp_path, rtol=1e-5, atol=2e-6)
    assert np.array_equal(out["p3"], x * x * x) and np.array_equal(out["p2"], x * x)


def test_gelu_and_integer_powers_call_no_libm():
    x = np.ones((1, 64, 32), np.float32)
    asm, _ = compiled_asm(_gelu_pow_model(x), "llvm -mcpu=znver4")
    called = set(re.findall(r"callq?\s+(\w+)", asm))
    assert "powf" in called  # x ** 0.3 keeps TVM's lowering: the check sees libm calls
    assert not {"erff", "tanhf", "expf"} & called


def _finite_model(x):
    nodes = [
        helper.make_node("IsInf", ["x"], ["inf"]),
        helper.make_node("IsInf", ["x"], ["pos"], detect_negative=0),
        helper.make_node("IsNaN", ["x"], ["nan"]),
        helper.make_node("Mul", ["x", "k"], ["y"]),
        helper.make_node("Cast", ["y"], ["i"], to=6),  # float -> int32: where(!isfinite(y), 0, y) first
    ]
    return make_model(nodes, {"x": x}, ["inf", "pos", "nan", "i"], {"k": np.float32(3.0)}, opset=13)


def test_isinf_isnan_and_float_to_int_cast_match_onnxruntime_on_specials(tmp_path):
    """onnxruntime on finite values (its Cast of inf/NaN to int is undefined behaviour), numpy on the specials."""
    finite_x = np.linspace(-1000, 1000, 64, dtype=np.float32).reshape(1, -1)
    check_against_ort(_finite_model(finite_x), {"x": finite_x}, tmp_path, rtol=0, atol=0)
    x = np.array([[0.0, -0.0, 1.5, -2.5, np.inf, -np.inf, np.nan, 3e38, -3e38, 1e-45] * 4], np.float32)
    got = compile_and_run(_finite_model(x), {"x": x}, tmp_path)
    finite = np.isfinite(x)
    np.testing.assert_array_equal(got["inf"], np.isinf(x))
    np.testing.assert_array_equal(got["pos"], np.isposinf(x))
    np.testing.assert_array_equal(got["nan"], np.isnan(x))
    assert (got["i"][~np.isfinite(x * 3)] == 0).all()  # Kiln's choice where ONNX leaves it undefined
    small = finite & (np.abs(x) < 1e9)
    np.testing.assert_array_equal(got["i"][small], (x * 3)[small].astype(np.int32))


def test_float_to_int_cast_is_vectorized():
    """Structural (znver4, not run): TVM's isfinite lowers to fabs, which its vectorizer leaves scalar, and with
    it every op fused into the Cast's kernel (ddddocr's dequantize + sigmoid epilogues at 0.5 GB/s)."""
    x = np.zeros((1, 64, 32), np.float32)
    asm, _ = compiled_asm(_finite_model(x), "llvm -mcpu=znver4")
    scalar = len(re.findall(r"\tv(?:cvttss2si|minss|maxss|mulss)\b", asm))
    assert "zmm" in asm and scalar == 0, scalar
