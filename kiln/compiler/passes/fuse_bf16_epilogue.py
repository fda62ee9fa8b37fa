"""FuseBF16Epilogue: the bias add, residual add, ReLU/ReLU6 and bf16 cast that follow a BF16ConvKernel
(or F32ConvKernel) conv run inside its C kernel, on each output tile while it is in registers, instead of as TVM kernels
that read the float32 result back from memory and write it again (MobileNetV2's ReLU6 kernels after
its expansion convs are gone; timings: benchmarks/history.md). From each kernel
call it follows the chain of single uses [+ bias constant] -> [+ residual tensor] -> [ReLU, or a clip
with constant bounds]; the chain's value is written in bf16 for the casts to bf16 that read it and in
float32 where anything else does (a residual add further on, a float32 conv): one output or both.
`stats["bf16_epilogues_fused"]` counts the kernels that took an epilogue."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.ir.expr import GenericConst

from ...counters import Counter
from ..ir import clip_bounds, op_name, var_users
from .activation_region import activation_after
from .bf16_conv_kernel import EXTERNS, ConvGeometry, Epilogue, conv_dtype, kernel_func
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
    """The BF16ConvKernel/F32ConvKernel PrimFunc a binding's value calls without an epilogue yet, else None."""
    func = called_primfunc(mod, value)
    if func is None or ConvGeometry.of(func.attrs) is None:
        return None
    return func if int(func.attrs["kiln.bf16_epilogue"]) == Epilogue().flags else None


def _clamp(value) -> tuple[float, float] | None:
    """The [lo, hi] of a ReLU or of a clip with constant bounds (ReLU6), else None."""
    if op_name(value) == "relax.nn.relu":
        return 0.0, float("inf")
    return clip_bounds(value)


def _widened_bf16(bindings, var, shape):
    """The bf16 tensor of `shape` that `var` casts to float32 (a residual BF16Residuals rounded), else None."""
    value = next((b.value for b in bindings if b.var.same_as(var)), None)
    if value is None or op_name(value) != "relax.astype" or str(value.attrs.dtype) != "float32":
        return None
    src = value.args[0]
    return src if isinstance(src, relax.Var) and tensor_type(src) == (shape, "bfloat16") else None


def _gelu(bindings, chain, uses, claimed) -> tuple[str, list[int]] | None:
    """(GELU's form, its bindings) where the chain's value goes through a GELU (any spelling: activation_region)."""
    found = activation_after(bindings, chain[-1], uses, claimed, ("gelu_erf", "gelu_tanh"))
    if found is None or not bindings[found[1][-1]].var.same_as(found[2]):  # the chain's last binding holds it
        return None
    return found[0], found[1]


def _chain(bindings, i, uses, users, claimed):
    """Follow binding i's kernel output through single uses: (bias, residual, GELU, clamp, chain indices); the
    residual is a bf16 tensor where the add reads one widened to float32."""
    out = tensor_type(bindings[i].var)
    bias = residual = clamp = gelu = None
    chain = [i]
    cur = bindings[i].var
    while clamp is None and gelu is None:
        if (found := _gelu(bindings, chain, uses, claimed)) is not None:  # GELU reads the value more than once
            gelu = found[0]
            chain.extend(found[1])
            cur = bindings[chain[-1]].var
            continue
        if uses.get(cur, 0) != 1 or len(users.get(cur, [])) != 1:
            break
        j = users[cur][0]
        if j in claimed:
            break
        value = bindings[j].value
        if op_name(value) == "relax.add" and len(value.args) == 2:
            other = value.args[1] if value.args[0].same_as(cur) else value.args[0]
            if other.same_as(cur):
                break
            if (
                bias is None
                and residual is None
                and isinstance(other, GenericConst)
                and tensor_type(other) == ((1, out[0][1], 1, 1, 16), "float32")
            ):
                bias = other
            elif residual is None and isinstance(other, relax.Var) and tensor_type(other) == out:
                narrow = _widened_bf16(bindings, other, out[0])
                residual = other if narrow is None else narrow
            else:
                break
        elif (bounds := _clamp(value)) is not None and value.args[0].same_as(cur):
            clamp = bounds
        else:
            break
        chain.append(j)
        cur = bindings[j].var
    return bias, residual, gelu, clamp, chain


def _name(dtype: str, ep: Epilogue) -> str:
    """The kernel's name: its conv kernel's, then the ops its epilogue took (kernel_info matches the model's
    residual Add and activation to the kernel by these words)."""
    act = "" if ep.clamp is None else "_relu" if ep.clamp == (0.0, float("inf")) else "_clip"
    return EXTERNS[dtype] + "_add" * ep.residual + "_gelu" * (ep.gelu is not None) + act


def _fuse_block(mod, builder, block, uses, stats):
    bindings = list(block.bindings)
    users = var_users(bindings)
    claimed: set = set()
    replace: dict = {}  # binding index -> the bindings that take its place ([] drops it)
    for i, b in enumerate(bindings):
        func = _kernel(mod, b.value) if i not in claimed else None
        if func is None:
            continue
        bias, residual, gelu, clamp, chain = _chain(bindings, i, uses, users, claimed)
        final = bindings[chain[-1]].var
        casts = bf16_casts(bindings, users, final, claimed)
        if len(chain) == 1 and not casts:
            continue
        res16 = residual is not None and str(residual.ty.dtype) == "bfloat16"
        ep = Epilogue(
            bias is not None,
            residual is not None,
            clamp,
            float32=uses.get(final, 0) > len(casts),
            bf16=bool(casts),
            residual_bf16=res16,
            gelu=gelu,
        )
        data, packed = b.value.args[1].fields
        g, dtype = ConvGeometry.of(func.attrs), conv_dtype(func.attrs)
        shapes = static_shape(data), static_shape(packed)[0]
        new, out_shape = kernel_func(*shapes, g.kernel, g.strides, g.pads, ep, g.amx, dtype, g.dilation)
        gv = builder.add_func(new.without_attr("global_symbol"), _name(dtype, ep))
        args = [data, packed] + [bias] * ep.bias + [residual] * ep.residual
        types = output_types(out_shape, ep.float32, ep.bf16)
        call = kernel_call(gv, args, types)
        claimed.update(chain, casts)
        rebind(block, bindings, chain, casts, call, types, replace)
        stats["bf16_epilogues_fused"] += 1
    return rebuilt(block, bindings, replace)


# what FuseBF16Epilogue counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("bf16_epilogues_fused", int, "bf16 conv kernels that took an epilogue", always=True),
)


@tvm.transform.module_pass(opt_level=2, name="FuseBF16Epilogue")
class FuseBF16Epilogue:
    COUNTERS = COUNTERS

    def __init__(self):
        self.stats = {"bf16_epilogues_fused": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        if not any(e in gv.name_hint for gv in mod.get_global_vars() for e in EXTERNS.values()):
            return mod
        return fuse_epilogues(mod, _fuse_block, self.stats, "bf16_epilogues_fused")
