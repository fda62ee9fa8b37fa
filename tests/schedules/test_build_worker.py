"""The build worker of `kiln tune` starts inside --budget: it imports TVM and nothing it does not use."""

import tvm
from tvm import te
from tvm.s_tir.meta_schedule.builder import BuilderInput
from worker_probe import loaded_modules

from kiln.schedules.tuning.builder import WorkerBuilder


def test_the_build_worker_loads_tvm_but_not_torch_nor_the_rules(tmp_path):
    """PyTorch (imported by tvm_ffi when installed: 1.5 s) and Kiln's schedule rules (their int8
    intrinsics: 3 s) are not needed to compile a candidate; the worker starts without them."""
    a = te.placeholder((4,), name="a")
    mod = tvm.IRModule({"main": te.create_prim_func([a, te.compute((4,), lambda i: a[i] + 1.0, name="b")])})
    builder = WorkerBuilder(str(tmp_path), build=loaded_modules)
    builder.launch()
    try:
        (r,) = builder.build([BuilderInput(mod, tvm.target.Target({"kind": "llvm"}))])
    finally:
        builder.close()
    assert r.error_msg is None and r.artifact_path == "tvm", r.error_msg or r.artifact_path
