"""--target cuda: every zoo model compiles (no GPU needed) into an artifact whose manifest says
cuda, every kernel bound by the GPU schedules; on a host without a GPU, loading it is a clear
error. Running on a GPU is benchmarks/gpu.sh's job."""

from __future__ import annotations

import pytest

import kiln
from kiln import zoo
from kiln.target import Target


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_zoo_compiles_for_cuda(tmp_path, name):
    build, shape = zoo.MODELS[name]
    r = kiln.compile(
        build(), tmp_path / "m.kiln", input_shapes=[shape], target="cuda -arch=sm_90", report_path=tmp_path / "r.json"
    )
    m = r.manifest
    assert m["device"] == "cuda" and m["target"] == "cuda -arch=sm_90" and m["target_dict"]["arch"] == "sm_90"
    assert m["cpu_features"] == []  # generic host code: any x86-64 GPU server
    assert (
        r.report["kernels"] > 0 and r.report["kernels_unscheduled"] == 0
    )  # CUDA codegen needs every kernel bound to threads


def test_cuda_artifact_on_a_host_without_gpu(tmp_path, small_conv_model):
    import tvm

    kiln.compile(small_conv_model, tmp_path / "g.kiln", input_shapes=["input:1x3x8x8"], target="cuda -gpu=a100")
    if tvm.cuda(0).exist:
        pytest.skip("this host has a GPU")
    with pytest.raises(kiln.IncompatibleArtifactError, match="CUDA GPU"):
        kiln.load(tmp_path / "g.kiln")


def test_cuda_target_parsing():
    assert Target.parse("cuda").gpu_arch == "sm_80"
    t = Target.parse("cuda -gpu=h100")
    assert t.gpu == "nvidia/nvidia-h100" and t.gpu_arch.startswith("sm_90") and Target.parse(str(t)) == t
    for bad, msg in (("cuda -gpu=nope", "unknown GPU"), ("cuda -arch=80", "sm_80"), ("cuda -mcpu=x", "bad option")):
        with pytest.raises(kiln.TargetError, match=msg):
            Target.parse(bad)


def test_gpu_kernels_are_tunable_tasks():
    """kiln tune on a cuda target searches the same kernels the GPU pipeline builds (measuring needs
    a GPU: locally on a GPU host, or over --rpc-tracker)."""
    from kiln.compiler import CompileOptions
    from kiln.compiler.optimize import optimize
    from kiln.frontends.importer import import_onnx
    from kiln.schedules.tuning.tuning import extract

    co = CompileOptions.make(
        target="cuda -arch=sm_80", input_shapes=["input:1x3x32x32"], disabled_passes=("GPUSchedules",)
    )
    mod = optimize(import_onnx(zoo.resnet18(size=32, classes=10), co.shapes).mod, co).mod
    tasks = extract(mod, co.target.tvm())
    assert len(tasks) >= 10 and all(t.target.kind.name == "cuda" for t in tasks)


def test_recurrences_stay_unrolled_for_cuda(tmp_path):
    # the one-kernel LSTM/GRU/RNN (schedules/rules/recurrence.py) is a CPU kernel with no thread binding: a GPU
    # target keeps the per-step ops, each bound by the GPU schedules
    import numpy as np
    from onnx import TensorProto, helper

    r = np.random.default_rng(0)
    w = {"W": r.standard_normal((1, 24, 4)), "R": r.standard_normal((1, 24, 8))}
    g = helper.make_graph(
        [helper.make_node("GRU", ["x", "W", "R"], ["y"], hidden_size=8)],
        "gru",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 1, 1, 8])],
        [helper.make_tensor(k, TensorProto.FLOAT, v.shape, v.astype(np.float32).ravel()) for k, v in w.items()],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cpu = kiln.compile(m, tmp_path / "c.kiln", target="llvm -mcpu=haswell").report
    gpu = kiln.compile(m, tmp_path / "g.kiln", target="cuda -arch=sm_90").report
    assert cpu["recurrence_kernels"] == 1
    assert gpu["recurrence_kernels"] == 0 and gpu["kernels"] > 3 and gpu["kernels_unscheduled"] == 0
