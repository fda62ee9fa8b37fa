"""Regression tests for the rewrites of standard_math.py: a few of onnx's own backend node cases per op
family, compiled by Kiln (shape-deciding inputs frozen, as the CLI's --freeze-input) and compared with
the case's expected outputs."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import kiln

CASES = {
    "test_cumprod_2d_axis_1": ["axis"],
    "test_cumprod_1d_reverse_exclusive": ["axis"],
    "test_pow_types_int64_float32": [],
    "test_pow_types_float32_int32": [],
    "test_mod_float_edge_cases_fmod_0_float32": [],
    "test_isinf_negative": [],
    "test_cosh_example": [],
    "test_l2normalization_axis_0": [],
    "test_batchnorm_example_training_mode": [],
    "test_det_nd": [],
    "test_reversesequence_batch": [],
    "test_spacetodepth_crd_mode_example": [],
    "test_eyelike_with_dtype": [],
    "test_dropout_default_mask": [],
    "test_convtranspose_output_shape": [],
    "test_col2im_pads": ["image_shape", "block_shape"],
    "test_maxpool_with_argmax_2d_precomputed_strides": [],
    "test_resize_downsample_scales_cubic_antialias": ["scales"],
    "test_resize_tf_crop_and_resize_axes_3_2": ["roi", "sizes"],
    "test_resize_downsample_sizes_nearest_not_larger": ["sizes"],
    # constant weights (frozen) take the one-kernel recurrence (schedules/rules/recurrence.py)
    "test_gru_seq_length": ["W", "R", "B"],
    "test_gru_batchwise": ["W", "R"],
    "test_lstm_bidirectional": ["W", "R"],
    "test_lstm_with_initial_bias": ["W", "R", "B"],
    "test_simple_rnn_reverse": ["W", "R"],
    "test_simple_rnn_batchwise": ["W", "R"],
}


@pytest.fixture(scope="module")
def cases():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from onnx.backend.test.case.node import collect_testcases

        return {c.name: c for c in collect_testcases(None) if c.name in CASES}


@pytest.mark.parametrize("name", sorted(CASES))
def test_case(cases, name, tmp_path):
    case = cases[name]
    g = case.model.graph
    inits = {t.name for t in g.initializer}
    feeds = dict(zip([i.name for i in g.input if i.name not in inits], case.data_sets[0][0]))
    frozen = {k: feeds.pop(k) for k in CASES[name]}
    kiln.compile(case.model, tmp_path / "m.kiln", freeze_inputs=frozen)
    got = kiln.load(tmp_path / "m.kiln").run(feeds)
    for (k, g_), e in zip(got.items(), case.data_sets[0][1]):
        assert g_.dtype == e.dtype and g_.shape == e.shape, (k, g_.dtype, g_.shape, e.dtype, e.shape)
        np.testing.assert_allclose(g_, e, rtol=1e-3, atol=1e-6, err_msg=k)


def test_equal_on_strings_is_a_clear_refusal(cases, tmp_path):
    from onnx import TensorProto, helper

    n = helper.make_node("Equal", ["a", "b"], ["y"])
    g = helper.make_graph(
        [n],
        "t",
        [helper.make_tensor_value_info(x, TensorProto.STRING, [2]) for x in "ab"],
        [helper.make_tensor_value_info("y", TensorProto.BOOL, [2])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    with pytest.raises(kiln.errors.UnsupportedModelError, match="Equal on string"):
        kiln.compile(m, tmp_path / "m.kiln")
