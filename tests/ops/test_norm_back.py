"""patches/0067: NORM_BACK, layer normalisation's gradient as one op, on the CPU and each GPU backend.

The reference is the Jacobian-vector product of ``norm(x) = (x - mean) / sqrt(var + eps)`` in numpy float64,
written from the definition as ``dx = (dy - mean(dy) - y * mean(dy * y)) / sqrt(var + eps)`` with ``y = norm(x)``,
and checked itself against central differences of ``norm`` in float64 (the first test).

Tolerance, per device, as ``|dx - ref| <= tol * r * max|dy|`` per row (``r = 1/sqrt(var + eps)``, the gradient's
scale): the kernels sum each row in float32 (16 lanes on the CPU, a tree in a workgroup or block on the GPUs), so
each sum of n terms is off by up to about log2(n) ulp of the terms' magnitude; three such sums (mean, mean(dy),
mean(dy xc)) and a few operations per element: 2e-6 for the rows here (up to 3000 columns; measured ~3e-7).
Rows with a large mean (1e3 + N(0, 1)) are included: the kernels sum ``x - x[0]`` and centre as
``(x - x[0]) - mean(x - x[0])``, which keeps their digits (``x - mean`` in float32 is off by half an ulp of the mean,
3e-5 here, and failed this bound by 50 %; a one-pass ``mean(x^2) - mean^2`` would lose six digits).
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.compute import backward_ops, compute, compute_grad
from tests.helpers.devices import assert_ran_on


TOL = 2e-6


def norm64(x, eps):
    xc = x - x.mean(axis=-1, keepdims=True)
    return xc / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)


def norm_grad64(dy, x, eps):
    xc = x - x.mean(axis=-1, keepdims=True)
    r = 1.0 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)
    y = xc * r
    return r * (dy - dy.mean(axis=-1, keepdims=True) - y * (dy * y).mean(axis=-1, keepdims=True))


def _close(out, dy, x, eps):
    dy64, x64 = dy.astype(np.float64), x.astype(np.float64)
    ref = norm_grad64(dy64, x64, eps)
    xc = x64 - x64.mean(axis=-1, keepdims=True)
    r = 1.0 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)
    bound = TOL * r * np.abs(dy64).max(axis=-1, keepdims=True)
    err = np.abs(out.reshape(ref.shape) - ref)
    assert np.all(err <= bound), float((err / bound).max())


def test_the_reference_is_the_derivative_of_norm():
    rng = np.random.default_rng(0)
    x, dy, eps = rng.normal(size=(3, 7)), rng.normal(size=(3, 7)), 1e-3
    fd = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[idx] += 1e-6
        down[idx] -= 1e-6
        fd[idx] = np.sum((norm64(up, eps) - norm64(down, eps)) * dy) / 2e-6
    np.testing.assert_allclose(norm_grad64(dy, x, eps), fd, atol=1e-8)


@pytest.mark.parametrize("shape, eps", [((1, 1), 1e-5), ((3, 5), 1e-5), ((2, 3, 64), 1e-6), ((600, 17), 1e-5),
                                        ((4, 3000), 0.0), ((513, 64), 1e-2)])
def test_norm_back_equals_the_derivative(any_backend, shape, eps):
    # rows wider than a vector and than a 512-wide workgroup, a remainder past 16 lanes, more rows than one
    # 512-row dispatch block (600, 513), a row of one element (its gradient is 0), eps 0 and a large eps
    rng = np.random.default_rng(sum(shape))
    x = rng.normal(size=shape).astype(np.float32)
    x[..., 0, :] += 1e3                       # a row with a large mean
    dy = rng.normal(size=shape).astype(np.float32)
    placed: list = []
    (out,) = compute(lambda ctx, d, t: G.ggml_norm_back(ctx, d, t, eps), dy, x, backend=any_backend, placements=placed)
    assert_ran_on(any_backend, "NORM_BACK", placed)
    if shape[-1] == 1:
        np.testing.assert_array_equal(out, np.zeros_like(out))
    else:
        _close(out, dy, x, eps)


@pytest.mark.parametrize("strided", [False, True])
def test_autodiff_of_norm_builds_one_norm_back(any_backend, strided):
    # loss = sum(norm(x) * r): d loss / d x; a view of every other row (rows contiguous, the whole not) is copied
    # before NORM_BACK, and the rows it skips get no gradient
    rng = np.random.default_rng(5)
    x = (rng.normal(size=(48, 40)) * 3 + 1).astype(np.float32)
    r = rng.normal(size=(24, 40) if strided else (48, 40)).astype(np.float32)

    def build(ctx, t):
        return G.ggml_norm(ctx, G.ggml_view_2d(ctx, t, 40, 24, 2 * 40 * 4, 0) if strided else t, 1e-5)
    placed: list = []
    _, grad = compute_grad(build, x, r, backend=any_backend, placements=placed)
    assert_ran_on(any_backend, "NORM_BACK", placed)
    if strided:
        _close(grad[::2], r, x[::2], 1e-5)
        assert np.all(grad[1::2] == 0)
    else:
        _close(grad, r, x, 1e-5)


def test_the_backward_graph_has_one_node_per_norm():
    ops = backward_ops(lambda ctx, x: G.ggml_sqr(ctx, G.ggml_norm(ctx, x, 1e-5)))
    assert ops.count("NORM_BACK") == 1
    assert "RMS_NORM_BACK" not in ops and "SUM_ROWS" not in ops, ops   # patches/0004's composition is gone for F32
