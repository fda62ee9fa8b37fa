"""Fuzz harnesses for Kiln's two front doors: ONNX models (import + compile + run) and .kiln
artifacts (load + run). Cases are drawn with hypothesis and executed in a worker process, so a
crash or a hang is caught and reported with its case instead of taking the fuzzer down.
The test suite runs a bounded number (tests/fuzz); `python -m fuzz.run` runs longer and prints totals."""
