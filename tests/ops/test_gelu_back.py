"""patches/0064: GELU_BACK, the gradient of GELU's tanh form as one op, on the CPU and each GPU backend.

References are the derivative in numpy float64, from its definition (not the kernels' formula): with
``u = c (x + a x^3)``, ``gelu(x) = x (1 + tanh(u)) / 2`` and
``gelu'(x) = (1 + tanh(u)) / 2 + x (1 - tanh(u)^2) u' / 2``, ``u' = c (1 + 3 a x^2)``; and, separately, central
differences of ggml's own forward GELU in float64.

Tolerance, per device, as ``|dx - ref| <= tol * |dy|`` (``gelu'`` lies in [-0.17, 1.13]): the CPU computes ``exp``
within a few ulp and ``1 - s`` as ``e s`` (no cancellation), then about ten float32 operations: 1e-6 (measured
2.2e-7, 2 ulp of 1.1). The GPUs' ``exp`` is looser: Vulkan's may be off by ``3 + 2 |t|`` ulp (the Vulkan spec's
precision for exp(t)), CUDA's ``__expf`` (ggml's CUDA build uses -use_fast_math) by ``2 + 1.16 |t|`` ulp; at |t| = 88,
the clamp, that is up to 179 ulp = 2.1e-5 relative in ``e``, and ``s`` and ``e s s`` inherit it: 4e-5 (lavapipe
measured 2.3e-7).
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.compute import backward_ops, compute, compute_grad, nd4
from tests.helpers.devices import assert_ran_on


C = np.sqrt(2.0 / np.pi)
A = 0.044715


def gelu64(x):
    return 0.5 * x * (1.0 + np.tanh(C * (x + A * x ** 3)))


def gelu_grad64(x):
    t = np.tanh(C * (x + A * x ** 3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * C * (1.0 + 3.0 * A * x * x)


def tolerance(backend) -> float:
    return 1e-6 if backend.name == "CPU" else 4e-5


@pytest.mark.parametrize("shape", [(7,), (3, 17), (2, 3, 5, 33), (600, 530)])
def test_gelu_back_equals_the_derivative(any_backend, shape):
    # (600, 530): more than 512 x 512 elements, the Vulkan dispatch's third axis; widths not a multiple of the lanes
    rng = np.random.default_rng(sum(shape))
    x = rng.uniform(-12, 12, size=shape).astype(np.float32)
    x.flat[:5] = [0.0, -0.0, 1e-30, -11.5, 40.0]   # zero, a denormal-sized input, exp past float32, x^3 large
    dy = rng.normal(size=shape).astype(np.float32)
    placed: list = []
    (out,) = compute(lambda ctx, d, t: G.ggml_gelu_back(ctx, d, t), dy, x, backend=any_backend, placements=placed)
    assert_ran_on(any_backend, "GELU_BACK", placed)
    ref = dy.astype(np.float64) * gelu_grad64(x.astype(np.float64))
    err = np.abs(out - nd4(ref))
    assert np.all(err <= tolerance(any_backend) * np.abs(nd4(dy)) + 1e-30), float(err.max())


def test_gelu_back_of_huge_inputs_is_zero_below_and_dy_above(any_backend):
    # the derivative tends to 0 for x -> -inf and to 1 for x -> +inf; a form that clamped exp's argument grew like
    # x^3 below x = -1e10 (-1.3 at x = -1e13); x^2 must stay finite (|x| < 1.8e19)
    x = np.array([-1e15, -1e13, -1e10, -1e4, -30.0, 30.0, 1e4, 1e10, 1e13, 1e15], np.float32)
    dy = np.full_like(x, 3.0)
    placed: list = []
    (out,) = compute(lambda ctx, d, t: G.ggml_gelu_back(ctx, d, t), dy, x, backend=any_backend, placements=placed)
    assert_ran_on(any_backend, "GELU_BACK", placed)
    np.testing.assert_array_equal(out.ravel(), np.where(x < 0, 0.0, 3.0))


def test_gelu_back_matches_finite_differences_of_ggmls_gelu():
    # the derivative of what ggml's forward computes (float32), by central differences in float64 of its output
    x = np.linspace(-6, 6, 241).astype(np.float32)
    h = np.float32(1e-2)
    (up,) = compute(lambda ctx, t: G.ggml_gelu(ctx, t), (x + h).astype(np.float32))
    (down,) = compute(lambda ctx, t: G.ggml_gelu(ctx, t), (x - h).astype(np.float32))
    fd = (up.astype(np.float64) - down) / (np.float64(x + h) - np.float64(x - h))
    (out,) = compute(lambda ctx, d, t: G.ggml_gelu_back(ctx, d, t), np.ones_like(x), x)
    np.testing.assert_allclose(out, fd, atol=2e-4)  # h^2 f''' / 6 and float32 rounding of the outputs / 2h


@pytest.mark.parametrize("strided", [False, True])
def test_autodiff_of_gelu_builds_one_gelu_back(any_backend, strided):
    # loss = sum(gelu(x) * r): d loss / d x = r * gelu'(x); a view of every other row of x (rows contiguous, the
    # whole not) gets a contiguous copy before GELU_BACK, and the rows it skips get no gradient
    rng = np.random.default_rng(3)
    x = rng.uniform(-5, 5, size=(48, 40)).astype(np.float32)
    r = rng.normal(size=(24, 40) if strided else (48, 40)).astype(np.float32)

    def build(ctx, t):
        return G.ggml_gelu(ctx, G.ggml_view_2d(ctx, t, 40, 24, 2 * 40 * 4, 0) if strided else t)
    placed: list = []
    _, grad = compute_grad(build, x, r, backend=any_backend, placements=placed)
    assert_ran_on(any_backend, "GELU_BACK", placed)
    ref = np.zeros(x.shape)
    if strided:
        ref[::2] = r * gelu_grad64(x[::2].astype(np.float64))
    else:
        ref = r * gelu_grad64(x.astype(np.float64))
    assert np.abs(grad - ref).max() <= tolerance(any_backend) * np.abs(r).max()


def test_the_backward_graph_has_one_node_per_gelu():
    ops = backward_ops(lambda ctx, x: G.ggml_gelu(ctx, x))
    assert ops.count("GELU_BACK") == 1
    assert "TANH" not in ops and "SQR" not in ops, ops   # patches/0004's composition is gone for F32
