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


def _span(t) -> tuple[int, int]:
    start = t.data_ptr()
    return start, start + t.numel() * np.dtype(str(t.dtype)).itemsize


class OutputViews:
    """Per bucket: unknown (the first run, held), then which outputs are fresh each run."""

    def __init__(self):
        self._first: dict = {}  # bucket -> the first run's output tensors, held
        self._fresh: dict = {}  # bucket -> [output j is allocated afresh each run]

    def arrays(self, bucket: int, outs: list, args: list, viewable) -> list[np.ndarray]:
        """outs as numpy arrays; viewable(t): whether numpy can take tensor t over DLPack at all."""
        fresh = self._learn(bucket, outs)
        inputs = [_span(a) for a in args] if fresh is not None else []
        seen: set = set()
        result = []
        for j, t in enumerate(outs):
            if not viewable(t):
                result.append(t.numpy())  # a copy already
                continue
            p, a = t.data_ptr(), np.from_dlpack(t)
            view = fresh is not None and fresh[j] and p not in seen and not any(lo <= p < hi for lo, hi in inputs)
            seen.add(p)
            result.append(a if view else a.copy())
        return result

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
