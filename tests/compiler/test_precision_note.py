"""--precision bf16/fp16 says so when the target has no arithmetic in that type (it would only be
converted to float32 around every op): a warning and the report's precision_note, per target."""

import warnings

import pytest
from helpers import make_model, rand
from onnx import helper

import kiln


def _model():
    return make_model(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
        {"x": rand(1, 8, 8, 8)},
        ["y"],
        {"w": rand(8, 8, 3, 3, seed=1)},
    )


@pytest.mark.parametrize(
    "target,precision,slow",
    [
        ("llvm -mcpu=haswell", "bf16", True),
        ("llvm -mcpu=znver4", "bf16", False),
        ("llvm -mcpu=znver4", "fp16", True),
        ("llvm -mcpu=sapphirerapids", "fp16", True),  # AVX512-FP16, but no Kiln kernel uses it: widened to fp32
        ("llvm -mcpu=sapphirerapids", "bf16", False),
    ],
)
def test_precision_note_per_target(tmp_path, target, precision, slow):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        r = kiln.compile(_model(), tmp_path / "m.kiln", target=target, precision=precision)
    ours = [str(i.message) for i in w if issubclass(i.category, kiln.errors.KilnWarning)]
    note = r.report["precision_note"]
    if slow:
        assert note and "will not be faster than float32" in note and target.split("=")[1] in note
        assert any(f"--precision {precision}" in m for m in ours)
    else:
        assert note is None and not any("--precision" in m for m in ours)
