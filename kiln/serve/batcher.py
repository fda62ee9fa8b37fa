"""Dynamic batching for one loaded model: requests wait in a bounded queue; the batcher takes the
first, then more with the same per-sample shapes until the batch is full (the largest batch bucket,
at most --max-batch) or --max-wait-ms has passed since the first arrived, runs them as one batch in
the model's thread (the runtime pads to the nearest bucket and crops), and splits the outputs back
along axis 0. A full queue refuses at once (the caller answers 503): memory stays bounded."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import sys
import threading
import time

import numpy as np

from ..runtime.model import Model
from .metrics import Metrics


class QueueFull(Exception):
    pass


OVERLOAD_SWITCH_S = 0.00005  # the GIL switch interval while a queue is at least half full (Python's default: 5 ms)


class GilShare:
    """Under overload the event loop holds the GIL almost all the time (parsing and refusing requests), and each
    time a model thread comes back from a run (which releases it) it waited up to the switch interval to take it
    again: at 30x overload each batch took twice its time at capacity, and the model served 69-80% of its capacity
    (benchmarks/load_wrk_amx.md). While any queue is at least half full the interval is OVERLOAD_SWITCH_S (medians
    104-107% there); otherwise Python's own, which the JSON route's parsing needs (0.2 ms always: V1 JSON's capacity
    -7%)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._overloaded: set[int] = set()
        self.default = sys.getswitchinterval()

    def set(self, who: object, overloaded: bool) -> None:
        with self._lock:
            (self._overloaded.add if overloaded else self._overloaded.discard)(id(who))
            sys.setswitchinterval(OVERLOAD_SWITCH_S if self._overloaded else self.default)


GIL = GilShare()


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
    """Batches form in the model's own thread, not on the event loop: under overload the loop is busy
    refusing requests, and a batch that waited for it to come round left the model idle (at 240
    connections the encoder served 48% of its capacity: benchmarks/load.md). The loop only enqueues
    and gets results back (call_soon_threadsafe)."""

    def __init__(self, model: Model, version: str, metrics: Metrics, max_batch: int, max_wait_ms: float, queue: int):
        self.model, self.version, self.metrics = model, version, metrics
        self.capacity = batch_capacity(model, max_batch)
        self.max_wait = max_wait_ms / 1e3
        self.maxsize = queue
        self._items: collections.deque[_Item] = collections.deque()
        self._cond = threading.Condition()
        self._held: _Item | None = None  # taken but not compatible with the batch being formed
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name=f"kiln-{version}", daemon=True)
        self._loop_ref: asyncio.AbstractEventLoop | None = None
        metrics.queue_depth[version] = self.depth

    def depth(self) -> int:
        return len(self._items) + (self._held is not None)

    def full(self) -> bool:
        """Read without the lock (a deque's length is atomic): the admission check costs next to nothing."""
        return len(self._items) >= self.maxsize

    def start(self) -> None:
        self._loop_ref = asyncio.get_running_loop()
        self._thread.start()

    async def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)

    def submit(self, arrays: list[np.ndarray]) -> asyncio.Future:
        """Enqueue validated inputs; the future gets this request's outputs (a list of arrays)."""
        fut = self._loop_ref.create_future()
        n = arrays[0].shape[0] if arrays and arrays[0].ndim else 1
        with self._cond:
            if len(self._items) >= self.maxsize:
                raise QueueFull()
            self._items.append(_Item(arrays, fut, n))
            self._cond.notify()
        return fut

    # the model's thread ------------------------------------------------------------------------
    def _take(self, deadline: float | None) -> _Item | None:
        """The next live item, waiting until the deadline (None: until one comes or the batcher stops)."""
        if self._held is not None:
            item, self._held = self._held, None
            return item
        with self._cond:
            while not self._items and not self._stopping:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left)
            return self._items.popleft() if self._items else None

    def _form(self) -> tuple[list[_Item], int] | None:
        first = self._take(None)
        while first is not None and first.future.done():  # timed out or cancelled while queued: skip it
            first = self._take(None)
        if first is None:
            return None
        batch, total = [first], first.n
        deadline = time.monotonic() + self.max_wait
        while total < self.capacity:
            item = self._take(deadline)
            if item is None:
                break
            if item.future.done():
                continue
            if item.key() != first.key() or total + item.n > self.capacity:
                self._held = item
                break
            batch.append(item)
            total += item.n
        return batch, total

    def _loop(self) -> None:
        overloaded = False
        while (formed := self._form()) is not None:
            if overloaded != (self.depth() * 2 >= self.maxsize):
                overloaded = not overloaded
                GIL.set(self, overloaded)
            batch, total = formed
            self.metrics.batch(self.version, len(batch))
            t = time.perf_counter()
            self.metrics.stage(self.version, "queue", sum(t - b.queued_at for b in batch), len(batch))
            try:
                outs, error = self._run([b.arrays for b in batch]), None
                self.metrics.stage(self.version, "compute_infer", time.perf_counter() - t, len(batch))
                self.metrics.stage(self.version, "samples", 0.0, total)
                self.metrics.last_inference_ms[self.version] = int(time.time() * 1e3)
            except Exception as e:  # a KilnError from the runtime, or a bug: every request of the batch gets it
                outs, error = None, e
            self._loop_ref.call_soon_threadsafe(_deliver, batch, outs, error)
        if overloaded:
            GIL.set(self, False)

    def _run(self, requests: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
        names = [s.name for s in self.model.inputs]
        if len(requests) == 1:
            out = self.model.run_tensors(dict(zip(names, requests[0])))
            return [list(out.values())]
        feed = {n: np.concatenate([r[i] for r in requests]) for i, n in enumerate(names)}
        out = list(self.model.run_tensors(feed).values())
        sizes = np.cumsum([r[0].shape[0] for r in requests])[:-1]
        parts = [np.split(o, sizes) for o in out]
        return [[p[j] for p in parts] for j in range(len(requests))]


def _deliver(batch: list[_Item], outs, error: Exception | None) -> None:
    """On the event loop: each request's future gets its outputs (or the batch's error)."""
    for i, b in enumerate(batch):
        if b.future.done():
            continue
        if error is not None:
            b.future.set_exception(error)
        else:
            b.future.set_result(outs[i])
