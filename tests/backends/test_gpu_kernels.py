"""Our GPU kernels against ggml's CPU kernel, as ggml's test-backend-ops compares a backend with the CPU:
random shapes, the same inputs on both, results that must agree.

* patches/0016: IM2COL_BACK (a convolution's input gradient, 2-D and 1-D, strides, padding, dilation),
  POOL_2D_BACK (max with tied maxima, as the CPU breaks ties: the first of them; average) on Vulkan and CUDA,
  and OUT_PROD with a transposed operand (a matrix product's gradient) on Vulkan. Gather kernels that add in the CPU's order: the
  results are equal, not just close.
* patches/0018: DROPOUT's mask, the same bit for bit on every backend (``test_ops_random.py`` checks it
  against a numpy reference of its hash).

Each case also checks that the op really ran on the device (a test of a kernel the scheduler quietly sent
to the CPU would prove nothing). Vulkan runs on Mesa's lavapipe in CI, CUDA where a GPU is lent
(``benchmarks/gpu_check.sh``); a device that is missing skips its tests, saying so.
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G
from tests.conftest import compute, compute_grad


DEVICES = {"Vulkan0": ("vulkan", "GGML_VK_VISIBLE_DEVICES=0 selects Mesa's lavapipe"),
           "CUDA0": ("cuda", "an NVIDIA GPU and its driver")}


@pytest.fixture(scope="module", params=sorted(DEVICES))
def gpu(request):
    """A GPU backend: Vulkan (on Mesa's lavapipe in CI) or CUDA."""
    name = request.param
    family, hint = DEVICES[name]
    if family not in G.ggml_backends_built():
        pytest.skip(f"the {family} backend is not built in this installation (GGMLPY_BACKENDS=...,{family})")
    if G.ggml_backend_dev_by_name(name) is None:
        pytest.skip(f"no {name} device ({hint})")
    b = G.ggml_backend_init_by_name(name)
    yield b
    b.free()


def _both(build, x, r, *others, gpu, op: str):
    """d loss / d x on the CPU and on the GPU; checks that ``op`` ran on the GPU."""
    _, on_cpu = compute_grad(build, x, r, *others)
    placed: list = []
    _, on_gpu = compute_grad(build, x, r, *others, backend=gpu, placements=placed)
    assert placed[0].op_counts(gpu.name)[op] >= 1 and placed[0].cpu_ops == [], placed[0]
    return on_cpu, on_gpu


CONV_2D = [  # (N, C, H, W, O, KH, KW, s0, s1, p0, p1, d0, d1)
    (1, 1, 5, 5, 1, 3, 3, 1, 1, 0, 0, 1, 1), (2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1),
    (3, 2, 9, 8, 2, 3, 2, 2, 1, 1, 0, 1, 1), (2, 2, 8, 9, 3, 2, 3, 1, 2, 2, 1, 2, 1),
    (1, 4, 11, 7, 2, 5, 3, 3, 2, 2, 1, 1, 2), (4, 1, 6, 6, 5, 1, 1, 2, 2, 0, 0, 1, 1),
]


@pytest.mark.parametrize("case", CONV_2D, ids=str)
def test_im2col_back_2d_equals_the_cpu(gpu, case):
    n, c, h, w, o, kh, kw, s0, s1, p0, p1, d0, d1 = case
    rng = np.random.default_rng(sum(case))
    x = rng.normal(size=(n, c, h, w)).astype(np.float32)
    kernel = np.zeros((o, c, kh, kw), np.float32)   # shape only: im2col reads none of its values
    cols = G.ggml_im2col  # [C*KH*KW, OW, OH, N], F32
    oh, ow = (h + 2 * p1 - d1 * (kh - 1) - 1) // s1 + 1, (w + 2 * p0 - d0 * (kw - 1) - 1) // s0 + 1
    r = rng.normal(size=(n, oh, ow, c * kh * kw)).astype(np.float32)
    on_cpu, on_gpu = _both(lambda ctx, t, k: cols(ctx, k, t, s0, s1, p0, p1, d0, d1, True, G.GGML_TYPE_F32), x, r, kernel,
                     gpu=gpu, op="IM2COL_BACK")
    np.testing.assert_array_equal(on_gpu, on_cpu)
    assert np.abs(on_cpu).max() > 0.1


@pytest.mark.parametrize("case", [(2, 3, 11, 3, 1, 0, 1), (1, 2, 9, 2, 2, 1, 1), (3, 1, 12, 3, 3, 2, 2)], ids=str)
def test_im2col_back_1d_equals_the_cpu(gpu, case):
    n, c, length, k, s0, p0, d0 = case
    rng = np.random.default_rng(sum(case))
    x = rng.normal(size=(n, c, length)).astype(np.float32)
    kernel = np.zeros((2, c, k), np.float32)
    ol = (length + 2 * p0 - d0 * (k - 1) - 1) // s0 + 1
    r = rng.normal(size=(n, ol, c * k)).astype(np.float32)
    on_cpu, on_gpu = _both(lambda ctx, t, kk: G.ggml_im2col(ctx, kk, t, s0, 0, p0, 0, d0, 0, False, G.GGML_TYPE_F32),
                     x, r, kernel, gpu=gpu, op="IM2COL_BACK")
    np.testing.assert_array_equal(on_gpu, on_cpu)


POOLS = [(2, 2, 2, 2, 0, 0), (3, 3, 1, 1, 1, 1), (3, 2, 2, 1, 1, 0), (2, 3, 1, 2, 0, 1), (1, 1, 1, 1, 0, 0)]


@pytest.mark.parametrize("op", ["max", "avg"])
@pytest.mark.parametrize("k0, k1, s0, s1, p0, p1", POOLS)
def test_pool_2d_back_equals_the_cpu(gpu, op, k0, k1, s0, s1, p0, p1):
    rng = np.random.default_rng(k0 * 7 + s0 * 3 + p0)
    # values from a handful of integers: windows with tied maxima, where the first must get the gradient
    x = rng.integers(-2, 3, size=(3, 2, 7, 8)).astype(np.float32)
    gop = G.GGML_OP_POOL_MAX if op == "max" else G.GGML_OP_POOL_AVG
    oh, ow = (7 + 2 * p1 - k1) // s1 + 1, (8 + 2 * p0 - k0) // s0 + 1
    r = rng.normal(size=(3, 2, oh, ow)).astype(np.float32)
    on_cpu, on_gpu = _both(lambda ctx, t: G.ggml_pool_2d(ctx, t, gop, k0, k1, s0, s1, p0, p1), x, r, gpu=gpu,
                     op="POOL_2D_BACK")
    np.testing.assert_array_equal(on_gpu, on_cpu)


def test_pool_2d_back_sends_a_tied_windows_gradient_to_its_first_maximum(gpu):
    """One 2x2 window of equal values: the CPU (and so the GPU) gives the whole gradient to the first."""
    x = np.ones((1, 1, 2, 2), np.float32)
    r = np.full((1, 1, 1, 1), 3.0, np.float32)
    on_cpu, on_gpu = _both(lambda ctx, t: G.ggml_pool_2d(ctx, t, G.GGML_OP_POOL_MAX, 2, 2, 2, 2, 0, 0), x, r,
                     gpu=gpu, op="POOL_2D_BACK")
    np.testing.assert_array_equal(on_cpu.ravel(), [3, 0, 0, 0])
    np.testing.assert_array_equal(on_gpu, on_cpu)


@pytest.mark.parametrize("shape", [(5, 7, 3), (64, 98, 32), (16, 9, 64)], ids=str)
def test_out_prod_with_a_transposed_operand_runs_on_the_device(gpu, shape):
    """The gradient of a matrix product's second operand is out_prod(a, transpose(grad)): a strided operand."""
    k, m, n = shape
    rng = np.random.default_rng(k + m + n)
    w, x = rng.normal(size=(m, k)).astype(np.float32), rng.normal(size=(n, k)).astype(np.float32)
    r = rng.normal(size=(n, m)).astype(np.float32)
    on_cpu, on_gpu = _both(lambda ctx, t, ww: G.ggml_mul_mat(ctx, ww, t), x, r, w, gpu=gpu, op="OUT_PROD")
    np.testing.assert_allclose(on_gpu, on_cpu, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(on_cpu, r.astype(np.float64) @ w.astype(np.float64), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9])
def test_dropout_masks_are_the_same_on_the_device(gpu, p):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(3, 5, 37)).astype(np.float32)
    seed = np.array([12345], np.int32)
    build = lambda ctx, t, s: G.ggml_dropout(ctx, t, s, p)  # noqa: E731
    (on_cpu,) = compute(build, x, seed)
    placed: list = []
    (on_gpu,) = compute(build, x, seed, backend=gpu, placements=placed)
    assert placed[0].op_counts(gpu.name)["DROPOUT"] == 1 and placed[0].cpu_ops == [], placed[0]
    np.testing.assert_array_equal(on_gpu, on_cpu)
    transposed = lambda ctx, t, s: G.ggml_dropout(ctx, G.ggml_transpose(ctx, t), s, p)  # noqa: E731
    (cpu_t,) = compute(transposed, x[0], seed)
    (gpu_t,) = compute(transposed, x[0], seed, backend=gpu)
    np.testing.assert_array_equal(gpu_t, cpu_t)
