"""The reduced-precision instructions in the code of pinned targets, compiled on any host and never run: bf16
matmuls on vdpbf16ps (znver4) and bfmmla (graviton3), and what an fp16 build computes in on AVX512-FP16
(sapphirerapids: float32) and arm64 fp16 (fullfp16: fmla .8h on Kiln's kernel) -- with the per-layer precision
report saying the same."""

from __future__ import annotations

import re
import subprocess

import pytest
from helpers import make_model, rand
from onnx import helper

from kiln.capabilities import capabilities
from kiln.target import Target

ZNVER4 = "llvm -mcpu=znver4 -mtriple=x86_64-linux-gnu"
SPR = "llvm -mcpu=sapphirerapids -mtriple=x86_64-linux-gnu"
GRAVITON3 = "graviton3"


def _dense(rows=32, k=64, n=64):
    nodes = [helper.make_node("MatMul", ["input", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["output"])]
    return make_model(nodes, {"input": rand(1, rows, k)}, ["output"], {"w": rand(k, n, seed=1), "b": rand(n, seed=2)})


def _build(model, spec: str, precision: str):
    """(TVM kernels' assembly, compile report, {kernel kind: (precision, unit)}) of a build for `spec`."""
    from kiln.compiler.executable import build_executable
    from kiln.compiler.kernel_info import for_manifest
    from kiln.compiler.optimize import optimize
    from kiln.compiler.options import CompileOptions
    from kiln.frontends.importer import import_onnx

    opts = CompileOptions.make(target=spec, precision=precision)
    opt = optimize(import_onnx(model).mod, opts)
    asm = "".join(m.inspect_source("asm") for m in build_executable(opt.mod, opts, "test").mod.imports)
    info = for_manifest(opt.mod, None, precision, capabilities(Target.parse(spec)))
    return asm, opt.report, {v["kind"]: (v["precision"], v["unit"]) for v in info.values() if v["kind"]}


def _objdump(obj: str, tool: str = "objdump") -> str:
    return subprocess.run([tool, "-d", obj], capture_output=True, text=True, check=True).stdout


def _kernel_code(name: str, arch: str) -> str:
    """The disassembly of Kiln's C kernel `name` built for `arch` (skipped, naming the tool, where this host lacks
    that arch's C compiler or objdump)."""
    import shutil

    from kiln.errors import CompileError
    from kiln.runtime.hostinfo import host_arch
    from kiln.schedules.kernels import build, compiler

    tool = "objdump" if arch == host_arch() else f"{arch}-linux-gnu-objdump"
    try:
        compiler(name, arch)
    except CompileError as e:
        pytest.skip(str(e))
    if shutil.which(tool) is None:
        pytest.skip(f"reading the {arch} kernel's object needs {tool}")
    return _objdump(build(name, arch)[0], tool)


def test_znver4_bf16_matmul_calls_the_vdpbf16ps_kernel():
    """A bf16 build for Zen 4 calls Kiln's matmul kernel, whose object (the one linked into the artifact) is
    vdpbf16ps; the report names that unit."""
    asm, report, units = _build(_dense(), ZNVER4, "bf16")
    assert report["bf16_kernel_matmuls"] == 1 and "kiln_bf16_matmul" in asm
    assert units["bf16_matmul"] == ("bf16", "avx512-bf16 vdpbf16ps")
    assert _kernel_code("bf16_matmul", "x86_64").count("vdpbf16ps") >= 10


def test_sapphirerapids_fp16_matmul_computes_in_fp32():
    """AVX512-FP16 has fp16 FMAs (TVM's LLVM code generator emits vfmadd...ph for a matmul that sums in fp16),
    but Kiln's fp16 matmul accumulates in float32 (as onnxruntime's does), so TVM widens the fp16 operands
    (vcvtph2ps) and multiply-adds in float32: no ph FMA, and the report says fp16 is storage there."""
    asm, report, units = _build(_dense(), SPR, "fp16")
    assert report["mixed_precision_ops"] == 1
    assert not re.search(r"\bvfn?m(add|sub)\w*ph\b", asm)
    assert "vcvtph2ps" in asm and re.search(r"\bvfmadd\w*ps\s+%zmm", asm)
    assert units["matmul"] == ("fp32", "fp32 FMA avx512 (float16 stored, converted)")


def test_arm64_fp16_matmul_runs_on_fp16_fmla():
    """An fp16 build for arm64 with fullfp16 (Graviton3, and the Raspberry Pi 5's Cortex-A76) calls Kiln's fp16
    matmul kernel, whose object multiply-adds by fmla .8h (fp16 partial sums, float32 totals); a matmul of two
    activations, which no kernel takes, stays float32 (fmla .4s), and the report says both."""
    for spec in (GRAVITON3, "rpi5"):
        assert Target.parse(spec).caps.native_fp16
        asm, report, units = _build(_dense(), spec, "fp16")
        assert report["fp16_kernel_matmuls"] == 1 and "kiln_fp16_matmul" in asm
        assert units["fp16_matmul"] == ("fp16", "arm-fp16 fmla .8h")
    asm, report, units = _build(_activation_matmul(), GRAVITON3, "fp16")
    assert report["fp16_kernel_matmuls"] == 0 and report["mixed_precision_kept"] == 1
    assert not re.search(r"\bfmla\s+v\d+\.8h", asm) and re.search(r"\bfmla\s+v\d+\.4s", asm)
    assert units["matmul"] == ("fp32", "fp32 fmla neon")
    code = _kernel_code("fp16_matmul", "aarch64")
    assert len(re.findall(r"\bfmla\s+v\d+\.8h, v\d+\.8h, v\d+\.(8h|h\[\d\])", code)) >= 64


def _activation_matmul():
    """x @ x^T: both operands activations."""
    mk = helper.make_node
    nodes = [mk("Transpose", ["input"], ["t"], perm=[0, 2, 1]), mk("MatMul", ["input", "t"], ["output"])]
    return make_model(nodes, {"input": rand(1, 32, 64)}, ["output"], {})


@pytest.mark.parametrize("spec", [SPR, GRAVITON3])
def test_fp16_sums_in_fp16_emit_fp16_fmas(spec):
    """What the two tests above rule out is TVM's choice of accumulator, not its code generator: a float16
    matmul that sums in float16 is vfmadd...ph on Sapphire Rapids and fmla .8h on Graviton3."""
    import tvm
    from tvm import te

    a, b = te.placeholder((64, 64), "float16", name="a"), te.placeholder((64, 64), "float16", name="b")
    k = te.reduce_axis((0, 64), "k")
    c = te.compute((64, 64), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b, c]))
    i, j, kk = sch.get_loops(sch.get_sblock("c"))
    jo, ji = sch.split(j, [None, 32])
    sch.reorder(i, jo, kk, ji)
    sch.vectorize(ji)
    asm = tvm.compile(sch.mod, target=Target.parse(spec).tvm()).mod.inspect_source("asm")
    pattern = r"\bvfn?madd\w*ph\b" if spec == SPR else r"\bfmla\s+v\d+\.8h"
    assert re.search(pattern, asm)


def test_graviton3_bf16_matmul_calls_the_bfmmla_kernel():
    """A bf16 build for Graviton3 (Arm BF16) calls the same kernel symbol, whose arm64 object is bfmmla, with the
    GELU and the bf16 cast for the next matmul in its epilogue; the report names the unit."""
    asm, report, units = _build(_mlp(), GRAVITON3, "bf16")
    assert report["bf16_kernel_matmuls"] == 2 and report["bf16_matmul_epilogues_fused"] == 1
    assert "kiln_bf16_matmul" in asm
    assert units["bf16_matmul"] == ("bf16", "arm-bf16 bfmmla")
    code = _kernel_code("bf16_matmul", "aarch64")
    assert len(re.findall(r"\bbfmmla\s+v\d+\.4s, v\d+\.8h, v\d+\.8h", code)) >= 16 and "bfcvtn" in code


def _mlp(rows=17, k=64, h=128, n=64):
    """matmul, bias, GELU (erf), matmul, bias."""
    mk = helper.make_node
    nodes = [mk("MatMul", ["input", "w1"], ["m1"]), mk("Add", ["m1", "b1"], ["a1"]), mk("Gelu", ["a1"], ["g"])]
    nodes += [mk("MatMul", ["g", "w2"], ["m2"]), mk("Add", ["m2", "b2"], ["output"])]
    inits = {"w1": rand(k, h, seed=1) * 0.2, "b1": rand(h, seed=2), "w2": rand(h, n, seed=3) * 0.1}
    return make_model(nodes, {"input": rand(1, rows, k)}, ["output"], inits | {"b2": rand(n, seed=4)})
