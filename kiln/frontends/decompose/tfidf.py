"""TfIdfVectorizer over integer tokens (TVM 0.27's importer has no converter) as compares and sums over
static slices: for every n-gram length n in [min_gram_length, max_gram_length] and skip distance d
(1 .. max_skip_count + 1; unigrams once, as skips do not change them), the i-th n-gram of a row is
X[i], X[i+d], ..., X[i+(n-1)d]; its k-th tokens for all i are one contiguous slice of length
C - (n-1)d, compared at once with the k-th token of every pooled n-gram ([M, 1] against [1, P]).
The matches (an And over k) summed over i and d are the n-gram counts [.., M]; a matrix [M, O]
(pool n-gram -> its ngram_indexes column, holding its weight or 1) sums them into the output.
Exact: counts are small integers in float32. The counting rule is onnx's reference and onnxruntime's
(last of duplicate pool n-grams wins, n-grams outside the length range are skipped but numbered).
String pools stay unsupported (TVM has no string tensors)."""

from __future__ import annotations

import numpy as np
from onnx import helper

from ...errors import UnsupportedModelError
from .emitter import Emitter


def _fail(node, where, msg, fix):
    raise UnsupportedModelError(f"TfIdfVectorizer: {msg}", where=f"{where}: node {node.name!r}", fix=fix)


def pool_grams(a: dict) -> dict[int, dict[tuple, int]]:
    """n -> {pooled n-gram (tuple of tokens): its id (0-based index into ngram_indexes)}, for the lengths
    in [min_gram_length, max_gram_length]; ids count every pooled n-gram, in pool order."""
    pool, counts = list(a.get("pool_int64s", [])), list(a.get("ngram_counts", []))
    lo, hi = a.get("min_gram_length", 1), a.get("max_gram_length", 1)
    grams: dict[int, dict[tuple, int]] = {}
    next_id = 0
    for i, start in enumerate(counts):
        n, end = i + 1, counts[i + 1] if i + 1 < len(counts) else len(pool)
        for j in range((end - start) // n):
            if lo <= n <= hi:
                grams.setdefault(n, {})[tuple(pool[start + j * n : start + (j + 1) * n])] = next_id
            next_id += 1
    return grams


def _gram_counts(em: Emitter, x: str, shape: list, n: int, grams: list[tuple], skips: int) -> str | None:
    """How often each of `grams` (all of length n) occurs in every row of x ([.., C] int64), summed over
    the skip distances 1 .. skips + 1 (1 only for unigrams): float32 [.., M]; None when no n-gram fits."""
    table, length, rank = np.array(grams, np.int64), shape[-1], len(shape)  # table: [M, n]
    total = None
    for d in range(1, (skips if n > 1 else 0) + 2):
        positions = length - (n - 1) * d
        if positions <= 0:
            break
        hit = None
        for k in range(n):  # Gather, not Slice/Unsqueeze: their axes moved from attributes to inputs (opset 9+)
            starts = np.arange(k * d, k * d + positions, dtype=np.int64)[None, :]  # [1, P]: the k-th tokens
            tokens = em.op("Gather", [x, em.const(starts, "positions")], axis=rank - 1)  # [.., 1, P]
            eq = em.op("Equal", [tokens, em.const(table[:, k : k + 1], "gram_tokens")])  # [.., M, P]
            hit = eq if hit is None else em.op("And", [hit, eq])
        ones = em.const(np.ones(positions, np.float32), "ones")  # the sum over positions as a MatMul
        count = em.op("MatMul", [em.op("Cast", [hit], to=1), ones])
        total = count if total is None else em.op("Add", [total, count])
    return total


def _column_map(em: Emitter, table: dict, a: dict, size: int, per_gram) -> str:
    """[M, O]: pool n-gram -> its output column (ngram_indexes), holding its weight (or 1)."""
    to_out = np.zeros((len(table), size), np.float32)
    ids = list(table.values())
    to_out[np.arange(len(ids)), [a["ngram_indexes"][i] for i in ids]] = [per_gram[i] for i in ids]
    return em.const(to_out, "ngram_columns")


def tfidf_vectorizer(node, em: Emitter, shapes, consts, where):
    """Output [O] or [B, O] (float32). TF: the counts per column; TFIDF: count times the n-gram's weight;
    IDF: the n-gram's weight (or 1) where it occurs. Weights are per pooled n-gram, as the spec and
    onnxruntime read them (onnx's reference reads them per column: the same unless columns are permuted)."""
    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    x, shape = _checked_input(node, shapes, where, a)
    size, weights = max(a.get("ngram_indexes", [0])) + 1, list(a.get("weights", []))
    mode = a.get("mode", b"TF")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    presence = mode == "IDF" and weights  # per n-gram 0/1, weighted into the columns
    per_gram = weights if mode != "TF" and weights else [1.0] * len(a.get("ngram_indexes", []))
    x = em.op("Cast", [em.reshape(x, shape or [1])], to=7)  # int64 tokens, rank >= 1
    shape = list(shape or [1])
    y = em.const(np.zeros(shape[:-1] + [size], np.float32), "zeros")
    for n, table in sorted(pool_grams(a).items()):
        counts = _gram_counts(em, x, shape, n, list(table), a.get("max_skip_count", 0))
        if counts is None:
            continue
        if presence:
            counts = em.op("Cast", [em.op("Greater", [counts, em.const(np.float32(0))])], to=1)
        y = em.op("Add", [y, em.op("MatMul", [counts, _column_map(em, table, a, size, per_gram)])])
    if mode == "IDF" and not weights:  # 1 where a column's n-grams occur
        y = em.op("Cast", [em.op("Greater", [y, em.const(np.float32(0))])], to=1)
    em.op("Identity", [y], out=node.output[0])


def _checked_input(node, shapes, where, a: dict) -> tuple[str, tuple]:
    """The token input and its static shape; refuses string pools, unknown or rank > 2 shapes, and
    fewer weights than pooled n-grams."""
    if a.get("pool_strings"):
        _fail(node, where, "string tokens (pool_strings) are not supported", "TVM has no string tensors: map the "
              "tokens to integer ids before the model and use pool_int64s")  # fmt: skip
    x, shape = node.input[0], shapes.get(node.input[0])
    if shape is None or len(shape) > 2:
        _fail(node, where, f"input {x!r} needs a static shape [C] or [B, C] (got {shape})",
              "pin the input's shape with --input-shape")  # fmt: skip
    n_ids = len(a.get("ngram_indexes", []))
    if a.get("weights") and len(a["weights"]) < n_ids:
        _fail(node, where, f"{len(a['weights'])} weights for {n_ids} n-grams", "give one weight per n-gram")
    return x, shape


REWRITES = {"TfIdfVectorizer": tfidf_vectorizer}
