"""Artifacts whose ops need VM builtins TVM implements in its compiler package (NonZero, Unique) or
in libtvm_runtime_extra (TopK's sort kernels) load and run in a fresh process, where Kiln's runtime
has loaded TVM's runtime library alone. In the compiling process they always worked, which hid it:
the corpus' FasterRCNN artifact failed to load with "Cannot find ffi::Function relax.run.nonzero"."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
from helpers import make_model, ort_run
from onnx import helper

import kiln

PROBE = """
import json, sys
import numpy as np
import kiln
m = kiln.load(sys.argv[1])
out = m.run({"x": np.load(sys.argv[2])})
print(json.dumps({"runtime_only": "tvm.relax" not in sys.modules,
                  "out": {k: np.asarray(v).tolist() for k, v in out.items()}}))
"""


def test_nonzero_unique_topk_run_on_the_runtime_alone(tmp_path):
    x = np.array([[3.0, 0.0, 1.0, 3.0], [0.0, 2.0, 1.0, 5.0]], np.float32)
    k = np.array([3], np.int64)
    nodes = [
        helper.make_node("NonZero", ["x"], ["nz"]),
        helper.make_node("TopK", ["x", "k"], ["vals", "idx"], axis=1),
        helper.make_node("Unique", ["x"], ["u", "ui", "uinv", "uc"], sorted=0),
    ]
    model = make_model(nodes, {"x": x}, ["nz", "vals", "idx", "u", "ui", "uinv", "uc"], inits={"k": k})
    path = tmp_path / "m.kiln"
    kiln.compile(model, path)
    np.save(tmp_path / "x.npy", x)
    r = subprocess.run(
        [sys.executable, "-c", PROBE, str(path), str(tmp_path / "x.npy")], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert info["runtime_only"], "the probe should have loaded TVM's runtime only"
    names = [o.name for o in model.graph.output]
    for name, ref in zip(names, ort_run(model, {"x": x})):
        np.testing.assert_array_equal(np.asarray(info["out"][name], ref.dtype).reshape(ref.shape), ref, err_msg=name)
