"""Read-only measurements of a Relax module for the optimization report: op histograms, compiled
kernels, tensor bytes before and after static memory planning."""

from __future__ import annotations

import math

import tvm
from tvm import relax


def _calls(func) -> list[relax.Call]:
    found = []
    relax.analysis.post_order_visit(func.body, lambda e: found.append(e) if isinstance(e, relax.Call) else None)
    return found


def op_histogram(mod: tvm.IRModule, func: str = "main") -> dict[str, int]:
    """High-level Relax ops executed by `func`, per call site: a call to a fused Relax function
    counts the ops inside it (call_tir kernels count as call_tir)."""
    hist: dict[str, int] = {}

    def add(f, times: int = 1):
        for call in _calls(f):
            if isinstance(call.op, tvm.ir.Op):
                name = _kiln_kernel(call) or call.op.name.removeprefix("relax.")
                hist[name] = hist.get(name, 0) + times
            elif isinstance(call.op, tvm.ir.GlobalVar) and isinstance(mod[call.op], relax.Function):
                add(mod[call.op], times)

    add(mod[func])
    return dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))


def var_uses(func: relax.Function) -> dict:
    """How many times each Relax variable is referenced in the function's body (its uses)."""
    counts: dict = {}

    def visit(e):
        if isinstance(e, relax.Var):
            counts[e] = counts.get(e, 0) + 1

    relax.analysis.post_order_visit(func.body, visit)
    return counts


def op_name(e) -> str | None:
    """The name of the op a Relax call calls (e.g. "relax.add"), else None."""
    return e.op.name if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None


def var_users(bindings) -> dict:
    """Var -> indices of the bindings (in order) whose call reads it as an argument."""
    users: dict = {}
    for i, b in enumerate(bindings):
        if isinstance(b.value, relax.Call):
            for v in dict.fromkeys(a for a in b.value.args if isinstance(a, relax.Var)):
                users.setdefault(v, []).append(i)
    return users


def _kiln_kernel(call) -> str | None:
    """The op a call_tir of one of Kiln's graph-level kernels stands for (the Winograd pass's convs,
    PackDenseWeights' matmuls, FuseDepthwisePointwise's conv pairs), else None."""
    from .passes.fuse_depthwise_pointwise import PRIMFUNC as DWPW
    from .passes.pack_dense_weights import PRIMFUNC as PACKED
    from .passes.winograd import PRIMFUNC as WINOGRAD

    if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.call_tir":
        name = call.args[0].name_hint
        for prefix, op in (
            (WINOGRAD, "nn.conv2d_winograd"),
            (PACKED, "matmul_packed"),
            (DWPW, "nn.conv2d_depthwise_pointwise"),
        ):
            if name.startswith(prefix):
                return op
    return None


KILN_CONVS = {"nn.conv2d_winograd": 1, "nn.conv2d_depthwise_pointwise": 2}  # convs per call of Kiln's conv kernels


def conv_layouts(mod: tvm.IRModule, func: str = "main") -> dict[str, int]:
    """conv2d calls by data layout, fused groups included (e.g. {"NCHW16c": 19, "NCHW": 1})."""
    hist: dict[str, int] = {}

    def add(f):
        for call in _calls(f):
            if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d":
                hist[str(call.attrs.data_layout)] = hist.get(str(call.attrs.data_layout), 0) + 1
            elif (kernel := _kiln_kernel(call)) in KILN_CONVS:  # data [1, C/c, H, W, c]
                layout = f"NCHW{int(call.args[1][0].ty.shape[4])}c"
                hist[layout] = hist.get(layout, 0) + KILN_CONVS[kernel]
            elif isinstance(call.op, tvm.ir.GlobalVar) and isinstance(mod[call.op], relax.Function):
                add(mod[call.op])

    add(mod[func])
    return hist


def count_op(mod: tvm.IRModule, op_name: str) -> int:
    return op_histogram(mod).get(op_name.removeprefix("relax."), 0)


def kernels(mod: tvm.IRModule, func: str = "main") -> list[str]:
    """The compiled kernels `func` calls, in call order (one entry per call_tir)."""
    out = []
    for call in _calls(mod[func]):
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.call_tir":
            out.append(str(call.args[0].name_hint))
    return out


def _nbytes(ty) -> int:
    if isinstance(ty, relax.TensorType) and ty.shape is not None:
        try:
            return (
                math.prod(int(v) for v in ty.shape.values) * tvm.runtime.DataType(ty.dtype).bits // 8
            )  # Python ints: no overflow
        except (TypeError, ValueError, AttributeError):  # a symbolic dim, or a shape held in a variable
            return 0
    if isinstance(ty, relax.TupleType):
        return sum(_nbytes(f) for f in ty.fields)
    return 0


def activation_bytes_naive(mod: tvm.IRModule, func: str = "main") -> int:
    """Sum of every intermediate tensor `func` computes (each call_tir output), model outputs excluded."""
    f = mod[func]
    returned = set()
    relax.analysis.post_order_visit(f.body.body, lambda e: returned.add(e) if isinstance(e, relax.Var) else None)
    total = 0
    for block in f.body.blocks:
        for b in block.bindings:
            v = b.value
            if (
                isinstance(v, relax.Call)
                and isinstance(v.op, tvm.ir.Op)
                and v.op.name == "relax.call_tir"
                and b.var not in returned
            ):
                total += _nbytes(b.var.ty)
    return total


def activation_bytes_unfused(mod: tvm.IRModule, func: str = "main") -> int:
    """Sum of every op output in `func` as imported (before any pass): no fusion, no planning."""
    total = 0
    for block in mod[func].body.blocks:
        for b in block.bindings:
            if isinstance(b.value, relax.Call):
                total += _nbytes(b.var.ty)
    return total


def planned_storage(mod: tvm.IRModule, func: str = "main") -> tuple[int, int]:
    """(bytes, buffers) of the storage TVM's StaticPlanBlockMemory allocates for `func`'s
    intermediates, reusing buffers whose lifetimes do not overlap."""
    seq = tvm.transform.Sequential(
        [
            relax.transform.RewriteDataflowReshape(),
            relax.transform.ToNonDataflow(),
            relax.transform.RemovePurityChecking(),
            relax.transform.CallTIRRewrite(),
            relax.transform.StaticPlanBlockMemory(),
        ]
    )
    planned = seq(mod)
    total = count = 0
    for call in _calls(planned[func]):
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.memory.alloc_storage":
            size = call.args[0].values[0]
            total += int(size) if isinstance(size, (int, tvm.tirx.IntImm)) else 0  # sized at run time: not planned
            count += 1
    return total, count


def largest_tensor(mod: tvm.IRModule, func: str = "main") -> tuple[str, int]:
    """The biggest tensor `func` binds or takes (name, bytes): the check for absurd shapes."""
    best = ("", 0)
    for p in mod[func].params:
        best = max(best, (str(p.name), _nbytes(p.ty)), key=lambda t: t[1])
    for block in mod[func].body.blocks:
        for b in block.bindings:
            best = max(best, (str(b.var.name), _nbytes(b.var.ty)), key=lambda t: t[1])
    return best
