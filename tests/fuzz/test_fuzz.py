"""A bounded fuzz run of the front doors (ONNX, .pt2 and .tflite models, .kiln artifacts): every case must
end in success or a KilnError; no other exception, no crash, no hang. Longer runs: python -m fuzz.run."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fuzz.executor import Executor
from fuzz.run import campaign, seed_artifact


@pytest.fixture(scope="module")
def executor():
    ex = Executor(timeout_s=60)
    yield ex
    ex.close()


def test_fuzz_onnx_front_door(executor):
    totals = campaign("model", 80, seed=11, executor=executor, raise_on_finding=True)
    assert totals["cases"] >= 80 and not totals["findings"]
    assert totals["outcomes"]["ok"] > 0 and totals["outcomes"]["kiln_error"] > 0  # both ends were reached
    assert len(totals["kinds"]) >= 10  # many distinct error paths, not one early exit


def test_fuzz_artifact_reader(executor):
    totals = campaign("artifact", 150, seed=12, executor=executor, blob=seed_artifact(), raise_on_finding=True)
    assert totals["cases"] >= 150 and not totals["findings"]
    assert totals["outcomes"]["kiln_error"] > 0


@pytest.mark.parametrize("kind, n, extra", [("tflite", 30, "tflite"), ("pt2", 20, "torch")])
def test_fuzz_other_frontends(executor, kind, n, extra):
    pytest.importorskip(extra, reason=f"the {kind} reader needs the {extra} extra: pip install 'kiln[{extra}]'")
    if kind == "tflite":
        pytest.importorskip("ai_edge_litert", reason="the seed's int8 model is made by LiteRT's quantizer")
    totals = campaign(kind, n, seed=13, executor=executor, raise_on_finding=True)
    assert totals["cases"] >= n and not totals["findings"]
    assert totals["outcomes"]["kiln_error"] > 0 and len(totals["kinds"]) >= 5


def test_fuzz_v2_codec(executor):
    """Damaged V2 infer bodies (JSON and binary: fields dropped or of the wrong type, truncated or extended
    bodies, header lengths past the body) decode or raise a KilnError: the server answers 400, not 500."""
    pytest.importorskip("aiohttp", reason="kiln.serve needs the serve extra: pip install 'kiln[serve]'")
    totals = campaign("v2", 300, seed=14, executor=executor, raise_on_finding=True)
    assert totals["cases"] >= 300 and not totals["findings"]
    assert totals["outcomes"]["ok"] > 0 and totals["outcomes"]["kiln_error"] > 0
    assert len(totals["kinds"]) >= 10


def test_the_harness_reports_crashes_and_hangs():
    ex = Executor(timeout_s=2)
    try:
        assert ex.run("selftest-crash", b"")["outcome"] == "crash"
        assert ex.run("selftest-hang", b"")["outcome"] == "hang"
        assert ex.run("artifact", b"not a zip")["outcome"] == "kiln_error"  # a fresh worker after each
    finally:
        ex.close()
