"""`kiln profile` / `kiln bench --profile`: every kernel with its source ONNX nodes, time, roofline
and schedule; the kernels' times add up to the measured latency; --plot fails before any run
without matplotlib."""

import json
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.cli import main
from kiln.compiler.kernel_info import source_ops
from kiln.runtime import profile as prof
from kiln.runtime.profile import MULTIPLY_ADD, ProfileOptions, format_profile, profile, summarize
from kiln.schedules.rules.kinds import KINDS


def _rand(*shape, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * 0.2).astype(np.float32)


def small_cnn(c: int = 32, hw: int = 64) -> onnx.ModelProto:
    """conv-relu, strided conv-relu, conv + residual add + relu, global pool, flatten, fc: named nodes."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1], name="conv3"),
        helper.make_node("Add", ["c3", "r2"], ["a3"], name="residual"),
        helper.make_node("Relu", ["a3"], ["r3"], name="relu3"),
        helper.make_node("GlobalAveragePool", ["r3"], ["g"], name="pool"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1, name="fc"),
    ]
    inits = {
        "w1": _rand(c, 3, 3, 3, seed=1),
        "b1": _rand(c, seed=2),
        "w2": _rand(2 * c, c, 3, 3, seed=3),
        "b2": _rand(2 * c, seed=4),
        "w3": _rand(2 * c, 2 * c, 3, 3, seed=5),
        "b3": _rand(2 * c, seed=6),
        "wf": _rand(10, 2 * c, seed=7),
        "bf": _rand(10, seed=8),
    }
    g = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def cnn_artifact(tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "cnn.kiln"
    kiln.compile(small_cnn(), path, tuning_db="none")
    return path


def test_manifest_kernel_info(cnn_artifact):
    """Compile time records each kernel's source nodes, FLOPs, bytes and schedule."""
    from kiln.runtime.artifact import read_manifest

    info = read_manifest(cnn_artifact)["buckets"][0]["kernel_info"]
    ops = {k: v["ops"] for k, v in info.items()}
    claimed = [o for v in ops.values() for o in v]
    assert sorted(claimed) == sorted(set(claimed))  # no node in two kernels
    assert {"conv1", "conv2", "conv3", "pool", "fc"} <= set(claimed)
    conv3 = next(k for k, v in ops.items() if "conv3" in v)
    assert {"residual", "relu3"} <= set(ops[conv3])  # the fused epilogue
    for k, v in info.items():
        assert v["calls"] >= 1 and v["bytes_read"] > 0 and v["bytes_written"] > 0
        assert v["schedule"] in ("default", "none", "c-kernel")  # c-kernel: AVX-512's fp32 convs and classifier
        if any(o.startswith("conv") for o in v["ops"]):
            assert v["flops"] > 1e6, k


def test_profile_adds_up(cnn_artifact):
    """The kernels' times (median per kernel over instrumented runs) add up to within 10% of the
    median latency of the plain runs alternating with them."""
    p = profile(cnn_artifact, ProfileOptions(threads=1, warmup=5, repeat=60))
    assert abs(p["kernels_ms"] - p["latency_ms"]) <= 0.10 * p["latency_ms"], (p["kernels_ms"], p["latency_ms"])
    rows = p["kernels"]
    assert [r["ms"] for r in rows] == sorted((r["ms"] for r in rows), reverse=True)
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    assert rows[0]["ops"] and rows[0]["flops"] > 0 and rows[0]["schedule"] in ("default", "c-kernel")
    assert 0 < rows[0]["peak_share"] < 1.5 and rows[0]["gflops"] > 0 and rows[0]["bytes"] > 0
    assert p["peak_gflops"] > 0 and p["bandwidth_gbs"] > 0 and p["static_facts"]
    text = format_profile(p)
    assert "total:" in text and rows[0]["kernel"][:40] in text and "% of peak" in text
    assert all(r["kind"] for r in rows)  # kernel_info names every kernel's kind
    assert p["above_peak"] == [r["kernel"] for r in rows if (r["peak_share"] or 0) > 1]
    assert all((r["peak_share"] is None) == (r["kind"] not in MULTIPLY_ADD or not r["flops"]) for r in rows)
    assert MULTIPLY_ADD <= set(KINDS)
    assert "faster than the measured peak" in format_profile({**p, "above_peak": [rows[0]["kernel"]]})


def test_cli_profile_json(cnn_artifact, tmp_path, capsys):
    out = tmp_path / "p.json"
    assert (
        main(["profile", str(cnn_artifact), "--threads", "1", "--repeat", "5", "--top", "2", "--json", str(out)]) == 0
    )
    text = capsys.readouterr().out
    p = json.loads(out.read_text())
    assert len(p["kernels"]) >= 4 and f"{len(p['kernels']) - 2} more kernel(s)" in text


def test_bench_profile_json(cnn_artifact, tmp_path, capsys):
    out = tmp_path / "b.json"
    assert (
        main(
            [
                "bench",
                str(cnn_artifact),
                "--threads",
                "1",
                "--warmup",
                "1",
                "--repeat",
                "5",
                "--profile",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    r = json.loads(out.read_text())
    assert r["runs"] == 5 and r["profile"]["runs"] == 5 and r["profile"]["kernels"]
    assert "source ops" in capsys.readouterr().out


def test_plot_without_matplotlib_fails_first(cnn_artifact, tmp_path, monkeypatch, capsys):
    """No matplotlib: an OptionsError naming the extra, before anything runs."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setattr(prof, "profile", lambda *a, **k: pytest.fail("ran before checking matplotlib"))
    for cmd in (["profile", str(cnn_artifact)], ["bench", str(cnn_artifact), "--repeat", "2", "--profile"]):
        assert main(cmd + ["--plot", str(tmp_path / "k.png")]) == 2
        assert "pip install 'kiln[bench]'" in capsys.readouterr().err
    assert not (tmp_path / "k.png").exists()


def test_plot_png(cnn_artifact, tmp_path):
    pytest.importorskip("matplotlib")
    assert (
        main(["profile", str(cnn_artifact), "--threads", "1", "--repeat", "3", "--plot", str(tmp_path / "k.png")]) == 0
    )
    assert (tmp_path / "k.png").read_bytes()[:4] == b"\x89PNG"


def test_summarize_without_static_facts():
    """An artifact compiled before kernel_info existed: times and shares, no roofline; builtins apart."""
    runs = [{"k1": 0.002, "k2": 0.001, "vm.builtin.alloc_storage": 0.0001}] * 3
    p = summarize(
        runs,
        {"k1": 1, "k2": 2, "vm.builtin.alloc_storage": 1},
        [3.5, 3.2, 3.4],
        {},
        {"gflops": 100.0, "method": "x"},
        10.0,
        {"artifact": "a.kiln", "target": "llvm", "threads": 1, "runs": 3},
    )
    assert [r["kernel"] for r in p["kernels"]] == ["k1", "k2"] and p["kernels_ms"] == pytest.approx(3.0)
    assert p["latency_ms"] == 3.4 and p["builtins_ms"] == pytest.approx(0.1) and p["kernels"][1]["calls"] == 2
    assert p["kernels"][0]["gflops"] is None and not p["static_facts"]
    assert "no kernel_info" in format_profile(p)


def test_int8_kernels_have_no_share_of_the_float32_peak(tmp_path):
    """An int8 kernel is marked in kernel_info (its block declares an int8 kind) and the profile shows no
    share of the float32 FMA peak for it (an AMX conv read 318% of it), nor end to end."""
    from helpers import qdq_conv

    from kiln.runtime.artifact import read_manifest

    kiln.compile(qdq_conv(32, 32, 3, 1, 1, 0)[0], tmp_path / "q.kiln", tuning_db="none")
    info = read_manifest(tmp_path / "q.kiln")["buckets"][0]["kernel_info"]
    marked = [k for k, v in info.items() if v.get("int8")]
    assert len(marked) == 1 and "conv2d" in marked[0]
    runs = [{"q": 0.002, "f": 0.001}] * 3
    facts = {"q": {"flops": 2e6, "int8": True}, "f": {"flops": 1e6}}
    p = summarize(
        runs,
        {"q": 1, "f": 1},
        [3.0] * 3,
        facts,
        {"gflops": 100.0, "method": "x"},
        10.0,
        {"artifact": "a.kiln", "target": "llvm", "threads": 1, "runs": 3},
    )
    assert p["kernels"][0]["peak_share"] is None and p["kernels"][1]["peak_share"] == pytest.approx(0.01)
    assert "int8 kernels: no share of the float32 peak" in format_profile(p)


def test_kernel_info_of_a_model_with_topi_extern_kernels(tmp_path):
    """ScatterElements and NonMaxSuppression lower to extern kernels whose root block is named after the op:
    looking for a block named "root" raised, and FasterRCNN's whole manifest had no kernel_info (the profile
    showed no source ops, FLOPs or schedules)."""
    from kiln.runtime.artifact import read_manifest

    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    idx = np.array([[1, 0, 3], [0, 2, 1]], np.int64)
    upd = np.ones((2, 3), np.float32)
    g = helper.make_graph(
        [
            helper.make_node("ScatterElements", ["x", "idx", "upd"], ["s"], axis=0),
            helper.make_node("Relu", ["s"], ["y"]),
        ],
        "scatter",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 6])],
        [numpy_helper.from_array(idx, "idx"), numpy_helper.from_array(upd, "upd")],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)])
    kiln.compile(model, tmp_path / "s.kiln")
    info = read_manifest(tmp_path / "s.kiln")["buckets"][0]["kernel_info"]
    assert any("scatter" in k for k in info), sorted(info)
    assert all(v["schedule"] in ("default", "none", "tuned", "c-kernel") for v in info.values())
    want = x.copy()
    for i in range(2):
        for j in range(3):
            want[idx[i, j], j] = upd[i, j]
    np.testing.assert_array_equal(kiln.load(tmp_path / "s.kiln").run({"x": x})["y"], np.maximum(want, 0))


def test_source_ops_matching():
    """Compute kernels take the compute nodes in order (a depthwise+pointwise kernel two), with the
    element-wise nodes their names show fused; layout transforms take none."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["a"], name="dw"),
        helper.make_node("Clip", ["a"], ["b"], name="clip"),
        helper.make_node("Conv", ["b", "w2"], ["c"], name="pw"),
        helper.make_node("Add", ["c", "x"], ["d"], name="res"),
        helper.make_node("Relu", ["d"], ["e"], name="act"),
    ]
    model = helper.make_model(
        helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1])],
        )
    )
    got = source_ops(["te_layout_transform", "fused_dwpw_conv2d_relax_add", "relu"], model)
    assert got == {
        "te_layout_transform": [],
        "fused_dwpw_conv2d_relax_add": ["dw", "clip", "pw", "res"],
        "relu": ["act"],
    }


def test_source_ops_space_to_depth_stem():
    """Regression: on ResNet-50's bf16 build the RGB stem (after SpaceToDepthStem: 2x2 blocks, channels padded to
    16, a 4x4 kernel; 64 x 256 packed weights) matched no Conv node's weight size, and among the next ones the
    block's 1x1 64 -> 256 conv had its weight's size by chance: the profile named the stem after that conv and every
    stage-1 kernel after it wrong. The stem's weight as SpaceToDepthStem packs it now counts as its size."""
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"], strides=[2, 2], pads=[3, 3, 3, 3], name="stem"),
        helper.make_node("Relu", ["a"], ["ar"], name="stem_relu"),
        helper.make_node("Conv", ["ar", "w1"], ["b"], name="reduce"),
        helper.make_node("Conv", ["b", "w2"], ["c"], name="expand"),
    ]
    inits = {"w0": _rand(64, 3, 7, 7, seed=1), "w1": _rand(64, 64, 1, 1, seed=2), "w2": _rand(256, 64, 1, 1, seed=3)}
    model = helper.make_model(
        helper.make_graph(
            nodes,
            "stem",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 224, 224])],
            [helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 256, 112, 112])],
            [numpy_helper.from_array(v, k) for k, v in inits.items()],
        )
    )
    kernels = ["kiln_bf16_conv_relu", "kiln_bf16_conv1", "kiln_bf16_conv2"]
    # the stem's arguments: blocked input [1, 1, 115, 115, 16], packed weights [4, 128, 16, 2], bias [1, 4, 1, 1, 16]
    sizes = [{115 * 115 * 16, 64 * 256, 64}, {112 * 112 * 64, 64 * 64, 64}, {112 * 112 * 64, 256 * 64, 256}]
    got = source_ops(kernels, model, sizes)
    assert got == {
        "kiln_bf16_conv_relu": ["stem", "stem_relu"],
        "kiln_bf16_conv1": ["reduce"],
        "kiln_bf16_conv2": ["expand"],
    }


def _bottleneck_with_projection(c: int = 64, m: int = 32, hw: int = 14) -> onnx.ModelProto:
    """A ResNet bottleneck whose stride-2 projection shortcut comes after the block's last conv in the
    ONNX graph (as torchvision's export has it) but is called before it in the compiled model."""
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="reduce"),
        helper.make_node("Relu", ["a"], ["ar"], name="reduce_relu"),
        helper.make_node("Conv", ["ar", "w2"], ["b"], pads=[1, 1, 1, 1], strides=[2, 2], name="spatial"),
        helper.make_node("Relu", ["b"], ["br"], name="spatial_relu"),
        helper.make_node("Conv", ["br", "w3"], ["c3"], name="expand"),
        helper.make_node("Conv", ["x", "ws"], ["s"], strides=[2, 2], name="projection"),
        helper.make_node("Add", ["c3", "s"], ["y0"], name="residual"),
        helper.make_node("Relu", ["y0"], ["y"], name="out_relu"),
    ]
    inits = {
        "w1": _rand(m, c, 1, 1, seed=1),
        "w2": _rand(m, m, 3, 3, seed=2),
        "w3": _rand(4 * m, m, 1, 1, seed=3),
        "ws": _rand(4 * m, c, 1, 1, seed=4),
    }
    g = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4 * m, hw // 2, hw // 2])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_source_ops_projection_shortcut(tmp_path):
    """Regression: the profile named a ResNet block's projection conv after the block's last conv and
    the other way round (kernels were matched to Conv nodes by call order alone). Each conv kernel
    now takes the queued Conv node whose weight size is among its arguments'."""
    from kiln.runtime.artifact import read_manifest

    kiln.compile(_bottleneck_with_projection(), tmp_path / "b.kiln", tuning_db="none")
    info = read_manifest(tmp_path / "b.kiln")["buckets"][0]["kernel_info"]
    owner = {o: k for k, v in info.items() for o in v["ops"]}
    assert {"reduce", "spatial", "expand", "projection"} <= set(owner)
    flops = {o: info[owner[o]]["flops"] for o in ("expand", "projection")}
    # expand: 128x32 MACs per pixel, projection 128x64, both at 7x7 (the projection on a subsampled input)
    assert flops["projection"] > 1.5 * flops["expand"], flops
    # the residual add and its ReLU fuse into the conv called second: the block's last conv
    assert owner["residual"] == owner["out_relu"] == owner["expand"] != owner["projection"]


def test_a_profile_during_a_slow_spell_says_so():
    """A machine that halves its speed for part of the profile (a slow spell, benchmarks/tail.md) mixes both
    speeds into every kernel's median: the summary measures it and the text says to profile again."""
    runs = [{"k1": 0.002}] * 3
    args = ({"k1": 1}, {}, {"gflops": 100.0, "method": "x"}, 10.0)
    meta = {"artifact": "a.kiln", "target": "llvm", "threads": 1, "runs": 50}
    steady = summarize(runs, args[0], [2.0] * 25 + [2.1] * 25, *args[1:], meta)
    spelled = summarize(runs, args[0], [2.0] * 25 + [3.8] * 25, *args[1:], meta)
    assert steady["spell"] == pytest.approx(1.05) and "speed changed" not in format_profile(steady)
    assert spelled["spell"] == pytest.approx(1.9)
    assert "the slowest fifth of the runs had a median 1.9x the fastest fifth's" in format_profile(spelled)
    assert summarize(runs, args[0], [2.0, 9.0, 2.0], *args[1:], meta)["spell"] == 1.0  # too few runs to tell


def test_a_profile_says_what_timing_each_call_costs():
    """Many microsecond kernels (a 70 us VAD model: 37 kernels, 0.19 ms of builtins) add up to more than the
    plain run, because each hooked call pays for its timing: the summary says how much per call."""
    runs = [{"k1": 0.00006, "k2": 0.00003, "vm.builtin.alloc_storage": 0.00001}] * 3
    meta = {"artifact": "a.kiln", "target": "llvm", "threads": 1, "runs": 3, "latency_ms_instrumented": 0.19}
    p = summarize(
        runs,
        {"k1": 10, "k2": 10, "vm.builtin.alloc_storage": 20},
        [0.07] * 3,
        {},
        {"gflops": 1.0, "method": "x"},
        1.0,
        meta,
    )
    assert p["kernels_share_of_latency"] == pytest.approx(0.09 / 0.07)
    assert p["instrument_us_per_call"] == pytest.approx(3.0)  # (0.19 - 0.07) ms over 40 hooked calls
    assert "timing each call costs about 3.0 us" in format_profile(p)
    exact = summarize(runs, {"k1": 1, "k2": 1}, [0.09] * 3, {}, {"gflops": 1.0, "method": "x"}, 1.0, meta)
    assert "timing each call" not in format_profile(exact)


def _summary(facts: dict, runs: dict, unit_peaks=None) -> dict:
    return summarize(
        [runs] * 3,
        {k: 1 for k in runs},
        [sum(runs.values()) * 1e3] * 3,
        facts,
        {"gflops": 100.0, "method": "fma-avx512"},
        10.0,
        {"artifact": "a.kiln", "target": "llvm", "threads": 1, "runs": 3},
        unit_peaks=unit_peaks,
    )


def test_a_bf16_kernel_is_set_against_the_vdpbf16ps_peak():
    """A bf16 kernel on AVX512-BF16 does two multiply-adds a lane per instruction: its share is of vdpbf16ps's
    measured peak, not the fp32 FMA's (BERT-base's bf16 matmuls read 175-188% of that, with a note blaming a busy
    machine); the end-to-end share charges each kernel's FLOPs at its own unit's peak."""
    facts = {
        "b": {"flops": 4e6, "kind": "bf16_matmul", "unit": "avx512-bf16 vdpbf16ps"},
        "f": {"flops": 1e6, "kind": "matmul", "unit": "fp32 FMA avx512"},
    }
    p = _summary(facts, {"b": 0.004, "f": 0.001}, {"bf16": {"gflops": 200.0, "method": "vdpbf16ps"}})
    rows = {r["kernel"]: r for r in p["kernels"]}
    assert rows["b"]["peak_share"] == pytest.approx(1.0 / 200) and rows["b"]["peak_unit"] == "bf16"
    assert rows["f"]["peak_share"] == pytest.approx(1.0 / 100) and rows["f"]["peak_unit"] == "fma"
    assert p["roofline_share"] == pytest.approx((4e6 / 200e9 + 1e6 / 100e9) / 5e-3)
    text = format_profile(p)
    assert "bf16 200 GFLOP/s (vdpbf16ps)" in text and f"({p['roofline_share'] * 100:.1f}% of peak)" in text


def test_kernels_on_units_with_no_measured_peak_get_no_share():
    """AMX tiles have no peak loop: their kernels and the run get no share, and the profile says why."""
    facts = {
        "a": {"flops": 4e6, "kind": "bf16_matmul", "unit": "amx-bf16 tdpbf16ps"},
        "f": {"flops": 1e6, "kind": "matmul", "unit": "fp32 FMA avx512"},
    }
    p = _summary(facts, {"a": 0.004, "f": 0.001})
    rows = {r["kernel"]: r for r in p["kernels"]}
    assert rows["a"]["peak_share"] is None and rows["f"]["peak_share"] == pytest.approx(0.01)
    assert p["roofline_share"] is None and p["above_peak"] == []
    assert "no measured peak" in format_profile(p)


def test_an_int8_kernel_on_vnni_is_set_against_the_vpdpbusd_peak():
    """int8 kernels on AVX512-VNNI get a share of vpdpbusd's measured peak (in integer operations); on another int8
    path (AVX2's vpmaddubsw) none, and then the run gets none either."""
    facts = {
        "q": {"flops": 8e6, "kind": "conv2d_int8", "int8": True, "unit": "avx512-vnni"},
        "f": {"flops": 1e6, "kind": "matmul", "unit": "fp32 FMA avx512"},
    }
    p = _summary(facts, {"q": 0.002, "f": 0.001}, {"int8": {"gflops": 400.0, "method": "vpdpbusd"}})
    rows = {r["kernel"]: r for r in p["kernels"]}
    assert rows["q"]["peak_share"] == pytest.approx(4.0 / 400) and rows["q"]["peak_unit"] == "int8"
    assert p["roofline_share"] == pytest.approx((8e6 / 400e9 + 1e6 / 100e9) / 3e-3)
    assert "int8 400 GOP/s (vpdpbusd)" in format_profile(p)
    other = _summary({**facts, "q": {**facts["q"], "unit": "avx2-pmaddubsw"}}, {"q": 0.002, "f": 0.001})
    assert other["kernels"][0]["peak_share"] is None and other["roofline_share"] is None
    assert "int8 kernels: no share of the float32 peak" in format_profile(other)


@pytest.mark.parametrize(
    "unit,flag,method", [("bf16", "avx512_bf16", "vdpbf16ps"), ("int8", "avx512_vnni", "vpdpbusd")]
)
def test_the_dot_product_loops_run_where_the_cpu_has_them(unit, flag, method):
    from kiln.runtime.hostinfo import host_cpu_flags
    from kiln.runtime.peak import fresh_unit_peak

    p = fresh_unit_peak(unit, 1)
    if flag not in host_cpu_flags():
        assert p is None
    else:
        assert p["method"] == method and p["gflops"] > 0
