"""After import, a torch.export program and a TFLite model go through the same Kiln pipeline as ONNX:
`--quantize int8` (calibrated post-training quantization onto Kiln's int8 kernels, the counts read from
the compile report) within a stated int8 tolerance of the float framework (eager PyTorch, the LiteRT
interpreter), and the arm64 cross-compile (`--target rpi5`: an aarch64 shared library, int8 on sdot)."""

import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch frontend needs the torch extra: pip install 'kiln[torch]'")
pytest.importorskip("tflite", reason="the TFLite frontend needs the tflite extra: pip install 'kiln[tflite]'")
pytest.importorskip("ai_edge_litert", reason="the reference is the LiteRT interpreter: pip install ai-edge-litert")

import tflite_models as tm  # noqa: E402

import kiln  # noqa: E402
from kiln.cli import main  # noqa: E402

# int8 tolerance against the float model: per-tensor activations and per-channel weights on a 3-conv net
# keep the largest error within 3% of the output's range (measured: 0.14% for the .pt2 net, 1.5% for the
# TFLite one) and the outputs' cosine similarity above 0.999
INT8_REL, INT8_COS = 0.03, 0.999
AARCH64_ELF = 183  # e_machine of an ELF built for arm64


class Net(torch.nn.Module):
    """conv(3->16) + BatchNorm + ReLU -> conv(16->32) -> conv(32->32) -> mean -> linear: the stem stays
    float (3 input channels), the two inner convs go to the int8 kernels."""

    def __init__(self):
        super().__init__()
        self.c0, self.bn = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16)
        self.c1, self.c2 = torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.Conv2d(32, 32, 3, padding=1)
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, x):
        x = torch.relu(self.c2(torch.relu(self.c1(torch.relu(self.bn(self.c0(x)))))))
        return self.fc(x.mean((2, 3)))


def _check_int8(got: np.ndarray, ref: np.ndarray) -> None:
    err = float(np.abs(got - ref).max())
    cos = float(np.sum(got * ref) / (np.linalg.norm(got) * np.linalg.norm(ref)))
    assert err <= INT8_REL * float(np.abs(ref).max()), (err, float(np.abs(ref).max()))
    assert cos > INT8_COS, cos


def _is_aarch64(art, dest) -> bool:
    assert main(["unpack", str(art), str(dest)]) == 0
    head = (dest / "model.so").read_bytes()[:20]
    return head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == AARCH64_ELF


@pytest.fixture(scope="module")
def pt2(tmp_path_factory):
    d = tmp_path_factory.mktemp("pt2")
    torch.manual_seed(0)
    m = Net().eval()
    data = np.random.default_rng(0).standard_normal((12, 3, 8, 8)).astype(np.float32)
    torch.export.save(torch.export.export(m, (torch.from_numpy(data[:1]),)), d / "net.pt2")
    np.savez(d / "calib.npz", x=data)  # the input's name comes from forward's signature
    with torch.no_grad():
        ref = m(torch.from_numpy(data)).numpy()
    return d, data, ref


@pytest.fixture(scope="module")
def tfl(tmp_path_factory):
    d = tmp_path_factory.mktemp("tfl")
    blob = tm.conv_stack(size=8)
    (d / "net.tflite").write_bytes(blob)
    data = np.random.default_rng(0).standard_normal((12, 8, 8, 3)).astype(np.float32)
    np.savez(d / "calib.npz", input=data)
    ref = np.concatenate([tm.litert_run(blob, [data[i : i + 1]])[0] for i in range(len(data))])
    return d, data, ref


def _quantized(model, calib, out, **kw):
    return kiln.compile(model, out, quantize="int8", calibration=calib, calib_samples=8, **kw)


def test_pt2_int8_matches_eager_within_int8_tolerance(pt2, tmp_path):
    d, data, ref = pt2
    r = _quantized(d / "net.pt2", d / "calib.npz", tmp_path / "q.kiln")
    q = r.report["quantization"]
    assert q["int8_layers"] == ["conv2d_1", "conv2d_2"] and "3->16" in q["float_layers"]["conv2d_0"]
    assert r.manifest["quantization"]["int8_layers"] == 2 and r.manifest["source"]["format"] == "pt2"
    kernels = r.manifest["buckets"][0]["kernel_info"]
    assert sum("conv2d_NCHWc_int8" in k or "conv2d_amx" in k for k in kernels) == 2  # VNNI or AMX tiles
    a = kiln.load(r.path)
    got = np.concatenate([a.run({"x": data[i : i + 1]})["linear"] for i in range(8, 12)])  # held out
    _check_int8(got, ref[8:])


def test_tflite_int8_matches_litert_float_within_int8_tolerance(tfl, tmp_path):
    d, data, ref = tfl
    r = _quantized(d / "net.tflite", d / "calib.npz", tmp_path / "q.kiln")
    q = r.report["quantization"]
    assert q["int8_layers"] == ["conv2d_1", "conv2d_2", "matmul_0"] and list(q["float_layers"]) == ["conv2d_0"]
    assert r.manifest["quantization"]["int8_layers"] == 3 and r.manifest["source"]["format"] == "tflite"
    a = kiln.load(r.path)
    got = np.concatenate([a.run({"input": data[i : i + 1]})["logits"] for i in range(8, 12)])
    _check_int8(got, ref[8:])


@pytest.mark.parametrize("kind", ["pt2", "tflite"])
def test_int8_cross_compiles_for_arm64(kind, pt2, tfl, tmp_path):
    if shutil.which("aarch64-linux-gnu-g++") is None:
        pytest.skip("linking for arm64 needs aarch64-linux-gnu-g++ (make edge-deps installs it)")
    d = (pt2 if kind == "pt2" else tfl)[0]
    r = _quantized(d / f"net.{kind}", d / "calib.npz", tmp_path / "arm.kiln", target="rpi5")
    q = r.report["quantization"]
    assert r.manifest["arch"] == "aarch64" and "cortex-a76" in r.manifest["target"]
    assert q["speed"]["int8_kernel"] == "dotprod" and len(q["int8_layers"]) == (2 if kind == "pt2" else 3)
    assert q["accuracy"]["measured_on"].startswith("host build")  # this x86 host cannot run the arm64 code
    assert _is_aarch64(r.path, tmp_path / "unpacked")
