"""Memory limits, checked before anything big is built or allocated:
- every tensor of the imported model must fit --max-memory (default: this host's RAM), so absurd
  declared shapes end in a clear error, not an out-of-memory kill in constant folding or at run;
- the planned memory (planned activations + weights) must fit --max-memory when it is given."""

from __future__ import annotations

import psutil

from ..errors import ResourceError
from . import analysis


def _mb(n: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n} B"


def check_tensor_sizes(mod, max_memory: int | None, where: str) -> None:
    limit = max_memory or psutil.virtual_memory().total
    name, nbytes = analysis.largest_tensor(mod)
    if nbytes > limit:
        src = "--max-memory" if max_memory else "this host's RAM"
        raise ResourceError(
            f"tensor {name!r} would take {_mb(nbytes)}, more than {src} ({_mb(limit)})",
            where=where,
            fix="pin smaller input shapes with --input-shape"
            + ("" if max_memory else ", or pass a larger --max-memory if the target has the memory"),
        )


def io_bytes(specs) -> int:
    import numpy as np

    return sum(
        int(np.prod(s.shape, dtype=np.int64)) * np.dtype(s.dtype).itemsize
        for s in specs
        if min(s.shape, default=0) >= 0
    )


def check_planned_memory(report: dict, io: int, max_memory: int | None, where: str) -> None:
    """io: bytes of the model's inputs and outputs (the runtime holds them too)."""
    if max_memory is None:
        return
    planned = report["activation_bytes_planned"] + report["weights_bytes"] + io
    if planned > max_memory:
        raise ResourceError(
            f"planned memory {_mb(planned)} (activations {_mb(report['activation_bytes_planned'])}, weights "
            f"{_mb(report['weights_bytes'])}, inputs and outputs {_mb(io)}) exceeds --max-memory {_mb(max_memory)}",
            where=where,
            fix="raise --max-memory, pin smaller input shapes, or quantize the model",
        )
