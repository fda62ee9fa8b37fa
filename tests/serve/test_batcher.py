"""The batcher in-process, on a model that holds its run until the test lets it go: the GIL's switch interval
shortens while its queue is at least half full (the model thread then gets the GIL back from a busy event loop at
once) and returns to Python's own once the queue drains."""

import asyncio
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np

from kiln.serve.batcher import GIL, OVERLOAD_SWITCH_S, Batcher, GilShare
from kiln.serve.metrics import Metrics


class _HeldModel:
    """One input x [1, 4] and one output y = x; run_tensors waits for `go`."""

    def __init__(self):
        spec = SimpleNamespace(name="x", shape=(1, 4))
        self.inputs, self.outputs = [spec], [SimpleNamespace(name="y", shape=(1, 4))]
        self.buckets = [SimpleNamespace(inputs=[spec], outputs=self.outputs)]
        self.go, self.entered = threading.Event(), threading.Event()

    def run_tensors(self, feed):
        self.entered.set()
        assert self.go.wait(10)
        return {"y": feed["x"]}


def _interval_is(seconds: float) -> bool:
    return abs(sys.getswitchinterval() - seconds) < 1e-9  # Python keeps it in whole microseconds


def _wait_for(check, seconds=5.0):
    end = time.monotonic() + seconds
    while not check() and time.monotonic() < end:
        time.sleep(0.001)
    return check()


def test_switch_interval_is_short_only_while_a_queue_is_deep():
    default = GIL.default
    model = _HeldModel()

    async def main():
        b = Batcher(model, "1", Metrics(), max_batch=1, max_wait_ms=0, queue=4)
        b.start()
        futures = [b.submit([np.full((1, 4), i, np.float32)]) for i in range(4)]  # a full queue
        assert await asyncio.to_thread(model.entered.wait, 5)
        # the first batch taken, 3 of 4 places still held: overloaded while the model runs it
        assert await asyncio.to_thread(_wait_for, lambda: _interval_is(OVERLOAD_SWITCH_S))
        model.go.set()
        outs = await asyncio.gather(*futures)
        assert [float(o[0][0, 0]) for o in outs] == [0.0, 1.0, 2.0, 3.0]
        assert await asyncio.to_thread(_wait_for, lambda: _interval_is(default))
        await b.stop()

    try:
        asyncio.run(main())
    finally:
        sys.setswitchinterval(default)


def test_gil_share_keeps_the_short_interval_while_any_batcher_is_overloaded():
    default = sys.getswitchinterval()
    share, a, b = GilShare(), object(), object()
    try:
        share.set(a, True)
        share.set(b, True)
        share.set(a, False)
        assert _interval_is(OVERLOAD_SWITCH_S)  # b still is
        share.set(b, False)
        assert _interval_is(default)
    finally:
        sys.setswitchinterval(default)
