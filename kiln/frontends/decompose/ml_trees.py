"""ai.onnx.ml's tree ensembles (TreeEnsemble, opset 5; TreeEnsembleRegressor and Classifier) as gathers
and compares over static node arrays; TVM 0.27's importer converts none of them.

Every tree node (leaves included) is a state with a feature, a threshold, a comparison and its two next
states (a leaf's are itself). All node conditions are evaluated at once for a batch ([N, S]: the input's
features gathered per node, compared per mode, set membership as an Equal against the node's members,
NaN sent to the true branch where the node says so); then every tree descends together, one step per
level of the deepest tree: idx [N, T] <- where(cond[idx], true_next[idx], false_next[idx]). The
leaves reached index a [S, targets] table of leaf weights, reduced over the trees (sum, average, min,
max) and post-transformed. Comparisons run in the input's float type against thresholds of that type,
as onnxruntime compares."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...errors import UnsupportedModelError
from .emitter import CURRENT_MODEL, Emitter
from .llm_common import elem_type

LEQ, LT, GTE, GT, EQ, NEQ, MEMBER = range(7)  # TreeEnsemble's node modes
COMPARE = {LEQ: "LessOrEqual", LT: "Less", GTE: "GreaterOrEqual", GT: "Greater", EQ: "Equal"}
BRANCH_MODES = {b"BRANCH_LEQ": LEQ, b"BRANCH_LT": LT, b"BRANCH_GTE": GTE, b"BRANCH_GT": GT, b"BRANCH_EQ": EQ}
BRANCH_MODES[b"BRANCH_NEQ"] = NEQ
AGGREGATES = {b"SUM": 1, b"AVERAGE": 0, b"MIN": 2, b"MAX": 3}  # the older ops' names -> TreeEnsemble's codes
TRANSFORMS = {b"NONE": 0, b"SOFTMAX": 1, b"LOGISTIC": 2, b"SOFTMAX_ZERO": 3, b"PROBIT": 4}
DEFAULT_OPSET = 17  # the default domain's opset added to a model that imports only ai.onnx.ml


@dataclass
class Forest:
    """The trees as flat arrays over states (internal nodes and leaves): what the rewrite emits."""

    feature: list = field(default_factory=list)
    threshold: list = field(default_factory=list)
    mode: list = field(default_factory=list)
    members: list = field(default_factory=list)  # per state: the set of a MEMBER node, else ()
    missing_true: list = field(default_factory=list)
    true_next: list = field(default_factory=list)
    false_next: list = field(default_factory=list)
    weights: list = field(default_factory=list)  # per state: [(target, weight)] (a leaf's)
    roots: list = field(default_factory=list)

    def add(self, feature=0, threshold=0.0, mode=LEQ, members=(), missing=False) -> int:
        self.feature.append(int(feature))
        self.threshold.append(float(threshold))
        self.mode.append(int(mode))
        self.members.append(tuple(members))
        self.missing_true.append(bool(missing))
        self.true_next.append(len(self.true_next))  # a leaf until linked
        self.false_next.append(len(self.false_next))
        self.weights.append([])
        return len(self.feature) - 1

    def depth(self) -> int:
        """The most branch nodes on a path from a root to a leaf (the descent's step count)."""
        best, stack, seen = 0, [(r, 0) for r in self.roots], 0
        while stack:
            s, d = stack.pop()
            seen += 1
            if seen > 1 << 22 or d > len(self.feature):
                raise ValueError("the tree nodes form a cycle")
            if self.true_next[s] == s and self.false_next[s] == s:
                best = max(best, d)
                continue
            stack += [(self.true_next[s], d + 1), (self.false_next[s], d + 1)]
        return best


def _fail(node, where, msg, fix):
    raise UnsupportedModelError(f"{node.op_type}: {msg}", where=f"{where}: node {node.name!r}", fix=fix)


def _attrs(node) -> dict:
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        out[a.name] = numpy_helper.to_array(v).tolist() if isinstance(v, onnx.TensorProto) else v
    return out


# ------------------------------------------------------------------------------------------ the trees


def forest_v5(a: dict) -> Forest:
    """TreeEnsemble (opset 5): internal nodes 0..K-1 by index, leaves K..K+L-1; a root whose two
    branches are the same leaf is that leaf (a one-leaf tree)."""
    f, k = Forest(), len(a["nodes_featureids"])
    sets = iter(_member_sets(a.get("membership_values") or []))
    missing = a.get("nodes_missing_value_tracks_true") or [0] * k
    for i in range(k):
        mode = a["nodes_modes"][i]
        f.add(a["nodes_featureids"][i], a["nodes_splits"][i], mode, next(sets) if mode == MEMBER else (), missing[i])
    for i in range(len(a["leaf_weights"])):
        f.weights[f.add()].append((a["leaf_targetids"][i], a["leaf_weights"][i]))
    for i in range(k):
        f.true_next[i] = a["nodes_truenodeids"][i] + (k if a["nodes_trueleafs"][i] else 0)
        f.false_next[i] = a["nodes_falsenodeids"][i] + (k if a["nodes_falseleafs"][i] else 0)
    for r in a["tree_roots"]:
        leaf = a["nodes_trueleafs"][r] and a["nodes_falseleafs"][r] and f.true_next[r] == f.false_next[r]
        f.roots.append(f.true_next[r] if leaf else r)
    return f


def _member_sets(values) -> list[list[float]]:
    """membership_values split at its NaNs: one member list per MEMBER node, in node order."""
    sets, cur = [], []
    for v in values:
        if np.isnan(v):
            sets.append(cur)
            cur = []
        else:
            cur.append(v)
    return sets


def forest_regressor(a: dict, prefix: str) -> Forest:
    """TreeEnsembleRegressor/Classifier: nodes named by (tree id, node id); a tree's root is its first
    node listed (onnxruntime's rule); weights attach to leaves by (tree id, node id)."""
    f, index, tree_ids = Forest(), {}, a["nodes_treeids"]
    values = a.get("nodes_values_as_tensor") or a.get("nodes_values") or [0.0] * len(tree_ids)
    missing = a.get("nodes_missing_value_tracks_true") or [0] * len(tree_ids)
    for i, (t, n) in enumerate(zip(tree_ids, a["nodes_nodeids"])):
        mode = a["nodes_modes"][i]
        index[t, n] = f.add(a["nodes_featureids"][i], values[i], BRANCH_MODES.get(mode, LEQ), (), missing[i])
        if t not in {tree_ids[j] for j in range(i)}:
            f.roots.append(index[t, n])
    for i, (t, mode) in enumerate(zip(tree_ids, a["nodes_modes"])):
        if mode != b"LEAF":
            f.true_next[index[t, a["nodes_nodeids"][i]]] = index[t, a["nodes_truenodeids"][i]]
            f.false_next[index[t, a["nodes_nodeids"][i]]] = index[t, a["nodes_falsenodeids"][i]]
    weights = a.get(f"{prefix}_weights_as_tensor") or a.get(f"{prefix}_weights")
    for t, n, target, w in zip(a[f"{prefix}_treeids"], a[f"{prefix}_nodeids"], a[f"{prefix}_ids"], weights):
        f.weights[index[t, n]].append((target, w))
    return f


# ------------------------------------------------------------------------------------------ emitting


def _conditions(em: Emitter, x: str, f: Forest, dtype) -> str:
    """Every state's condition for every row: bool [N, S]."""
    feats = em.op("Gather", [x, em.const(np.array(f.feature, np.int64), "features")], axis=1)  # [N, S]
    thr = em.const(np.array(f.threshold, dtype), "thresholds")
    modes, cond = np.array(f.mode), None
    for m in sorted(set(f.mode), key=lambda m: -f.mode.count(m)):
        if m == MEMBER:
            c = _membership(em, x, f, dtype)
        elif m == NEQ:
            # NaN != t is true, as in onnxruntime; TVM may fold Not(Equal) into an ordered not-equal (false for NaN)
            c = em.op("Or", [em.op("Not", [em.op("Equal", [feats, thr])]), em.op("IsNaN", [feats])])
        else:
            c = em.op(COMPARE[m], [feats, thr])
        cond = c if cond is None else em.op("Where", [em.const(modes == m, "is_mode"), c, cond])
    if any(f.missing_true):
        nan = em.op("And", [em.op("IsNaN", [feats]), em.const(np.array(f.missing_true), "missing_true")])
        cond = em.op("Or", [cond, nan])
    return cond


def _membership(em: Emitter, x: str, f: Forest, dtype) -> str:
    """x[feature] in the state's member set (NaN padding never matches): bool [N, S]."""
    width = max(len(m) for m in f.members) or 1
    table = np.full((len(f.members), width), np.nan, dtype)
    for i, m in enumerate(f.members):
        table[i, : len(m)] = m
    col = em.op("Gather", [x, em.const(np.array(f.feature, np.int64)[:, None], "features")], axis=1)  # [N, S, 1]
    hits = em.op("Cast", [em.op("Equal", [col, em.const(table, "members")])], to=onnx.TensorProto.FLOAT)
    return em.op("Greater", [em.op("MatMul", [hits, em.const(np.ones(width, np.float32))]), em.const(np.float32(0))])


def _descend(em: Emitter, cond: str, f: Forest) -> str:
    """The state each tree ends in for every row: int64 [N, T]."""
    nxt_t = em.const(np.array(f.true_next, np.int64), "true_next")
    nxt_f = em.const(np.array(f.false_next, np.int64), "false_next")
    roots = np.array(f.roots, np.int64)
    c = em.op("Gather", [cond, em.const(roots, "roots")], axis=1)  # [N, T]
    idx = em.op("Where", [c, em.const(np.array(f.true_next)[roots]), em.const(np.array(f.false_next)[roots])])
    as_int = em.op("Cast", [cond], to=onnx.TensorProto.INT8)  # GatherElements on bool: not in every TVM kernel
    for _ in range(f.depth() - 1):
        c = em.op("Cast", [em.op("GatherElements", [as_int, idx], axis=1)], to=onnx.TensorProto.BOOL)
        idx = em.op("Where", [c, em.op("Gather", [nxt_t, idx]), em.op("Gather", [nxt_f, idx])])
    return idx


def _reduce(em: Emitter, op: str, x: str, axis: int, opset: int) -> str:
    """op over one axis, dropped; axes an input from opset 13 (ReduceSum) or 18 (the others)."""
    if opset >= (13 if op == "ReduceSum" else 18):
        return em.op(op, [x, em.const(np.array([axis], np.int64))], keepdims=0)
    return em.op(op, [x], axes=[axis], keepdims=0)


def _leaf_table(f: Forest, n_targets: int, aggregate: int, dtype) -> np.ndarray:
    """[S, targets]: a leaf's weight per target (summed; the least or most for MIN/MAX), the aggregate's
    neutral value where a state gives a target nothing."""
    fill = {2: np.finfo(dtype).max, 3: np.finfo(dtype).min}.get(aggregate, 0)
    table = np.full((len(f.weights), n_targets), fill, dtype)
    for s, entries in enumerate(f.weights):
        for target, w in entries:
            if aggregate in (0, 1):
                table[s, target] += w
            else:
                table[s, target] = (min if aggregate == 2 else max)(table[s, target], w)
    return table


def _emit_forest(em: Emitter, x: str, f: Forest, spec: dict, dtype, opset: int) -> str:
    """The aggregated, base-shifted scores [N, targets] (before the post transform)."""
    aggregate = spec["aggregate"]
    idx = _descend(em, _conditions(em, x, f, dtype), f)
    per_tree = em.op("Gather", [em.const(_leaf_table(f, spec["targets"], aggregate, dtype), "leaf_weights"), idx])
    y = _reduce(em, {0: "ReduceSum", 1: "ReduceSum", 2: "ReduceMin", 3: "ReduceMax"}[aggregate], per_tree, 1, opset)
    if aggregate == 0:
        y = em.op("Div", [y, em.const(np.array(len(f.roots), dtype))])
    elif aggregate in (2, 3):  # a target no tree gives a weight scores 0, as in onnxruntime (the reference: +-max)
        fill = em.const(np.array(np.finfo(dtype).max if aggregate == 2 else np.finfo(dtype).min, dtype))
        y = em.op("Where", [em.op("Equal", [y, fill]), em.const(np.array(0, dtype)), y])
    if spec.get("base") is not None:
        y = em.op("Add", [y, em.const(np.array(spec["base"], dtype), "base_values")])
    return y


def _post_transform(em: Emitter, y: str, transform: int, out: str) -> None:
    """The spec's codes: 1 SOFTMAX, 2 LOGISTIC (onnxruntime 1.32's TreeEnsemble-5 swaps these two)."""
    if transform == 1:
        em.op("Softmax", [y], out=out, axis=1)
    elif transform == 2:
        em.op("Sigmoid", [y], out=out)
    else:
        em.op("Identity", [y], out=out)


def _prepare(node, em: Emitter, shapes, where, transform: int):
    """The input as the float type compared in (double stays double, integers become float32), that
    type, and the default domain's opset (imported at DEFAULT_OPSET when the model has none)."""
    if transform in (3, 4):
        _fail(node, where, f"post_transform {'SOFTMAX_ZERO' if transform == 3 else 'PROBIT'} is not supported",
              "apply the transform after the model (export with post_transform NONE)")  # fmt: skip
    shape = shapes.get(node.input[0])
    if shape is not None and len(shape) != 2:
        _fail(node, where, f"input of shape {list(shape)}: a [N, features] input is supported", "reshape it to 2-D")
    model = CURRENT_MODEL.get()
    if model is not None and not any(o.domain in ("", "ai.onnx") for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("", DEFAULT_OPSET))  # the emitted ops' domain
    opset = (
        next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), DEFAULT_OPSET)
        if model
        else em.opset
    )
    t = elem_type(node.input[0])
    dtype = np.float64 if t == onnx.TensorProto.DOUBLE else np.float32
    x = (
        node.input[0]
        if t in (onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT)
        else em.op("Cast", [node.input[0]], to=1)
    )
    return x, dtype, opset


def tree_ensemble(node, em: Emitter, shapes, consts, where):
    """ai.onnx.ml TreeEnsemble (opset 5): output in the input's type."""
    a = _attrs(node)
    x, dtype, opset = _prepare(node, em, shapes, where, a.get("post_transform", 0))
    if elem_type(node.input[0]) not in (onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT):
        _fail(node, where, "a float16 input is not supported", "cast the input to float32 before the tree ensemble")
    spec = {"aggregate": a.get("aggregate_function", 1), "targets": a["n_targets"]}
    _post_transform(
        em, _emit_forest(em, x, forest_v5(a), spec, dtype, opset), a.get("post_transform", 0), node.output[0]
    )


def tree_ensemble_regressor(node, em: Emitter, shapes, consts, where):
    """ai.onnx.ml TreeEnsembleRegressor: float32 output whatever the input type."""
    a = _attrs(node)
    transform = TRANSFORMS[a.get("post_transform", b"NONE")]
    x, dtype, opset = _prepare(node, em, shapes, where, transform)
    base = a.get("base_values_as_tensor") or a.get("base_values") or None
    spec = {
        "aggregate": AGGREGATES[a.get("aggregate_function", b"SUM")],
        "targets": a.get("n_targets", 1),
        "base": base,
    }
    y = _emit_forest(em, x, forest_regressor(a, "target"), spec, dtype, opset)
    if dtype != np.float32:
        y = em.op("Cast", [y], to=onnx.TensorProto.FLOAT)
    _post_transform(em, y, transform, node.output[0])


def tree_ensemble_classifier(node, em: Emitter, shapes, consts, where):
    """ai.onnx.ml TreeEnsembleClassifier with integer labels: the class scores summed over the trees (Z,
    float32, post-transformed) and the label of the highest (Y, int64; the first on ties)."""
    a = _attrs(node)
    labels = a.get("classlabels_int64s")
    if not labels:
        _fail(node, where, "string class labels (classlabels_strings) are not supported",
              "TVM has no string tensors: export the classifier with integer labels (classlabels_int64s)")  # fmt: skip
    if len(labels) == 2 and len(set(a["class_ids"])) == 1:
        _fail(node, where, "a binary classifier with one score column (onnxruntime derives the other) is not "
              "supported", "export it with both classes' weights")  # fmt: skip
    transform = TRANSFORMS[a.get("post_transform", b"NONE")]
    x, dtype, opset = _prepare(node, em, shapes, where, transform)
    base = a.get("base_values_as_tensor") or a.get("base_values") or None
    spec = {"aggregate": 1, "targets": len(labels), "base": base}
    z = _emit_forest(em, x, forest_regressor(a, "class"), spec, dtype, opset)
    if dtype != np.float32:
        z = em.op("Cast", [z], to=onnx.TensorProto.FLOAT)
    best = em.op("ArgMax", [z], axis=1, keepdims=0)  # the transforms keep the order
    em.op("Gather", [em.const(np.array(labels, np.int64), "labels"), best], out=node.output[0])
    if len(node.output) > 1 and node.output[1]:
        _post_transform(em, z, transform, node.output[1])


REWRITES = {
    "TreeEnsemble": tree_ensemble,
    "TreeEnsembleRegressor": tree_ensemble_regressor,
    "TreeEnsembleClassifier": tree_ensemble_classifier,
}
