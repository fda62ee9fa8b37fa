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
    assert main(["compile", str(tmp / "r18.onnx"), "-o", str(tmp / "r18.kiln"), "--target", "vta-sim -board=ultra96", "--quantize", "int8",
                 "--calibration", str(tmp / "calib.npz"), "--report", str(tmp / "r.json")]) == 0
    return model, tmp


def test_report_and_manifest(vta_model):
    _, tmp = vta_model
    v = json.loads((tmp / "r.json").read_text())["vta"]
    convs = [n.name for n in onnx.load(tmp / "r18.onnx").graph.node if n.op_type == "Conv"]
    assert v["offloaded"] == convs[1:] and list(v["not_offloaded"]) == [convs[0]]  # every conv but the first
    assert "first conv" in v["not_offloaded"][convs[0]]
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
    assert sim.accelerator and all(r.runs == 1 and r.stats.gemm_ops > 0 for r in sim.accelerator)  # every layer ran on the simulator
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
