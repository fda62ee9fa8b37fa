"""The blocked stem rule (schedules/rules/stem.py): a conv reading NCHW1c and writing NCHW{c}c gets its padded rows in a
stack tile and a [pixels x channel block] accumulator tile; it matches numpy; a blocked conv with a wide input
block is not a stem. And a 7x7 stem in a model reads NCHW1c, so the max pool after it runs blocked."""

import numpy as np
import pytest
from onnx import helper
from tvm import relax, s_tir

from kiln.frontends.importer import import_onnx
from kiln.schedules.rules.registry import RULES, classify
from kiln.schedules.rules.stem import is_stem
from tests.helpers import check_against_ort, make_model, rand
from tests.schedules.test_rules import _conv_nchw_ref, _kernel, _run, _var


def _stem_kernel(cin, cout, block, hw, k, stride, pad):
    x, w, b = rand(1, cin, *hw, seed=1), rand(cout, cin, k, k, seed=2), rand(1, cout // block, 1, 1, block, seed=3)
    vx, vw, vb = _var("x", (1, cin, *hw, 1)), _var("w", (cout // block, cin, k, k, 1, block)), _var("b", b.shape)
    conv = lambda bb: relax.op.nn.relu(
        bb.emit(
            relax.op.add(
                bb.emit(
                    relax.op.nn.conv2d(
                        vx,
                        vw,
                        strides=[stride, stride],
                        padding=[pad, pad],
                        data_layout="NCHW1c",
                        kernel_layout=f"OIHW1i{block}o",
                        out_layout=f"NCHW{block}c",
                    )
                ),
                vb,
            )
        )
    )
    func = _kernel(conv, [vx, vw, vb])
    wb = w.reshape(cout // block, block, cin, k, k, 1).transpose(0, 2, 3, 4, 5, 1)
    ref = _conv_nchw_ref(x, w, pad)[:, :, ::stride, ::stride]
    oh, ow = ref.shape[2:]
    ref = ref.reshape(1, cout // block, block, oh, ow).transpose(0, 1, 3, 4, 2) + b
    return func, [x[..., None], np.ascontiguousarray(wb), b], np.maximum(ref, 0)


@pytest.mark.parametrize(
    "cin,cout,block,hw,k,stride,pad",
    [
        (3, 16, 8, (23, 21), 7, 2, 3),  # ResNet's 7x7/2 stem on a ragged map: 12 x 11 outputs, tiles of 6 and 11
        (3, 32, 16, (17, 17), 3, 2, 1),  # MobileNet's 3x3/2 stem, 16 lanes
        (4, 8, 8, (9, 10), 3, 1, 0),  # 4 channels, unpadded
    ],
)
def test_stem_rule_matches_numpy(cin, cout, block, hw, k, stride, pad):
    func, inputs, ref = _stem_kernel(cin, cout, block, hw, k, stride, pad)
    sch = s_tir.Schedule(func)
    kind, anchor = classify(sch)
    assert kind == "conv2d" and is_stem(sch, anchor)
    RULES[("cpu", "conv2d")](sch, anchor, block, registers=16)
    scheduled = sch.mod["main"]
    # the stem's loop nest: the padded rows in a local (stack) buffer, a parallel row loop, the channel block vectorized
    text = scheduled.script()
    local_pad = any("data_pad" in line and 'scope="local"' in line for line in text.splitlines())
    assert local_pad == (pad > 0) and "T.parallel" in text and "T.vectorized" in text
    np.testing.assert_allclose(_run(scheduled, inputs), ref, rtol=1e-4, atol=1e-4)


def test_a_wide_input_block_is_not_a_stem():
    """24 -> 32 channels on AVX-512: NCHW8c -> NCHW16c is a blocked conv for reduction_tiled, not a stem."""
    vx, vw = _var("x", (1, 3, 6, 6, 8)), _var("w", (2, 3, 3, 3, 8, 16))
    func = _kernel(
        lambda bb: relax.op.nn.conv2d(
            vx, vw, padding=[1, 1], data_layout="NCHW8c", kernel_layout="OIHW8i16o", out_layout="NCHW16c"
        ),
        [vx, vw],
    )
    sch = s_tir.Schedule(func)
    assert not is_stem(sch, classify(sch)[1])


def _resnet_stem():
    """7x7/2 conv + bias -> ReLU -> 3x3/2 max pool -> 1x1 conv: ResNet's stem and the conv after it."""
    nodes = [
        helper.make_node("Conv", ["input", "w", "b"], ["c"], strides=[2, 2], pads=[3, 3, 3, 3]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["p", "w2"], ["output"]),
    ]
    inits = {"w": rand(16, 3, 7, 7, seed=1) * 0.1, "b": rand(16, seed=2), "w2": rand(16, 16, 1, 1, seed=3) * 0.2}
    return make_model(nodes, {"input": rand(1, 3, 32, 32)}, ["output"], inits)


def test_a_7x7_stem_reads_nchw1c_and_its_pool_runs_blocked(tmp_path):
    from kiln.compiler.optimize import optimize
    from kiln.compiler.options import CompileOptions

    model = _resnet_stem()
    co = CompileOptions.make(target="llvm -mcpu=haswell", tuning_db="none")  # structural: 8 lanes
    opt = optimize(import_onnx(model).mod, co)
    assert opt.report["conv_layouts"] == {"NCHW1c": 1, "NCHW8c": 1}
    pools = [f for gv, f in opt.mod.functions.items() if "pool" in gv.name_hint]
    assert len(pools) == 1 and [len(p.ty.shape) for p in pools[0].params] == [5, 5]  # NCHW8c in and out
    check_against_ort(model, {"input": rand(1, 3, 32, 32, seed=4)}, tmp_path)
