"""Shipped tuning records are chosen by capabilities (schedules/shipped.py): an exact target key, or a
set whose code the target can run on the same vector family, block and kernel families; never an
AVX-512 set for an AVX2 target. The report says which set was used, or why none applied."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import make_model, rand
from onnx import helper

import kiln
from kiln.schedules.shipped import select, shipped_sets
from kiln.target import Target

ROOT = Path(__file__).resolve().parents[2] / "tuning_logs"


def _znver4_set():
    sets = [s for s in shipped_sets(ROOT) if s.target.caps.cpu == "znver4"]
    if not sets:
        pytest.skip("tuning_logs/ ships no znver4 records")
    return sets[0]


@pytest.mark.parametrize(
    "target, applies, why",
    [
        ("llvm -mcpu=znver5", True, "tuned for znver4"),  # AVX-512 + VNNI + BF16, a superset
        ("llvm -mcpu=znver3", False, "isa avx512 there, avx2 here"),
        ("llvm -mcpu=haswell", False, "isa avx512 there, avx2 here"),
        ("llvm -mcpu=skylake-avx512", False, "int8_path"),  # no VNNI: another int8 kernel family
        ("llvm -mcpu=sapphirerapids", False, "int8_path"),  # AMX
        ("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a76", False, "arch x86_64 there, aarch64 here"),
    ],
)
def test_shipped_set_by_capabilities(target, applies, why):
    s = _znver4_set()
    chosen, sentence = select(ROOT, Target.parse(target))
    assert (chosen == s.path) == applies, sentence
    assert why in sentence


def test_exact_key_wins():
    s = _znver4_set()
    exact = Target.parse("llvm -mcpu=znver4 -num-cores=2")
    chosen, sentence = select(ROOT, exact)
    assert chosen == s.path and "exactly this target" in sentence


def test_compile_reports_which_records_or_why_none(tmp_path, monkeypatch):
    _znver4_set()
    monkeypatch.setenv("KILN_TUNING_LOGS", str(ROOT))
    x = rand(1, 8, 8, 8)
    m = make_model(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
        {"x": x},
        ["y"],
        inits={"w": rand(8, 8, 3, 3, seed=1)},
    )
    r = kiln.compile(m, tmp_path / "a.kiln", target="llvm -mcpu=znver3")
    assert r.report["tuning_records"].startswith("no shipped set matches"), r.report["tuning_records"]
    assert r.manifest["compile_options"]["tuning_db"] is None
    r = kiln.compile(m, tmp_path / "b.kiln", target="llvm -mcpu=znver5")
    assert "tuned for znver4" in r.report["tuning_records"]
    assert Path(r.manifest["compile_options"]["tuning_db"]).name.startswith("llvm-znver4")
