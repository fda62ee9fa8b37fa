"""Dynamic batching for one loaded model: requests wait in a bounded queue; the batcher takes the
first, then more with the same per-sample shapes until the batch is full (the largest batch bucket,
at most --max-batch) or --max-wait-ms has passed since the first arrived, runs them as one batch in
a worker thread (the runtime pads to the nearest bucket and crops), and splits the outputs back
along axis 0. A full queue refuses at once (the caller answers 503): memory stays bounded."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import time

import numpy as np

from ..runtime.model import Model
from .metrics import Metrics


class QueueFull(Exception):
    pass


@dataclasses.dataclass
class _Item:
    arrays: list[np.ndarray]
    future: asyncio.Future
    n: int  # samples (axis 0)
    queued_at: float = dataclasses.field(default_factory=time.perf_counter)

    def key(self) -> tuple:
        return tuple((a.shape[1:], a.dtype.str) for a in self.arrays)


def batch_capacity(model: Model, max_batch: int) -> int:
    """How many samples one run can take: the largest batch bucket (1 if the outputs do not keep
    the batch axis, or the model has a single batch size)."""
    cap = 1
    for b in model.buckets:
        n = b.inputs[0].shape[0] if b.inputs and b.inputs[0].shape else 1
        if all(s.shape and s.shape[0] == n for s in b.inputs + b.outputs):
            cap = max(cap, n)
    return max(1, min(cap, max_batch))


class Batcher:
    def __init__(self, model: Model, version: str, metrics: Metrics, max_batch: int, max_wait_ms: float, queue: int):
        self.model, self.version, self.metrics = model, version, metrics
        self.capacity = batch_capacity(model, max_batch)
        self.max_wait = max_wait_ms / 1e3
        self.queue: asyncio.Queue[_Item] = asyncio.Queue(maxsize=queue)
        self._held: _Item | None = None  # dequeued but not compatible with the batch being formed
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"kiln-{version}")
        self._task: asyncio.Task | None = None
        metrics.queue_depth[version] = self.depth

    def depth(self) -> int:
        return self.queue.qsize() + (self._held is not None)

    def full(self) -> bool:
        return self.queue.full()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._pool.shutdown(wait=True)

    def submit(self, arrays: list[np.ndarray]) -> asyncio.Future:
        """Enqueue validated inputs; the future gets this request's outputs (a list of arrays)."""
        fut = asyncio.get_running_loop().create_future()
        n = arrays[0].shape[0] if arrays and arrays[0].ndim else 1
        try:
            self.queue.put_nowait(_Item(arrays, fut, n))
        except asyncio.QueueFull:
            raise QueueFull() from None
        return fut

    async def _next(self) -> _Item:
        if self._held is not None:
            item, self._held = self._held, None
            return item
        return await self.queue.get()

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            first = await self._next()
            if first.future.done():  # timed out or cancelled while queued: skip the work
                continue
            batch, total = [first], first.n
            deadline = time.monotonic() + self.max_wait
            while total < self.capacity:
                try:
                    item = (
                        self.queue.get_nowait()
                        if self.queue.qsize()
                        else await asyncio.wait_for(self.queue.get(), max(0.0, deadline - time.monotonic()))
                    )
                except TimeoutError:
                    break
                if item.future.done():
                    continue
                if item.key() != first.key() or total + item.n > self.capacity:
                    self._held = item
                    break
                batch.append(item)
                total += item.n
                if time.monotonic() >= deadline:
                    break
            self.metrics.batch(self.version, len(batch))
            t = time.perf_counter()
            self.metrics.stage(self.version, "queue", sum(t - b.queued_at for b in batch), len(batch))
            try:
                outs = await loop.run_in_executor(self._pool, self._run, [b.arrays for b in batch])
                self.metrics.stage(self.version, "compute_infer", time.perf_counter() - t, len(batch))
                self.metrics.stage(self.version, "samples", 0.0, total)
                self.metrics.last_inference_ms[self.version] = int(time.time() * 1e3)
            except Exception as e:  # a KilnError from the runtime, or a bug: every request of the batch gets it
                for b in batch:
                    if not b.future.done():
                        b.future.set_exception(e)
                continue
            for b, o in zip(batch, outs):
                if not b.future.done():
                    b.future.set_result(o)

    def _run(self, requests: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
        names = [s.name for s in self.model.inputs]
        if len(requests) == 1:
            out = self.model.run(dict(zip(names, requests[0])))
            return [list(out.values())]
        feed = {n: np.concatenate([r[i] for r in requests]) for i, n in enumerate(names)}
        out = list(self.model.run(feed).values())
        sizes = np.cumsum([r[0].shape[0] for r in requests])[:-1]
        parts = [np.split(o, sizes) for o in out]
        return [[p[j] for p in parts] for j in range(len(requests))]
