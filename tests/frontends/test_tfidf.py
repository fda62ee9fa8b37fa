"""TfIdfVectorizer over integer tokens (decompose/tfidf.py) against onnxruntime: every weighting mode, skips,
uni/bi/trigram pools, int32 and int64 tokens, one row and a batch; string pools refused by name."""

import numpy as np
import pytest
from helpers import check_against_ort, make_model
from onnx import helper

import kiln

# unigrams 2, 3, 5; bigrams (5, 6), (7, 8), (6, 7), (3, 3); trigram (3, 3, 7)
POOL = dict(pool_int64s=[2, 3, 5, 5, 6, 7, 8, 6, 7, 3, 3, 3, 3, 7], ngram_counts=[0, 3, 11])
SHARED = [0, 1, 2, 3, 4, 5, 6, 1]  # unigram 3 and the trigram count in one column
PERMUTED = [7, 1, 2, 0, 4, 6, 5, 3]  # weights belong to n-grams, not to columns (onnxruntime, the spec)


def _model(x, indexes=SHARED, **attrs):
    node = helper.make_node("TfIdfVectorizer", ["x"], ["y"], ngram_indexes=indexes, **POOL, **attrs)
    return make_model([node], {"x": x}, ["y"], opset=9)


ROWS = np.array([[1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8, 2], [3, 3, 7, 3, 3, 7, 5, 6, 5, 6, 9, 9]])
WEIGHTS = [0.5 + i for i in range(len(SHARED))]  # one per pooled n-gram
BY_GRAM = dict(weights=WEIGHTS, indexes=PERMUTED)


@pytest.mark.parametrize(
    "attrs, x",
    [
        (dict(mode="TF", min_gram_length=2, max_gram_length=2, max_skip_count=0), ROWS.astype(np.int32)),
        (dict(mode="TF", min_gram_length=1, max_gram_length=3, max_skip_count=3), ROWS[1]),
        (dict(mode="IDF", min_gram_length=1, max_gram_length=2, max_skip_count=1), ROWS[0].astype(np.int32)),
        (dict(mode="IDF", min_gram_length=1, max_gram_length=3, max_skip_count=1, **BY_GRAM), ROWS),
        (dict(mode="TFIDF", min_gram_length=1, max_gram_length=3, max_skip_count=2, weights=WEIGHTS), ROWS),
        (dict(mode="TFIDF", min_gram_length=1, max_gram_length=2, max_skip_count=0, **BY_GRAM), ROWS[0]),
        (dict(mode="TFIDF", min_gram_length=2, max_gram_length=3, max_skip_count=5), ROWS.astype(np.int32)),
    ],
)
def test_tfidf_vectorizer(tmp_path, attrs, x):
    check_against_ort(_model(x, **attrs), {"x": x}, tmp_path, rtol=0, atol=0)


def test_tfidf_vectorizer_strings_refused(tmp_path):
    node = helper.make_node(
        "TfIdfVectorizer", ["x"], ["y"], mode="TF", min_gram_length=1, max_gram_length=1, max_skip_count=0,
        ngram_counts=[0], ngram_indexes=[0, 1], pool_strings=["a", "b"],
    )  # fmt: skip
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", 8, [4])],
                          [helper.make_tensor_value_info("y", 1, None)])  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 9)])
    with pytest.raises(kiln.UnsupportedModelError, match="string"):
        kiln.compile(m, tmp_path / "m.kiln")
