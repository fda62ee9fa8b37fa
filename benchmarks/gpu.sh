#!/usr/bin/env bash
# The zoo on an NVIDIA GPU against onnxruntime-gpu; skips cleanly (exit 0) where there is no GPU.
# Usage: bash benchmarks/gpu.sh [--models resnet50,...] [--tuning-db DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "benchmarks/gpu.sh: no NVIDIA GPU on this host (nvidia-smi absent or failing): skipped"
  exit 0
fi
PY=.venv/bin/python
[ -x "$PY" ] || { make -s .venv/.installed >/dev/null; }
# the GPU runtime compiles the artifact's CUDA kernels at load time: NVRTC through cuda-bindings, or nvcc
"$PY" -c "import cuda.bindings" 2>/dev/null || command -v nvcc >/dev/null || "$PY" -m pip install -q cuda-bindings
exec "$PY" benchmarks/gpu.py "$@"
