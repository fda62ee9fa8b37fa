"""onnxruntime's quantize_dynamic of a stacked LSTM exported from torch (issue 51): two
com.microsoft.DynamicQuantizeLSTM, the second reading the first's output through a Reshape. ONNX's shape
inference cannot size a contrib op's outputs, so the second layer saw no static shape even with every
input pinned; it is now rewritten after the first, with shapes inferred again. The result matches
onnxruntime's quantized model within the corpus tolerance, at -O0 and -O2."""

import numpy as np
import onnx
import pytest
from helpers import ort_run, quantize_dynamic

import kiln


def _tolerance(ref: np.ndarray) -> np.ndarray:
    """benchmarks/corpus.md's: |kiln - ort| <= 1e-4 * max(1, max|ort|) + 1e-3 * |ort|."""
    return 1e-4 * max(1.0, float(np.abs(ref).max())) + 1e-3 * np.abs(ref)


def _quantized_lstm(tmp_path):
    torch = pytest.importorskip("torch")

    class Tagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.emb = torch.nn.Embedding(50, 16)
            self.lstm = torch.nn.LSTM(16, 12, num_layers=2, batch_first=True, bidirectional=True)
            self.fc = torch.nn.Linear(24, 10)

        def forward(self, x):
            return self.fc(self.lstm(self.emb(x))[0])

    x = torch.randint(0, 50, (1, 8), generator=torch.Generator().manual_seed(1))
    torch.onnx.export(
        Tagger().eval(),
        (x,),
        tmp_path / "f.onnx",
        dynamo=False,
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "batch", 1: "seq"}},
        opset_version=17,
    )
    return quantize_dynamic(onnx.load(tmp_path / "f.onnx"), tmp_path)


@pytest.mark.parametrize("opt_level", [0, 2])
def test_dynamic_quantize_lstm_stacked_matches_onnxruntime(tmp_path, opt_level):
    q = _quantized_lstm(tmp_path)
    assert sum(n.op_type == "DynamicQuantizeLSTM" for n in q.graph.node) == 2
    kiln.compile(q, tmp_path / "q.kiln", input_shapes=["input:1x5"], opt_level=opt_level)
    art = kiln.load(tmp_path / "q.kiln")
    assert art.outputs[0].shape == (1, 5, 10)  # static: both layers kept their shapes
    for seed in (2, 3):
        feeds = {"input": np.random.default_rng(seed).integers(0, 50, (1, 5)).astype(np.int64)}
        ours, ref = art.run(feeds)["logits"], ort_run(q, feeds)[0]
        err = np.abs(ours - ref)
        assert (err <= _tolerance(ref)).all(), (err.max(), np.abs(ref).max())
