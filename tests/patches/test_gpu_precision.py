"""Float32 models get float32 matrix products on the GPUs, as on the CPU and as PyTorch defaults to: CUDA
computes them in full F32 unless GGMLPY_CUDA_TF32=1 allows TF32 tensor cores (patches/0039: ggml turned TF32 on
in cuBLAS and in its own small-batch kernel), Vulkan unless GGMLPY_VULKAN_F16=1 allows F16 operands.

The measure is ||out - ref|| / ||ref|| against numpy float64 on random data: float32 arithmetic lands near 1e-7,
TF32 (10-bit mantissas) near 3e-4 and F16 operands between 1e-4 and 1e-3. Products of at most 16 columns run on
ggml's own kernels (CUDA's mmf, Vulkan's matrix-vector shaders up to 8), wider ones on cuBLAS or the tiled
shaders; OUT_PROD, the weight gradient, on cuBLAS (CUDA) or out_prod.comp (Vulkan).
"""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.compute import compute
from tests.helpers.devices import GPUS, require_gpu
from tests.helpers.subprocesses import run_in_subprocess


F32_LEVEL = 1e-5          # float32 products of length 640: about 1e-7, with room for any summation order
TF32_LEVEL = (3e-5, 5e-3)  # where TF32 products land: clearly above float32, clearly below garbage


def _rel(out: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(out.astype(np.float64) - want) / np.linalg.norm(want))


def _cases(rng, cols: int):
    a = rng.normal(size=(512, 640)).astype(np.float32)          # ne [640, 512]
    b = rng.normal(size=(cols, 640)).astype(np.float32)         # ne [640, cols]
    return a, b


@pytest.fixture(params=sorted(GPUS))
def gpu(request):
    require_gpu(request.param)
    b = G.ggml_backend_init_by_name(request.param)
    yield b
    b.free()


@pytest.mark.parametrize("cols", [8, 16, 384])
def test_f32_products_are_float32_accurate_by_default(gpu, cols):
    rng = np.random.default_rng(cols)
    a, b = _cases(rng, cols)
    placed: list = []
    (out,) = compute(lambda ctx, ta, tb: G.ggml_mul_mat(ctx, ta, tb), a, b, backend=gpu, placements=placed)
    assert placed[0].cpu_ops == [], placed[0]
    want = b.astype(np.float64) @ a.astype(np.float64).T
    assert _rel(out.reshape(want.shape), want) < F32_LEVEL


def test_f32_gradient_products_are_float32_accurate_by_default(gpu):
    rng = np.random.default_rng(1)
    x, gy = rng.normal(size=(640, 300)).astype(np.float32), rng.normal(size=(640, 200)).astype(np.float32)
    placed: list = []
    (out,) = compute(lambda ctx, ta, tb: G.ggml_out_prod(ctx, ta, tb), x, gy, backend=gpu, placements=placed)
    assert placed[0].op_counts(gpu.name)["OUT_PROD"] == 1, placed[0]
    want = gy.astype(np.float64).T @ x.astype(np.float64)
    assert _rel(out.reshape(want.shape), want) < F32_LEVEL


TF32_SCRIPT = textwrap.dedent("""
    import numpy as np, ggmlpy as G
    from tests.helpers.compute import compute
    be = G.ggml_backend_init_by_name("CUDA0")
    rng = np.random.default_rng(5)
    a = rng.normal(size=(512, 640)).astype(np.float32)
    for cols in (8, 384):
        b = rng.normal(size=(cols, 640)).astype(np.float32)
        (out,) = compute(lambda ctx, ta, tb: G.ggml_mul_mat(ctx, ta, tb), a, b, backend=be)
        want = b.astype(np.float64) @ a.astype(np.float64).T
        print("mul_mat", cols, float(np.linalg.norm(out.reshape(want.shape) - want) / np.linalg.norm(want)))
    gy = rng.normal(size=(200, 640)).astype(np.float32)
    (out,) = compute(lambda ctx, ta, tb: G.ggml_out_prod(ctx, ta, tb), a.T.copy(), gy.T.copy(), backend=be)
    want = gy.astype(np.float64) @ a.astype(np.float64).T
    print("out_prod", 0, float(np.linalg.norm(out.reshape(want.shape) - want) / np.linalg.norm(want)))
""")


@pytest.mark.parametrize("switch", ["1", "0"])
def test_cuda_uses_tf32_only_when_asked(switch):
    """GGMLPY_CUDA_TF32=1: TF32 in cuBLAS (wide products, OUT_PROD) and in ggml's small-batch kernel; =0 (or
    unset, the other tests): float32. A fresh process each: ggml reads the switch once."""
    require_gpu("CUDA0")
    rc, out, err = run_in_subprocess(TF32_SCRIPT, timeout=120, env={"GGMLPY_CUDA_TF32": switch})
    assert rc == 0, err[-2000:]
    errors = {f"{w[0]} {w[1]}": float(w[2]) for w in (line.split() for line in out.splitlines()) if len(w) == 3}
    assert len(errors) == 3, out
    for name, e in errors.items():
        if switch == "1":
            assert TF32_LEVEL[0] < e < TF32_LEVEL[1], (name, e)
        else:
            assert e < F32_LEVEL, (name, e)
