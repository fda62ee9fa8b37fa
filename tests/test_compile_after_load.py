"""kiln.load, then kiln.compile, in one process. kiln.load imports TVM without its compiler library, which
TVM cannot add afterwards; the compile then runs in a fresh process (kiln/_compile_elsewhere.py) and gives
back the same result, or the same error, as in-process. Before, the compile died in TVM's import
("Global Function relax.run.shape_to_tensor is already registered")."""

from __future__ import annotations

import pickle
import subprocess
import sys

import onnx

from kiln.errors import UnsupportedModelError

SCRIPT = r"""
import sys
import numpy as np
import kiln
from kiln._compile_elsewhere import runtime_only_tvm
src, first, second = sys.argv[1:4]
x = {"input": np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)}
want = kiln.load(first).run(x)["output"]
assert runtime_only_tvm()
r = kiln.compile(src, second, input_shapes=["input:1x3x8x8"])
assert type(r).__name__ == "CompileResult" and r.report["kernels"] >= 1, r
np.testing.assert_array_equal(kiln.load(second).run(x)["output"], want)
try:
    kiln.compile(src + ".missing", second)
except kiln.ModelLoadError as e:
    assert e.where == src + ".missing", e.where
else:
    raise AssertionError("no error")
assert "tvm.relax" not in sys.modules  # the compiler never loaded here
print("ok")
"""


def test_compile_after_load_runs_in_a_fresh_process(tmp_path, small_conv_model, small_artifact):
    src = tmp_path / "m.onnx"
    onnx.save(small_conv_model, src)
    args = [str(src), str(small_artifact), str(tmp_path / "again.kiln")]
    r = subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_kiln_errors_pickle_with_their_fields():
    e = UnsupportedModelError("no kernel", ops=[{"op": "Foo"}], where="m.onnx", fix="remove Foo")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is UnsupportedModelError and str(back) == str(e)
    assert (back.where, back.fix, back.ops) == ("m.onnx", "remove Foo", [{"op": "Foo"}])
