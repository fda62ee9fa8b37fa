"""ai.onnx.ml tree ensembles (decompose/ml_trees.py) against onnxruntime: random forests built by code, every
node mode (set membership included), NaN sent down the branch a node names, each aggregate and the
post transforms Kiln supports; TreeEnsemble (opset 5), TreeEnsembleRegressor and TreeEnsembleClassifier."""

import numpy as np
import pytest
from helpers import check_against_ort, compile_and_run, ort_run
from onnx import TensorProto, helper, numpy_helper

import kiln

VALUES = [-1.0, -0.5, 0.0, 0.5, 1.0]  # features and splits from one small set: EQ and membership hit
# set members: onnxruntime takes only small non-negative integers (a bitmask)
NP = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.int64: TensorProto.INT64}


def _features(dtype, rows=16, cols=4, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.choice(VALUES + [np.nan], size=(rows, cols)) if dtype != np.int64 else rng.integers(-2, 3, (rows, cols))
    return x.astype(dtype)


def _model(node, dtype, opsets):
    g = helper.make_graph(
        [node],
        "trees",
        [helper.make_tensor_value_info("x", NP[dtype], [16, 4])],
        [helper.make_tensor_value_info("y", NP.get(dtype, TensorProto.FLOAT), None)],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


class _V5Builder:
    """Random trees in TreeEnsemble's (opset 5) arrays."""

    def __init__(self, seed, targets, modes, depth=4):
        self.rng, self.targets, self.modes, self.depth = np.random.default_rng(seed), targets, modes, depth
        self.n = {k: [] for k in ("feat", "split", "mode", "t", "tleaf", "f", "fleaf", "miss")}
        self.leaf_t, self.leaf_w, self.members = [], [], []

    def build(self, d=0):
        if d == self.depth or (d and self.rng.random() < 0.3):
            self.leaf_t.append(int(self.rng.integers(self.targets)))
            self.leaf_w.append(float(np.round(self.rng.normal(), 3)))
            return len(self.leaf_w) - 1, 1
        i, mode = len(self.n["feat"]), int(self.rng.choice(self.modes))
        for k, v in zip(self.n, (int(self.rng.integers(4)), float(self.rng.choice(VALUES)), mode, 0, 0, 0, 0)):
            self.n[k].append(v)
        self.n["miss"].append(int(self.rng.integers(2)))
        if mode == 6:
            self.n["split"][i] = np.nan
            self.members += list(self.rng.choice([0.0, 1.0], 1 + int(self.rng.integers(2)), replace=False)) + [np.nan]
        self.n["t"][i], self.n["tleaf"][i] = self.build(d + 1)
        self.n["f"][i], self.n["fleaf"][i] = self.build(d + 1)
        return i, 0

    def node(self, trees, dtype, **attrs):
        roots = [self.build()[0] for _ in range(trees)]
        t = lambda v, name: numpy_helper.from_array(np.array(v, dtype), name)
        extra = {"membership_values": t(self.members, "m")} if self.members else {}
        return helper.make_node(
            "TreeEnsemble", ["x"], ["y"], domain="ai.onnx.ml", n_targets=self.targets, tree_roots=roots,
            nodes_featureids=self.n["feat"], nodes_splits=t(self.n["split"], "s"),
            nodes_modes=numpy_helper.from_array(np.array(self.n["mode"], np.uint8), "modes"),
            nodes_truenodeids=self.n["t"], nodes_trueleafs=self.n["tleaf"], nodes_falsenodeids=self.n["f"],
            nodes_falseleafs=self.n["fleaf"], nodes_missing_value_tracks_true=self.n["miss"],
            leaf_targetids=self.leaf_t, leaf_weights=t(self.leaf_w, "w"), **extra, **attrs,
        )  # fmt: skip


@pytest.mark.parametrize(
    "dtype, aggregate, transform, modes",
    [
        (np.float32, 1, 0, [0, 1, 2, 3, 4, 5, 6]),  # SUM, every mode
        (np.float32, 0, 2, [0, 3, 6]),  # AVERAGE, LOGISTIC
        (np.float32, 2, 0, [0, 3, 6]),  # MIN: a target no tree scores is 0
        (np.float64, 2, 0, [0, 1, 4]),  # MIN, double
        (np.float32, 3, 1, [1, 2, 5]),  # MAX, SOFTMAX
    ],
)
def test_tree_ensemble(tmp_path, dtype, aggregate, transform, modes):
    """Against onnxruntime; a post transform against onnxruntime's scores without it, transformed as the spec
    says (1 SOFTMAX, 2 LOGISTIC: onnxruntime 1.32 swaps the two, onnx's reference applies none)."""

    def model(post):
        node = _V5Builder(seed=aggregate, targets=3, modes=modes).node(
            5, dtype, aggregate_function=aggregate, post_transform=post
        )
        return _model(node, dtype, [("ai.onnx.ml", 5)])

    x = _features(dtype)
    if not transform:
        check_against_ort(model(0), {"x": x}, tmp_path, rtol=1e-5, atol=1e-6)
        return
    scores = ort_run(model(0), {"x": x})[0]
    if transform == 1:
        e = np.exp(scores - scores.max(axis=1, keepdims=True))
        want = e / e.sum(axis=1, keepdims=True)
    else:
        want = 1 / (1 + np.exp(-scores))
    np.testing.assert_allclose(compile_and_run(model(transform), {"x": x}, tmp_path)["y"], want, rtol=1e-5, atol=1e-6)


def _regressor(seed, trees, op="TreeEnsembleRegressor", prefix="target", outputs=2, **attrs):
    """Random trees in TreeEnsembleRegressor's (or Classifier's) (tree id, node id) arrays; a leaf feeds one
    or more of `outputs` targets (classes)."""
    rng, a = np.random.default_rng(seed), {k: [] for k in ("treeids", "nodeids", "feat", "val", "mode", "t", "f")}
    tg = {k: [] for k in ("treeids", "nodeids", "ids", "weights")}

    def build(tree, d):
        nid = sum(1 for t in a["treeids"] if t == tree)
        leaf = d == 3 or (d and rng.random() < 0.3)
        for k, v in zip(a, (tree, nid, int(rng.integers(4)), float(rng.choice(VALUES)), "LEAF", 0, 0)):
            a[k].append(v)
        i = len(a["treeids"]) - 1
        if leaf:
            for target in rng.choice(outputs, int(rng.integers(1, outputs + 1)), replace=False):
                for k, v in zip(tg, (tree, nid, int(target), float(np.round(rng.normal(), 3)))):
                    tg[k].append(v)
            return nid
        a["mode"][i] = str(
            rng.choice(["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"])
        )
        a["t"][i], a["f"][i] = build(tree, d + 1), build(tree, d + 1)
        return nid

    for tree in range(trees):
        build(tree, 0)
    return helper.make_node(
        op, ["x"], ["y"] if prefix == "target" else ["label", "y"], domain="ai.onnx.ml",
        nodes_treeids=a["treeids"], nodes_nodeids=a["nodeids"], nodes_featureids=a["feat"], nodes_values=a["val"],
        nodes_modes=a["mode"], nodes_truenodeids=a["t"], nodes_falsenodeids=a["f"],
        **{f"{prefix}_treeids": tg["treeids"], f"{prefix}_nodeids": tg["nodeids"], f"{prefix}_ids": tg["ids"]},
        **{f"{prefix}_weights": tg["weights"]}, **attrs,
    )  # fmt: skip


@pytest.mark.parametrize(
    "dtype, attrs",
    [
        (np.float32, dict(aggregate_function="SUM", base_values=[0.25, -1.0])),
        (np.float32, dict(aggregate_function="AVERAGE", post_transform="LOGISTIC")),  # onnxruntime: no int inputs
        (np.float64, dict(aggregate_function="MAX", base_values=[0.5, 0.5])),
    ],
)
def test_tree_ensemble_regressor(tmp_path, dtype, attrs):
    node = _regressor(seed=len(attrs), trees=4, n_targets=2, **attrs)
    m = _model(node, dtype, [("", 17), ("ai.onnx.ml", 3)])
    m.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    check_against_ort(m, {"x": _features(dtype)}, tmp_path, rtol=1e-5, atol=1e-6)


def test_tree_ensemble_probit_refused(tmp_path):
    node = _V5Builder(seed=0, targets=1, modes=[0]).node(1, np.float32, post_transform=4)
    with pytest.raises(kiln.UnsupportedModelError, match="PROBIT"):
        kiln.compile(_model(node, np.float32, [("ai.onnx.ml", 5)]), tmp_path / "m.kiln")


@pytest.mark.parametrize("transform", ["NONE", "SOFTMAX"])
def test_tree_ensemble_classifier(tmp_path, transform):
    node = _regressor(seed=3, trees=5, op="TreeEnsembleClassifier", prefix="class", outputs=3,
                      classlabels_int64s=[4, 7, 9], post_transform=transform)  # fmt: skip
    g = helper.make_graph(
        [node], "trees", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 4])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, None),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    check_against_ort(m, {"x": _features(np.float32)}, tmp_path, rtol=1e-5, atol=1e-6)
