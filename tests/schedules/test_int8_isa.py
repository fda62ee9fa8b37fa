"""int8 kernels per instruction set (schedules/rules/int8.py): the kernel each pinned target gets, the
instruction in the generated assembly of its int8 conv and matmul (compiled, never run), and the
AVX2 kernel's numerics on this host (AVX2 code runs on any AVX2 or AVX-512 x86-64 CPU)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import compiled_asm, make_model, ort_run, rand
from helpers import qdq_conv as _qdq_conv
from onnx import helper

import kiln
from kiln.compiler.hostrun import missing_on_host
from kiln.errors import KilnWarning
from kiln.schedules.rules.int8 import int8_kernel, pairs_may_saturate
from kiln.target import Target

X86 = "-mtriple=x86_64-linux-gnu"
HASWELL = f"llvm -mcpu=haswell {X86}"
# target: (caps.int8_path, kernel lanes, data shifted to int8), None where int8 layers stay float
KERNELS = {
    HASWELL: ("avx2-pmaddubsw", 8, False),
    f"llvm -mcpu=alderlake {X86}": ("avx-vnni", 8, False),
    f"llvm -mcpu=skylake-avx512 {X86}": ("avx512-pmaddubsw", 16, False),
    f"llvm -mcpu=znver4 {X86}": ("avx512-vnni", 16, False),
    f"llvm -mcpu=sapphirerapids {X86}": ("amx-int8", 16, False),
    "rpi5": ("dotprod", 4, True),
    "graviton3": ("i8mm", 4, False),
    "rpi4": None,
    f"llvm -mcpu=x86-64 {X86}": None,
}
# target: what its int8 kernels' assembly must hold (AT&T syntax on x86)
ASM = {
    HASWELL: r"vpmaddubsw\s+%ymm\d+, %ymm\d+, %ymm\d+",
    f"llvm -mcpu=alderlake {X86}": r"\{vex\}\s+vpdpbusd\s+%ymm\d+, %ymm\d+, %ymm\d+",  # VEX: AVX-VNNI, no AVX-512
    f"llvm -mcpu=skylake-avx512 {X86}": r"vpmaddubsw\s+%zmm\d+, %zmm\d+, %zmm\d+",
    f"llvm -mcpu=znver4 {X86}": r"vpdpbusd\s+%zmm\d+, %zmm\d+, %zmm\d+",
    "rpi5": r"sdot\s+v\d+\.4s, v\d+\.16b, v\d+\.16b",
    "graviton3": r"usdot\s+v\d+\.4s, v\d+\.16b, v\d+\.16b",
}


@pytest.mark.parametrize("spec", list(KERNELS))
def test_int8_kernel_follows_the_target(spec):
    caps = Target.parse(spec).caps
    k = int8_kernel(caps)
    assert (None if k is None else (k.path, k.lanes, k.signed_data)) == KERNELS[spec]
    if k is not None:
        assert k.lanes == caps.lanes("int32") == caps.f32_block  # one int32 accumulator register per block
        assert k.weight_max == (64 if "pmaddubsw" in k.path else 127)


def _weights(rng, shape, wmax):
    return rng.integers(-wmax, wmax + 1, shape).astype(np.int8)


def _qdq_matmul(wmax=64, zx=128, xshape=(4, 64), n=32):
    rng = np.random.default_rng(3)
    wq = _weights(rng, (xshape[-1], n), wmax)
    sw, sx = np.float32(0.004), np.float32(0.03)
    nodes = [
        helper.make_node("QuantizeLinear", ["input", "sx", "zx"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xf"]),
        helper.make_node("DequantizeLinear", ["wq", "sw"], ["wf"]),
        helper.make_node("MatMul", ["xf", "wf"], ["output"]),
    ]
    x = rand(*xshape, seed=4)
    model = make_model(nodes, {"input": x}, ["output"], {"sx": sx, "zx": np.uint8(zx), "wq": wq, "sw": sw})
    xq = np.clip(np.round(x / sx) + zx, 0, 255).astype(np.int64) - zx
    return model, x, (xq @ wq.astype(np.int64)) * np.float64(sx) * np.float64(sw)


@pytest.mark.parametrize("op", ["conv2d", "matmul"])
@pytest.mark.parametrize("spec", list(ASM))
def test_int8_assembly_holds_the_isa_instruction(spec, op):
    """Compiled for the target (not run): the int8 kernel is tensorized with the target's instruction."""
    model = _qdq_conv()[0] if op == "conv2d" else _qdq_matmul()[0]
    asm, report = compiled_asm(model, spec)
    assert report["qdq_lowered"] == 1 and report["kernels_unscheduled"] == 0
    assert re.search(ASM[spec], asm), f"{spec}: no {ASM[spec]!r} in the {op} kernel"
    if "alderlake" in spec:
        assert "zmm" not in asm  # no AVX-512 on this target


def test_saturation_rule():
    """vpmaddubsw sums two u8*s8 products into int16: |w| <= 64 never saturates; 65 + 64 can."""
    w = np.full((4, 8), 64, np.int8)
    assert not pairs_may_saturate(w, 1) and not pairs_may_saturate(-w, 1)
    w[1, 2] = 65
    assert pairs_may_saturate(w, 1)
    assert not pairs_may_saturate(np.array([[127, -127]], np.int8), 1)  # opposite signs cannot overflow


def test_register_tile():
    """Pixels x channel blocks: as many accumulators as the kernel allows, the squarer tile on ties,
    divisors only (tensorize takes no tails); a batch-1 matmul row gets several column blocks."""
    from kiln.schedules.rules.int8 import register_tile

    assert register_tile(56, 4, 8) == (4, 2) and register_tile(7, 4, 8) == (7, 1) and register_tile(14, 8, 8) == (2, 4)
    assert register_tile(1, 64, 16) == (1, 16) and register_tile(56, 1, 16) == (14, 1)


def test_int8_pays_where_multiply_adds_outweigh_the_quantize_pass():
    """cost.estimates: a 3x3 conv and a batch-1 classifier (weights 4x smaller) pay on every kernel;
    a 1x1 projection to few channels (MobileNetV2's 144->24) does not, where the input's quantize
    pass costs more than the multiply-adds int8 saves."""
    from kiln.compiler.quantize.cost import estimates
    from kiln.schedules.rules.int8 import KERNELS

    def conv(cin, cout, k, hw):
        return cout * hw * hw * cin * k * k, cin * hw * hw, cout * cin * k * k

    for path in ("avx512-vnni", "avx2-pmaddubsw", "dotprod"):
        kernel = KERNELS[path]
        for cost, pays in (
            (conv(64, 64, 3, 56), True),
            ((2048 * 1000, 2048, 2048 * 1000), True),
            (conv(144, 24, 1, 56), False),
            (conv(256, 64, 1, 56), True),
        ):
            fp32, int8 = estimates(cost, kernel)
            assert (int8 < fp32) == pays, (path, cost)


def _run_on_host(spec, tmp_path, model, x):
    if missing_on_host(Target.parse(spec)):
        pytest.skip(f"this host cannot run {spec} code ({', '.join(missing_on_host(Target.parse(spec)))})")
    r = kiln.compile(model, tmp_path / "m.kiln", target=spec)
    return r, kiln.load(tmp_path / "m.kiln").run({"input": x})["output"]


@pytest.mark.parametrize(
    "cin,cout,k,stride,pad,zx",
    [(32, 48, 3, 1, 1, 0), (32, 32, 3, 2, 1, 100), (16, 64, 1, 1, 0, 7)],
)
def test_avx2_int8_conv_is_exact(tmp_path, cin, cout, k, stride, pad, zx):
    """The haswell build's vpmaddubsw conv, run here, equals the integer reference: 7-bit weights
    (|w| <= 64) never saturate, so the only difference from VNNI is none at all."""
    model, x, ref = _qdq_conv(cin, cout, k, stride, pad, zx)
    r, got = _run_on_host(HASWELL, tmp_path, model, x)
    assert r.report["qdq_lowered"] == 1
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-5)


# the int8 convs whose channels the kernel's block does not divide: a 3-channel stem (padded to 4 input
# channels), 24 outputs (3 blocks of 8: the ymm sibling on AVX-512), 24 inputs (NCHW8c data)
NARROW_CONVS = [(3, 32, 3, 2, 1, 100), (3, 16, 7, 2, 3, 7), (96, 24, 1, 1, 0, 0), (24, 48, 3, 1, 1, 5)]


@pytest.mark.parametrize("spec", [HASWELL, "llvm"])
@pytest.mark.parametrize("cin,cout,k,stride,pad,zx", NARROW_CONVS)
def test_narrow_int8_convs_are_blocked_and_exact(tmp_path, spec, cin, cout, k, stride, pad, zx):
    """Built for haswell and for this host, run here: the conv runs blocked for the int8 kernel (ConvertLayout or
    NarrowBlockLayout; TVM's generic int8 NCHW conv ran at a third of its speed), and equals the integer reference."""
    model, x, ref = _qdq_conv(cin, cout, k, stride, pad, zx, hw=14)
    r, got = _run_on_host(spec, tmp_path, model, x)
    assert r.report["qdq_lowered"] == 1 and "NCHW" not in r.report["conv_layouts"], r.report["conv_layouts"]
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-5)


@pytest.mark.parametrize("cin,cout,k,stride,pad,zx", NARROW_CONVS[:2])
def test_int8_stems_are_blocked_on_amx_targets_too(tmp_path, cin, cout, k, stride, pad, zx):
    """Compiled for sapphirerapids (not run): a 3-channel int8 stem is blocked (NCHW4c) for the int8 kernels, not
    left to TVM's generic NCHW int8 conv (AMX hosts' make test ran them generic: NarrowBlockLayout skipped stems
    for AMX, whose tile conv takes any channel blocks but a stem's)."""
    model, _, _ = _qdq_conv(cin, cout, k, stride, pad, zx, hw=14)
    r = kiln.compile(model, tmp_path / "m.kiln", target=f"llvm -mcpu=sapphirerapids {X86}")
    assert r.report["qdq_lowered"] == 1 and "NCHW" not in r.report["conv_layouts"], r.report["conv_layouts"]
    kinds = {v["kind"] for v in r.manifest["buckets"][0]["kernel_info"].values()}
    assert kinds & {"conv2d_int8", "conv2d_amx"}, kinds


def test_avx512_runs_8_channel_int8_blocks_on_ymm():
    """Compiled for znver4 (not run): a 24-channel int8 conv takes vpdpbusd on ymm, the 16-lane kernel's
    half-width sibling (NarrowBlockLayout), and a 3-channel stride-2 stem the zmm kernel on its 2x2 space-to-depth
    blocks of 16 channels (SpaceToDepthStem)."""
    for model, reg, blocked, stems in (
        (_qdq_conv(48, 24, 1, 1, 0)[0], "ymm", 1, 0),
        (_qdq_conv(3, 32, 3, 2, 1)[0], "zmm", 0, 1),
    ):
        asm, report = compiled_asm(model, f"llvm -mcpu=znver4 {X86}")
        assert report["convs_blocked"] == blocked and report["kernels_unscheduled"] == 0
        assert report.get("space_to_depth_stems", 0) == stems
        assert re.search(rf"vpdpbusd\s+%{reg}\d+, %{reg}\d+, %{reg}\d+", asm)


def test_avx2_int8_matmul_is_exact(tmp_path):
    model, x, ref = _qdq_matmul()
    r, got = _run_on_host(HASWELL, tmp_path, model, x)
    assert r.report["qdq_lowered"] == 1
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-5)


@pytest.mark.parametrize("spec", [HASWELL, "llvm"])
def test_int8_matmul_over_unit_row_axis_is_exact(tmp_path, spec):
    """[T, 1, K] rows (a CTC head's frames; the schedule fuses the unit axis into the rows for its register
    tile) x 8210 columns (ddddocr's classes, padded to 8256 = 4 x 129 x 16 and sliced back, the slice's
    epilogue vectorized apart), built for haswell and this host, run here: the integer reference."""
    from kiln.compiler.quantize.rewrite import padded_columns

    assert [padded_columns(n) for n in (8210, 1000, 24, 64)] == [8256, 1008, 32, 64]
    model, x, ref = _qdq_matmul(xshape=(6, 1, 64), n=8210)
    r, got = _run_on_host(spec, tmp_path, model, x)
    assert r.report["qdq_lowered"] == 1 and r.report["kernels_unscheduled"] == 0
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-5)


def test_avx2_keeps_saturating_qdq_weights_float(tmp_path):
    """8-bit QDQ weights that could saturate vpmaddubsw stay a float layer on AVX2 (exact to float
    rounding) instead of an int8 layer that would be wrong (or, done exactly, no faster)."""
    model, x, ref = _qdq_conv(wmax=127)
    r, got = _run_on_host(HASWELL, tmp_path, model, x)
    assert (r.report["qdq_lowered"], r.report["qdq_kept_float"]) == (0, 1)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def _calib_cnn(tmp_path):
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
    inits["fc"] = (rng.standard_normal((32, 16)) * 0.5).astype(np.float32)
    nodes += [
        helper.make_node("GlobalAveragePool", [x], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["output"], name="fc"),
    ]
    model = make_model(nodes, {"input": rand(1, 3, 16, 16)}, ["output"], inits)
    data = np.random.default_rng(2).standard_normal((12, 3, 16, 16)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", input=data)
    return model, tmp_path / "calib.npz", data


def test_quantizer_uses_7bit_weights_for_avx2(tmp_path):
    """--quantize int8 for haswell: the int8 layers' weights are in [-64, 64] (docs/int8-kernels.md),
    the report names the kernel and predicts a gain, and the build runs here close to float."""
    model, calib, data = _calib_cnn(tmp_path)
    r = kiln.compile(model, tmp_path / "q.kiln", target=HASWELL, quantize="int8", calibration=calib)
    q = r.report["quantization"]
    assert q["int8_layers"] == ["conv1", "conv2", "fc"] and "3->16" in q["float_layers"]["conv0"]
    speed = q["speed"]
    assert speed["int8_kernel"] == "avx2-pmaddubsw" and speed["predicted_ratio"] < 1 and "7-bit" in speed["note"]
    assert "warning" not in speed
    from kiln.runtime import artifact as art

    manifest, members = art.read_artifact(tmp_path / "q.kiln")
    weights = art.unpack_weights(members[art.WEIGHTS], manifest["weights"], "test")
    int8 = [w for w in weights if w.dtype == np.int8]
    assert len(int8) == 3 and max(int(np.abs(w.astype(np.int32)).max()) for w in int8) == 64
    if not missing_on_host(Target.parse(HASWELL)):
        got = kiln.load(tmp_path / "q.kiln").run({"input": data[-1:]})["output"]
        ref = ort_run(model, {"input": data[-1:]})[0]
        assert np.abs(got - ref).max() < 0.05 * np.abs(ref).max()


def test_int8_without_a_fast_kernel_stays_float_and_warns(tmp_path):
    """rpi4 (Cortex-A72: NEON without dotprod): no int8 kernel beats float32 there, so every layer
    stays float, says why, and the build warns with both estimates."""
    model, calib, _ = _calib_cnn(tmp_path)
    with pytest.warns(KilnWarning, match="predicted no faster than float32") as w:
        r = kiln.compile(model, tmp_path / "q.kiln", target="rpi4", quantize="int8", calibration=calib)
    q = r.report["quantization"]
    assert q["int8_layers"] == [] and "no dotprod" in q["float_layers"]["conv1"]
    assert q["speed"]["predicted_ratio"] == 1.0 and "estimates: int8" in str(w[0].message)
