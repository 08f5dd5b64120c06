"""The GPU devices the backend tests run on, and how a test that needs one skips when it is missing (saying what
would provide it). Vulkan runs on Mesa's lavapipe in CI; CUDA where a GPU is lent (``benchmarks/gpu_check.sh``,
which sets GGMLPY_REQUIRE_DEVICES so that such a skip fails there)."""
from __future__ import annotations

import os

import pytest

import ggmlpy as g
from tests.helpers.markers import GPU_DEVICES


_HINTS = {"vulkan": "GGML_VK_VISIBLE_DEVICES=0 selects Mesa's lavapipe", "cuda": "an NVIDIA GPU and its driver"}
GPUS = {name: (family, _HINTS[family]) for name, family in GPU_DEVICES.items()}


def require_gpu(name: str) -> None:
    """Skip the calling test, saying why, unless ``name`` ("Vulkan0", "CUDA0") is built and present."""
    family, hint = GPUS[name]
    if family not in g.ggml_backends_built():
        pytest.skip(f"the {family} backend is not built in this installation (GGMLPY_BACKENDS=...,{family})")
    if g.ggml_backend_dev_by_name(name) is None:
        problem = next((p["message"] for p in g.ggml_backend_load_errors() if p["backend"] == family), None)
        pytest.skip(f"the {family} backend is built but there is no {name} device ({problem or hint})")


def is_lavapipe(name: str) -> bool:
    dev = g.ggml_backend_dev_by_name(name)
    return dev is not None and any(s in dev.description.lower() for s in ("llvmpipe", "lavapipe"))


def cpu_takes_f32_products() -> bool:
    """patches/0062: a CPU backend built with AVX-512 computes F32 products (MUL_MAT, OUT_PROD) itself, faster than
    OpenBLAS's sgemm, and the BLAS device declines them, unless the process runs with GGMLPY_NO_F32_GEMM set."""
    return bool(g.ggml_cpu_has_avx512()) and "GGMLPY_NO_F32_GEMM" not in os.environ


def assert_ran_on(backend, op: str, placed: list) -> None:
    """That ``op`` ran on ``backend`` and nothing went to the CPU, in the first placement a compute recorded (a test
    of a GPU kernel that the scheduler quietly sent to the CPU would prove nothing); nothing to check on the CPU."""
    if backend.name == "CPU":
        return
    assert placed[0].op_counts(backend.name)[op] >= 1 and placed[0].cpu_ops == [], placed[0]
