#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: build (or unpack) ggml's CUDA backend, then run the backend-parametrized tests on
# CUDA0, the placement report of a training step, the side-by-side with PyTorch CUDA (MNIST-FC, the small CNN, the
# char transformer) and the throughput table. Each step's output goes to $GPU_OUT/<step>.log (default
# benchmarks/out/gpu); a failing step is reported and the next one still runs; the exit status counts the failures.
#
#   bash benchmarks/gpu_check.sh                       # builds ggml's CUDA module here (minutes on 16 cores)
#   GGMLPY_PREBUILT=gpu.tar.xz bash benchmarks/gpu_check.sh
#
# GGMLPY_PREBUILT is a tarball of ggmlpy/lib (with libggml-cuda.so) and ggmlpy/_ffi/_ggml.abi3.so made on another
# machine from the same checkout (`python build_ggml.py --backends cpu,cuda --cuda-arch 90`, then the extension):
# the GPU machine then compiles nothing. The machine may be offline: put wheels of cffi and pycparser (and gguf) in
# benchmarks/wheels/, and for a build there the pinned ggml archive (see ggml.pin) in $GGMLPY_CACHE/archives/.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUTDIR=${GPU_OUT:-benchmarks/out/gpu}
mkdir -p "$OUTDIR"
export GGMLPY_CACHE=${GGMLPY_CACHE:-$PWD/.ggmlpy-cache}
export PYTHONUNBUFFERED=1
failed=0
step() {   # step NAME TIMEOUT_S COMMAND...: run, log, say how it went
    local name=$1 limit=$2; shift 2
    local t0; t0=$(date +%s)
    timeout "$limit" "$@" > "$OUTDIR/$name.log" 2>&1
    local rc=$?
    [ $rc -ne 0 ] && failed=$((failed + 1))
    echo "gpu_check: $name rc=$rc in $(( $(date +%s) - t0 ))s; last lines:"
    tail -n 6 "$OUTDIR/$name.log" | sed 's/^/    /'
}

if ! "$PY" -c "import cffi" 2>/dev/null; then
    "$PY" -m pip install -q --no-index --find-links benchmarks/wheels --target /tmp/ggmlpy-site cffi pycparser gguf \
        && export PYTHONPATH=/tmp/ggmlpy-site${PYTHONPATH:+:$PYTHONPATH}
fi
if ! command -v nvidia-smi >/dev/null; then
    echo "gpu_check: no nvidia-smi on this machine; nothing to check" >&2
    exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader
grep -m1 "model name" /proc/cpuinfo; nproc

# cuBLAS and the CUDA runtime where this machine keeps them (the toolkit, or NVIDIA's wheels beside PyTorch)
cuda_dirs=$("$PY" - <<'EOF'
import glob, os, site
dirs = set()
for root in ["/usr/local/cuda/lib64", *site.getsitepackages()]:
    for pattern in ("libcublas.so.*", "nvidia/*/lib/libcublas.so.*", "nvidia/*/lib/libcudart.so.*"):
        dirs.update(os.path.dirname(p) for p in glob.glob(os.path.join(root, pattern)))
print(":".join(sorted(dirs)))
EOF
)
export LD_LIBRARY_PATH=${cuda_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

start=$(date +%s)
if [ -n "${GGMLPY_PREBUILT:-}" ]; then
    tar -xJf "$GGMLPY_PREBUILT" -C . && echo "gpu_check: unpacked $GGMLPY_PREBUILT"
else
    arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')
    export GGMLPY_CUDA_ARCH=${GGMLPY_CUDA_ARCH:-$arch}
    step build 900 "$PY" build_ggml.py --backends cpu,cuda --jobs "$(nproc)"
    step extension 300 "$PY" ggmlpy/_ffi/build.py
fi
build_s=$(( $(date +%s) - start ))
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
"$PY" -c "import ggmlpy as g; print('backends built:', g.ggml_backends_built()); print('CUDA0:', g.ggml_backend_dev_by_name('CUDA0'))"

xdist=$("$PY" -c "import xdist" 2>/dev/null && echo "-n 8" || echo "")
step tests-backends 150 "$PY" -m pytest -q -rfEs -p no:cacheprovider $xdist tests/backends
step placement 60 "$PY" benchmarks/placement_report.py --backend CUDA0 --json "$OUTDIR/placement.json"
step tests-models 120 "$PY" -m pytest -q -rfE -p no:cacheprovider $xdist tests/models -k "cuda or CUDA0"
step tests-training 90 "$PY" -m pytest -q -rfE -p no:cacheprovider $xdist tests/training -k "cuda or CUDA0"
step vs-torch 120 "$PY" benchmarks/bench_vs_torch.py --backend CUDA0 --models mnist-fc,cnn,transformer --rounds 2 \
    --threads "$(nproc)" --json "$OUTDIR/vs_torch.json"
echo "gpu_check: $failed failing step(s); ggml ready in ${build_s}s; total $(( $(date +%s) - start ))s"
exit "$failed"
