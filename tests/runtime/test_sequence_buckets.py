"""Sequence buckets for text models: one artifact compiled for token lengths 8 and 16 serves any length up
to 16; token ids are padded with the --pad-value recorded in the manifest, the attention mask with zeros,
and the outputs cropped back; the padded result equals onnxruntime's on the unpadded input at odd lengths."""

import numpy as np
import pytest
from helpers import HIDDEN, VOCAB, ort_run, text_encoder

import kiln
from kiln.errors import OptionsError


@pytest.fixture(scope="module")
def bucketed(tmp_path_factory):
    m = text_encoder()
    path = tmp_path_factory.mktemp("seq") / "text.kiln"
    kiln.compile(
        m,
        path,
        shape_buckets=["input_ids:1x8,1x16", "attention_mask:1x8,1x16"],
        pad_values=["input_ids=3"],
    )
    return m, kiln.load(path)


def test_pad_value_is_recorded(bucketed):
    _, model = bucketed
    assert model.manifest["pad_values"] == {"input_ids": 3.0}
    assert [b.name for b in model.buckets] == ["input_ids:1x8+attention_mask:1x8", "input_ids:1x16+attention_mask:1x16"]


@pytest.mark.parametrize("length", [5, 8, 11, 16])
def test_any_length_up_to_the_largest_bucket_matches_onnxruntime(bucketed, length):
    m, model = bucketed
    rng = np.random.default_rng(length)
    feed = {
        "input_ids": rng.integers(4, VOCAB, (1, length)).astype(np.int64),
        "attention_mask": np.ones((1, length), np.int64),
    }
    out = model.run(feed)["output"]
    assert out.shape == (1, length, HIDDEN)
    np.testing.assert_allclose(out, ort_run(m, feed)[0], rtol=1e-4, atol=1e-4)


def test_pad_values_fill_the_padding():
    from kiln.runtime import buckets as bk
    from kiln.runtime.artifact import TensorSpec

    spec = (TensorSpec("input_ids", (1, 8), "int64"), TensorSpec("attention_mask", (1, 8), "int64"))
    bucket = bk.Bucket("b", spec, (), (("input_ids", 3.0),))
    (ids, mask), padded = bk.pad([np.ones((1, 5), np.int64), np.ones((1, 5), np.int64)], bucket)
    assert ids.tolist() == [[1, 1, 1, 1, 1, 3, 3, 3]] and mask.tolist() == [[1, 1, 1, 1, 1, 0, 0, 0]]
    assert padded == {1: (8, 5)}


def test_pad_value_for_an_input_without_buckets_is_refused(tmp_path):
    with pytest.raises(OptionsError, match="no --shape-buckets"):
        kiln.compile(text_encoder(), tmp_path / "m.kiln", input_shapes=["input_ids:1x8"], pad_values=["x=0"])
