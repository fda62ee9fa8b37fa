"""What the two epilogue passes share (FuseBF16Epilogue for the bf16 convs, FuseBF16MatmulEpilogue for the bf16
matmuls): finding the C kernel a binding calls, the driver over every block, and the bindings that replace a chain
fused into one kernel call: the chain's last value in float32 where anything but a bf16 cast reads it, and in bf16
for the casts to bf16 that read it, as one output or a tuple of both."""

from __future__ import annotations

import tvm
from tvm import relax

from ..ir import op_name, var_uses
from .counting import static_shape
from .module_map import keep_added_functions, rewrite_functions, var_like

CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def called_primfunc(mod, value):
    """The PrimFunc a binding's value calls through call_tir, else None."""
    if not (
        isinstance(value, relax.Call) and value.op.same_as(CALL_TIR) and isinstance(value.args[0], tvm.ir.GlobalVar)
    ):
        return None
    func = mod[value.args[0]]
    return func if isinstance(func, tvm.tirx.PrimFunc) else None


def tensor_type(e) -> tuple | None:
    """(static shape, dtype) of a tensor-typed expression, else None."""
    shape = static_shape(e)
    return None if shape is None else (shape, str(e.ty.dtype))


def fuse_epilogues(mod, fuse_block, stats: dict, counter: str):
    """fuse_block(mod, builder, block, uses, stats) over every block of every function; the module with the kernels
    it added and the bindings it left dead dropped, or `mod` itself where stats[counter] stayed 0."""
    builder = relax.BlockBuilder(mod)

    def rewrite(f):
        if not isinstance(f.body, relax.SeqExpr):
            return f
        uses = var_uses(f)
        blocks = [fuse_block(mod, builder, blk, uses, stats) for blk in f.body.blocks]
        return relax.Function(f.params, relax.SeqExpr(blocks, f.body.body), f.ret_ty, f.is_pure, f.attrs)

    out = rewrite_functions(mod, rewrite)
    if not stats[counter]:
        return mod
    return relax.transform.DeadCodeElimination(["main"])(keep_added_functions(out, mod, builder))


def bf16_casts(bindings, users: dict, var, claimed: set, dtype: str = "bfloat16") -> list[int]:
    """The indices of the bindings casting `var` to bf16 (or `dtype`: fp16 kernels) that no other fusion has
    taken."""
    return [
        k
        for k in users.get(var, [])
        if op_name(bindings[k].value) == "relax.astype"
        and str(bindings[k].value.attrs.dtype) == dtype
        and k not in claimed
    ]


def output_types(shape, float32: bool, bf16: bool, dtype: str = "bfloat16") -> list:
    """The kernel's output types: float32 and/or bf16 (or `dtype`), in that order."""
    return [relax.TensorType(list(shape), "float32")] * float32 + [relax.TensorType(list(shape), dtype)] * bf16


def kernel_call(gv, args: list, types: list):
    """The call_tir of an epilogue kernel: one output, or a tuple of its float32 and bf16 outputs."""
    return relax.call_tir(gv, args, types if len(types) > 1 else types[0])


def rebind(block, bindings, chain: list[int], casts: list[int], call, types: list, replace: dict) -> None:
    """Fill `replace` (binding index -> the bindings in its place, [] drops it) for the kernel `call` that
    computes the chain's value (its output `types`, from output_types): bound to the chain's last var
    (float32) and/or to the casts' vars (bf16)."""
    final, float32 = bindings[chain[-1]].var, str(types[0].dtype) == "float32"
    for k in chain[:-1]:
        replace[k] = []
    if not (float32 and casts):  # one output: bound to the chain's var, or to the first cast
        first = final if float32 else bindings[casts[0]].var
        replace[chain[-1]] = [relax.VarBinding(first, call)] if float32 else []
        if not float32:
            replace[casts[0]] = [relax.VarBinding(first, call)]
        for k in casts[0 if float32 else 1 :]:
            replace[k] = [relax.VarBinding(bindings[k].var, first)]
        return
    both = var_like(block)(f"{final.name}_ep", relax.TupleType(types))
    replace[chain[-1]] = [relax.VarBinding(both, call), relax.VarBinding(final, relax.TupleGetItem(both, 0))]
    for k in casts:
        replace[k] = [relax.VarBinding(bindings[k].var, relax.TupleGetItem(both, 1))]
