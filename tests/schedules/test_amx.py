"""AMX convs: int8 (schedules/rules/amx.py, compiler/legalize_amx.py) and bf16 (kernels/amx_bf16_conv.c):
the tile instructions in the code of a Sapphire Rapids build (compiled, never run, on any host), the
exact int8 result and the bf16 result against the AVX512-BF16 kernel on a host with AMX (skipped
elsewhere, naming the feature), the register blocking and weight packing, and the host target's
features taken from the CPU itself rather than from LLVM's guess of its model."""

from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import bf16_block, compiled_asm, ort_run, rand
from helpers import qdq_conv as _qdq_conv
from test_int8_isa import _qdq_matmul as _qdq_int8_matmul

import kiln
from kiln.capabilities import host_mattr
from kiln.compiler.legalize_amx import row_tasks
from kiln.runtime.hostinfo import enable_amx, missing_cpu_features
from kiln.schedules.rules.amx import blocking, pixel_rows
from kiln.target import Target

SPR = "llvm -mcpu=sapphirerapids -mtriple=x86_64-linux-gnu"
ZNVER4 = "llvm -mcpu=znver4 -mtriple=x86_64-linux-gnu"  # AVX512-BF16 and VNNI, no AMX
AMX_MISSING = missing_cpu_features(["amx-tile", "amx-int8"])
BF16_MISSING = missing_cpu_features(["amx-tile", "amx-bf16", "avx512bf16"])


def test_sapphirerapids_conv_runs_on_tiles():
    """The int8 conv kernel configures the tiles once per row task, accumulates with tdpbusd on tile
    registers, and releases them; no vpdpbusd is left in it."""
    asm, report = compiled_asm(_qdq_conv(64, 64, 3, 1, 1, 3, 64, 28)[0], SPR)
    assert report["qdq_lowered"] == 1 and report["kernels_unscheduled"] == 0
    assert re.search(r"tdpbusd\s+%tmm\d, %tmm\d, %tmm\d", asm)
    assert "ldtilecfg" in asm and "tilerelease" in asm and "tilestored" in asm
    assert "tilezero" in asm  # accumulators start from zero in the tiles, not from a zero-filled row
    assert "vpdpbusd" not in asm


def test_sapphirerapids_blocks_int8_convs_by_8_for_the_tiles():
    """24 channels (MobileNetV2's narrow stage): on AMX the int8 conv is blocked by 8 (NarrowBlockLayout) and
    runs on tiles; on Zen 4 (no AMX) it is blocked by 8 too, for VNNI on ymm registers."""
    model = _qdq_conv(96, 24, 1, 1, 0, 3, 64, 14)[0]
    asm, report = compiled_asm(model, SPR)
    assert report["convs_blocked"] == 1 and report["kernels_unscheduled"] == 0
    assert re.search(r"tdpbusd\s+%tmm\d, %tmm\d, %tmm\d", asm)
    asm, report = compiled_asm(model, ZNVER4)
    assert report["convs_blocked"] == 1 and "tdpbusd" not in asm
    assert re.search(r"vpdpbusd\s+%ymm\d+, %ymm\d+, %ymm\d+", asm)


def _qdq_matmul(xshape, n):
    return _qdq_int8_matmul(wmax=127, xshape=xshape, n=n)


def test_sapphirerapids_matmul_runs_on_tiles():
    """A matmul with a tile of rows or more runs on the tile unit too; a batch-1 row stays on VNNI."""
    asm, report = compiled_asm(_qdq_matmul((1, 50, 64), 32)[0], SPR)
    assert report["qdq_lowered"] == 1 and report["kernels_unscheduled"] == 0
    assert re.search(r"tdpbusd\s+%tmm\d, %tmm\d, %tmm\d", asm) and "vpdpbusd" not in asm
    asm, _ = compiled_asm(_qdq_matmul((4, 64), 32)[0], SPR)
    assert "tdpbusd" not in asm and "vpdpbusd" in asm


@pytest.mark.skipif(bool(AMX_MISSING), reason=f"needs AMX (this host lacks {', '.join(AMX_MISSING)})")
@pytest.mark.parametrize(
    "xshape,n",
    [
        ((1, 50, 64), 32),  # 50 rows in tiles of 16 (64, the last clamped), one row index: the epilogue fuses
        ((2, 40, 96), 48),  # rows of 2 sequences flattened by reshapes; K = 96 padded to 128; 3 channel tiles
        ((128, 256), 64),  # tasks of 32 rows: 2 x 2 blocking
    ],
)
def test_amx_matmul_is_exact_on_this_host(tmp_path, xshape, n):
    model, x, ref = _qdq_matmul(xshape, n)
    r = kiln.compile(model, tmp_path / "m.kiln", target="host")
    assert r.report["qdq_lowered"] == 1 and r.report["kernels_unscheduled"] == 0
    assert any("matmul_amx" in k for k in r.manifest["buckets"][0]["kernel_info"])
    got = kiln.load(tmp_path / "m.kiln").run({"input": x})["output"]
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-5)


def test_blocking_and_rows():
    """C + A + B tiles fit the 8 tile registers; divisors only; rows of 16 pixels, a short row whole."""
    assert blocking(4, 4) == (2, 2) and blocking(1, 6) == (1, 3) and blocking(3, 1) == (3, 1)
    assert blocking(1, 5) == (1, 1) and blocking(5, 2) == (1, 2)
    for bm, bn in (blocking(m, n) for m in range(1, 9) for n in range(1, 9)):
        assert bm * bn + bm + bn <= 8
    assert pixel_rows(56) == (64, 16) and pixel_rows(14) == (14, 14) and pixel_rows(7) == (7, 7)
    assert row_tasks(56, 56) == (1, 64, 16) and row_tasks(28, 28) == (1, 32, 16)  # a row a task
    assert row_tasks(14, 14) == (1, 14, 14) and row_tasks(1, 7) == (1, 7, 7)
    assert row_tasks(7, 7) == (7, 52, 13) and row_tasks(8, 8) == (8, 64, 16) and row_tasks(4, 4) == (4, 16, 16)


@pytest.mark.skipif(bool(AMX_MISSING), reason=f"needs AMX (this host lacks {', '.join(AMX_MISSING)})")
@pytest.mark.parametrize(
    "cin,cout,k,stride,pad,zx,hw",
    [
        (64, 64, 3, 1, 1, 3, 56),  # 2 x 2 blocking, 64 pixels a row (56 + 8 padded)
        (32, 48, 3, 1, 1, 0, 10),  # 3 channel tiles (1 x 3), K = 288 padded to 320, 10-pixel tiles
        (16, 80, 1, 1, 0, 7, 20),  # 5 channel tiles (1 x 1), 20 pixels -> 32, K = 16 padded to 64
        (32, 32, 3, 2, 1, 100, 15),  # stride 2, 8-pixel rows
        (32, 16, 3, 1, 1, 5, 9),  # one channel tile: no channel loop to tensorize
        (96, 24, 1, 1, 0, 3, 14),  # 16-channel blocks in, 8 out (NarrowBlockLayout): 24 outputs in 2 tiles
        (24, 40, 3, 1, 1, 5, 12),  # 8-channel blocks in and out, K = 216 in chunks of 8
        (64, 64, 3, 1, 1, 3, 7),  # a 7x7 map in one task's rows: 4 tiles of 13 pixels (52), 2 channel groups
        (64, 128, 1, 1, 0, 9, 7),  # the same for a pointwise conv, 4 channel groups of 2 blocks
        (96, 24, 1, 1, 0, 3, 7),  # a whole 7x7 map into 8-channel output blocks
    ],
)
def test_amx_conv_is_exact_on_this_host(tmp_path, cin, cout, k, stride, pad, zx, hw):
    model, x, ref = _qdq_conv(cin, cout, k, stride, pad, zx, wmax=127, hw=hw)
    target = Target.parse("host")
    assert target.caps.int8_path == "amx-int8"
    r = kiln.compile(model, tmp_path / "m.kiln", target=target)
    assert r.report["qdq_lowered"] == 1 and r.report["kernels_unscheduled"] == 0
    assert [k for k in r.manifest["buckets"][0]["kernel_info"] if "conv2d" in k and "amx" not in k] == []
    got = kiln.load(tmp_path / "m.kiln").run({"input": x})["output"]
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-5)


@pytest.mark.skipif(bool(AMX_MISSING), reason=f"needs AMX (this host lacks {', '.join(AMX_MISSING)})")
def test_enable_amx_is_granted_here():
    assert enable_amx() is None


def test_host_target_follows_the_cpu_flags(monkeypatch):
    """A KVM Emerald Rapids reports a model LLVM calls rocketlake: the host target adds what
    /proc/cpuinfo lists and the model lacks, and drops what the model has and the host masks."""
    import kiln.runtime.hostinfo as hi

    base = "sse4_1 sse4_2 avx avx2 fma f16c avx512f avx512cd avx512bw avx512dq avx512vl avx512_vnni avx512vbmi"
    monkeypatch.setattr(hi, "usable_cpu_flags", lambda: frozenset(f"{base} amx_tile amx_int8 amx_bf16".split()))
    assert host_mattr.__wrapped__("rocketlake", "x86_64-linux-gnu") == ("+amx-tile", "+amx-int8", "+amx-bf16")
    monkeypatch.setattr(hi, "usable_cpu_flags", lambda: frozenset(base.replace("avx512_vnni", "").split()))
    assert host_mattr.__wrapped__("rocketlake", "x86_64-linux-gnu") == ("-avx512vnni",)
    monkeypatch.setattr(hi, "usable_cpu_flags", lambda: frozenset())
    assert host_mattr.__wrapped__("rocketlake", "x86_64-linux-gnu") == ()


def test_amx_bf16_weights_follow_the_gather_order():
    """pack(amx=True): B tile row r holds inputs (2r, 2r + 1) of 16 outputs, inputs in (kh, input block, kw,
    channel) order as amx_bf16_conv.c gathers a receptive field, zero from K to K' (a multiple of 32)."""
    from kiln.compiler.passes.bf16_conv_kernel import pack, packed_shape

    w = np.random.default_rng(0).standard_normal((2, 3, 3, 3, 16, 16)).astype(np.float32)  # K = 432 -> 448
    p = pack(w, amx=True)
    assert p.shape == packed_shape(2, 3, 3, 3, True) == (2, 224, 16, 2)
    flat = p.transpose(0, 1, 3, 2).reshape(2, 448, 16)
    for ob, kh, kw, ib, c in [(0, 0, 0, 0, 0), (1, 2, 1, 2, 15), (1, 1, 2, 0, 7)]:
        np.testing.assert_array_equal(flat[ob, ((kh * 3 + ib) * 3 + kw) * 16 + c], w[ob, ib, kh, kw, c])
    assert not flat[:, 432:].any()


def test_sapphirerapids_bf16_convs_call_the_tile_kernel():
    """--precision bf16 for an AMX-BF16 target: every conv calls the AMX kernel, whose object (linked into
    the artifact) holds tdpbf16ps; an AVX512-BF16 target keeps the vdpbf16ps kernel."""
    import subprocess

    from kiln.compiler.optimize import optimize
    from kiln.compiler.options import CompileOptions
    from kiln.frontends.importer import import_onnx
    from kiln.schedules.kernels import build

    for spec, symbol in ((SPR, "kiln_amx_bf16_conv2d_nchw16c"), (ZNVER4, "kiln_bf16_conv2d_nchw16c")):
        opt = optimize(import_onnx(bf16_block(32, 8)).mod, CompileOptions.make(target=spec, precision="bf16"))
        assert opt.report["bf16_kernel_convs"] == 5 and opt.report["bf16_epilogues_fused"] == 5
        calls = re.findall(r'call_extern\("int32", "(\w+)"', opt.mod.script())
        assert len(calls) == 5 and set(calls) == {symbol}
    asm = subprocess.run(["objdump", "-d", build("amx_bf16_conv")[0]], capture_output=True, text=True).stdout
    assert re.search(r"tdpbf16ps\s+%tmm\d,%tmm\d,%tmm\d", asm) and "ldtilecfg" in asm


@pytest.mark.skipif(bool(BF16_MISSING), reason=f"needs AMX-BF16 (this host lacks {', '.join(BF16_MISSING)})")
@pytest.mark.parametrize("c, hw", [(32, 8), (48, 20), (64, 7)])
def test_amx_bf16_matches_the_vdpbf16ps_kernel_here(tmp_path, c, hw):
    """The host build (AMX tiles) against the AVX512-BF16 build of the same graph, both run here, and
    onnxruntime's float32: the same bf16 products, summed in another order."""
    m, x = bf16_block(c, hw), rand(1, c, hw, hw, seed=9)
    amx = kiln.compile(m, tmp_path / "amx.kiln", target="host", precision="bf16")
    kiln.compile(m, tmp_path / "avx.kiln", target=ZNVER4, precision="bf16")
    assert amx.report["bf16_kernel_convs"] == 5 and amx.report["winograd_convs"] == 0  # no bf16 Winograd on AMX
    got = kiln.load(tmp_path / "amx.kiln").run({"x": x})["y"]
    ref = ort_run(m, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=4e-2, atol=4e-2 * np.abs(ref).max())
    other = kiln.load(tmp_path / "avx.kiln").run({"x": x})["y"]
    np.testing.assert_allclose(got, other, rtol=1e-2, atol=1e-2 * np.abs(ref).max())


def test_kiln_tune_spends_no_trials_on_tile_kernels():
    """The AMX conv's default is a hand-written tile kernel that MetaSchedule's search space cannot match:
    it is no tuning task on a Sapphire Rapids target; the same model for Zen 4 tunes its VNNI conv."""
    from kiln.compiler import CompileOptions
    from kiln.compiler.tune import prepare
    from kiln.schedules.rules.kinds import kernel_kind
    from kiln.schedules.tuning.tuning import extract

    model = _qdq_conv(64, 64, 3, 1, 1, 3, 64, 14)[0]
    kinds = {}
    for spec in (SPR, ZNVER4):
        mod, target, _ = prepare(model, CompileOptions.make(target=spec))
        kinds[spec] = sorted(kernel_kind(t.mod["main"]) for t in extract(mod, target))
    assert "conv2d_amx" not in kinds[SPR] and "conv2d_int8" in kinds[ZNVER4]
    assert len(kinds[ZNVER4]) == len(kinds[SPR]) + 1


@pytest.mark.parametrize(
    "pixels, ob", [(49, 32), (196, 16), (3136, 4), (12, 2), (784, 8), (49, 3), (49, 128), (196, 64)]
)
def test_amx_bf16_conv_tasks_cover_the_map_once(pixels, ob):
    """The AMX conv's tasks (ranges of two pixel tiles across output rows x output-channel ranges) cover every
    (pixel, channel block) exactly once; a 7 x 7 map's 49 pixels are 4 tiles of 13 (not 7 tiles of 7), and small
    maps split their channels so there are tasks for the cores. Where the output channels outnumber the pixels
    WEIGHT_BOUND times (ResNet-50's last stage), every task covers the whole map: each weight is read once."""
    from kiln.compiler.passes.bf16_conv_kernel import AMX_TASKS, WEIGHT_BOUND, amx_pixel_rows, amx_tasks

    (loops, _), args = amx_tasks(pixels, ob)
    found = re.search(r"p_ \* (\d+) //", loops) or re.search(r"T\.parallel\((\d+)\)", loops)
    tasks = int(found.group(1))  # the tasks, in a loop of their own count or of fewer iterations (parallel_tasks)
    expr = args.replace("T.min", "min").replace(" // ", "//")
    seen = np.zeros((pixels, ob), int)
    for r in range(tasks):
        ob0, ob1, p0, n, rows = eval(expr, {"r": r, "min": min})  # the kernel's last five arguments for task r
        whole = ob * 16 >= WEIGHT_BOUND * pixels
        assert rows == amx_pixel_rows(pixels) and n == (-(-pixels // rows) * rows if whole else 2 * rows)
        seen[p0 : min(p0 + n, pixels), ob0:ob1] += 1
    assert (seen == 1).all()
    assert amx_pixel_rows(49) == 13 and amx_pixel_rows(196) == 16 and amx_pixel_rows(12) == 12
    assert tasks >= min(AMX_TASKS, -(-pixels // (2 * amx_pixel_rows(pixels))) * -(-ob // 2))


def test_the_patch_gather_copies_runs_without_index_arithmetic():
    """A 3x3 conv of 64 channels at 56x56 (ResNet's first stage): the row gather's loop over 16-byte runs is split
    into (tap, channel block) loops (rules.amx.RUNS_ATTR), so each copy's source is loop variables times strides;
    one flat loop of 36 runs divided and took remainders per copy (half the conv's time; 2.85 -> 2.19 ms for
    ResNet-18 int8 on this kernel). Structural: the scheduled TIR for Sapphire Rapids, on any host."""
    from tvm import s_tir, tirx

    from kiln.compiler import CompileOptions
    from kiln.compiler.tune import prepare
    from kiln.schedules.rules.amx import conv2d_amx
    from kiln.schedules.rules.kinds import kernel_kind

    model = _qdq_conv(64, 64, 3, 1, 1, 3, 64, 56)[0]
    mod, _, _ = prepare(model, CompileOptions.make(target=SPR))
    func = next(f for _, f in mod.functions.items() if hasattr(f, "body") and kernel_kind(f) == "conv2d_amx")
    sch = s_tir.Schedule(func)
    conv2d_amx(sch, sch.get_sblock("conv2d_amx"), 16)
    loops = [sch.get(lp) for lp in sch.get_loops(sch.get_sblock("amx_patch"))]
    assert [int(lp.extent) for lp in loops[-3:]] == [9, 4, 16], [int(lp.extent) for lp in loops]
    assert loops[-1].kind == tirx.ForKind.VECTORIZED
