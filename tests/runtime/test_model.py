"""Running an artifact: input validation, threads, and the runtime-only guarantee."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import aligned, ort_run

import kiln
from kiln.runtime.model import COPY_BELOW


def test_run_matches_onnxruntime(small_artifact, small_conv_model, small_input):
    m = kiln.load(small_artifact, num_threads=1)
    out = m.run(small_input)
    assert list(out) == ["output"]
    np.testing.assert_allclose(out["output"], ort_run(small_conv_model, small_input)[0], rtol=1e-5, atol=1e-5)
    assert "small.kiln" in repr(m) and "input:1x3x8x8:float32" in repr(m)


@pytest.mark.parametrize(
    "feed,match,fix",
    [
        (
            {"inp": np.zeros((1, 3, 8, 8), np.float32)},
            r"missing \['input'\]; unknown \['inp'\]",
            "inputs are ['input']",
        ),
        ({}, r"missing \['input'\]", "inputs are"),
        (
            {"input": np.zeros((1, 3, 8, 9), np.float32)},
            "shape 1x3x8x9, the model was compiled for 1x3x8x8",
            "--input-shape input:1x3x8x9",
        ),
        (
            {"input": np.zeros((1, 3, 8, 8), np.float64)},
            "dtype float64, the model expects float32",
            "astype('float32')",
        ),
    ],
)
def test_bad_inputs(small_artifact, feed, match, fix):
    with pytest.raises(kiln.InputError, match=match) as e:
        kiln.load(small_artifact).run(feed)
    assert fix in str(e.value)


def test_bad_num_threads(small_artifact):
    with pytest.raises(kiln.OptionsError, match="num_threads"):
        kiln.load(small_artifact, num_threads=0)


def test_default_threads_is_physical_cores(small_artifact):
    from kiln.runtime.hostinfo import physical_cores

    assert kiln.load(small_artifact).num_threads == physical_cores() >= 1


PROBE = """
import json, sys
import numpy as np
import kiln
m = kiln.load(sys.argv[1], num_threads=1)
out = m.run({"input": np.load(sys.argv[2])})["output"]
maps = open("/proc/self/maps").read()
print(json.dumps({"compiler_lib": "libtvm_compiler" in maps, "runtime_lib": "libtvm_runtime" in maps,
                  "kiln_compiler": any(k.startswith(("kiln.compiler", "kiln.frontends")) for k in sys.modules),
                  "relax": "tvm.relax" in sys.modules, "sum": float(out.sum())}))
"""


def test_runtime_loads_without_the_compiler(tmp_path, small_artifact, small_input):
    np.save(tmp_path / "x.npy", small_input["input"])
    r = subprocess.run(
        [sys.executable, "-c", PROBE, str(small_artifact), str(tmp_path / "x.npy")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert info == {
        "compiler_lib": False,
        "runtime_lib": True,
        "kiln_compiler": False,
        "relax": False,
        "sum": pytest.approx(float(kiln.load(small_artifact).run(small_input)["output"].sum()), rel=1e-5),
    }


def test_runtime_sources_never_import_the_compiler():
    pkg = Path(kiln.__file__).parent
    accel_runtime = [
        pkg / "accel" / "vta" / f for f in ("runtime.py", "sim.py", "isa.py", "config.py")
    ]  # loaded by kiln.load
    for f in [
        *(pkg / "runtime").rglob("*.py"),
        *(pkg / "serve").rglob("*.py"),
        *accel_runtime,
    ]:  # the server runs on the runtime only
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                mod = ("." * node.level) + (node.module or "")
                assert not any(x in mod for x in ("compiler", "frontends", "target")), f"{f}: imports {mod}"
            elif isinstance(node, ast.Import):
                assert not any(
                    a.name.startswith(("kiln.compiler", "kiln.frontends", "tvm.relax")) for a in node.names
                ), f


def test_cpu_model_name_is_the_one_proc_cpuinfo_gives():
    """Every benchmark names its CPU through hostinfo.cpu_model_name (once seven copies of the same lookup)."""
    from kiln.runtime.hostinfo import cpu_model_name

    name = cpu_model_name()
    assert isinstance(name, str) and name
    try:
        lines = open("/proc/cpuinfo").read().split("\n\n")[0].splitlines()
    except OSError:
        lines = []
    field = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
    if field.get("model name"):
        assert name.startswith(field["model name"])
    if field.get("cpu family") and field.get("model"):  # x86: a VM's "AMD EPYC" names Zen 3 and Zen 4 alike
        assert name.endswith(f" (family {field['cpu family']} model {field['model']})")


def test_inputs_at_any_alignment_and_reused_buffers_give_the_right_outputs(small_artifact, small_conv_model):
    """Model._argument copies a small input (under COPY_BELOW bytes, as this one is) into a buffer it keeps per
    input, at any alignment: every alignment gives onnxruntime's result, a kept buffer never leaks one run's input
    into the next, and an output is the caller's own (a later run or input change does not alter it)."""
    m = kiln.load(small_artifact, num_threads=1)
    rng = np.random.default_rng(0)
    results = []
    for offset in range(0, 64, 4):  # bytes past a 64-byte boundary: 0 is the no-copy path
        raw = np.empty(3 * 8 * 8 + 32, np.float32)
        start = (-raw.ctypes.data % 64 + offset) // 4
        x = raw[start : start + 3 * 8 * 8].reshape(1, 3, 8, 8)
        x[...] = rng.standard_normal(x.shape)
        assert x.ctypes.data % 64 == offset and x.nbytes < COPY_BELOW
        out = m.run({"input": x})["output"]
        ref = ort_run(small_conv_model, {"input": x})[0]
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
        results.append((out, ref))
        x[...] = 0  # the caller reuses its array: the output already returned must not change
    for out, ref in results:
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def _relu(tmp_path, shape):
    """A one-Relu model (a kernel of TVM's reads its input), loaded on one thread."""
    from helpers import make_model
    from onnx import helper

    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": np.zeros(shape, np.float32)}, ["y"], {})
    kiln.compile(model, tmp_path / "r.kiln")
    return kiln.load(tmp_path / "r.kiln", num_threads=1)


def test_a_large_aligned_input_is_taken_without_a_copy(tmp_path):
    """An input of COPY_BELOW bytes or more is taken over DLPack when 64-byte aligned (no staged buffer) and
    copied when not; both give the same result, and the caller's later writes do not reach the output."""
    shape = (1, 16, 32, 32)  # 64 KiB
    m = _relu(tmp_path, shape)
    rng = np.random.default_rng(1)
    for offset, staged in ((0, False), (16, True)):
        x = aligned(rng.standard_normal(shape).astype(np.float32), offset)
        assert x.nbytes >= COPY_BELOW and x.ctypes.data % 64 == offset
        m._staging.clear()
        y = m.run({"x": x})["y"]
        assert bool(m._staging) is staged
        np.testing.assert_array_equal(y, np.maximum(x, 0))
        x[...] = -1
        assert (y >= 0).all() and y.any()


@pytest.mark.parametrize("offset", [0, 16])
def test_a_read_only_input_is_copied_not_refused(tmp_path, offset):
    """numpy exports no read-only array over DLPack (np.load with mmap_mode, np.frombuffer of a request's bytes): such
    an input, aligned or not, is copied into the staged buffer; taken in place it failed the run as a Kiln bug."""
    shape = (1, 16, 32, 32)  # 64 KiB: an aligned writable one would be taken in place
    m = _relu(tmp_path, shape)
    x = aligned(np.random.default_rng(2).standard_normal(shape).astype(np.float32), offset)
    x.flags.writeable = False
    np.testing.assert_array_equal(m.run({"x": x})["y"], np.maximum(x, 0))
    assert m._staging


def test_an_output_that_is_an_input_is_a_copy(tmp_path):
    """Outputs leave the VM as DLPack views, copied where a view would be shared (outputs.OutputViews; past a
    bucket's first runs: tests/runtime/test_outputs.py): a graph that returns an input as it is, beside
    a computed output of each dtype numpy takes, gives arrays of its own that the caller's later writes to the
    input do not change."""
    from helpers import make_model
    from onnx import helper

    nodes = [
        helper.make_node("Identity", ["x"], ["same"]),
        helper.make_node("Greater", ["x", "zero"], ["pos"]),
        helper.make_node("Cast", ["x"], ["i"], to=7),  # int64
    ]
    x = np.array([[1.5, -2.0, 3.25]], np.float32)
    model = make_model(nodes, {"x": x}, ["same", "pos", "i"], {"zero": np.zeros(1, np.float32)})
    kiln.compile(model, tmp_path / "m.kiln")
    m = kiln.load(tmp_path / "m.kiln", num_threads=1)
    feed = x.copy()
    out = m.run({"x": feed})
    feed[...] = 7
    np.testing.assert_array_equal(out["same"], x)
    np.testing.assert_array_equal(out["pos"], [[True, False, True]])
    np.testing.assert_array_equal(out["i"], [[1, -2, 3]])
    assert out["pos"].dtype == np.bool_ and out["i"].dtype == np.int64
    assert not any(np.shares_memory(a, feed) for a in out.values())
