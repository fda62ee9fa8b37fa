"""A CPU run's outputs as numpy arrays: views of the tensors the VM allocated for this run where that is safe,
copies where it is not.

The Relax VM allocates a run's outputs afresh (the pooled allocator hands a block out again only once nothing holds
it), so a numpy view of one, which keeps the tensor alive, belongs to the caller alone. Copying every output cost a
small model a noticeable share of its run: 33 us of 715 for a 77 x 768 x 768 GEMM, the output's lines read from the
core that wrote them (benchmarks/history.md). An output is still copied where a view would be shared:

- it is an input (or inside one) as the model returns it: the caller's array, or the buffer Kiln stages inputs in
  and writes again next run;
- it is the same memory in every run: a constant or a weight returned as it is. Which outputs are is learnt from a
  bucket's first two runs, the first run's outputs held (copied meanwhile) so their memory cannot come back;
- it is the same tensor as an earlier output of the same run."""

from __future__ import annotations

import numpy as np


class OutputViews:
    """Per bucket: unknown (the first run, held), then which outputs are fresh each run. Whether numpy takes an output
    over DLPack at all (not bfloat16, not a GPU's memory) is learnt from its first try, not asked of its dtype each run:
    reading a tensor's dtype took 0.6 us, a tenth of what Model.run adds to a one-row GEMM (benchmarks/history.md)."""

    def __init__(self, on_cpu: bool = True):
        self._on_cpu = on_cpu
        self._first: dict = {}  # bucket -> the first run's output tensors, held
        self._fresh: dict = {}  # bucket -> [output j is allocated afresh each run]
        self._dlpack: dict = {}  # (bucket, j) -> False where numpy cannot take output j over DLPack

    def arrays(self, bucket: int, outs: list, args: list, nbytes: list[int]) -> list[np.ndarray]:
        """outs as numpy arrays; args: the run's input tensors, nbytes: their sizes in bytes."""
        fresh = self._learn(bucket, outs)
        inputs = [(p, p + n) for p, n in zip((a.data_ptr() for a in args), nbytes)] if fresh is not None else []
        seen: set = set()
        result = []
        for j, t in enumerate(outs):
            a = self._numpy(bucket, j, t)
            if a is None:
                result.append(t.numpy())  # a copy already
                continue
            p = t.data_ptr()
            view = fresh is not None and fresh[j] and p not in seen and not any(lo <= p < hi for lo, hi in inputs)
            seen.add(p)
            result.append(a if view else a.copy())
        return result

    def _numpy(self, bucket: int, j: int, t) -> np.ndarray | None:
        """Output j over DLPack, or None where numpy cannot take it (learnt once per output)."""
        if not self._on_cpu or self._dlpack.get((bucket, j), True) is False:
            return None
        try:
            return np.from_dlpack(t)
        except (BufferError, TypeError, ValueError, RuntimeError):
            self._dlpack[(bucket, j)] = False
            return None

    def _learn(self, bucket: int, outs: list) -> list[bool] | None:
        if bucket in self._fresh:
            return self._fresh[bucket]
        held = self._first.pop(bucket, None)
        if held is None:  # the first run: hold its outputs until the second
            self._first[bucket] = list(outs)
            return None
        before = {t.data_ptr() for t in held}
        self._fresh[bucket] = [t.data_ptr() not in before for t in outs]
        return None  # this run's outputs are copied too: the held ones are let go only now
