"""FuseBF16MatmulEpilogue: the activation, residual add and bf16 cast that follow a BF16MatmulKernel matmul
run inside its C kernel, on each output vector while it is in registers, instead of as TVM kernels that read
the float32 result back and write it again. A transformer's FFN-up matmul then writes GELU(x W + b) in bf16,
which the FFN-down matmul reads directly; the attention-output and FFN-down matmuls add the residual as they
store. From each kernel call (its bias already inside) it follows: [an activation: GELU in any spelling, or
ReLU (activation_region)] -> [+ residual tensor of the output's shape], through reshapes (views of the
kernel's row-major output); the chain's value is written in bf16
for the casts to bf16 that read it and in float32 where anything else does. Timings in benchmarks/history.md.
`stats["bf16_matmul_epilogues_fused"]` counts the kernels that took an epilogue."""

from __future__ import annotations

import tvm
from tvm import relax

from ...counters import Counter
from ...schedules.kernels import C_KERNEL_ATTR
from ..ir import op_name, var_users
from .activation_region import activation_after
from .bf16_matmul_kernel import BY_SOURCE, F32, MatmulEpilogue, kernel_func
from .counting import static_shape
from .epilogue_outputs import (
    bf16_casts,
    called_primfunc,
    fuse_epilogues,
    kernel_call,
    output_types,
    rebind,
    tensor_type,
)
from .module_map import rebuilt


def _kernel(mod, value):
    """The BF16MatmulKernel (or FP16MatmulKernel) PrimFunc a binding's value calls with no epilogue past its bias,
    else None."""
    func = called_primfunc(mod, value)
    info = (func.attrs or {}).get("kiln.bf16_matmul") if func is not None else None
    return func if info is not None and [int(v) for v in info][1:] == [0, 1, 0] else None


def _residual(bindings, users, cur, uses, claimed):
    """(binding index, residual var) for the one use of `cur` that adds a float32 tensor of its shape."""
    readers = users.get(cur, [])
    if uses.get(cur, 0) != 1 or len(readers) != 1 or readers[0] in claimed:
        return None
    value = bindings[readers[0]].value
    if op_name(value) != "relax.add":
        return None
    other = value.args[1] if value.args[0].same_as(cur) else value.args[0]
    if isinstance(other, relax.Var) and not other.same_as(cur) and tensor_type(other) == tensor_type(cur):
        return readers[0], other
    return None


def _reshapes(bindings, users, cur, uses, claimed) -> list[int]:
    """The run of reshapes that alone read `cur` (then each other): views of the kernel's row-major output, so
    the epilogue goes on through them (GPT-2's Gemm writes [128, 3072] that its GELU reads as [1, 128, 3072])."""
    run = []
    while uses.get(cur, 0) == 1 and len(users.get(cur, [])) == 1:
        j = users[cur][0]
        if j in claimed or op_name(bindings[j].value) != "relax.reshape" or static_shape(bindings[j].var) is None:
            break
        run.append(j)
        cur = bindings[j].var
    return run


def _chain(bindings, i, uses, users, claimed):
    """(activation, residual, chain indices) after kernel binding i, through reshapes."""
    chain, activation, residual = [i], None, None
    chain += _reshapes(bindings, users, bindings[chain[-1]].var, uses, claimed)
    found = activation_after(bindings, chain[-1], uses, claimed)
    if found is not None:
        activation, chain = found[0], chain + found[1]
        chain += _reshapes(bindings, users, found[2], uses, claimed)
    got = _residual(bindings, users, bindings[chain[-1]].var, uses, claimed)
    if got is not None:
        residual = got[1]
        chain.append(got[0])
        chain += _reshapes(bindings, users, bindings[chain[-1]].var, uses, claimed)
    return activation, residual, chain


def _fuse_block(mod, builder, block, uses, stats):
    bindings = list(block.bindings)
    users = var_users(bindings)
    claimed: set = set()
    replace: dict = {}  # binding index -> the bindings that take its place ([] drops it)
    for i, b in enumerate(bindings):
        func = _kernel(mod, b.value) if i not in claimed else None
        if func is None:
            continue
        activation, residual, chain = _chain(bindings, i, uses, users, claimed)
        final = bindings[chain[-1]].var
        kt = BY_SOURCE[str(func.attrs[C_KERNEL_ATTR])]  # bf16, fp16 or fp32: the type its 16-bit output has
        casts = bf16_casts(bindings, users, final, claimed, kt.dtype) if kt is not F32 else []
        if len(chain) == 1 and not casts:
            continue
        float32 = uses.get(final, 0) > len(casts)
        bias = bool(int(func.attrs["kiln.bf16_matmul"][0]))
        ep = MatmulEpilogue(bias, residual is not None, activation, float32=float32, bf16=bool(casts))
        x, packed, *rest = b.value.args[1].fields
        k, n = static_shape(x)[-1], static_shape(packed)[0] * 16
        x_bf16 = kt is not F32 and str(x.ty.dtype) == kt.dtype
        new = kernel_func(static_shape(x), k, n, x_bf16, ep, static_shape(final), static_shape(packed), kt)
        gv = builder.add_func(new.without_attr("global_symbol"), kt.source)
        types = output_types(static_shape(final), ep.float32, ep.bf16, kt.dtype)
        call = kernel_call(gv, [x, packed, *rest] + [residual] * ep.residual, types)
        claimed.update(chain, casts)
        rebind(block, bindings, chain, casts, call, types, replace)
        stats["bf16_matmul_epilogues_fused"] += 1
    return rebuilt(block, bindings, replace)


# what FuseBF16MatmulEpilogue counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("bf16_matmul_epilogues_fused", int, "bf16 matmul kernels that took an epilogue", always=True),
)


@tvm.transform.module_pass(opt_level=2, name="FuseBF16MatmulEpilogue")
class FuseBF16MatmulEpilogue:
    COUNTERS = COUNTERS

    def __init__(self):
        self.stats = {"bf16_matmul_epilogues_fused": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        return fuse_epilogues(mod, _fuse_block, self.stats, "bf16_matmul_epilogues_fused")


__all__ = ["FuseBF16MatmulEpilogue"]
