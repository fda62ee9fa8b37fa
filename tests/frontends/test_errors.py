"""Bad models get a typed KilnError that says what, where and how to fix it."""

import numpy as np
import onnx
import pytest
from helpers import make_model, rand
from onnx import helper

import kiln


def test_truncated_onnx(tmp_path, small_conv_model):
    p = tmp_path / "t.onnx"
    data = small_conv_model.SerializeToString()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(kiln.ModelLoadError, match="not a readable ONNX model") as e:
        kiln.compile(p, tmp_path / "o.kiln", input_shapes=["input:1x3x8x8"])
    assert str(p) in str(e.value) and "re-export" in str(e.value)
    assert not (tmp_path / "o.kiln").exists()


def test_empty_and_missing_files(tmp_path):
    (tmp_path / "e.onnx").write_bytes(b"")
    with pytest.raises(kiln.ModelLoadError, match="no ONNX graph"):
        kiln.compile(tmp_path / "e.onnx", tmp_path / "o.kiln")
    with pytest.raises(kiln.ModelLoadError, match="no such model file"):
        kiln.compile(tmp_path / "nope.onnx", tmp_path / "o.kiln")


def test_every_unsupported_op_is_listed(tmp_path):
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="ok"),
        helper.make_node("StringNormalizer", ["a"], ["d"], name="sn_first"),
        helper.make_node("StringNormalizer", ["a"], ["d2"], name="sn_second"),
        helper.make_node("MyOp", ["a"], ["y"], name="custom_one", domain="com.example"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in ("d", "d2", "y")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    with pytest.raises(kiln.UnsupportedModelError) as e:
        kiln.compile(m, tmp_path / "o.kiln")
    ops = {(o["domain"], o["op_type"]): o for o in e.value.ops}
    assert set(ops) == {("ai.onnx", "StringNormalizer"), ("com.example", "MyOp")}
    assert (
        ops[("ai.onnx", "StringNormalizer")]["count"] == 2
        and ops[("ai.onnx", "StringNormalizer")]["first_node"] == "sn_first"
    )
    assert ops[("ai.onnx", "StringNormalizer")]["opset"] == 17 and ops[("com.example", "MyOp")]["opset"] == 1
    assert "StringNormalizer" in str(e.value) and "MyOp" in str(e.value) and "2 unsupported op type(s)" in str(e.value)


def test_unpinned_dynamic_dims_name_each_input_and_the_flag(tmp_path, small_conv_model):
    x = rand(2, 5)
    m2 = make_model(
        [helper.make_node("Add", ["a", "b"], ["y"])],
        {"a": x, "b": x},
        ["y"],
        in_shapes={"a": ["batch", 5], "b": ["batch", "len"]},
    )
    with pytest.raises(kiln.ShapeError) as e:
        kiln.compile(m2, tmp_path / "o.kiln")
    msg = str(e.value)
    assert "input 'a': dim 0 (batch)" in msg and "input 'b': dim 0 (batch), dim 1 (len)" in msg
    assert "--input-shape a:1x5" in msg and "--input-shape b:1x1" in msg


@pytest.mark.parametrize(
    "spec,match",
    [
        ("input:1x3x8", "rank 4"),
        ("input:1x4x8x8", "dim 1 is fixed at 3"),
        ("other:1x3x8x8", "unknown input"),
        ("input:1xAx8x8", "bad dimensions"),
        ("input1x3", "NAME:DIMS"),
    ],
)
def test_bad_pinned_shapes(tmp_path, small_conv_model, spec, match):
    with pytest.raises(kiln.ShapeError, match=match):
        kiln.compile(small_conv_model, tmp_path / "o.kiln", input_shapes=[spec])


def test_bad_target_lists_accepted_forms(tmp_path, small_conv_model):
    with pytest.raises(kiln.TargetError, match="use one of: host .* llvm -mcpu=NAME"):
        kiln.compile(small_conv_model, tmp_path / "o.kiln", input_shapes=["input:1x3x8x8"], target="gpu9000")


def test_external_data(tmp_path, small_conv_model, small_input):
    p = tmp_path / "ext" / "m.onnx"
    p.parent.mkdir()
    copy = onnx.ModelProto()
    copy.CopyFrom(small_conv_model)  # onnx.save with external data rewrites the proto in place
    onnx.save(
        copy, p, save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin", size_threshold=0
    )
    assert (p.parent / "weights.bin").stat().st_size > 0
    kiln.compile(p, tmp_path / "o.kiln", input_shapes=["input:1x3x8x8"])
    from helpers import ort_run

    np.testing.assert_allclose(
        kiln.load(tmp_path / "o.kiln").run(small_input)["output"],
        ort_run(small_conv_model, small_input)[0],
        rtol=1e-4,
        atol=1e-4,
    )
    (p.parent / "weights.bin").unlink()
    with pytest.raises(kiln.ModelLoadError, match="external weight data"):
        kiln.compile(p, tmp_path / "o2.kiln", input_shapes=["input:1x3x8x8"])
