"""The accelerator's layers in the Relax graph (compile side): TVM's partitioning turns each
offloadable chain into a composite function, then each one is lowered to a call of its layer's
packed function. A layer whose input (or residual) is another accelerator layer's output takes
that layer's int8 output as it is; the CPU quantizes only float inputs, and dequantizes an
output only for CPU consumers (dead-code elimination drops the rest)."""

from __future__ import annotations

import dataclasses

import numpy as np
import tvm
from tvm import relax

from ....accel.vta import runtime
from ...ir import op_name as _op


def _quantize(bb, x, scale: float):
    op = relax.op
    return bb.emit(
        op.astype(op.clip(op.round(op.multiply(x, relax.const(np.float32(1.0 / scale)))), -127.0, 127.0), "int8")
    )


def _lower_layer(bb, ch, x, residual, compiled: tuple, uid: str, int8_of):
    """[quantize (CPU)] -> the layer's packed function (accelerator) -> dequantize (CPU, for CPU
    consumers only: a neighbouring accelerator layer takes the int8 output, int8_of finds it).
    Returns (the float output, the int8 output)."""
    index, prog, info = compiled
    op = relax.op
    xq = int8_of(x) if info["int8_input_from"] else None
    xq = xq if xq is not None else _quantize(bb, x, info["sx"])
    if ch.dense:
        xq = bb.emit(op.reshape(xq, list(prog.in_shape)))
    args = [xq]
    if ch.residual is not None:
        rq = int8_of(residual) if info["int8_residual_from"] else None
        args.append(rq if rq is not None else _quantize(bb, residual, info["sr"]))
    yq = bb.emit(
        relax.call_dps_packed(runtime.func_name(uid, index), args, relax.TensorType(list(prog.out_shape), "int8"))
    )
    if ch.dense:
        yq = bb.emit(op.reshape(yq, [1, prog.out_shape[1]]))
    return bb.emit(op.multiply(op.astype(yq, "float32"), relax.const(np.float32(info["sy"])))), yq


def partition(mod, chains: list) -> tvm.IRModule:
    """TVM's partitioning: FuseOpsByPattern turns each offloadable chain into a composite function
    (`vta.conv2d_bias_relu`, `vta.dense_bias_relu`, ...; its check accepts exactly the chains
    find_chains accepted, each one whole), MergeCompositeFunctions groups neighbouring composites
    into `Codegen="vta"` functions."""
    from tvm.relax.dpl import is_const, is_op, wildcard
    from tvm.relax.transform import FusionPattern

    accepted = {_weight_key(ch.conv): ch for ch in chains if ch.reason is None}

    def check_for(res: bool, bias: bool, relu: bool):
        def check(ctx) -> bool:
            # by weights, not object identity: fusing one pattern rebuilds the calls downstream of it;
            # the chain's own shape too, or a bias add would pass for a residual add (MobileNetV2)
            ch = accepted.get(_weight_key(ctx.annotated_expr["root"]))
            return (
                ch is not None
                and ((ch.residual is not None), (ch.bias is not None), ch.relu) == (res, bias, relu)
                and _op(ctx.matched_expr) == _op(ch.end)
            )

        return check

    patterns = []
    root = is_op("relax.nn.conv2d")(wildcard(), is_const())
    for name, body in (("bias_res", is_op("relax.add")(root, is_const())), ("res", root)):
        # one pattern per operand order: an alternative ("|") would stop at the first order that matches,
        # and in `block input + conv(...)` the block input can itself look like the body (an earlier conv + bias)
        for added in (is_op("relax.add")(body, wildcard()), is_op("relax.add")(wildcard(), body)):
            for suffix, top in (("_relu", is_op("relax.nn.relu")(added)), ("", added)):
                check = check_for(True, name == "bias_res", suffix == "_relu")
                patterns.append(FusionPattern(f"vta.conv2d_{name}{suffix}", top, {"root": root}, check))
    for base, tag in (("relax.nn.conv2d", "conv2d"), ("relax.matmul", "dense")):
        root = is_op(base)(wildcard(), is_const())
        add = is_op("relax.add")(root, is_const())
        for name, top, bias, relu in (
            (f"vta.{tag}_bias_relu", is_op("relax.nn.relu")(add), True, True),
            (f"vta.{tag}_bias", add, True, False),
            (f"vta.{tag}_relu", is_op("relax.nn.relu")(root), False, True),
            (f"vta.{tag}", root, False, False),
        ):
            patterns.append(FusionPattern(name, top, {"root": root}, check_for(False, bias, relu)))
    fused = relax.transform.FuseOpsByPattern(patterns, bind_constants=True, annotate_codegen=False)(mod)
    return relax.transform.MergeCompositeFunctions()(fused)


def _weight_key(call) -> bytes:
    w = call.args[1].value.numpy()
    return w.tobytes() + str(w.shape).encode()


def _root_weight(func) -> bytes:
    found = []
    relax.analysis.post_order_visit(
        func.body, lambda e: found.append(e) if _op(e) in ("relax.nn.conv2d", "relax.matmul") else None
    )
    return _weight_key(found[0])


@relax.expr_functor.mutator
class _Lower(relax.PyExprMutator):
    """Inline every `Codegen="vta"` function, each composite call in it lowered to its layer's
    accelerator call (the composite is matched to its chain by its weights)."""

    def __init__(self, mod, chains: list, compiled: dict, uid: str):
        super().__init__(mod)
        self.mod, self.compiled, self.uid = mod, compiled, uid
        self.by_weight = {_weight_key(ch.conv): ch for ch in chains if ch.reason is None}
        self.lowered = 0
        self.int8: dict = {}  # dequantized output variable -> the int8 output it came from

    def visit_call_(self, call):
        f = self.mod[call.op] if isinstance(call.op, tvm.ir.GlobalVar) else None
        attrs = (f.attrs or {}) if isinstance(f, relax.Function) else {}
        if "Composite" not in attrs and "Codegen" not in attrs:
            return super().visit_call_(call)
        args = [self.visit_expr(a) for a in call.args]
        if "Composite" in attrs:
            return self._layer(f, args)
        for p, a in zip(f.params, args):
            self.set_var_remap(p, a)
        local = {}  # MergeCompositeFunctions binds each composite as a local function inside the Codegen one
        for block in f.body.blocks:
            for b in block.bindings:
                v = b.value
                if isinstance(v, relax.Function):
                    local[b.var] = v
                    continue
                callee = local.get(v.op) if isinstance(v, relax.Call) and isinstance(v.op, relax.Var) else None
                new = (
                    self._layer(callee, [self.visit_expr(a) for a in v.args])
                    if callee is not None
                    else self.visit_expr(v)
                )
                self.set_var_remap(b.var, self.builder_.emit(new))
        return self.visit_expr(f.body.body)

    def _layer(self, composite, args):
        ch = self.by_weight[_root_weight(composite)]
        self.lowered += 1
        x, residual = _inputs(composite, args)
        y, yq = _lower_layer(self.builder_, ch, x, residual, self.compiled[ch.name], self.uid, self._int8_of)
        self.int8[y] = yq
        return y

    def _int8_of(self, v):
        """The int8 output of the accelerator layer whose dequantized output v is (through aliases)."""
        for _ in range(8):
            if v in self.int8:
                return self.int8[v]
            if not isinstance(v, relax.Var):
                return None
            try:
                v = self.builder_.lookup_binding(v)
            except Exception:  # not bound in this builder
                return None
            if v is None:
                return None
        return None


def _inputs(composite, args):
    """(conv input, residual or None) among a composite's arguments: the conv's data operand is
    the first, the other free input (if any) the residual."""
    found = []
    relax.analysis.post_order_visit(
        composite.body, lambda e: found.append(e) if _op(e) in ("relax.nn.conv2d", "relax.matmul") else None
    )
    data = found[0].args[0]
    by_param = dict(zip(composite.params, args))
    x = next(a for p, a in by_param.items() if p.same_as(data))
    rest = [a for p, a in by_param.items() if not p.same_as(data)]
    return x, (rest[0] if rest else None)


def offloaded(mod, chains, layers, uid: str):
    compiled = {ch.name: (i, prog, info) for i, (ch, prog, info) in enumerate(layers)}
    offload = [
        dataclasses.replace(ch, reason=None)
        if ch.name in compiled
        else dataclasses.replace(ch, reason=ch.reason or "not compiled")
        for ch in chains
    ]
    parts = partition(mod, offload)
    lower = _Lower(parts, offload, compiled, uid)
    main = lower.visit_expr(parts["main"])
    keep = {
        gv: f
        for gv, f in parts.functions.items()  # the partition's functions are all inlined now
        if not (isinstance(f, relax.Function) and f.attrs and ("Codegen" in f.attrs or "Composite" in f.attrs))
    }
    out = tvm.IRModule(keep, attrs=parts.attrs)
    out["main"] = main
    if lower.lowered != len(compiled):
        raise AssertionError(f"partitioned {lower.lowered} accelerator layers, compiled {len(compiled)}")
    return relax.transform.DeadCodeElimination(["main"])(relax.transform.Normalize()(out))
