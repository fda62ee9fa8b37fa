"""Importing TVM through Kiln does not import PyTorch (kiln/_tvm_without_torch.py: 3-4 s of every
process's start where torch is installed), and PyTorch models still compile afterwards in the same
process (the .pt2 frontend imports torch itself; TVM takes its tensors over DLPack)."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = r"""
import sys
import kiln, tvm, tvm.relax
from kiln.compiler import compile_model  # the whole compiler: still no torch
assert "torch" not in sys.modules, "TVM's import loaded torch"
import numpy as np, torch
m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
x = torch.randn(1, 3, 8, 8)
kiln.compile(m, sys.argv[1], example_inputs=(x,))
art = kiln.load(sys.argv[1])
(got,) = art.run({art.inputs[0].name: x.numpy()}).values()
np.testing.assert_allclose(got, m(x).detach().numpy(), rtol=1e-5, atol=1e-5)
print("ok")
"""


def test_tvm_imports_without_torch_and_torch_models_still_compile(tmp_path):
    pytest.importorskip("torch")
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "m.kiln")], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_a_loaded_torch_is_kept():
    """A user who imported torch first (to compile an nn.Module) keeps tvm_ffi's torch support."""
    pytest.importorskip("torch")
    code = "import torch, kiln, tvm, tvm_ffi._convert as c; assert c.torch is torch; print('ok')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
