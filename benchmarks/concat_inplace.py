"""What would writing concat inputs in place save? Measures, on an Inception-style block (four
1x1 conv branches -> Concat -> 1x1 conv), the whole block's latency and planned memory, and the
latency of the Concat kernel alone on the same shapes. Run by hand:
    .venv/bin/python benchmarks/concat_inplace.py"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import kiln

C, HW, BRANCHES = 64, 56, 4


def _model(concat_only: bool):
    r = np.random.default_rng(0)
    nodes, inits, inputs = [], [], []
    if concat_only:
        inputs = [helper.make_tensor_value_info(f"b{i}", TensorProto.FLOAT, [1, C, HW, HW]) for i in range(BRANCHES)]
        nodes.append(helper.make_node("Concat", [f"b{i}" for i in range(BRANCHES)], ["output"], axis=1))
    else:
        inputs = [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, C, HW, HW])]
        for i in range(BRANCHES):
            inits.append(numpy_helper.from_array((r.standard_normal((C, C, 1, 1)) * 0.1).astype(np.float32), f"w{i}"))
            nodes += [
                helper.make_node("Conv", ["input", f"w{i}"], [f"c{i}"]),
                helper.make_node("Relu", [f"c{i}"], [f"b{i}"]),
            ]
        nodes.append(helper.make_node("Concat", [f"b{i}" for i in range(BRANCHES)], ["cat"], axis=1))
        inits.append(
            numpy_helper.from_array((r.standard_normal((C, C * BRANCHES, 1, 1)) * 0.1).astype(np.float32), "wo")
        )
        nodes.append(helper.make_node("Conv", ["cat", "wo"], ["output"]))
    g = helper.make_graph(
        nodes, "block", inputs, [helper.make_tensor_value_info("output", TensorProto.FLOAT, None)], inits
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _median_ms(m, feed, repeat=30) -> float:
    m.run(feed)
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        m.run(feed)
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


def main() -> int:
    tmp = Path(tempfile.mkdtemp())
    rng = np.random.default_rng(1)
    block = kiln.compile(_model(False), tmp / "block.kiln")
    kiln.compile(_model(True), tmp / "cat.kiln")
    mb, mc = kiln.load(tmp / "block.kiln"), kiln.load(tmp / "cat.kiln")
    block_ms = _median_ms(mb, {"input": rng.standard_normal((1, C, HW, HW)).astype(np.float32)})
    cat_ms = _median_ms(mc, {f"b{i}": rng.standard_normal((1, C, HW, HW)).astype(np.float32) for i in range(BRANCHES)})
    r = block.report
    inputs_mb = BRANCHES * C * HW * HW * 4 / 1e6
    print(
        f"block: {block_ms:.2f} ms, kernels {r['kernels']}, planned {r['activation_bytes_planned'] / 1e6:.2f} MB "
        f"in {r['buffers_planned']} buffers (naive {r['activation_bytes_naive'] / 1e6:.2f} MB)"
    )
    print(
        f"concat kernel alone (includes the runtime's input copies): {cat_ms:.2f} ms = at most "
        f"{100 * cat_ms / block_ms:.1f}% of the block"
    )
    print(
        f"in-place concat would drop one kernel and the {inputs_mb:.2f} MB of branch outputs that live beside "
        f"the {inputs_mb:.2f} MB concat output"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
