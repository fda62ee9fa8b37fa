"""Loop and Scan unrolled into straight-line ONNX (Kiln compiles ahead of time with static shapes):
a Loop whose trip count is a constant once shapes are pinned and whose condition never turns false,
and a Scan over its static scan-axis length, become their body repeated with per-iteration names,
loop-carried values chained and scan outputs stacked. A Loop whose trip count or termination
depends on data has no static shape and is refused by name. Body names that are not the body's
own (outer-scope values) keep their names, also inside subgraphs nested in the body; the unrolled
nodes go through the rewrites again (decompose() runs to a fixpoint), so an LSTM or a Loop inside
a body is handled as well."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from ...errors import UnsupportedModelError
from .emitter import Emitter

MAX_UNROLLED_NODES = 200_000  # past this the unrolled graph would take TVM too long to compile


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _locals(g: onnx.GraphProto) -> set[str]:
    return {i.name for i in g.input} | {i.name for i in g.initializer} | {o for n in g.node for o in n.output if o}


def _renamed_subgraph(g: onnx.GraphProto, rename: dict, prefix: str) -> onnx.GraphProto:
    """A copy of a subgraph nested in the body, reading the renamed names of the body's locals, its
    own names prefixed (copies of one body must not share names: ONNX's shape inference keys on them)."""
    inner = dict(rename)
    inner.update({n: f"{prefix}{n}" for n in _locals(g)})
    c = onnx.GraphProto()
    c.CopyFrom(g)
    for v in list(c.input) + list(c.initializer):
        v.name = inner[v.name]
    for n in c.node:
        _rename_node(n, inner, prefix)
        n.output[:] = [inner.get(o, o) if o else "" for o in n.output]
    for v in list(c.output) + list(c.value_info):
        v.name = inner.get(v.name, v.name)
    return c


def _rename_node(n: onnx.NodeProto, rename: dict, prefix: str) -> None:
    n.input[:] = [rename.get(i, i) if i else "" for i in n.input]
    for a in n.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            a.g.CopyFrom(_renamed_subgraph(a.g, rename, prefix))
        elif a.type == onnx.AttributeProto.GRAPHS:
            subs = [_renamed_subgraph(s, rename, prefix) for s in a.graphs]
            del a.graphs[:]
            a.graphs.extend(subs)


def inline_body(em: Emitter, body: onnx.GraphProto, feeds: list[str | None], tag: str) -> list[str]:
    """Emit one copy of body with its inputs bound to feeds (outer names; None: the input stays
    unbound, an error if read); returns the outer names of its outputs."""
    rename = {}
    for inp, src in zip(body.input, feeds):
        rename[inp.name] = src if src is not None else em.name(f"{tag}/unbound")
    for init in body.initializer:
        rename[init.name] = em.const(numpy_helper.to_array(init), f"{tag}/{init.name}")
    for n in body.node:
        for o in n.output:
            if o:
                rename[o] = em.name(f"{tag}/{o}")
    for n in body.node:
        c = onnx.NodeProto()
        c.CopyFrom(n)
        c.name = em.name(f"{tag}/{n.name or n.op_type}")
        _rename_node(c, rename, c.name + "/")
        c.output[:] = [rename.get(o, o) if o else "" for o in n.output]
        em.nodes.append(c)
    return [rename.get(o.name, o.name) for o in body.output]


def unsqueeze(em: Emitter, x: str, axis: int) -> str:
    """Unsqueeze in the form of the model's opset (axes became an input in opset 13)."""
    if getattr(em, "opset", 13) >= 13:
        return em.op("Unsqueeze", [x, em.const(np.array([axis], np.int64), "ax")])
    return em.op("Unsqueeze", [x], axes=[axis])


def _stack(em: Emitter, parts: list[str], axis: int, out: str) -> None:
    """Stack same-shape tensors along a new axis (negative counts from the result's end)."""
    if len(parts) == 1:
        em.op("Identity", [unsqueeze(em, parts[0], axis)], out=out)
    else:
        em.op("Concat", [unsqueeze(em, p, axis) for p in parts], out=out, axis=axis)


def _is_true_const(name: str, consts) -> bool:
    return name in consts and np.asarray(consts[name]).size == 1 and bool(np.asarray(consts[name]).reshape(-1)[0])


def _body_keeps_cond(body: onnx.GraphProto) -> bool:
    """True when the body's cond output is its cond input passed through, or a constant true."""
    cond_in, cond_out = body.input[1].name, body.output[0].name
    inits = {i.name: numpy_helper.to_array(i) for i in body.initializer}
    seen = set()
    while cond_out not in seen:
        seen.add(cond_out)
        if cond_out == cond_in:
            return True
        if cond_out in inits:
            return bool(np.asarray(inits[cond_out]).reshape(-1)[0])
        prod = next((n for n in body.node if cond_out in n.output), None)
        if prod is None:
            return False  # an outer-scope value: not known here
        if prod.op_type == "Identity":
            cond_out = prod.input[0]
        elif prod.op_type == "Constant":
            t = _attr(prod, "value")
            return t is not None and bool(numpy_helper.to_array(t).reshape(-1)[0])
        else:
            return False
    return False


def _body(node, n_in: int, n_out_min: int, where_n: str) -> onnx.GraphProto:
    """The node's body graph, checked against the node's inputs (a malformed node is refused, not a crash)."""
    body = _attr(node, "body")
    if not isinstance(body, onnx.GraphProto) or len(body.input) != n_in or len(body.output) < n_out_min:
        raise UnsupportedModelError(
            f"{node.op_type} node without a body graph matching its inputs",
            where=where_n,
            fix="check the model with onnx.checker.check_model and re-export it",
        )
    return body


def _check_size(node, body, trips: int, where_n: str) -> None:
    if trips * max(len(body.node), 1) > MAX_UNROLLED_NODES:
        raise UnsupportedModelError(
            f"{node.op_type} of {trips} iterations x {len(body.node)} nodes is too large to unroll",
            where=where_n,
            fix="export fewer iterations, or compute the loop outside the model",
        )


def unroll_loop(node, em: Emitter, shapes, consts, where) -> None:
    """ONNX Loop: inputs (M, cond, v_initial...), body (iter_num, cond_in, v_in...) ->
    (cond_out, v_out..., scan_out...); outputs v_final..., scan outputs stacked on a new axis 0."""
    where_n = f"{where}: node {node.name!r}"
    body = _body(node, max(len(node.input), 2), max(len(node.input) - 1, 1), where_n)
    m_name = node.input[0] if len(node.input) > 0 else ""
    c_name = node.input[1] if len(node.input) > 1 else ""
    if not m_name or m_name not in consts:
        why = "has no trip count" if not m_name else f"has a trip count {m_name!r} computed from data"
        raise UnsupportedModelError(
            f"Loop {why}: the number of iterations (and so its outputs' shapes) is only known at run time",
            where=where_n,
            fix="Kiln unrolls a Loop whose trip count is a constant once input shapes are pinned; "
            "freeze the input it depends on with --freeze-input NAME=VALUE if it is known, or unroll before export",
        )
    if c_name and c_name not in consts:
        raise UnsupportedModelError(
            f"Loop with an initial condition {c_name!r} computed from data can stop early at run time",
            where=where_n,
            fix="drop the loop's condition input, or freeze it with --freeze-input NAME=VALUE",
        )
    if c_name and not _is_true_const(c_name, consts):
        trips = 0
    else:
        trips = int(np.asarray(consts[m_name]).reshape(-1)[0])
    if trips > 0 and not _body_keeps_cond(body):
        raise UnsupportedModelError(
            "Loop whose condition is computed in its body can stop after a data-dependent number of iterations",
            where=where_n,
            fix="make the loop's continue-condition constant true (a for loop), or unroll before export",
        )
    n_carried = len(node.input) - 2
    n_scan = len(body.output) - 1 - n_carried
    if trips <= 0:
        if n_scan:
            raise UnsupportedModelError(
                "Loop of zero iterations with scan outputs (empty tensors) is not supported",
                where=where_n,
                fix="remove the loop from the model",
            )
        for src, dst in zip(node.input[2:], node.output):
            if dst:
                em.op("Identity", [src], out=dst)
        return
    _check_size(node, body, trips, where_n)
    state = list(node.input[2:])
    scans: list[list[str]] = [[] for _ in range(n_scan)]
    true = em.const(np.array(True), "true")
    for it in range(trips):
        outs = inline_body(em, body, [em.const(np.array(it, np.int64), "iter"), true] + state, f"it{it}")
        state = outs[1 : 1 + n_carried]
        for k in range(n_scan):
            scans[k].append(outs[1 + n_carried + k])
    for src, dst in zip(state, node.output[:n_carried]):
        if dst:
            em.op("Identity", [src], out=dst)
    for parts, dst in zip(scans, node.output[n_carried:]):
        if dst:
            _stack(em, parts, 0, dst)


def _axes(node, name: str, n: int) -> list[int]:
    v = _attr(node, name)
    return list(v) if v is not None else [0] * n


def _scan_core(
    em: Emitter,
    node,
    body,
    states: list[str],
    xs: list[str],
    x_shapes: list[tuple],
    where_n: str,
    tag: str,
    x_axes: list[int],
    x_dirs: list[int],
    y_axes: list[int],
    y_dirs: list[int],
) -> list[str]:
    """One Scan (opset-9 semantics) over tensors; returns the final states then the scan outputs."""
    lengths = {s[a % len(s)] for s, a in zip(x_shapes, x_axes)}
    if len(lengths) != 1:
        raise UnsupportedModelError(
            f"Scan inputs disagree on the scan length ({sorted(lengths)})",
            where=where_n,
            fix="the scan axes of all scan inputs must have one length",
        )
    T = lengths.pop()
    _check_size(node, body, T, where_n)
    n_out = len(body.output) - len(states)
    ys: list[list[str]] = [[] for _ in range(n_out)]
    for t in range(T):
        sl = [
            em.op("Gather", [x, em.const(np.array(T - 1 - t if d else t, np.int64), "t")], axis=a)
            for x, a, d in zip(xs, x_axes, x_dirs)
        ]
        outs = inline_body(em, body, states + sl, f"{tag}t{t}")
        states = outs[: len(states)]
        for k in range(n_out):
            ys[k].append(outs[len(states) + k])
    results = []
    for k, parts in enumerate(ys):
        if y_dirs[k]:
            parts = parts[::-1]
        name = em.name("scan_out")
        _stack(em, parts, y_axes[k], name)
        results.append(name)
    return states + results


def unroll_scan(node, em: Emitter, shapes, consts, where) -> None:
    """ONNX Scan. Opset 9+: inputs (state..., scan_input...); opset 8: (sequence_lens, state...,
    scan_input...) with a batch axis 0 in front of everything, unrolled per batch entry."""
    where_n = f"{where}: node {node.name!r}"
    m = _attr(node, "num_scan_inputs")
    batched = getattr(em, "opset", 9) < 9
    ins = list(node.input)
    if not isinstance(m, int) or not 0 < m <= len(ins) - batched:
        raise UnsupportedModelError(
            "Scan node with a num_scan_inputs that does not match its inputs",
            where=where_n,
            fix="check the model with onnx.checker.check_model and re-export it",
        )
    body = _body(node, len(ins) - batched, len(ins) - batched - m, where_n)
    if batched:
        if ins[0]:
            raise UnsupportedModelError(
                "opset-8 Scan with sequence_lens is not supported",
                where=where_n,
                fix="pad the sequences to one length and drop sequence_lens",
            )
        ins = ins[1:]
    n = len(ins) - m
    states, xs = ins[:n], ins[n:]
    missing = [x for x in xs if x not in shapes]
    if missing:
        raise UnsupportedModelError(
            f"Scan input {missing[0]!r} has no static shape", where=where_n, fix="pin every input with --input-shape"
        )
    x_shapes = [shapes[x] for x in xs]
    n_out = len(body.output) - n
    if batched:
        dirs = list(_attr(node, "directions", [0] * m))
        B = x_shapes[0][0]
        per_b = []
        for b in range(B):
            pick = lambda v, b=b: em.op("Gather", [v, em.const(np.array(b, np.int64), "b")], axis=0)
            per_b.append(
                _scan_core(
                    em,
                    node,
                    body,
                    [pick(s) for s in states],
                    [pick(x) for x in xs],
                    [s[1:] for s in x_shapes],
                    where_n,
                    f"b{b}",
                    [0] * m,
                    dirs,
                    [0] * n_out,
                    [0] * n_out,
                )
            )
        for k, dst in enumerate(node.output):
            if dst:
                _stack(em, [r[k] for r in per_b], 0, dst)
        return
    res = _scan_core(
        em,
        node,
        body,
        states,
        xs,
        x_shapes,
        where_n,
        "",
        _axes(node, "scan_input_axes", m),
        _axes(node, "scan_input_directions", m),
        _axes(node, "scan_output_axes", n_out),
        _axes(node, "scan_output_directions", n_out),
    )
    for src, dst in zip(res, node.output):
        if dst:
            em.op("Identity", [src], out=dst)


REWRITES = {"Loop": unroll_loop, "Scan": unroll_scan}
