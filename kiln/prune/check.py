"""How far a pruned model is from its original on calibration data: the INT8 accuracy report
(compiler/quantize/accuracy.py: per output error and cosine, top-1 agreement for classifiers) and
the layers whose outputs moved most, each compared on the channels it kept. Both models run in
onnxruntime when it is installed, else through Kiln itself (a compile of each)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx

from ..compiler.quantize.accuracy import compare


def _with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    m.graph.output.extend(
        onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in names if n not in have
    )
    return m


def _runner(model: onnx.ModelProto, workdir: Path, tag: str):
    """feed -> {output name: array}."""
    names = [o.name for o in model.graph.output]
    try:
        import onnxruntime as ort
    except ImportError:
        import kiln

        path = workdir / f"{tag}.kiln"
        kiln.compile(model, path)
        loaded = kiln.load(path)
        return loaded.run
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return lambda feed: dict(zip(names, sess.run(None, feed)))


def accuracy(
    original: onnx.ModelProto, pruned: onnx.ModelProto, layers: dict, removed: dict, calib, zero_only: bool = False
) -> dict:
    """layers: layer name -> its output tensor; removed: tensor -> channels removed from it (still
    there, zero, in a zero_only model)."""
    outputs = [o.name for o in original.graph.output]
    taps = list(dict.fromkeys(layers.values()))
    fo, po, fl, pl = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        run_o = _runner(_with_outputs(original, taps), Path(tmp), "original")
        run_p = _runner(_with_outputs(pruned, taps), Path(tmp), "pruned")
        for i in range(len(calib)):
            feed = calib.feed(i)
            a, b = run_o(feed), run_p(feed)
            fo.append([a[n] for n in outputs])
            po.append([b[n] for n in outputs])
            fl.append({k: np.delete(a[t], removed.get(t, []), axis=1) for k, t in layers.items()})
            pl.append(
                {k: np.delete(b[t], removed.get(t, []), axis=1) if zero_only else b[t] for k, t in layers.items()}
            )
    report = compare(outputs, fo, po, list(layers), fl, pl)
    report["runtime"] = "onnxruntime" if _has_ort() else "kiln"
    return report


def _has_ort() -> bool:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True
