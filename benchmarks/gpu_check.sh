#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: build ggml's CUDA backend for the detected architecture,
# run the backend-parametrized tests, the placement report of a training step, the side-by-side with
# PyTorch CUDA (MNIST-FC, the small CNN, the char transformer) and the throughput table.
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
"$PY" -m pytest -q -rs tests/backends | tail -n 15     # incl. test_gpu_resident / test_gpu_kernels on CUDA0
"$PY" -m pytest -q tests/training -k cuda | tail -n 5   # losses, optimizers, fits on the GPU
"$PY" benchmarks/placement_report.py --backend CUDA0    # splits, CPU ops and bytes per training step
"$PY" benchmarks/bench_vs_torch.py --backend CUDA0 --models mnist-fc,cnn,transformer --rounds 2 --threads "$(nproc)"
"$PY" benchmarks/bench_backends.py --quick --backends cpu,cuda
echo "gpu_check: CUDA build took ${build_s}s for sm_${GGMLPY_CUDA_ARCH}; total $(( $(date +%s) - start ))s"
