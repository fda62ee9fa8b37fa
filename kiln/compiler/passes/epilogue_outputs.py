"""The bindings that replace a chain of bindings fused into one C kernel call with an epilogue
(FuseBF16Epilogue for the bf16 convs, FuseBF16MatmulEpilogue for the bf16 matmuls): the chain's last value
in float32 where anything but a bf16 cast reads it, and in bf16 for the casts to bf16 that read it, as one
output or a tuple of both."""

from __future__ import annotations

from tvm import relax

from ..ir import op_name


def bf16_casts(bindings, users: dict, var, claimed: set) -> list[int]:
    """The indices of the bindings casting `var` to bf16 that no other fusion has taken."""
    return [
        k
        for k in users.get(var, [])
        if op_name(bindings[k].value) == "relax.astype"
        and str(bindings[k].value.attrs.dtype) == "bfloat16"
        and k not in claimed
    ]


def output_types(shape, float32: bool, bf16: bool) -> list:
    """The kernel's output types: float32 and/or bf16, in that order."""
    return [relax.TensorType(list(shape), "float32")] * float32 + [relax.TensorType(list(shape), "bfloat16")] * bf16


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
    var = relax.DataflowVar if isinstance(block, relax.DataflowBlock) else relax.Var
    both = var(f"{final.name}_ep", relax.TupleType(types))
    replace[chain[-1]] = [relax.VarBinding(both, call), relax.VarBinding(final, relax.TupleGetItem(both, 0))]
    for k in casts:
        replace[k] = [relax.VarBinding(bindings[k].var, relax.TupleGetItem(both, 1))]


def rebuilt(block, bindings, replace: dict):
    """The block with `replace` applied (the block itself where nothing changed)."""
    if not replace:
        return block
    new_bindings = [nb for i, b in enumerate(bindings) for nb in replace.get(i, [b])]
    kind = relax.DataflowBlock if isinstance(block, relax.DataflowBlock) else relax.BindingBlock
    return kind(new_bindings)
