"""HoistBF16Casts: a cast to bf16 moved above the op before it where the two commute exactly (max pooling, strided
slices, reshapes, transposes: each picks or moves values, and rounding is monotonic), so the op runs on bf16 and
the tensor it reads can be written in bf16 alone. In a bf16 ResNet the stem conv wrote its 112x112x64 output in
float32 for the max pool, and each stage's last block wrote its output in float32 for the strided slice before the
downsample conv, both then cast to bf16; now FuseBF16Epilogue fuses the hoisted casts into those kernels, which
write half the bytes (benchmarks/history.md). `astype(op(x), bf16)` becomes `op(x16)`, x16 the cast of x the graph
has (the block output's, for the next conv), else a new one; only where the cast is op(x)'s one reader and x is
float32. `stats["bf16_casts_hoisted"]`."""

from __future__ import annotations

import tvm
from tvm import relax

from ...counters import Counter
from ..ir import op_name, var_users
from .module_map import rebuilt, rewrite_blocks, var_like

COMMUTING = ("relax.nn.max_pool2d", "relax.strided_slice", "relax.reshape", "relax.permute_dims")


def _cast_to_bf16(value) -> bool:
    return op_name(value) == "relax.astype" and str(value.attrs.dtype) == "bfloat16"


def _hoist_block(block, stats):
    bindings = list(block.bindings)
    defs = {b.var: (i, b.value) for i, b in enumerate(bindings)}
    users = var_users(bindings)
    var = var_like(block)
    casts = {b.value.args[0]: b.var for b in bindings if _cast_to_bf16(b.value)}
    replace: dict = {}
    for i, b in enumerate(bindings):
        if not _cast_to_bf16(b.value) or not isinstance(b.value.args[0], relax.Var):
            continue
        y = b.value.args[0]
        j, op = defs.get(y, (None, None))
        if op_name(op) not in COMMUTING or len(users.get(y, [])) != 1 or not isinstance(op.args[0], relax.Var):
            continue
        x = op.args[0]
        if str(x.ty.dtype) != "float32":
            continue
        x16, new = casts.get(x), []
        if x16 is None or defs[x16][0] > j:  # none, or one after the op: a new cast, just before it
            x16 = var(f"{x.name}_bf16", relax.TensorType(x.ty.shape, "bfloat16"))
            casts[x], defs[x16] = x16, (j, None)
            new.append(relax.VarBinding(x16, relax.op.astype(x, "bfloat16")))
        moved = relax.Call(op.op, [x16, *op.args[1:]], op.attrs)
        replace[j] = new + [relax.VarBinding(b.var, moved)]
        replace[i] = []
        stats["bf16_casts_hoisted"] += 1
    return rebuilt(block, bindings, replace)


# what HoistBF16Casts counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("bf16_casts_hoisted", int, "bf16 casts moved above a max pool, slice, reshape or transpose"),
)


@tvm.transform.module_pass(opt_level=2, name="HoistBF16Casts")
class HoistBF16Casts:
    COUNTERS = COUNTERS

    def __init__(self):
        self.stats = {"bf16_casts_hoisted": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        out = rewrite_blocks(mod, lambda blk: _hoist_block(blk, self.stats))
        return relax.transform.DeadCodeElimination(["main"])(out) if self.stats["bf16_casts_hoisted"] else mod
