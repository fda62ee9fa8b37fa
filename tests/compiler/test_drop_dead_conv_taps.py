"""DropDeadConvTaps: the taps of a dilated conv that read only padding are cut, the padding shifted, and
the output is onnxruntime's (DeepLabV3's ASPP convs on a 14x14 map, strided and asymmetric cases, 1-D and
3-D convs, a tap live for only one output row)."""

import numpy as np
import pytest
import tvm
from helpers import check_against_ort, make_model, rand
from onnx import helper
from tvm.relax.analysis import post_order_visit

from kiln.compiler.ir import calls
from kiln.compiler.passes import DropDeadConvTaps
from kiln.compiler.passes.drop_dead_conv_taps import bands, live_taps
from kiln.frontends.importer import import_onnx

pytestmark = pytest.mark.filterwarnings("error::kiln.errors.KilnWarning")  # a failed optional pass is skipped


def _model(shape, c_out, k, **attrs):
    rank = len(shape) - 2
    x = rand(*shape)
    groups = attrs.get("group", 1)
    nodes = [
        helper.make_node("Conv", ["input", "w", "b"], ["c"], kernel_shape=[k] * rank, **attrs),
        helper.make_node("Relu", ["c"], ["output"]),
    ]
    inits = {"w": rand(c_out, shape[1] // groups, *[k] * rank, seed=1) * 0.2, "b": rand(c_out, seed=2)}
    return make_model(nodes, {"input": x}, ["output"], inits), x


def test_live_taps_per_axis():
    assert live_taps(14, 3, 1, 24, 24, 24) == (1, 1)  # ASPP dilation 24: only the centre tap
    assert live_taps(14, 3, 1, 12, 12, 12) == (0, 2)  # dilation 12: the outer taps reach rows 0-1 / 12-13
    assert live_taps(14, 3, 1, 13, 13, 13) == (0, 2)  # the outer taps each read one row (row 0 / row 13)
    assert live_taps(14, 3, 1, 14, 14, 14) == (1, 1)
    assert live_taps(5, 3, 1, 4, 8, 0) == (1, 2)  # asymmetric: all padding before
    assert live_taps(4, 3, 2, 1, 1, 1) == (0, 2)


@pytest.mark.parametrize(
    "shape,k,c_out,attrs,cut,split",
    [
        ((1, 16, 14, 14), 3, 24, {"dilations": [24, 24], "pads": [24, 24, 24, 24]}, 1, 0),  # ASPP: a 1x1 conv
        ((1, 64, 14, 14), 3, 64, {"dilations": [12, 12], "pads": [12, 12, 12, 12]}, 0, 1),  # ASPP: 9 pieces
        ((1, 16, 9, 20), 3, 24, {"dilations": [10, 6], "pads": [10, 6, 10, 6]}, 1, 0),  # rows only: 3x3 -> 1x3
        ((1, 64, 10, 10), 3, 64, {"dilations": [6, 6], "pads": [12, 0, 0, 12], "strides": [2, 2]}, 1, 0),
        ((1, 256, 14, 14), 3, 256, {"dilations": [12, 12], "pads": [12, 12, 12, 12], "group": 256}, 0, 0),  # cheap
        ((1, 256, 14, 14), 3, 256, {"dilations": [12, 12], "pads": [12, 12, 12, 12], "group": 4}, 0, 1),  # grouped
        ((1, 128, 2, 2), 3, 128, {"pads": [1, 1, 1, 1]}, 0, 0),  # 3x3 on a 2x2 map: too few MACs saved
        ((1, 16, 7, 7), 3, 24, {"pads": [1, 1, 1, 1]}, 0, 0),  # an ordinary conv: nothing to cut
        ((1, 8, 40), 3, 24, {"dilations": [48], "pads": [48, 48]}, 1, 0),  # conv1d
        ((1, 4, 5, 6, 6), 3, 24, {"dilations": [8, 8, 8], "pads": [8, 8, 8, 8, 8, 8]}, 1, 0),  # conv3d
    ],
)
def test_cut_and_split_convs_match_onnxruntime(tmp_path, shape, k, c_out, attrs, cut, split):
    model, x = _model(shape, c_out, k, **attrs)
    p = DropDeadConvTaps()
    mod = p(import_onnx(model).mod)
    assert (p.stats["conv_taps_dropped"], p.stats["conv_band_split"]) == (cut, split)
    convs = [c for c in _calls(mod["main"]) if c.op.name.startswith("relax.nn.conv")]
    if not split:
        assert len(convs) == 1
        for i in range(len(shape) - 2):  # the taps left per axis: those live_taps finds
            pads = attrs["pads"]
            stride = attrs.get("strides", [1] * 3)[i]
            k0, k1 = live_taps(
                shape[2 + i], k, stride, attrs.get("dilations", [1] * 3)[i], pads[i], pads[i + len(shape) - 2]
            )
            assert int(convs[0].args[1].ty.shape[2 + i]) == k1 - k0 + 1
    else:  # every piece unpadded, and fewer multiply-adds in all than the conv had
        assert all(list(map(int, c.attrs.padding)) == [0, 0, 0, 0] for c in convs)
        macs = sum(
            np.prod([int(v) for v in c.ty.shape]) * np.prod([int(v) for v in c.args[1].ty.shape][1:]) for c in convs
        )
        out = np.prod(ort_shape(model, x))
        assert macs * 2 <= out * (shape[1] // attrs.get("group", 1)) * k * k
    check_against_ort(model, {"input": x}, tmp_path, rtol=1e-4, atol=2e-4)


def test_band_bounds():
    assert bands(14, 3, 1, 12, 12, 12) == [(0, 2, 1, 2), (2, 12, 1, 1), (12, 14, 0, 1)]
    assert bands(7, 3, 1, 1, 1, 1) == [(0, 1, 1, 2), (1, 6, 0, 2), (6, 7, 0, 1)]
    assert bands(2, 3, 1, 4, 4, 4) == [(0, 2, 1, 1)]


def ort_shape(model, x):
    from helpers import ort_run

    return ort_run(model, {"input": x})[0].shape


def test_aspp_branch_becomes_a_1x1_conv():
    model, _ = _model((1, 16, 14, 14), 8, 3, dilations=[36, 36], pads=[36, 36, 36, 36])
    mod = DropDeadConvTaps()(import_onnx(model).mod)
    consts = [c.value.numpy() for c in _constants(mod["main"])]
    assert any(c.shape == (8, 16, 1, 1) for c in consts), [c.shape for c in consts]
    w = next(c for c in consts if c.shape == (8, 16, 1, 1))
    assert np.array_equal(w, (rand(8, 16, 3, 3, seed=1) * 0.2)[:, :, 1:2, 1:2])


def test_report_counts_the_cut_convs(tmp_path):
    import kiln

    model, _ = _model((1, 16, 14, 14), 16, 3, dilations=[24, 24], pads=[24, 24, 24, 24])
    res = kiln.compile(model, tmp_path / "m.kiln", target="llvm -mcpu=znver4")
    assert res.report["conv_taps_dropped"] == 1
    off = kiln.compile(model, tmp_path / "off.kiln", target="llvm -mcpu=znver4", disabled_passes=["DropDeadConvTaps"])
    assert off.report.get("conv_taps_dropped", 0) == 0


def _constants(f):
    from tvm.ir.expr import GenericConst

    found = []
    post_order_visit(f, lambda e: found.append(e) if isinstance(e, GenericConst) else None)
    return found


def _calls(f):
    return [c for c in calls(f) if isinstance(c.op, tvm.ir.Op)]
