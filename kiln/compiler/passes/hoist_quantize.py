"""HoistQuantize: the quantization of a max pool's or a strided slice's output moves above it (the int8 twin of
HoistBF16Casts). QuantizeGraph's quantize (--quantize int8), clip(round(x * (1 / s)) [+ zp], 0, 255) as uint8, and
a QDQ model's per-tensor relax.quantize are elementwise with scalar parameters and never decreasing in x, so they
commute with picking values (a slice) and with taking their maximum (a max pool, whose padding is the dtype's
lowest value on either side): exact. The op then runs on the codes, and the conv before it writes 1 byte an
element in its epilogue instead of float32's 4: ResNet's stem conv for its max pool. Only where the op's output is
read by the quantize alone and its input is float32. A strided shortcut and the next block's first conv read one
tensor: calibration gives them one range (quantize.rewrite.shared_ranges), so the hoisted quantize is the conv's,
and the block's conv writes the codes once for both. (Slicing the conv's codes while the shortcut's requantization
kept its own scale took ResNet-50's int8 logits from 0.74 to 5.25 off float32's.) `stats["quantizes_hoisted"]`."""

from __future__ import annotations

import tvm
from tvm import relax

from ...counters import Counter
from ..ir import op_name, scalar_value, var_users
from ..quantize.rewrite import PICKING, quantize_act_chain
from .module_map import rebuilt, rewrite_blocks, var_like


def _per_tensor_quantize(v) -> bool:
    """relax.quantize with a positive scalar scale and zero point (LowerQDQ leaves it after float ops)."""
    scale = scalar_value(v.args[1]) if op_name(v) == "relax.quantize" else None
    return (
        scale is not None
        and scale > 0
        and scalar_value(v.args[2]) is not None
        and str(v.attrs.out_dtype) in ("uint8", "int8")
    )


def _quantize_chain(bindings, users: dict, y):
    """The binding indices of the quantize that is y's one reader: a QDQ model's relax.quantize, or quantize_act's
    chain (--quantize int8), else None."""
    one = users.get(y, [])
    if len(one) != 1:
        return None
    if _per_tensor_quantize(bindings[one[0]].value):
        return one
    got = quantize_act_chain(bindings, users, one[0])
    return None if got is None else got[0]


def _hoist_block(block, stats):
    bindings = list(block.bindings)
    users = var_users(bindings)
    var = var_like(block)
    replace: dict = {}
    for j, b in enumerate(bindings):
        op = b.value
        if op_name(op) not in PICKING or not isinstance(op.args[0], relax.Var) or j in replace:
            continue
        x = op.args[0]
        chain = _quantize_chain(bindings, users, b.var) if str(x.ty.dtype) == "float32" else None
        if chain is None:
            continue
        new, cur = [], x
        for k in chain:  # the chain on x, just before the op
            v = bindings[k].value
            out = var(f"{bindings[k].var.name}_h", relax.TensorType(x.ty.shape, bindings[k].var.ty.dtype))
            new.append(relax.VarBinding(out, relax.Call(v.op, [cur, *v.args[1:]], v.attrs)))
            cur = out
        last = bindings[chain[-1]].var
        replace[j] = new + [relax.VarBinding(last, relax.Call(op.op, [cur, *op.args[1:]], op.attrs))]
        for k in chain:
            replace[k] = []
        stats["quantizes_hoisted"] += 1
    return rebuilt(block, bindings, replace)


# what HoistQuantize counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("quantizes_hoisted", int, "int8 quantizes moved above a max pool or strided slice"),
)


@tvm.transform.module_pass(opt_level=2, name="HoistQuantize")
class HoistQuantize:
    COUNTERS = COUNTERS

    def __init__(self, merge: bool = True):
        self.merge = merge  # merge QuantizeGraph's identical quantizes first (--quantize int8 builds)
        self.stats = {"quantizes_hoisted": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        # QuantizeGraph quantizes a tensor once per int8 layer reading it, with the same parameters where the layers
        # read the same tensor (a max pool's output read by a block's first conv and its shortcut): one chain
        merged = relax.transform.EliminateCommonSubexpr()(mod) if self.merge else mod
        out = rewrite_blocks(merged, lambda blk: _hoist_block(blk, self.stats))
        return relax.transform.DeadCodeElimination(["main"])(out) if self.stats["quantizes_hoisted"] else mod
