"""Read-only measurements of a Relax module for the optimization report: op histograms, compiled
kernels, tensor bytes before and after static memory planning. The IR helpers it builds on are in ir.py."""

from __future__ import annotations

import tvm
from tvm import relax

from .ir import calls, kiln_kernel, nbytes


def op_histogram(mod: tvm.IRModule, func: str = "main") -> dict[str, int]:
    """High-level Relax ops executed by `func`, per call site: a call to a fused Relax function
    counts the ops inside it (call_tir kernels count as call_tir)."""
    hist: dict[str, int] = {}

    def add(f, times: int = 1):
        for call in calls(f):
            if isinstance(call.op, tvm.ir.Op):
                kernel = kiln_kernel(call)
                name = kernel.op if kernel else call.op.name.removeprefix("relax.")
                hist[name] = hist.get(name, 0) + times
            elif isinstance(call.op, tvm.ir.GlobalVar) and isinstance(mod[call.op], relax.Function):
                add(mod[call.op], times)

    add(mod[func])
    return dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))


def conv_layouts(mod: tvm.IRModule, func: str = "main") -> dict[str, int]:
    """conv2d calls by data layout, fused groups included (e.g. {"NCHW16c": 19, "NCHW": 1})."""
    hist: dict[str, int] = {}

    def add(f):
        for call in calls(f):
            if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d":
                hist[str(call.attrs.data_layout)] = hist.get(str(call.attrs.data_layout), 0) + 1
            elif (kernel := kiln_kernel(call)) and kernel.convs:  # data [1, C/c, H, W, c]
                layout = f"NCHW{int(call.args[1][0].ty.shape[4])}c"
                hist[layout] = hist.get(layout, 0) + kernel.convs
            elif isinstance(call.op, tvm.ir.GlobalVar) and isinstance(mod[call.op], relax.Function):
                add(mod[call.op])

    add(mod[func])
    return hist


def count_op(mod: tvm.IRModule, op_name: str) -> int:
    return op_histogram(mod).get(op_name.removeprefix("relax."), 0)


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
                total += nbytes(b.var.ty)
    return total


def activation_bytes_unfused(mod: tvm.IRModule, func: str = "main") -> int:
    """Sum of every op output in `func` as imported (before any pass): no fusion, no planning."""
    total = 0
    for block in mod[func].body.blocks:
        for b in block.bindings:
            if isinstance(b.value, relax.Call):
                total += nbytes(b.var.ty)
    return total


def planned_storage(mod: tvm.IRModule, func: str = "main") -> tuple[int, int]:
    """(bytes, buffers) of the storage TVM's StaticPlanBlockMemory allocates for `func`'s
    intermediates, reusing buffers whose lifetimes do not overlap: the build's own planning passes, so a
    plan the build rejects (executable._guarded_plan) reports none."""
    from .executable import planning_passes

    planned = tvm.transform.Sequential(planning_passes())(mod)
    total = count = 0
    for call in calls(planned[func]):
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.memory.alloc_storage":
            size = call.args[0].values[0]
            total += int(size) if isinstance(size, (int, tvm.tirx.IntImm)) else 0  # sized at run time: not planned
            count += 1
    return total, count


def largest_tensor(mod: tvm.IRModule, func: str = "main") -> tuple[str, int]:
    """The biggest tensor `func` binds or takes (name, bytes): the check for absurd shapes."""
    best = ("", 0)
    for p in mod[func].params:
        best = max(best, (str(p.name), nbytes(p.ty)), key=lambda t: t[1])
    for block in mod[func].body.blocks:
        for b in block.bindings:
            best = max(best, (str(b.var.name), nbytes(b.var.ty)), key=lambda t: t[1])
    return best
