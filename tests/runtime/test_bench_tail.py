"""kiln bench shows the tail: the worst run, p99 over p50, and a flag when that exceeds 2x."""

import json

import pytest

from kiln.cli import main
from kiln.runtime.bench import SPELL_RATIO, TAIL_FLAG_RATIO, format_bench, percentiles, slow_runs, spell, tail_lines


def test_tail_fields_and_flag():
    flat = percentiles([10.0] * 99 + [12.0])
    assert flat["max_ms"] == 12.0 and flat["p99_over_p50"] == pytest.approx(flat["p99_ms"] / 10.0)
    assert flat["tail_flag"] is False
    spiky = percentiles([6.0] * 97 + [500.0] * 3, prefix="ort_")
    assert spiky["ort_max_ms"] == 500.0 and spiky["ort_p99_over_p50"] > TAIL_FLAG_RATIO
    assert spiky["ort_tail_flag"] is True


def test_slow_runs_and_which_were_preempted():
    r = slow_runs([6.0, 6.0, 6.0, 14.0, 500.0, 7.0], [0, 1, 0, 0, 3, 0])  # median 6.5: 14 and 500 are slow
    assert r == {"slow_runs": 2, "slow_runs_preempted": 1, "runs_preempted": 2}


def test_a_slow_spell_is_told_from_scattered_slow_runs():
    steady = [5.0] * 2000  # 10 s of 5 ms runs
    scattered = [5.0 if i % 50 else 40.0 for i in range(2000)]  # one slow run in 50, in every window
    spelled = [5.0] * 800 + [9.0] * 300 + [5.0] * 900  # 2.7 s at 1.8x in the middle
    assert spell(steady) == 1.0
    assert spell(scattered) < 1.05  # p99 8x p50, but every window's median is the same: the model's own tail
    assert spell(spelled) == pytest.approx(1.8)
    assert percentiles(spelled)["spell"] > SPELL_RATIO >= percentiles(scattered)["spell"]
    assert spell([5.0] * 10) == 1.0  # under two windows of runs


def test_the_tail_line_names_a_spell():
    ms = [5.0] * 800 + [11.0] * 300 + [5.0] * 900  # p99 2.2x p50, all of it one 3 s spell
    r = {"threads": 2, "runs": len(ms), **percentiles(ms), **slow_runs(ms, [0] * len(ms))}
    (line,) = tail_lines(r)
    assert "p99 is 2.2x" in line and "slowed for whole seconds" in line and "2.2x the fastest" in line


def test_the_text_says_which_engine_has_a_tail():
    r = {
        "artifact": "m.kiln",
        "target": "llvm",
        "threads": 2,
        "runs": 100,
        "warmup": 5,
        **percentiles([6.0] * 97 + [500.0] * 3),
        **slow_runs([6.0] * 97 + [500.0] * 3, [0] * 97 + [2] * 3),
        **percentiles([6.0] * 100, prefix="ort_"),
        "cold_start_ms": 1.0,
        "peak_rss_mb": 1.0,
        "first_run_ms": 1.0,
        "first_run_after_warmup_ms": 1.0,
        "warmup_ms": 1.0,
        "ratio_p50": 1.0,
        "max_abs_diff": 0.0,
    }
    text = format_bench(r)
    assert "TAIL: kiln p99 is" in text and "TAIL: onnxruntime" not in text and "max" in text
    assert "3 run(s) over 2x p50, 3 of them preempted" in text
    assert "whole seconds" not in text  # 100 runs of 6 ms: one window, no spell


def test_bench_json_has_the_tail(tmp_path, small_artifact, small_onnx_path):
    out = tmp_path / "b.json"
    assert (
        main(
            [
                "bench",
                str(small_artifact),
                "--onnx",
                str(small_onnx_path),
                "--repeat",
                "5",
                "--warmup",
                "1",
                "--threads",
                "1",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    r = json.loads(out.read_text())
    for p in ("", "ort_"):
        assert isinstance(r[f"{p}tail_flag"], bool) and r[f"{p}max_ms"] >= r[f"{p}p99_ms"]
        assert r[f"{p}p99_over_p50"] >= 1.0
        assert 0 <= r[f"{p}slow_runs_preempted"] <= r[f"{p}slow_runs"] <= 5 and 0 <= r[f"{p}runs_preempted"] <= 5
