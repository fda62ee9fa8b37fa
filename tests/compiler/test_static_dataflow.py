"""StaticDataflow: a graph TVM's importer leaves outside dataflow blocks (an If anywhere in it: torchvision's
detection exports) still gets constant folding, layout conversion and fusion in its statically shaped part, and the
run-time-sized part after NonZero compiles as before. Regression for FasterRCNN / RetinaNet / SSDlite
(901 kernels, no folding: 124 -> 71 ms with the dynamic matmul packing). The model also has what broke
TVM's passes once that part was in dataflow blocks: a one-piece Split (here), a Stack
(test_stack_is_kept_from_convert_layout) and a dynamic slice (FasterRCNN's box decoding)."""

import numpy as np
import pytest
from helpers import make_model, ort_run, rand
from onnx import helper
from tvm import relax

import kiln
from kiln.compiler.ir import calls
from kiln.compiler.passes import StaticDataflow
from kiln.frontends.importer import import_onnx

pytestmark = pytest.mark.filterwarnings("error::kiln.errors.KilnWarning")  # a failed optional pass is skipped


def _branch(op, x):
    out = helper.make_tensor_value_info("b_" + op, 1, None)
    return helper.make_graph([helper.make_node(op, [x], ["b_" + op])], op, [], [out])


def _model():
    N = helper.make_node
    nodes = [
        N("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        N("BatchNormalization", ["c", "gam", "be", "m", "v"], ["bn"]),
        N("Relu", ["bn"], ["r"]),
        N("Conv", ["r", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        N("Split", ["c2"], ["one"], axis=0),  # one piece: TVM types it as the tensor itself
        N("ReduceMean", ["one"], ["feat"], axes=[2, 3], keepdims=0),  # [1, 32]
        N("Reshape", ["r", "shape"], ["rows"]),  # [16*16, 16]: one row per pixel
        N("ReduceMax", ["rows"], ["score"], axes=[1], keepdims=0),
        N("Greater", ["score", "t"], ["keep"]),
        N("NonZero", ["keep"], ["idx2"]),
        N("Squeeze", ["idx2", "ax0"], ["idx"]),
        N("Gather", ["rows", "idx"], ["picked"], axis=0),  # run-time rows
        N("Gemm", ["picked", "wg", "bg"], ["g"], transB=1),
        N("ReduceMax", ["feat"], ["fm0"], axes=[0], keepdims=0),
        N("ReduceSum", ["x"], ["xs"], keepdims=0),
        N("Greater", ["xs", "zero"], ["pos"]),
        N("If", ["pos"], ["fm"], then_branch=_branch("Identity", "fm0"), else_branch=_branch("Neg", "fm0")),
    ]
    r = np.random.default_rng(0)
    inits = {
        "w": rand(16, 3, 3, 3, seed=1) * 0.3,
        "b": rand(16, seed=2),
        "gam": np.abs(rand(16, seed=3)) + 0.5,
        "be": rand(16, seed=4),
        "m": rand(16, seed=5) * 0.1,
        "v": np.abs(rand(16, seed=6)) + 0.5,
        "w2": rand(32, 16, 3, 3, seed=7) * 0.2,
        "b2": rand(32, seed=8),
        "shape": np.array([256, 16], np.int64),
        "t": np.array(1.5, np.float32),
        "ax0": np.array([0], np.int64),
        "zero": np.array(0.0, np.float32),
        "wg": r.standard_normal((91, 16)).astype(np.float32),
        "bg": r.standard_normal(91).astype(np.float32),
    }
    x = rand(1, 3, 16, 16, seed=9)
    return make_model(nodes, {"x": x}, ["g", "fm"], inits, opset=13), x


def test_the_static_part_is_folded_fused_and_blocked(tmp_path):
    model, x = _model()
    res = kiln.compile(model, tmp_path / "m.kiln", target="llvm -mcpu=znver4")
    rep = res.report
    assert rep["dataflow_regions"] >= 1
    assert rep["batchnorm_folded"] == 1 and rep["constants_folded"] > 0
    assert rep["conv_layouts"] == {"NCHW1c": 1, "NCHW16c": 1}, rep["conv_layouts"]  # the 3-channel stem reads NCHW1c
    assert rep["dense_packed_dynamic"] == 1
    assert not rep["passes_skipped"], rep["passes_skipped"]


def test_matches_onnxruntime(tmp_path):
    model, x = _model()
    kiln.compile(model, tmp_path / "m.kiln")
    got = kiln.load(tmp_path / "m.kiln").run({"x": x})
    want = ort_run(model, {"x": x})
    assert 0 < want[0].shape[0] < 256
    for name, ref in zip(["g", "fm"], want):
        assert got[name].shape == ref.shape
        np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-4)


def test_regions_between_impure_ops():
    model, _ = _model()
    mod = import_onnx(model).mod
    assert not any(isinstance(b, relax.DataflowBlock) for b in mod["main"].body.blocks)  # TVM's importer
    p = StaticDataflow()
    out = p(mod)
    blocks = out["main"].body.blocks
    assert p.stats["dataflow_regions"] >= 1 and isinstance(blocks[0], relax.DataflowBlock)
    assert sum(len(b.bindings) for b in blocks) == sum(len(b.bindings) for b in mod["main"].body.blocks)


def test_stack_is_kept_from_convert_layout():
    """TVM's ConvertLayout fails on the op after a stack ("Invalid SLayout"); the guard makes it a concat."""
    import tvm

    from kiln.compiler.passes import ConvertLayout

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "float32"))
    y = relax.Var("y", relax.TensorType((450, 2), "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            c = bb.emit(relax.op.nn.conv2d(x, relax.const(rand(16, 16, 3, 3)), padding=1))
            s = bb.emit(relax.op.stack([y, y], axis=0))
            m = bb.emit(relax.op.max(s, axis=[0]))
            o = bb.emit_output(relax.Tuple([c, m]))
        bb.emit_func_output(o)
    with tvm.target.Target({"kind": "llvm", "mcpu": "znver4"}):
        out = ConvertLayout("NCHWc", 16)(bb.get())
    names = [getattr(c.op, "name", "") for c in calls(out["main"])]
    assert "relax.stack" not in names and "relax.concat" in names and "relax.nn.conv2d" in names
