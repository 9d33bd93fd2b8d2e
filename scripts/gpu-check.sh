#!/usr/bin/env bash
# `make gpu-check`: the first run on a GPU host (one H100/H200, under 10 minutes). Checks that a CUDA GPU
# is visible before building anything, builds .venv with the host's torch/Triton (FARM_TORCH and
# FARM_TRITON, e.g. make gpu-check FARM_TORCH='torch==2.13.0' with the host's CUDA index in
# PIP_EXTRA_INDEX_URL), then runs benchmarks/gpu_check.py: the GPU tests, one small sweep per family and
# the figures against the hardware, all kept in benchmarks/results/gpu-check-<host>-<YYYYMMDD>/.
# Exit 0: every step and every correctness verdict passed; 1: something failed (see summary.txt);
# 4: no CUDA GPU is visible (nothing was built).
set -euo pipefail
cd "$(dirname "$0")/.."

no_gpu() {
    echo "gpu-check: no CUDA GPU is visible ($1): run it on a GPU host" >&2
    exit 4
}

case "${CUDA_VISIBLE_DEVICES-unset}" in
    "" | -*) no_gpu "CUDA_VISIBLE_DEVICES='${CUDA_VISIBLE_DEVICES}' hides every device" ;;
esac
command -v nvidia-smi >/dev/null 2>&1 || no_gpu "nvidia-smi not found"
nvidia-smi -L 2>/dev/null | grep -q '^GPU ' || no_gpu "nvidia-smi -L lists no GPU"

${MAKE:-make} --no-print-directory venv ${FARM_TORCH:+FARM_TORCH="$FARM_TORCH"} ${FARM_TRITON:+FARM_TRITON="$FARM_TRITON"}
exec .venv/bin/python -m benchmarks.gpu_check "$@"
