"""The TFLite frontend: a float and a full-integer TFLite model made by code (tflite_models.py: LiteRT's
schema and LiteRT's own quantizer) through the Kiln pipeline, matched against the LiteRT interpreter;
the int8 model's convs and matmuls on Kiln's integer kernels (LowerQDQ); unsupported builtins listed
at once; typed errors for damaged, truncated and mismatched files and for a missing extra."""

import numpy as np
import pytest

pytest.importorskip("tflite", reason="the TFLite frontend needs the tflite extra: pip install 'kiln[tflite]'")
pytest.importorskip("ai_edge_litert", reason="the reference is the LiteRT interpreter: pip install ai-edge-litert")

import tflite_models as tm

import kiln
from kiln.frontends import tflite as kt


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tfl")
    rng = np.random.default_rng(2)
    fp = tm.cnn()
    q = tm.quantize_full_integer(fp, [rng.standard_normal((1, 16, 16, 3)).astype(np.float32) for _ in range(16)])
    (d / "float.tflite").write_bytes(fp)
    (d / "int8.tflite").write_bytes(q)
    return d


def _x(seed=3):
    return np.random.default_rng(seed).standard_normal((1, 16, 16, 3)).astype(np.float32)


def test_float_model_matches_litert(models, tmp_path):
    r = kiln.compile(models / "float.tflite", tmp_path / "f.kiln")
    src = r.manifest["source"]
    assert src["format"] == "tflite" and src["framework"]["schema_version"] == 3
    assert src["framework"]["description"] == "kiln test model"
    assert [i["name"] for i in r.manifest["inputs"]] == ["input"]
    assert [o["name"] for o in r.manifest["outputs"]] == ["probs"]
    assert r.manifest["import_stats"]["tflite_nhwc_convs"] == 2  # put in NCHW for Kiln's layout passes
    from kiln.cli.build import _frontend_line

    assert _frontend_line(r.manifest["source"]) == "frontend TFLite (tvm.relax.frontend.tflite): tflite schema 3"
    x = _x()
    got = kiln.load(r.path).run({"input": x})["probs"]
    np.testing.assert_allclose(got, tm.litert_run((models / "float.tflite").read_bytes(), [x])[0], rtol=1e-4, atol=1e-4)


def test_full_integer_model_runs_on_int8_kernels_and_matches_litert(models, tmp_path):
    blob = (models / "int8.tflite").read_bytes()
    r = kiln.compile(models / "int8.tflite", tmp_path / "q.kiln")
    assert r.manifest["inputs"][0]["dtype"] == "int8" and r.manifest["outputs"][0]["dtype"] == "int8"
    # the conv and the fully-connected layer become uint8 x int8 -> int32 layers (the depthwise conv stays
    # fake-quant); a CPU whose int8 kernel would not beat float32 keeps them float (qdq_kept_float)
    assert r.report["qdq_lowered"] + r.report.get("qdq_kept_float", 0) == 2
    assert r.manifest["import_stats"]["tflite_pools_rounded"] == 1  # TFLite's rounded mean, not a truncated one
    if r.report["qdq_lowered"] == 2:
        kernels = r.manifest["buckets"][0]["kernel_info"]
        # the conv (a 3-channel stem, padded to 4 input channels) on the blocked int8 kernel (VNNI, pmaddubsw or
        # sdot: conv2d_NCHWc_int8; AMX hosts: the tile conv), the classifier (10 columns) padded to the int8
        # kernel's lanes: no generic int8 conv or matmul is left
        kinds = {v["kind"] for v in kernels.values()}
        assert kinds & {"conv2d_int8", "conv2d_amx"} and any("matmul_int8" in k for k in kernels)
        assert not any("matmul_cast" in k or k.startswith("fused_conv2d_cast") for k in kernels), list(kernels)
    art = kiln.load(r.path)
    diffs = []
    for seed in range(4):
        x = tm.quantize_input(blob, _x(seed))
        got = art.run({"input": x})["probs"].astype(np.int32)
        want = tm.litert_run(blob, [x])[0].astype(np.int32)
        diffs.append(np.abs(got - want))
    diffs = np.concatenate([d.ravel() for d in diffs])
    assert diffs.max() <= 1  # LiteRT requantizes in fixed point, Kiln in float: one step apart at most
    assert (diffs == 0).mean() >= 0.9  # 0.97 measured


def test_dynamic_batch_must_be_pinned(tmp_path):
    p = tmp_path / "dyn.tflite"
    p.write_bytes(tm.cnn(batch_signature=-1))
    with pytest.raises(kiln.ShapeError, match=r"must be pinned.*--input-shape input:1x16x16x3"):
        kiln.compile(p, tmp_path / "d.kiln")
    with pytest.raises(kiln.ShapeError, match="static dims"):
        kiln.compile(p, tmp_path / "d.kiln", input_shapes=["input:1x8x16x3"])
    r = kiln.compile(p, tmp_path / "d.kiln", input_shapes=["input:1x16x16x3"])
    assert r.manifest["inputs"][0]["shape"] == [1, 16, 16, 3]


def test_unsupported_builtins_are_listed_at_once(tmp_path):
    p = tmp_path / "u.tflite"
    p.write_bytes(tm.unsupported())
    with pytest.raises(kiln.UnsupportedModelError) as e:
        kiln.compile(p, tmp_path / "u.kiln")
    ops = {o["op_type"]: o["count"] for o in e.value.ops}
    assert ops == {"CUSTOM:KilnMystery": 1, "DYNAMIC_UPDATE_SLICE": 2, "SKIP_GRAM": 1}
    assert "3 unsupported op type(s)" in str(e.value) and "u.tflite" in str(e.value)


def test_damaged_truncated_and_mismatched_files_are_typed_errors(models, tmp_path):
    blob = (models / "float.tflite").read_bytes()
    cases = {
        "trunc.tflite": blob[: len(blob) // 3],
        "noident.tflite": blob[:4] + b"XXXX" + blob[8:],
        "tiny.tflite": b"\x01\x02",
        "model.onnx": blob,  # a TFLite file under an .onnx name
    }
    bad = bytearray(blob)
    bad[8:40] = b"\xff" * 32  # the root table's vtable offsets
    cases["damaged.tflite"] = bytes(bad)
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(kiln.ModelLoadError) as e:
            kiln.compile(tmp_path / name, tmp_path / "o.kiln")
        assert name in str(e.value) and "->" in str(e.value), str(e.value)
    with pytest.raises(kiln.ModelLoadError, match="suffix says ONNX but its content is TFLite"):
        kiln.compile(tmp_path / "model.onnx", tmp_path / "o.kiln")


def test_missing_tflite_names_the_extra(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_tflite(name, *a, **kw):
        if name == "tflite" or name.startswith("tflite."):
            raise ImportError("no tflite")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_tflite)
    with pytest.raises(kiln.MissingExtraError, match=r"pip install 'kiln\[tflite\]'"):
        kt.require_tflite("m.tflite")


def test_inspect_a_tflite(models):
    from kiln.describe import format_text, inspect_path

    info = inspect_path(models / "int8.tflite")
    assert "frontend TFLite (tvm.relax.frontend.tflite)" in format_text(info)
    assert info["format"] == "tflite" and info["inputs"][0]["dtype"] == "int8"
    assert info["op_histogram"]["CONV_2D"] == 1 and info["unsupported_ops"] == []


def test_sparse_float16_weight_densify_then_dequantize(tmp_path):
    # MediaPipe's full-range face and pose detectors store weights sparse in float16; TVM 0.27's
    # DEQUANTIZE read the densified weight's empty buffer and raised TypeError (tflite_ops.py)
    blob, dense = tm.sparse_fp16_fc()
    (tmp_path / "sparse.tflite").write_bytes(blob)
    r = kiln.compile(tmp_path / "sparse.tflite", tmp_path / "s.kiln")
    x = _x(5).reshape(-1)[:8].reshape(1, 8)
    got = kiln.load(r.path).run({"x": x})["y"]
    np.testing.assert_allclose(got, tm.litert_run(blob, [x])[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, x @ dense.T, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kernel,stride,same", [(3, 2, True), (4, 2, True), (2, 2, False), (3, 1, True)])
def test_mediapipe_transpose_conv_bias_custom_op(kernel, stride, same, tmp_path):
    # MediaPipe's selfie segmentation upsamples with this custom op (LiteRT registers it): its padding is
    # TFLite's SAME/VALID with the output tensor's size (tflite_ops.py)
    blob = tm.transpose_conv_bias(kernel, stride, same)
    (tmp_path / "t.tflite").write_bytes(blob)
    r = kiln.compile(tmp_path / "t.tflite", tmp_path / "t.kiln")
    x = np.random.default_rng(kernel).standard_normal((1, 5, 5, 4)).astype(np.float32)
    want = tm.litert_run(blob, [x])[0]
    got = kiln.load(r.path).run({"x": x})["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_expand_dims(axis, tmp_path):
    # TVM 0.27 passed Relay's num_newaxis to Relax's expand_dims: every EXPAND_DIMS raised TypeError
    blob = tm.expand_dims(axis)
    (tmp_path / "e.tflite").write_bytes(blob)
    r = kiln.compile(tmp_path / "e.tflite", tmp_path / "e.kiln")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = kiln.load(r.path).run({"x": x})["y"]
    want = tm.litert_run(blob, [x])[0]
    assert got.shape == want.shape == np.expand_dims(x, axis).shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("batch,via", [(1, "slice"), (3, "slice"), (1, "split"), (3, "split")])
def test_shape_arithmetic_of_a_pinned_batch_folds(batch, via, tmp_path):
    # TFLiteConverter writes a Keras reshape under a dynamic batch as SHAPE -> STRIDED_SLICE -> PACK ->
    # RESHAPE (EfficientNet, MobileNetV3); TVM 0.27 failed on the computed shape. Kiln pins the batch and
    # folds the integer chain to a constant: from the pinned shape, not the flatbuffer's batch of 1; a
    # multi-output op in the chain (SPLIT, as BirdNET's STFT framing has) folds output by output
    blob = tm.dynamic_batch_reshape(via=via)
    (tmp_path / "r.tflite").write_bytes(blob)
    r = kiln.compile(tmp_path / "r.tflite", tmp_path / "r.kiln", input_shapes=[f"x:{batch}x8"])
    x = np.arange(batch * 8, dtype=np.float32).reshape(batch, 8)
    got = kiln.load(r.path).run({"x": x})["y"]
    np.testing.assert_array_equal(got, x.reshape(batch, 1, 1, 8))
    if batch == 1:
        np.testing.assert_array_equal(got, tm.litert_run(blob, [x])[0])
