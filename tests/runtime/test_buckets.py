"""Shape buckets: one function per bucket, the smallest bucket that holds the input, padding and
cropping, and errors that name the buckets. Numerics against onnxruntime on the same (padded or
exact) input."""

import numpy as np
import pytest
from helpers import make_model, ort_run, rand
from onnx import helper

import kiln
from kiln.frontends.shapes import parse_shape_buckets
from kiln.runtime import artifact as art


@pytest.fixture(scope="module")
def dyn_model():
    nodes = [
        helper.make_node("Conv", ["input", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["output"]),
    ]
    return make_model(
        nodes,
        {"input": rand(1, 3, 8, 8)},
        ["output"],
        {"w": rand(4, 3, 3, 3, seed=1), "b": rand(4, seed=2)},
        in_shapes={"input": ["N", 3, "H", "W"]},
    )


@pytest.fixture(scope="module")
def bucketed(tmp_path_factory, dyn_model):
    path = tmp_path_factory.mktemp("buckets") / "b.kiln"
    r = kiln.compile(dyn_model, path, shape_buckets="input:1x3x8x8,4x3x8x8,1x3x12x12")
    return path, r


def test_one_function_per_bucket_smallest_first_weights_shared(bucketed):
    path, r = bucketed
    m = r.manifest
    assert [b["name"] for b in m["buckets"]] == ["input:1x3x8x8", "input:1x3x12x12", "input:4x3x8x8"]
    manifest, members = art.read_artifact(path)
    libs = [b["library"] for b in manifest["buckets"]]
    assert len(set(libs)) == 3 and all(lib in members for lib in libs)
    n = len(manifest["buckets"][0]["weights"])
    assert n >= 1 and len(manifest["weights"]) == n  # the conv weight, stored once for three buckets
    assert all(b["weights"] == manifest["buckets"][0]["weights"] for b in manifest["buckets"])
    assert [b["outputs"][0]["shape"] for b in manifest["buckets"]] == [[1, 4, 8, 8], [1, 4, 12, 12], [4, 4, 8, 8]]


@pytest.mark.parametrize(
    "shape, bucket",
    [
        ((1, 3, 8, 8), 0),
        ((4, 3, 8, 8), 2),
        ((1, 3, 12, 12), 1),
        ((3, 3, 8, 8), 2),
        ((2, 3, 8, 8), 2),
        ((1, 3, 10, 9), 1),
    ],
)
def test_bucket_outputs_match_onnxruntime_on_padded_input(bucketed, dyn_model, shape, bucket):
    path, _ = bucketed
    model = kiln.load(path)
    x = rand(*shape, seed=sum(shape))
    assert model.select([x]) == bucket
    out = model.run({"input": x})["output"]
    assert out.shape == (shape[0], 4) + shape[2:]  # cropped back to the request
    big = model.buckets[bucket].inputs[0].shape
    ref = ort_run(dyn_model, {"input": np.pad(x, [(0, b - n) for n, b in zip(shape, big)])})[0]
    np.testing.assert_allclose(out, ref[: shape[0], :, : shape[2], : shape[3]], rtol=1e-4, atol=1e-4)
    if shape == big:  # exact bucket: also equal to onnxruntime on the unpadded input
        np.testing.assert_allclose(out, ort_run(dyn_model, {"input": x})[0], rtol=1e-4, atol=1e-4)


def test_wrong_size_input_names_the_buckets(bucketed):
    path, _ = bucketed
    with pytest.raises(
        kiln.InputError, match=r"larger than every bucket.*input:1x3x8x8, input:1x3x12x12, input:4x3x8x8"
    ):
        kiln.load(path).run({"input": rand(5, 3, 8, 8)})
    with pytest.raises(kiln.InputError, match=r"not one of the buckets \(bucket policy 'error'\).*input:4x3x8x8"):
        kiln.load(path, bucket_policy="error").run({"input": rand(3, 3, 8, 8)})
    with pytest.raises(kiln.InputError, match="rank 3"):
        kiln.load(path).run({"input": rand(3, 8, 8)})
    with pytest.raises(kiln.OptionsError, match="pad, error"):
        kiln.load(path, bucket_policy="crop")


def test_warmup_runs_every_bucket_at_load(bucketed):
    model = kiln.load(bucketed[0], warmup=True)
    assert len(model.warmup_ms) == 3 and all(t > 0 for t in model.warmup_ms)
    assert kiln.load(bucketed[0]).warmup_ms == []


def test_bucket_policy_error_is_kept_in_the_manifest(tmp_path, dyn_model):
    r = kiln.compile(dyn_model, tmp_path / "e.kiln", shape_buckets=["input:1x3x8x8,2x3x8x8"], bucket_policy="error")
    assert r.manifest["bucket_policy"] == "error" and r.manifest["compile_options"]["bucket_policy"] == "error"
    with pytest.raises(kiln.InputError, match="bucket policy 'error'"):
        kiln.load(tmp_path / "e.kiln").run({"input": rand(1, 3, 6, 6)})


@pytest.mark.parametrize(
    "spec, msg",
    [
        ("input", "bad shape buckets"),
        ("input:1x3,1x3", "twice"),
        ("input:1x3,1x3x4", "different ranks"),
        ("a:1x3,2x3;b:4", "different numbers"),
        ("input:0x3", "positive"),
    ],
)
def test_bad_bucket_specs(spec, msg):
    with pytest.raises(kiln.ShapeError, match=msg):
        parse_shape_buckets(spec)


def test_bucketed_input_cannot_also_be_pinned(dyn_model, tmp_path):
    with pytest.raises(kiln.OptionsError, match="both --input-shape and --shape-buckets"):
        kiln.compile(
            dyn_model, tmp_path / "x.kiln", input_shapes=["input:1x3x8x8"], shape_buckets="input:2x3x8x8,4x3x8x8"
        )


def test_cli_compile_with_buckets_and_inspect(tmp_path, dyn_model, capsys):
    import onnx

    from kiln.cli import main

    onnx.save(dyn_model, tmp_path / "m.onnx")
    assert (
        main(
            [
                "compile",
                str(tmp_path / "m.onnx"),
                "-o",
                str(tmp_path / "m.kiln"),
                "--shape-buckets",
                "input:1x3x8x8,2x3x8x8",
                "--bucket-policy",
                "error",
            ]
        )
        == 0
    )
    assert main(["inspect", str(tmp_path / "m.kiln")]) == 0
    assert "buckets  input:1x3x8x8, input:2x3x8x8 (policy error)" in capsys.readouterr().out
