"""The PyTorch frontend: torch.export programs (.pt2 files and nn.Modules traced by kiln.compile) through
the Kiln pipeline, each matched against eager PyTorch (rtol/atol 1e-4); symbolic dims pinned and
bucketed; every unsupported ATen op listed at once; typed errors for damaged and mismatched files."""

import json
import zipfile

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch frontend needs the torch extra: pip install 'kiln[torch]'")

import kiln  # noqa: E402
from kiln.frontends import pytorch  # noqa: E402

TOL = {"rtol": 1e-4, "atol": 1e-4}


class CNN(torch.nn.Module):
    """Conv -> BatchNorm -> ReLU -> strided conv -> global pool -> linear (BatchNorm folded by Kiln)."""

    def __init__(self):
        super().__init__()
        self.c1, self.bn = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.c2, self.fc = torch.nn.Conv2d(8, 16, 3, stride=2), torch.nn.Linear(16, 5)

    def forward(self, x):
        return self.fc(self.c2(torch.relu(self.bn(self.c1(x)))).mean((2, 3)))


class Block(torch.nn.Module):
    """A pre-norm transformer encoder block (multi-head attention + GELU MLP)."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.att = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.att(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Recurrent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(6, 12, num_layers=1, batch_first=True)

    def forward(self, x):
        y, (h, c) = self.lstm(x)
        return y, h


def _eager(m, *xs):
    with torch.no_grad():
        out = m(*xs)
    return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]


def _seeded(m):
    torch.manual_seed(0)
    m = m.eval()
    for p in m.parameters():
        torch.nn.init.uniform_(p, -0.5, 0.5)
    return m


@pytest.fixture(scope="module")
def cnn():
    m = _seeded(CNN())
    with torch.no_grad():
        m.bn.running_mean.uniform_(-1, 1)
        m.bn.running_var.uniform_(0.5, 2.0)
    return m


@pytest.fixture(scope="module")
def block_pt2(tmp_path_factory):
    m = _seeded(Block())
    seq = torch.export.Dim("seq", min=2, max=64)
    ep = torch.export.export(m, (torch.randn(1, 8, 32),), dynamic_shapes={"x": {1: seq}})
    path = tmp_path_factory.mktemp("pt") / "block.pt2"
    torch.export.save(ep, path)
    return m, path


def test_cnn_with_batchnorm_from_a_pt2_matches_eager(cnn, tmp_path):
    x = torch.randn(2, 3, 16, 16)
    path = tmp_path / "cnn.pt2"
    torch.export.save(torch.export.export(cnn, (x,)), path)
    r = kiln.compile(path, tmp_path / "cnn.kiln")
    src = r.manifest["source"]
    assert src["format"] == "pt2" and src["framework"]["name"] == "torch"
    assert src["framework"]["saved_by"] == torch.__version__
    assert [i["name"] for i in r.manifest["inputs"]] == ["x"]  # the program's signature
    assert r.report["batchnorm_folded"] == r.report["batchnorm_total"] == 1  # the same FoldBatchNorm as for ONNX
    out = list(kiln.load(r.path).run({"x": x.numpy()}).values())
    np.testing.assert_allclose(out[0], _eager(cnn, x)[0], **TOL)


def test_compile_an_nn_module_with_example_inputs(cnn, tmp_path):
    x = torch.randn(1, 3, 12, 12)
    r = kiln.compile(cnn, tmp_path / "m.kiln", example_inputs=(x,))
    assert r.manifest["source"]["format"] == "pt2"
    names = [str(o) for o in torch.export.export(cnn, (x,)).graph_signature.user_outputs]
    assert [o["name"] for o in r.manifest["outputs"]] == names
    np.testing.assert_allclose(kiln.load(r.path).run({"x": x.numpy()})[names[0]], _eager(cnn, x)[0], **TOL)


def test_transformer_block_dynamic_sequence_pinned(block_pt2, tmp_path):
    m, path = block_pt2
    with pytest.raises(kiln.ShapeError, match="must be pinned.*--input-shape x:1x1x32"):
        kiln.compile(path, tmp_path / "no.kiln")
    with pytest.raises(kiln.ShapeError, match="outside the range"):
        kiln.compile(path, tmp_path / "no.kiln", input_shapes=["x:1x100x32"])
    x = torch.randn(1, 20, 32)
    r = kiln.compile(path, tmp_path / "pinned.kiln", input_shapes=["x:1x20x32"])
    assert r.manifest["inputs"][0]["shape"] == [1, 20, 32]
    np.testing.assert_allclose(list(kiln.load(r.path).run({"x": x.numpy()}).values())[0], _eager(m, x)[0], **TOL)


def test_transformer_block_dynamic_sequence_bucketed(block_pt2, tmp_path):
    m, path = block_pt2
    r = kiln.compile(path, tmp_path / "b.kiln", shape_buckets=["x:1x8x32,1x16x32"])
    assert [b["name"] for b in r.manifest["buckets"]] == ["x:1x8x32", "x:1x16x32"]
    art = kiln.load(r.path)
    for n in (8, 16):
        x = torch.randn(1, n, 32)
        np.testing.assert_allclose(list(art.run({"x": x.numpy()}).values())[0], _eager(m, x)[0], **TOL)


def test_lstm_matches_eager(tmp_path):
    m = _seeded(Recurrent())
    x = torch.randn(2, 5, 6)
    r = kiln.compile(m, tmp_path / "lstm.kiln", example_inputs=(x,))
    outs = list(kiln.load(r.path).run({"x": x.numpy()}).values())
    assert len(outs) == 2
    for got, want in zip(outs, _eager(m, x)):
        np.testing.assert_allclose(got, want, **TOL)


class Unsupported(torch.nn.Module):
    def forward(self, x):
        return torch.special.i1e(torch.fft.fft(x).abs()) + torch.special.i1(x)


def test_unsupported_aten_ops_are_listed_at_once(tmp_path):
    with pytest.raises(kiln.UnsupportedModelError) as e:
        kiln.compile(Unsupported(), tmp_path / "u.kiln", example_inputs=(torch.randn(4, 8),))
    ops = {o["op_type"] for o in e.value.ops}
    assert len(ops) >= 2, ops  # several missing ops in one error, not the first one alone
    assert all(o["count"] >= 1 and o["first_node"] for o in e.value.ops)
    assert "unsupported op type(s)" in str(e.value)


def test_damaged_and_mismatched_pt2_files_are_typed_errors(cnn, tmp_path):
    path = tmp_path / "cnn.pt2"
    torch.export.save(torch.export.export(cnn, (torch.randn(1, 3, 8, 8),)), path)
    blob = path.read_bytes()
    (tmp_path / "trunc.pt2").write_bytes(blob[: len(blob) // 2])
    (tmp_path / "junk.pt2").write_bytes(b"\x00not a zip at all")
    (tmp_path / "cnn.onnx").write_bytes(blob)  # a .pt2 under an .onnx name
    for name, pattern in [
        ("trunc.pt2", "torch.export|zip"),
        ("junk.pt2", "torch.export|zip"),
        ("cnn.onnx", "suffix says ONNX but its content is PyTorch"),
    ]:
        with pytest.raises(kiln.ModelLoadError, match=pattern) as e:
            kiln.compile(tmp_path / name, tmp_path / "o.kiln")
        assert name in str(e.value)


def test_a_pt2_from_another_export_schema_names_both_versions(cnn, tmp_path):
    path = tmp_path / "cnn.pt2"
    torch.export.save(torch.export.export(cnn, (torch.randn(1, 3, 8, 8),)), path)
    old = tmp_path / "old.pt2"
    with zipfile.ZipFile(path) as z, zipfile.ZipFile(old, "w") as out:
        for n in z.namelist():
            data = z.read(n)
            if n.endswith("models/model.json"):
                doc = json.loads(data)
                doc["schema_version"], doc["torch_version"] = {"major": 1, "minor": 0}, "1.13.0"
                data = json.dumps(doc).encode()
            out.writestr(n, data)
    with pytest.raises(kiln.ModelLoadError, match="torch 1.13.0 with export schema 1.0") as e:
        kiln.compile(old, tmp_path / "o.kiln")
    assert "re-export" in str(e.value)


def test_missing_torch_names_the_extra(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_torch(name, *a, **kw):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("no torch")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    with pytest.raises(kiln.MissingExtraError, match=r"pip install 'kiln\[torch\]'"):
        pytorch.require_torch("m.pt2")


def test_inspect_a_pt2(block_pt2):
    from kiln.describe import format_text, inspect_path

    info = inspect_path(block_pt2[1])
    assert "frontend PyTorch (tvm.relax.frontend.torch)" in format_text(info)
    assert info["format"] == "pt2" and info["inputs"][0]["name"] == "x"
    assert isinstance(info["inputs"][0]["shape"][1], str)  # the symbolic sequence length
    assert info["unsupported_ops"] == [] and info["nodes"] > 10
