"""A model compiled for the simulated accelerator: every conv but the first offloaded, the
offloaded layers bit-exact with the numpy reference of the same integer arithmetic, outputs close
to onnxruntime's float ones, and the report's `vta` section."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from helpers import ort_run

import kiln
from kiln import zoo
from kiln.cli import main
from kiln.errors import OptionsError


@pytest.fixture(scope="module")
def vta_model(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vta")
    model = zoo.resnet18(size=32, classes=10)
    onnx.save(model, tmp / "r18.onnx")
    np.savez(tmp / "calib.npz", input=np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype(np.float32))
    assert (
        main(
            [
                "compile",
                str(tmp / "r18.onnx"),
                "-o",
                str(tmp / "r18.kiln"),
                "--target",
                "vta-sim -board=ultra96",
                "--quantize",
                "int8",
                "--calibration",
                str(tmp / "calib.npz"),
                "--report",
                str(tmp / "r.json"),
            ]
        )
        == 0
    )
    return model, tmp


def test_report_and_manifest(vta_model):
    _, tmp = vta_model
    v = json.loads((tmp / "r.json").read_text())["vta"]
    nodes = onnx.load(tmp / "r18.onnx").graph.node
    convs = [n.name for n in nodes if n.op_type == "Conv"]
    fc = [n.name for n in nodes if n.op_type == "Gemm"]
    assert v["offloaded"] == convs[1:] and list(v["not_offloaded"]) == [convs[0], *fc]  # every conv but the first
    assert "first conv" in v["not_offloaded"][convs[0]] and "logits" in v["not_offloaded"][fc[0]]
    assert v["sim_cycles_total"] > v["sim_gemm_cycles"] > 0 and 0 < v["utilization"] <= 1 and v["gops"] > 0
    assert v["config"]["board"] == "ultra96" and v["config"]["clock_mhz"] == 333.0
    macs = sum(l["macs"] for l in v["layers"])
    assert v["sim_gemm_cycles"] * 256 >= macs  # the array does at most 256 MACs a cycle
    m = kiln.load(tmp / "r18.kiln")
    assert m.manifest["accelerator"]["kind"] == "vta-sim" and m.manifest["target"].startswith("vta-sim -board=ultra96")


def test_offloaded_layers_bit_exact_and_outputs_close(vta_model):
    model, tmp = vta_model
    x = np.random.default_rng(7).standard_normal((1, 3, 32, 32)).astype(np.float32)
    sim = kiln.load(tmp / "r18.kiln")
    out = sim.run({"input": x})["output"]
    assert sim.accelerator and all(
        r.runs == 1 and r.stats.gemm_ops > 0 for r in sim.accelerator
    )  # every layer ran on the simulator
    ref = kiln.load(tmp / "r18.kiln", accelerator="reference").run({"input": x})["output"]
    np.testing.assert_array_equal(out, ref)  # simulator == numpy integer reference, bit for bit
    f = ort_run(model, {"input": x})[0]
    cos = float((out * f).sum() / np.linalg.norm(out) / np.linalg.norm(f))
    assert cos > 0.99, cos


def test_vta_target_needs_quantization(tmp_path):
    from kiln.compiler.options import CompileOptions

    with pytest.raises(OptionsError, match="needs --quantize int8"):
        CompileOptions.make(target="vta-sim")
    with pytest.raises(kiln.KilnError, match="unknown board"):
        CompileOptions.make(target="vta-sim -board=nope", quantize="int8", calibration="c.npz")


def test_bad_accelerator_backend(vta_model):
    _, tmp = vta_model
    with pytest.raises(OptionsError, match="reference"):
        kiln.load(tmp / "r18.kiln", accelerator="fpga")


def test_dense_layer_offloaded(tmp_path):
    """A hidden dense layer (matmul + bias + ReLU) runs on the accelerator as a 1x1 conv."""
    from helpers import make_model
    from onnx import helper

    rng = np.random.default_rng(3)
    inits = {
        "w1": (rng.standard_normal((32, 16, 3, 3)) * 0.1).astype(np.float32),
        "b1": np.zeros(32, np.float32),
        "w0": (rng.standard_normal((16, 3, 3, 3)) * 0.3).astype(np.float32),
        "fw": (rng.standard_normal((32 * 8 * 8, 40)) * 0.05).astype(np.float32),
        "fb": (rng.standard_normal(40) * 0.1).astype(np.float32),
        "ow": (rng.standard_normal((40, 10)) * 0.3).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["input", "w0"], ["c0"], pads=[1] * 4, name="conv0"),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], pads=[1] * 4, name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Flatten", ["r1"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["hr"]),
        helper.make_node("MatMul", ["hr", "ow"], ["output"], name="fc2"),
    ]
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    model = make_model(nodes, {"input": x}, ["output"], inits)
    np.savez(tmp_path / "c.npz", input=rng.standard_normal((6, 3, 8, 8)).astype(np.float32))
    r = kiln.compile(model, tmp_path / "m.kiln", target="vta-sim", quantize="int8", calibration=tmp_path / "c.npz")
    v = r.report["vta"]
    assert v["offloaded"] == ["conv1", "fc1"] and set(v["not_offloaded"]) == {"conv0", "fc2"}
    out = kiln.load(tmp_path / "m.kiln").run({"input": x})["output"]
    np.testing.assert_array_equal(
        out, kiln.load(tmp_path / "m.kiln", accelerator="reference").run({"input": x})["output"]
    )
    f = ort_run(model, {"input": x})[0]
    assert float((out * f).sum() / np.linalg.norm(out) / np.linalg.norm(f)) > 0.99


def test_int8_hand_off_and_residual_adds_on_the_alu(vta_model):
    """Neighbouring accelerator layers pass int8 as it is (no CPU dequantize/quantize between),
    each basic block's residual add + ReLU runs in its second conv's ALU epilogue, and a chain of
    layers run on the simulator, each fed the previous one's int8 output, is bit-exact with the
    chain of numpy references."""
    _, tmp = vta_model
    v = json.loads((tmp / "r.json").read_text())["vta"]
    layers = {lay["layer"]: lay for lay in v["layers"]}
    res = [n for n, lay in layers.items() if lay["residual_on_alu"]]
    assert len(res) == 8  # ResNet-18: 8 basic blocks, every residual add on the accelerator
    assert all(lay["alu_epilogue"].startswith("MUL (residual)") == (n in res) for n, lay in layers.items())
    assert all(layers[n]["int8_residual_from"] for n in res[1:])  # block 1's identity is the CPU max-pool
    handed = [n for n, lay in layers.items() if lay["int8_input_from"]]
    assert handed == list(layers)[1:]  # all but the first conv of block 1, whose input is the max-pool
    m = kiln.load(tmp / "r18.kiln")
    runners = {r.prog.name: r for r in m.accelerator}
    rng = np.random.default_rng(11)
    name = res[1]  # a block's second conv: input and residual from accelerator layers
    src, rsrc = layers[name]["int8_input_from"], layers[name]["int8_residual_from"]
    a, b = runners[src], runners[name]
    x = rng.integers(-127, 128, a.prog.in_shape).astype(np.int8)
    r = rng.integers(-127, 128, b.prog.out_shape).astype(np.int8)
    a_res = rng.integers(-127, 128, a.prog.out_shape).astype(np.int8) if a.prog.residual else None
    ya = a.run(x, "sim", a_res)
    np.testing.assert_array_equal(ya, a.run(x, "reference", a_res))
    yb = b.run(ya, "sim", r)
    np.testing.assert_array_equal(yb, b.run(ya, "reference", r))
    assert len(np.unique(yb)) > 10 and rsrc is not None


def test_linear_bottleneck_residual_whose_block_input_is_a_conv_plus_bias(tmp_path):
    """MobileNetV2's shape: `block input + conv(...) + bias` without a ReLU, where the block input is
    itself an offloaded conv + bias. Both are accelerator layers, the add runs on the second one's ALU
    (its bias add is not taken for the residual add), bit-exact with the reference."""
    from helpers import make_model
    from onnx import helper

    rng = np.random.default_rng(5)
    inits = {
        "w0": (rng.standard_normal((16, 3, 3, 3)) * 0.3).astype(np.float32),
        "wb": (rng.standard_normal((16, 16, 1, 1)) * 0.3).astype(np.float32),
        "bb": (rng.standard_normal(16) * 0.1).astype(np.float32),
        "wd": (rng.standard_normal((16, 1, 3, 3)) * 0.3).astype(np.float32),
        "wc": (rng.standard_normal((16, 16, 1, 1)) * 0.3).astype(np.float32),
        "bc": (rng.standard_normal(16) * 0.1).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["input", "w0"], ["c0"], pads=[1] * 4, name="conv0"),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("Conv", ["r0", "wb", "bb"], ["b"], name="project0"),
        helper.make_node("Conv", ["b", "wd"], ["d"], pads=[1] * 4, group=16, name="depthwise"),
        helper.make_node("Relu", ["d"], ["dr"]),
        helper.make_node("Conv", ["dr", "wc", "bc"], ["c"], name="project1"),
        helper.make_node("Add", ["b", "c"], ["output"]),
    ]
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    model = make_model(nodes, {"input": x}, ["output"], inits)
    np.savez(tmp_path / "c.npz", input=rng.standard_normal((6, 3, 8, 8)).astype(np.float32))
    r = kiln.compile(model, tmp_path / "m.kiln", target="vta-sim", quantize="int8", calibration=tmp_path / "c.npz")
    v = r.report["vta"]
    assert v["offloaded"] == ["project0", "project1"] and set(v["not_offloaded"]) == {"conv0", "depthwise"}
    layers = {lay["layer"]: lay for lay in v["layers"]}
    assert layers["project1"]["residual_on_alu"] and layers["project1"]["int8_residual_from"] == "project0"
    assert layers["project1"]["alu_epilogue"] == "MUL (residual), SHR, MAX, MIN"
    out = kiln.load(tmp_path / "m.kiln").run({"input": x})["output"]
    ref = kiln.load(tmp_path / "m.kiln", accelerator="reference").run({"input": x})["output"]
    np.testing.assert_array_equal(out, ref)
    f = ort_run(model, {"input": x})[0]
    assert float((out * f).sum() / np.linalg.norm(out) / np.linalg.norm(f)) > 0.99
