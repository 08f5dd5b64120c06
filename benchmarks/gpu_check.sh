#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: build ggml's CUDA backend for the detected architecture,
# run the backend-parametrized tests and the throughput table, and print a short summary.
# Meant to finish in under 8 minutes on a 16-core GPU machine (the CUDA module dominates).
#
# The machine may be offline: put wheels of cffi and pycparser in benchmarks/wheels/ and the
# pinned ggml archive (see ggml.pin) in $GGMLPY_CACHE/archives/ before running.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export GGMLPY_CACHE=${GGMLPY_CACHE:-$PWD/.ggmlpy-cache}

if ! "$PY" -c "import cffi, pycparser" 2>/dev/null; then
    "$PY" -m pip install -q --no-index --find-links benchmarks/wheels cffi pycparser
fi
if ! command -v nvidia-smi >/dev/null; then
    echo "gpu_check: no nvidia-smi on this machine; nothing to check" >&2
    exit 1
fi
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')
export GGMLPY_CUDA_ARCH=${GGMLPY_CUDA_ARCH:-$arch}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

start=$(date +%s)
"$PY" build_ggml.py --backends cpu,cuda --jobs "$(nproc)"
"$PY" ggmlpy/_ffi/build.py > /dev/null
build_s=$(( $(date +%s) - start ))

export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
"$PY" -m pytest -q -rs tests/backends | tail -n 15
"$PY" -m pytest -q tests/training -k cuda | tail -n 5   # losses, optimizers, fits on the GPU
"$PY" benchmarks/bench_backends.py --quick --backends cpu,cuda
echo "gpu_check: CUDA build took ${build_s}s for sm_${GGMLPY_CUDA_ARCH}; total $(( $(date +%s) - start ))s"
