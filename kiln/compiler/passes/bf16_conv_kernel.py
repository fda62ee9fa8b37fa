"""BF16ConvKernel: run bf16 convolutions (after MixedPrecision, in NCHW16c) on Kiln's C micro-kernel
that uses AVX512-BF16's vdpbf16ps (kiln/schedules/kernels/bf16_conv.c): TVM 0.27 cannot emit that
instruction (its LLVM code generator has no bfloat vector type and its TIR pipeline computes bf16 in
fp32). Each conv2d becomes a call_tir to a PrimFunc that calls the kernel once per output row, rows
in parallel on TVM's thread pool; weights are packed here, at compile time, into the kernel's
[O/16, I/16, KH, KW, 8, 16, 2] layout. The bias/activation epilogue stays in TVM (fused there).
`stats["bf16_kernel_convs"]` counts the convs it took."""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst

from .module_map import rewrite_calls

EXTERN = "kiln_bf16_conv"  # name of the PrimFuncs that call the C kernel (their library must link it)


def kernel_func(data_shape, packed_shape, strides, padding):
    from tvm.script import tirx as T
    _, ib, h, w, _ = data_shape
    ob, _, kh, kw, _, _, _ = packed_shape
    (sh, sw), (pt, pl, pb, pr) = strides, padding
    oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1

    @T.prim_func
    def func(data: T.Buffer(data_shape, "bfloat16"), packed: T.Buffer(packed_shape, "bfloat16"), out: T.Buffer((1, ob, oh, ow, 16), "float32")):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True, "op_pattern": 8})  # 8: opaque, FuseOps leaves it alone
        for r in T.parallel(oh):
            T.evaluate(T.call_extern("int32", "kiln_bf16_conv2d_nchw16c", data.data, packed.data, out.data, ib, h, w, oh, ow, kh, kw,
                                     sh, sw, pt, pl, 0, ob, r))
    return func, (1, ob, oh, ow, 16)


def applies(call) -> bool:
    if not isinstance(call.op, tvm.ir.Op) or call.op.name != "relax.nn.conv2d":
        return False
    a, x, w = call.attrs, call.args[0].ty, call.args[1]
    if str(x.dtype) != "bfloat16" or not isinstance(w, GenericConst) or str(w.ty.dtype) != "bfloat16" or int(a.groups) != 1:
        return False
    shp, wshp = [int(v) for v in x.shape.values], list(w.value.shape)
    return (len(shp) == 5 and shp[0] == 1 and shp[4] == 16 and len(wshp) == 6 and wshp[4] == 16 and wshp[5] == 16
            and str(a.data_layout) == "NCHW16c" and all(int(d) == 1 for d in a.dilation)
            and str(a.out_dtype) == "float32")


def _to_kernel(builder, call):
    if not applies(call):
        return None
    import ml_dtypes
    a = call.attrs
    w = call.args[1].value.numpy()  # [O/16, I/16, KH, KW, 16 i, 16 o]
    ob, ib, kh, kw = w.shape[:4]
    packed = np.ascontiguousarray(w.reshape(ob, ib, kh, kw, 8, 2, 16).transpose(0, 1, 2, 3, 4, 6, 5)).astype(ml_dtypes.bfloat16)
    func, out_shape = kernel_func(tuple(int(v) for v in call.args[0].ty.shape.values), packed.shape,
                                  [int(s) for s in a.strides], [int(p) for p in a.padding])
    gv = builder.add_func(func.without_attr("global_symbol"), EXTERN)  # TVMScript names it "func"
    return relax.call_tir(gv, [call.args[0], relax.const(packed, "bfloat16")], relax.TensorType(list(out_shape), "float32"))


@tvm.transform.module_pass(opt_level=2, name="BF16ConvKernel")
class BF16ConvKernel:
    def __init__(self):
        self.stats = {"bf16_kernel_convs": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        out, count = rewrite_calls(mod, _to_kernel)
        if not count:
            return mod
        from ...schedules.kernels import build
        build("bf16_conv")  # compiled and loaded before anything references its symbol
        self.stats["bf16_kernel_convs"] += count
        return relax.transform.DeadCodeElimination(["main"])(out)
