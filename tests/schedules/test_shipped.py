"""Shipped tuning records are chosen by capabilities (schedules/tuning/shipped.py): an exact target key, or a
set whose code the target can run on the same vector family, block and kernel families; never an
AVX-512 set for an AVX2 target. The report says which set was used, or why none applied."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import make_model, rand
from onnx import helper

import kiln
from kiln.schedules.tuning.shipped import select, shipped_sets
from kiln.target import Target

ROOT = Path(__file__).resolve().parents[2] / "tuning_logs"


def _set(cpu: str):
    sets = [s for s in shipped_sets(ROOT) if s.target.caps.cpu == cpu]
    if not sets:
        pytest.skip(f"tuning_logs/ ships no {cpu} records")
    return sets[0]


def _znver4_set():
    return _set("znver4")


@pytest.mark.parametrize(
    "target, tuned_for, why",
    [
        ("llvm -mcpu=znver5", "znver4", "tuned for znver4"),  # AVX-512 + VNNI + BF16, a superset
        ("llvm -mcpu=haswell", "haswell", "exactly this target"),  # the AVX2 set, never the AVX-512 one
        ("llvm -mcpu=znver3", "haswell", "tuned for haswell"),  # AVX2 + FMA
        ("llvm -mcpu=skylake", "haswell", "tuned for haswell"),
        ("llvm -mcpu=alderlake", None, "int8_path avx2-pmaddubsw there, avx-vnni here"),  # AVX-VNNI
        ("llvm -mcpu=skylake-avx512", None, "int8_path"),  # no VNNI: another int8 kernel family
        ("llvm -mcpu=sapphirerapids", None, "int8_path"),  # AMX
        ("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a76", None, "arch x86_64 there, aarch64 here"),
    ],
)
def test_shipped_set_by_capabilities(target, tuned_for, why):
    _znver4_set(), _set("haswell")
    expected = _set(tuned_for).path if tuned_for else None
    chosen, sentence = select(ROOT, Target.parse(target))
    assert chosen == expected, sentence
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
    r = kiln.compile(m, tmp_path / "a.kiln", target="llvm -mcpu=alderlake")
    assert r.report["tuning_records"].startswith("no shipped set matches"), r.report["tuning_records"]
    assert r.manifest["compile_options"]["tuning_db"] is None
    _set("haswell")
    r = kiln.compile(m, tmp_path / "c.kiln", target="llvm -mcpu=znver3")
    assert "tuned for haswell" in r.report["tuning_records"]
    r = kiln.compile(m, tmp_path / "b.kiln", target="llvm -mcpu=znver5")
    assert "tuned for znver4" in r.report["tuning_records"]
    assert Path(r.manifest["compile_options"]["tuning_db"]).name.startswith("llvm-znver4")
