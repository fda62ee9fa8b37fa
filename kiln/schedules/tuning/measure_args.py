"""The arguments a tuning candidate is measured on, made in MetaSchedule's runner process.

MetaSchedule fills every argument with random bits, integers included: a gather's or an
embedding's indices then point outside the table, the kernel reads out of bounds (TVM's fast
`take` does not clamp), and the measurement fails. Those kernels (every transformer's embedding
lookups) never got a measured default schedule nor a record, and `kiln tune` could not estimate the
model's latency. Integer arguments are zero here instead (an index valid for any table, a zero
point, a count); floating-point ones keep MetaSchedule's random fill. Imported by name in the runner
process, so it imports nothing from Kiln."""

from __future__ import annotations

import numpy as np
import tvm


def alloc_measure_args(device, args_info, alloc_repeat: int) -> list[list]:
    """MetaSchedule's `f_alloc_argument`: `alloc_repeat` lists of tensors for `args_info`
    ([("TENSOR", dtype, shape), ...]): random floats, zero integers."""
    fill = tvm.get_global_func("tvm.contrib.random.random_fill_for_measure", allow_missing=True)
    fill = fill or tvm.get_global_func("tvm.contrib.random.random_fill")

    def tensor(kind, dtype, shape):
        if kind != "TENSOR":
            raise NotImplementedError((kind, dtype, shape))
        arg = tvm.runtime.empty(shape=shape, dtype=dtype, device=device)
        if str(dtype).startswith(("int", "uint", "bool")):
            arg.copyfrom(np.zeros([int(s) for s in shape], dtype=str(dtype)))
        else:
            fill(arg)
        return arg

    return [[tensor(*info) for info in args_info] for _ in range(alloc_repeat)]
