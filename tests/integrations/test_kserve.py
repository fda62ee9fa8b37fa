"""kiln.integrations.kserve: KServe's ModelServer with KilnModel, driven by KServe's own client in a
subprocess (a Python with kserve: KILN_KSERVE_PYTHON, else this one). Results equal kiln.load().run;
the V2 metadata comes from the artifact (-1 for the batch dim that differs across buckets)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import batchable_conv, rand

import kiln

ROOT = Path(__file__).resolve().parents[2]


def _python() -> str:
    py = os.environ.get("KILN_KSERVE_PYTHON", sys.executable)
    if subprocess.run([py, "-c", "import kserve"], capture_output=True).returncode:
        pytest.skip("no Python with kserve: pip install 'kiln[kserve]', or set KILN_KSERVE_PYTHON")
    return py


def test_kserve_client_against_kiln_model(tmp_path):
    py = _python()
    m = batchable_conv()
    kiln.compile(m, tmp_path / "net.kiln", shape_buckets="input:1x3x8x8,2x3x8x8")
    x = rand(2, 3, 8, 8, seed=4)
    np.save(tmp_path / "x.npy", x)
    site = [p for p in sys.path if p.endswith("site-packages")]  # Kiln's own dependencies (TVM) for that Python
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *site])}
    run = subprocess.run(
        [py, str(Path(__file__).with_name("kserve_client.py")), str(tmp_path / "net.kiln"), str(tmp_path / "x.npy")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    line = [s for s in run.stdout.splitlines() if s.startswith("RESULT ")]
    assert line, run.stderr[-3000:]
    got = json.loads(line[0].removeprefix("RESULT "))
    assert got["id"] == "k1" and got["ready"]
    assert got["metadata"]["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 8, 8]}]
    want = kiln.load(tmp_path / "net.kiln").run({"input": x})["output"]
    np.testing.assert_allclose(np.asarray(got["output"], np.float32), want, rtol=1e-6, atol=1e-6)
