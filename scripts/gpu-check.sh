#!/usr/bin/env bash
# One prepared check of swapcast's GPU path, for a machine with an NVIDIA GPU: versions, `pytest -m gpu`,
# the torch backend per model (FP32 with TF32 off, FP16 vs ONNX Runtime, CUDA-graph capture per batch
# size, latency), capture beside eager work on another thread, TensorRT FP16/INT8 builds where TensorRT
# is installed, `swapcast bench-engines` and `swapcast bench-batch` with batching on. One JSON report.
#
#   scripts/gpu-check.sh [--output gpu-check.json] [--model-dir DIR] [--models a,b] [--budget 450]
#   scripts/gpu-check.sh --dry      # the CPU-only parts (CI runs this)
#
# Needs only this checkout and a Python with its dependencies (.venv/bin/python when present, else
# $PYTHON or python3); parts whose packages are missing (TensorRT, PyAV) are skipped and say so.
# Stops within 8 minutes whatever happens; the report is rewritten after every part.
set -euo pipefail
cd "$(dirname "$0")/.."

python="${PYTHON:-}"
if [ -z "$python" ]; then
    if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec timeout --kill-after=10 480 "$python" -m app.bench.gpu_check "$@"
