"""`kiln bench`: its numbers are real measurements of the artifact (and of onnxruntime when asked)."""

import json

import numpy as np
import pytest

from kiln.cli import main
from kiln.runtime.bench import BLOCK, BenchOptions, _abs_diff, bench, block_ratios, percentiles


def test_percentiles():
    p = percentiles([1.0, 2.0, 3.0, 4.0, 100.0])
    assert p["p50_ms"] == 3.0 and p["min_ms"] == 1.0 and p["p99_ms"] > 90 and p["qps"] == pytest.approx(1e3 / 22.0)


def test_bench_with_onnxruntime(small_artifact, small_onnx_path):
    r = bench(small_artifact, BenchOptions(threads=1, warmup=2, repeat=20, onnx=str(small_onnx_path)))
    assert r["runs"] == 20 and len(r["latencies_ms"]) == 20 == len(r["ort_latencies_ms"])
    assert 0 < r["min_ms"] <= r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"]
    assert r["ratio_p50"] == pytest.approx(r["p50_ms"] / r["ort_p50_ms"])
    assert r["cold_start_ms"] > r["min_ms"] and r["peak_rss_mb"] > 10
    assert r["max_abs_diff"] < 1e-4  # the same input gave the same answer
    # blocks of at least BLOCK runs and BLOCK_MIN_S: this tiny model's 20 runs fit in one to three pairs
    assert 1 <= r["ratio_block_pairs"] <= -(-20 // BLOCK)
    assert 0 < r["ratio_block_q25"] <= r["ratio_block_median"] <= r["ratio_block_q75"]


def test_abs_diff_of_empty_and_mismatched_outputs():
    """A detector that finds nothing returns empty outputs (FasterRCNN on a blank image): bench's
    comparison raised on them. Different shapes are an infinite difference, never broadcast."""
    assert _abs_diff(np.zeros((0, 4), "float32"), np.zeros((0, 4), "float32")) == 0.0
    assert _abs_diff(np.ones((2, 4), "float32"), np.ones((1, 4), "float32")) == float("inf")
    assert _abs_diff(np.array([1.0, 2.5], "float32"), np.array([1.0, 2.0])) == 0.5


def test_block_ratios():
    """Each block's median over the adjacent onnxruntime block's; a trailing onnxruntime block
    without its Kiln block is not a pair."""
    times = {"": [1.0, 2.0, 3.0, 4.0, 4.0, 4.0], "ort_": [2.0, 2.0, 2.0, 2.0, 4.0, 4.0, 1.0]}
    blocks = {"": [0, 3], "ort_": [0, 3, 6]}
    r = block_ratios(times, blocks)
    assert r["ratio_block_pairs"] == 2 and r["ratio_block_median"] == pytest.approx((1.0 + 1.0) / 2)
    assert (r["ratio_block_q25"], r["ratio_block_q75"]) == (pytest.approx(1.0), pytest.approx(1.0))
    times["ort_"][3:6] = [8.0, 8.0, 8.0]
    r = block_ratios(times, blocks)
    assert (r["ratio_block_q25"], r["ratio_block_median"], r["ratio_block_q75"]) == pytest.approx((0.625, 0.75, 0.875))


def test_block_ratios_after_onnxruntime_is_cut_to_kilns_count():
    """onnxruntime's runs are cut to Kiln's count; its blocks (longer where it runs faster) may then start
    past the end. Those pairs are dropped: the ratios stay numbers (they printed as nan)."""
    times = {"": [2.0] * 6, "ort_": [1.0] * 6}  # ort ran 4 + 4 + 4 + 4 runs, cut to 6
    blocks = {"": [0, 2, 4], "ort_": [0, 4, 8, 12]}
    r = block_ratios(times, blocks)
    assert r["ratio_block_pairs"] == 2 and r["ratio_block_median"] == pytest.approx(2.0)


def test_bench_cli_json(tmp_path, small_artifact, small_onnx_path, capsys):
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
    text = capsys.readouterr().out
    assert "kiln / onnxruntime p50 =" in text and "cold start" in text and "per block pair (1 pairs of" in text
    r = json.loads(out.read_text())
    assert {"p50_ms", "p99_ms", "qps", "cold_start_ms", "peak_rss_mb", "ort_p50_ms", "ort_p99_ms", "ratio_p50"} <= set(
        r
    )


def test_bench_bad_options(small_artifact, capsys):
    assert main(["bench", str(small_artifact), "--repeat", "0"]) == 2
    assert "repeat >= 1" in capsys.readouterr().err


def _token_type_model(tmp_path):
    """An embedding lookup into a 2-row table, as BERT's token_type_ids: random 0..9 indices are invalid."""
    import numpy as np
    import onnx
    from helpers import make_model
    from onnx import helper

    import kiln

    ids = np.zeros((1, 8), np.int64)
    m = make_model(
        [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)],
        {"ids": ids},
        ["y"],
        inits={"table": np.arange(8, dtype=np.float32).reshape(2, 4)},
    )
    onnx.save(m, tmp_path / "m.onnx")
    kiln.compile(m, tmp_path / "m.kiln")
    return tmp_path / "m.kiln", tmp_path / "m.onnx"


def test_bench_random_ints_are_valid_indices_and_inputs_flag(tmp_path, capsys):
    import numpy as np

    art, onnx_path = _token_type_model(tmp_path)
    r = bench(art, BenchOptions(repeat=5, warmup=1, onnx=str(onnx_path)))
    assert r["max_abs_diff"] == 0.0
    np.savez(tmp_path / "bad.npz", ids=np.full((1, 8), 5, np.int64))
    rc = main(["bench", str(art), "--onnx", str(onnx_path), "--inputs", str(tmp_path / "bad.npz"), "--repeat", "3"])
    err = capsys.readouterr().err
    # Kiln's own check of inputs that index a table rejects it first (frontends/index_ranges.py)
    assert rc == 2 and "input 'ids' holds 5, outside [-2, 1]" in err, err
