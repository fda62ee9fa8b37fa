"""unaligned_inputs: the inputs only Kiln's C kernels read (the runtime takes them in place at any address), and
the ones it must not name: read by a TVM kernel, returned as an output, or read by a caller with TIR of its own."""

import numpy as np
import pytest
from helpers import make_model, rand, target_cpu_flags
from onnx import helper

import kiln
from kiln.runtime import artifact as art

# the fp32 matmul runs on Kiln's C kernel (whose callers this analysis names) on AVX-512 targets only; elsewhere on
# TVM's schedule, and no input is named
needs_c_matmul = pytest.mark.skipif(
    "avx512f" not in target_cpu_flags(), reason="the fp32 matmul C kernel needs AVX-512 (avx512f, host and target)"
)


def _unaligned(tmp_path, model) -> list[int]:
    kiln.compile(model, tmp_path / "m.kiln")
    return art.read_manifest(tmp_path / "m.kiln")["buckets"][0]["unaligned_inputs"]


def _linear(x: str, out: str, k: int = 64, n: int = 64, seed: int = 0) -> tuple[list, dict]:
    inits = {f"w{seed}": rand(k, n, seed=seed) * 0.1, f"b{seed}": rand(n, seed=seed + 1)}
    nodes = [
        helper.make_node("MatMul", [x, f"w{seed}"], [f"{out}_mm"]),
        helper.make_node("Add", [f"{out}_mm", f"b{seed}"], [out]),
    ]
    return nodes, inits


@needs_c_matmul
def test_an_input_only_a_matmul_reads_is_named(tmp_path):
    nodes, inits = _linear("x", "y")
    assert _unaligned(tmp_path, make_model(nodes, {"x": rand(1, 24, 64)}, ["y"], inits)) == [0]


@needs_c_matmul
def test_an_input_a_tvm_kernel_also_reads_is_not(tmp_path):
    """x feeds the matmul and a Relu (TVM's kernel); z feeds only the second matmul."""
    n1, i1 = _linear("x", "y")
    n2, i2 = _linear("z", "u", seed=5)
    nodes = n1 + n2 + [helper.make_node("Relu", ["x"], ["r"])]
    model = make_model(nodes, {"x": rand(1, 24, 64), "z": rand(1, 24, 64)}, ["y", "u", "r"], {**i1, **i2})
    assert _unaligned(tmp_path, model) == [1]


def test_an_input_returned_as_an_output_is_not(tmp_path):
    nodes, inits = _linear("x", "y")
    nodes.append(helper.make_node("Identity", ["x"], ["same"]))
    assert _unaligned(tmp_path, make_model(nodes, {"x": rand(1, 24, 64)}, ["y", "same"], inits)) == []


def test_an_input_a_reshape_kernel_reads_is_not(tmp_path):
    """At the end of Kiln's flow a Reshape is a call_tir of TVM's code (the VM build may make it a view later, but
    the analysis does not count on it)."""
    nodes, inits = _linear("x2", "y")
    nodes.insert(0, helper.make_node("Reshape", ["x", "shape"], ["x2"]))
    inits["shape"] = np.array([1, 24, 64], np.int64)
    assert _unaligned(tmp_path, make_model(nodes, {"x": rand(24, 64)}, ["y"], inits)) == []


def test_a_caller_with_tir_of_its_own_reads_buffers():
    """The walk over a C kernel's caller: a loop of call_extern passes pointers only; any buffer load is TVM's
    code (which may assume alignment), and so is a node the walk does not know."""
    import tvm

    from kiln.compiler.passes.bf16_matmul_kernel import F32, kernel_func
    from kiln.compiler.unaligned_inputs import _reads_buffers

    caller = kernel_func([1, 24, 64], 64, 64, False, kt=F32)
    assert not _reads_buffers(caller)
    src = """
@T.prim_func
def func(x: T.Buffer((64,), "float32"), y: T.Buffer((64,), "float32")):
    for i in T.parallel(64):
        y[i] = x[i]
"""
    assert _reads_buffers(tvm.script.from_source(src))


def test_a_module_without_a_relax_main_names_no_input():
    """A module the analysis does not read (no Relax `main`, or `main` a PrimFunc) names nothing: every input is
    staged, as before the analysis existed."""
    import tvm

    from kiln.compiler.passes.bf16_matmul_kernel import F32, kernel_func
    from kiln.compiler.unaligned_inputs import unaligned_inputs

    caller = kernel_func([1, 24, 64], 64, 64, False, kt=F32)
    assert unaligned_inputs(tvm.IRModule({"main": caller}), 1) == []
    assert unaligned_inputs(tvm.IRModule({"kernel": caller}), 1) == []


@needs_c_matmul
@pytest.mark.parametrize("offset", [4, 16, 32])
def test_an_unaligned_input_runs_in_place_and_matches(tmp_path, offset):
    """At any address the matmul reads the caller's array itself (nothing staged) and gives the aligned result."""
    from helpers import aligned

    nodes, inits = _linear("x", "y", k=96, n=80)
    model = make_model(nodes, {"x": rand(1, 37, 96)}, ["y"], inits)
    kiln.compile(model, tmp_path / "m.kiln")
    m = kiln.load(tmp_path / "m.kiln", num_threads=2)
    x = rand(1, 37, 96, seed=3)
    expect = x @ inits["w0"] + inits["b0"]
    xu = aligned(x, offset)
    assert xu.ctypes.data % 64 == offset
    y = m.run({"x": xu})["y"]
    assert not m._staging
    np.testing.assert_allclose(y, expect, rtol=1e-5, atol=1e-5)
    xu[...] = 0  # the output is the model's own: the caller's later writes do not reach it
    np.testing.assert_allclose(y, expect, rtol=1e-5, atol=1e-5)


def test_a_read_only_unaligned_input_is_copied(tmp_path):
    """A read-only array (np.frombuffer of a request's bytes) cannot leave over DLPack: it is staged, not refused."""
    nodes, inits = _linear("x", "y")
    kiln.compile(make_model(nodes, {"x": rand(1, 24, 64)}, ["y"], inits), tmp_path / "m.kiln")
    m = kiln.load(tmp_path / "m.kiln", num_threads=2)
    x = rand(1, 24, 64, seed=4)
    ro = np.frombuffer(x.tobytes(), np.float32).reshape(x.shape)
    assert not ro.flags.writeable
    np.testing.assert_allclose(m.run({"x": ro})["y"], x @ inits["w0"] + inits["b0"], rtol=1e-5, atol=1e-5)
    assert m._staging
