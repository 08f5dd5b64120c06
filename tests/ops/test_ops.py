"""Forward values of the ops of ggmlpy/ops/ that no module-named file here takes (elementwise, reduce, linalg,
layout, conv's basics) against numpy float64 references, and the check that every op has a forward test.

Inputs are numpy arrays in ggml layout (shape (..., ne1, ne0)); ``compute`` returns each
result as a 4-D array (ne3, ne2, ne1, ne0), compared with ``nd4(reference)`` so shapes are
checked too.
"""
from __future__ import annotations

import importlib
import os
import pkgutil
from math import erf

import numpy as np
import pytest

import ggmlpy as G
import ggmlpy.ops
from tests.helpers.compute import compute, compute_grad, nd4
from tests.helpers.kernel_refs import dropout_keep


F32_TOL = dict(rtol=2e-5, atol=2e-6)


def r32(rng, *shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def f64(a):
    return np.asarray(a, dtype=np.float64)


def assert_close(out, ref, **tol):
    tol = tol or F32_TOL
    ref = nd4(ref)
    assert out.shape == ref.shape, f"shape {out.shape} != reference {ref.shape}"
    np.testing.assert_allclose(out.astype(np.float64), ref, **tol)


# ---------------------------------------------------------------- coverage bookkeeping

COVERED: set[str] = set()


def covers(*names):
    COVERED.update(names)

    def deco(fn):
        return fn
    return deco


# ---------------------------------------------------------------- binary element-wise ops

BINARY = {
    "ggml_add": (G.ggml_add, np.add),
    "ggml_sub": (G.ggml_sub, np.subtract),
    "ggml_mul": (G.ggml_mul, np.multiply),
    "ggml_div": (G.ggml_div, np.divide),
}
covers(*BINARY)

# (a shape, b shape) in numpy order; b is *repeated* (tiled) into a, as ggml does.
BROADCASTS = [
    ((3, 5), (3, 5)),          # same shape
    ((2, 3, 4, 5), (1, 1, 1, 5)),  # a bias row
    ((2, 3, 4, 5), (1, 3, 1, 1)),  # one value per ne2 slice
    ((3, 4, 6), (1, 2, 3)),    # true tiling: ne0 6 = 2 x 3, ne1 4 = 2 x 2
    ((4, 5), (1, 1)),          # a scalar
]


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("shapes", BROADCASTS, ids=lambda s: f"{s[0]}<-{s[1]}")
def test_binary_broadcast(rng, name, shapes):
    fn, ref_fn = BINARY[name]
    a_shape, b_shape = shapes
    a = r32(rng, *a_shape)
    b = r32(rng, *b_shape, lo=0.5, hi=2.0) * np.where(rng.random(b_shape) < 0.5, -1, 1).astype(np.float32)
    (out,) = compute(lambda ctx, ta, tb: fn(ctx, ta, tb), a, b)
    reps = tuple(n // m for n, m in zip(nd4(a).shape, nd4(b).shape))
    ref = ref_fn(f64(nd4(a)), np.tile(f64(nd4(b)), reps))
    assert_close(out, ref)


# ---------------------------------------------------------------- unary element-wise ops

def _softplus(x):
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * x * (1 + 0.044715 * x * x)))


UNARY = {
    # name: (op, reference, input range, tolerance)
    "ggml_dup": (G.ggml_dup, lambda x: x, (-3, 3), None),
    "ggml_cont": (G.ggml_cont, lambda x: x, (-3, 3), None),
    "ggml_sqr": (G.ggml_sqr, np.square, (-3, 3), None),
    "ggml_sqrt": (G.ggml_sqrt, np.sqrt, (0.01, 5), None),
    "ggml_log": (G.ggml_log, np.log, (0.01, 5), None),
    "ggml_exp": (G.ggml_exp, np.exp, (-5, 5), dict(rtol=1e-5, atol=1e-6)),
    "ggml_sin": (G.ggml_sin, np.sin, (-4, 4), None),
    "ggml_cos": (G.ggml_cos, np.cos, (-4, 4), None),
    "ggml_abs": (G.ggml_abs, np.abs, (-3, 3), None),
    "ggml_sgn": (G.ggml_sgn, np.sign, (-3, 3), None),
    "ggml_neg": (G.ggml_neg, np.negative, (-3, 3), None),
    "ggml_step": (G.ggml_step, lambda x: (x > 0).astype(np.float64), (-3, 3), None),
    "ggml_relu": (G.ggml_relu, lambda x: np.maximum(x, 0), (-3, 3), None),
    "ggml_elu": (G.ggml_elu, lambda x: np.where(x > 0, x, np.expm1(x)), (-4, 4), dict(rtol=1e-5, atol=1e-6)),
    "ggml_silu": (G.ggml_silu, lambda x: x / (1 + np.exp(-x)), (-8, 8), dict(rtol=1e-5, atol=1e-6)),
    "ggml_tanh": (G.ggml_tanh, np.tanh, (-4, 4), dict(rtol=1e-5, atol=1e-6)),
    "ggml_sigmoid": (G.ggml_sigmoid, lambda x: 1 / (1 + np.exp(-x)), (-8, 8), dict(rtol=1e-5, atol=1e-6)),
    "ggml_softplus": (G.ggml_softplus, _softplus, (-8, 25), dict(rtol=1e-5, atol=1e-6)),
    "ggml_hardswish": (G.ggml_hardswish, lambda x: x * np.clip((x + 3) / 6, 0, 1), (-5, 5), None),
}
covers(*UNARY)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(rng, name):
    fn, ref_fn, (lo, hi), tol = UNARY[name]
    x = r32(rng, 2, 3, 17, lo=lo, hi=hi)
    if name in ("ggml_sgn", "ggml_step", "ggml_relu", "ggml_abs"):
        x.flat[:3] = [0.0, -0.0, 1e-30]  # the edge around 0
    (out,) = compute(lambda ctx, t: fn(ctx, t), x)
    assert_close(out, ref_fn(f64(x)), **(tol or {}))


@covers("ggml_gelu")
def test_gelu_is_float32_exact(rng):
    """ggml's gelu is the tanh approximation 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))), computed in float32
    on every backend (patches/0019: the CPU read it from an F16 table, off by up to 3.9e-3)."""
    x = np.concatenate([r32(rng, 2000, lo=-6, hi=6), np.float32([-12.0, -10.0, 10.0, 15.5, 0.0, 1e-3, -1e-3])])
    (out,) = compute(lambda ctx, t: G.ggml_gelu(ctx, t), x)
    assert_close(out, _gelu_tanh(f64(x)), rtol=2e-6, atol=1e-7)
    # the negative tail, tiny values: 0.5x(1 + tanh(u)) cancelled there in float32 (relative error 0.4)
    tail = np.linspace(-9, -3, 61, dtype=np.float32)
    (out_tail,) = compute(lambda ctx, t: G.ggml_gelu(ctx, t), tail)
    ref = f64(tail) / (1 + np.exp(-2 * np.sqrt(2 / np.pi) * (f64(tail) + 0.044715 * f64(tail) ** 3)))
    np.testing.assert_allclose(out_tail.ravel(), ref, rtol=2e-5, atol=0)
    # and it is neither the erf form's cheap cousin x*sigmoid(1.702x) nor relu
    quick = f64(x) / (1 + np.exp(-1.702 * f64(x)))
    assert np.abs(out.ravel() - quick).max() > 5e-3
    # the erf form differs from the tanh form by < 5e-4
    erf_form = np.array([0.5 * v * (1 + erf(v / np.sqrt(2))) for v in f64(x)])
    np.testing.assert_allclose(out.ravel(), erf_form, atol=5e-4)


@covers("ggml_leaky_relu")
@pytest.mark.parametrize("slope", [0.01, 0.2, -0.5])
def test_leaky_relu(rng, slope):
    x = r32(rng, 4, 9)
    (out,) = compute(lambda ctx, t: G.ggml_leaky_relu(ctx, t, slope), x)
    xd = f64(x)
    assert_close(out, np.maximum(xd, 0) + slope * np.minimum(xd, 0))


@covers("ggml_scale")
def test_scale(rng):
    x = r32(rng, 3, 7)
    (out,) = compute(lambda ctx, t: G.ggml_scale(ctx, t, -2.5), x)
    assert_close(out, -2.5 * f64(x))


@covers("ggml_scale_bias")
def test_scale_bias(rng):
    x = r32(rng, 3, 7)
    (out,) = compute(lambda ctx, t: G.ggml_scale_bias(ctx, t, 0.75, -1.25), x)
    assert_close(out, 0.75 * f64(x) - 1.25)


@covers("ggml_dropout")
@pytest.mark.parametrize("p", [0.0, 0.25, 0.7])
def test_dropout_keeps_the_elements_its_hash_picks(rng, p):
    x = r32(rng, 3, 4, 50)
    for seed in (0, 7, -5):
        (out,) = compute(lambda ctx, t, s: G.ggml_dropout(ctx, t, s, p), x, np.array([seed], np.int32))
        keep = dropout_keep(seed, x.size, p).reshape(x.shape)
        scale = np.float32(1.0 / (1.0 - float(np.float32(p))))   # computed in float64, passed as a C float
        np.testing.assert_array_equal(out.reshape(x.shape), np.where(keep, x * scale, np.float32(0)))
    assert 0 < dropout_keep(7, x.size, p).sum() <= x.size
    # a view is read in its logical order: the same mask as the transposed copy
    (t_out,) = compute(lambda ctx, t, s: G.ggml_dropout(ctx, G.ggml_transpose(ctx, t), s, p), x[0],
                       np.array([3], np.int32))
    keep = dropout_keep(3, x[0].size, p).reshape(x[0].T.shape)
    np.testing.assert_array_equal(t_out.reshape(x[0].T.shape) != 0, keep & (x[0].T != 0))


def test_dropout_masks_follow_the_rate_and_change_with_the_seed(rng):
    x = np.ones((200, 500), np.float32)
    masks = []
    for seed in (11, 12):
        (out,) = compute(lambda ctx, t, s: G.ggml_dropout(ctx, t, s, 0.3), x, np.array([seed], np.int32))
        masks.append(out.reshape(x.shape) != 0)
        np.testing.assert_allclose(out[out != 0], 1 / 0.7, rtol=1e-6)
    n = x.size
    for m in masks:
        assert abs(m.mean() - 0.7) < 4 * np.sqrt(0.21 / n)
    assert abs((masks[0] & masks[1]).mean() - 0.49) < 4 * np.sqrt(0.49 * 0.51 / n)   # independent seeds


def test_dropout_gradient_goes_through_the_same_mask(rng):
    x, r = r32(rng, 4, 30), r32(rng, 4, 30)
    seed = np.array([99], np.int32)
    _, grad = compute_grad(lambda ctx, t, s: G.ggml_dropout(ctx, t, s, 0.4), x, r, seed)
    keep = dropout_keep(99, x.size, 0.4).reshape(x.shape)
    np.testing.assert_allclose(grad, np.where(keep, r / 0.6, 0), rtol=1e-6)


def test_dropout_misuse(ctx):
    a = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)
    seed = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_I32, 1)
    for bad in (1.0, -0.1, 1 - 1e-9):
        with pytest.raises(G.GgmlValueError, match=r"p must be in \[0, 1\)"):
            G.ggml_dropout(ctx, a, seed, bad)
    with pytest.raises(G.GgmlValueError, match="exactly one"):
        G.ggml_dropout(ctx, a, G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_I32, 2), 0.5)
    with pytest.raises(G.GgmlTypeError):
        G.ggml_dropout(ctx, a, G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 1), 0.5)
    with pytest.raises(G.GgmlTypeError):
        G.ggml_dropout(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F16, 4, 3), seed, 0.5)


@covers("ggml_clamp")
def test_clamp(rng):
    x = r32(rng, 5, 8, lo=-3, hi=3)
    out, x_after = compute(lambda ctx, t: (G.ggml_clamp(ctx, t, -0.5, 1.25), t), x)
    assert_close(out, np.clip(f64(x), -0.5, 1.25))
    assert_close(x_after, f64(x).reshape(x_after.shape))  # out of place since ggml 0.25 (0.20 clamped x itself)


# ---------------------------------------------------------------- reductions

@covers("ggml_sum", "ggml_sum_rows", "ggml_mean")
def test_sum_sum_rows_mean(rng):
    x = r32(rng, 2, 3, 4, 7)
    s, sr, m = compute(lambda ctx, t: (G.ggml_sum(ctx, t), G.ggml_sum_rows(ctx, t), G.ggml_mean(ctx, t)), x)
    xd = f64(x)
    assert_close(s, np.array(xd.sum()).reshape(1, 1, 1, 1), rtol=1e-5, atol=1e-5)
    assert_close(sr, xd.sum(axis=-1, keepdims=True))
    assert_close(m, xd.mean(axis=-1, keepdims=True))


@pytest.mark.parametrize("threads", [1, 2])
def test_sum_rows_of_long_and_odd_rows_in_float64_lanes(threads):
    """patches/0032: rows split between the threads, each summed in 8 double lanes and a tail."""
    rng = np.random.default_rng(threads)
    b = G.ggml_backend_cpu_init()
    G.ggml_backend_cpu_set_n_threads(b, threads)
    try:
        for shape in [(3, 1), (5, 7), (2, 3, 8), (7, 17), (3, 100003)]:
            x = (rng.normal(size=shape) + 1e3).astype(np.float32)    # a large mean: float32 sums would drift
            (out,) = compute(lambda ctx, t: G.ggml_sum_rows(ctx, t), x, backend=b)
            np.testing.assert_allclose(out.reshape(shape[:-1]), f64(x).sum(axis=-1), rtol=2e-7)
    finally:
        b.free()


@covers("ggml_argmax")
def test_argmax(rng):
    x = rng.permutation(5 * 11).astype(np.float32).reshape(5, 11)  # distinct values: no ties
    (out,) = compute(lambda ctx, t: G.ggml_argmax(ctx, t), x)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, nd4(np.argmax(x, axis=1)))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_argmax_rows_split_between_threads(rng, threads):
    # patches/0066: the CPU's ARGMAX gives each thread a range of rows; fewer rows than threads, a remainder, and
    # ggml-opt's accuracy shape (2048 rows of 98 classes); rows with ties: the same index for any thread count
    b = G.ggml_backend_cpu_init()
    G.ggml_backend_cpu_set_n_threads(b, threads)
    try:
        for rows, cols in [(1, 7), (2, 98), (5, 3), (2048, 98)]:
            x = np.stack([rng.permutation(cols) for _ in range(rows)]).astype(np.float32)
            (out,) = compute(lambda ctx, t: G.ggml_argmax(ctx, t), x, backend=b)
            np.testing.assert_array_equal(out, nd4(np.argmax(x, axis=1)))
        ties = rng.integers(0, 3, size=(301, 9)).astype(np.float32)
        (out,) = compute(lambda ctx, t: G.ggml_argmax(ctx, t), ties, backend=b)
        (one,) = compute(lambda ctx, t: G.ggml_argmax(ctx, t), ties)   # the suite's backend (2 threads)
        np.testing.assert_array_equal(out, one)
        assert np.all(ties[np.arange(301), out.ravel()] == ties.max(axis=1))
    finally:
        b.free()


@covers("ggml_count_equal")
def test_count_equal(rng):
    a = rng.integers(0, 4, size=(3, 10)).astype(np.int32)
    b = rng.integers(0, 4, size=(3, 10)).astype(np.int32)
    (out,) = compute(lambda ctx, ta, tb: G.ggml_count_equal(ctx, ta, tb), a, b)
    assert out.dtype == np.int64
    assert int(out.ravel()[0]) == int((a == b).sum())


# ---------------------------------------------------------------- broadcast, concat

@covers("ggml_repeat")
def test_repeat(rng):
    a = r32(rng, 1, 2, 3)
    template = np.zeros((2, 4, 2, 6), np.float32)
    (out,) = compute(lambda ctx, ta, tt: G.ggml_repeat(ctx, ta, tt), a, template)
    assert_close(out, np.tile(f64(nd4(a)), (2, 4, 1, 2)))


@covers("ggml_repeat_back")
def test_repeat_back(rng):
    a = r32(rng, 2, 4, 2, 6)
    template = np.zeros((1, 2, 1, 3), np.float32)
    (out,) = compute(lambda ctx, ta, tt: G.ggml_repeat_back(ctx, ta, tt), a, template)
    # repeat tiles b, so a's index i belongs to b's index i % nb: sum over the tile counts
    ref = f64(a).reshape(2, 1, 2, 2, 2, 1, 2, 3).sum(axis=(0, 2, 4, 6))
    assert_close(out, ref)


@covers("ggml_concat")
@pytest.mark.parametrize("dim", [0, 1, 2, 3])
def test_concat(rng, dim):
    a_shape = [2, 3, 4, 5]
    b_shape = list(a_shape)
    b_shape[3 - dim] = 2
    a, b = r32(rng, *a_shape), r32(rng, *b_shape)
    (out,) = compute(lambda ctx, ta, tb: G.ggml_concat(ctx, ta, tb, dim), a, b)
    assert_close(out, np.concatenate([f64(a), f64(b)], axis=3 - dim))


# ---------------------------------------------------------------- matrix products

@covers("ggml_mul_mat")
def test_mul_mat_2d(rng):
    A = r32(rng, 4, 6)   # [K=6, M=4]
    B = r32(rng, 5, 6)   # [K=6, N=5]
    (out,) = compute(lambda ctx, ta, tb: G.ggml_mul_mat(ctx, ta, tb), A, B)
    assert_close(out, f64(B) @ f64(A).T, rtol=1e-5, atol=1e-5)  # [M, N] = (N, M) numpy


def test_mul_mat_broadcast_batches(rng):
    A = r32(rng, 2, 3, 8)      # [K=8, M=3, 2]
    B = r32(rng, 6, 5, 8)      # [K=8, N=5, 6]: batch i uses A's batch i // 3
    (out,) = compute(lambda ctx, ta, tb: G.ggml_mul_mat(ctx, ta, tb), A, B)
    ref = np.stack([f64(B[i]) @ f64(A[i // 3]).T for i in range(6)])
    assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_mul_mat_f16_weights(rng):
    A = r32(rng, 4, 32).astype(np.float16)
    B = r32(rng, 3, 32)
    (out,) = compute(lambda ctx, ta, tb: G.ggml_mul_mat(ctx, ta, tb), A, B)
    # the F32 operand is converted to F16 for the dot product
    ref = f64(B.astype(np.float16)) @ f64(A).T
    assert_close(out, ref, rtol=1e-3, atol=1e-3)


@covers("ggml_out_prod")
def test_out_prod(rng):
    A = r32(rng, 6, 4)   # [M=4, K=6]
    B = r32(rng, 6, 5)   # [N=5, K=6]
    (out,) = compute(lambda ctx, ta, tb: G.ggml_out_prod(ctx, ta, tb), A, B)
    # dst[n][m] = sum_k A[k][m] * B[k][n]
    assert_close(out, f64(B).T @ f64(A), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- layout ops

@covers("ggml_reshape", "ggml_reshape_1d", "ggml_reshape_2d", "ggml_reshape_3d", "ggml_reshape_4d")
def test_reshapes(rng):
    x = r32(rng, 4, 6)
    tmpl = np.zeros((3, 8), np.float32)

    def build(ctx, t, tt):
        return (G.ggml_cont(ctx, G.ggml_reshape_1d(ctx, t, 24)),
                G.ggml_cont(ctx, G.ggml_reshape_2d(ctx, t, 12, 2)),
                G.ggml_cont(ctx, G.ggml_reshape_3d(ctx, t, 2, 3, 4)),
                G.ggml_cont(ctx, G.ggml_reshape_4d(ctx, t, 2, 2, 3, 2)),
                G.ggml_cont(ctx, G.ggml_reshape(ctx, t, tt)))
    r1, r2, r3, r4, rr = compute(build, x, tmpl)
    flat = f64(x).ravel()
    assert_close(r1, flat)
    assert_close(r2, flat.reshape(2, 12))
    assert_close(r3, flat.reshape(4, 3, 2))
    assert_close(r4, flat.reshape(2, 3, 2, 2))
    assert_close(rr, flat.reshape(3, 8))


@covers("ggml_view_1d", "ggml_view_2d", "ggml_view_3d", "ggml_view_4d")
def test_views_with_offsets(rng):
    x = r32(rng, 2, 3, 4, 5)   # ne = [5, 4, 3, 2], nb = [4, 20, 80, 240]
    es = 4

    def build(ctx, t):
        return (G.ggml_cont(ctx, G.ggml_view_1d(ctx, t, 7, 3 * es)),
                G.ggml_cont(ctx, G.ggml_view_2d(ctx, t, 3, 2, 5 * es, (1 * 5 + 2) * es)),
                G.ggml_cont(ctx, G.ggml_view_3d(ctx, t, 2, 3, 2, 5 * es, 20 * es, 1 * es)),
                G.ggml_cont(ctx, G.ggml_view_4d(ctx, t, 4, 2, 2, 2, 5 * es, 20 * es, 60 * es, (20 + 5) * es)))
    v1, v2, v3, v4 = compute(build, x)
    xd = f64(x)
    assert_close(v1, xd.ravel()[3:10])
    assert_close(v2, xd[0, 0, 1:3, 2:5])
    assert_close(v3, xd[0, 0:2, 0:3, 1:3])
    assert_close(v4, xd[:, 1:3, 1:3, 0:4])


@covers("ggml_permute", "ggml_transpose")
@pytest.mark.parametrize("axes", [(1, 0, 2, 3), (0, 2, 1, 3), (2, 0, 3, 1), (3, 2, 1, 0)])
def test_permute(rng, axes):
    x = r32(rng, 2, 3, 4, 5)
    (out,) = compute(lambda ctx, t: G.ggml_cont(ctx, G.ggml_permute(ctx, t, *axes)), x)
    # ggml dim i of a becomes dim axes[i] of the result; numpy axis of ggml dim d is 3 - d
    perm = [0] * 4
    for i, ax in enumerate(axes):
        perm[3 - ax] = 3 - i
    assert_close(out, np.transpose(f64(x), perm))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape, axes", [((33, 17), (1, 0, 2, 3)), ((64, 32, 2, 3), (1, 2, 0, 3)),
                                         ((5, 40, 3), (1, 0, 2, 3)), ((16, 16, 2), (1, 0, 2, 3)),
                                         ((1, 7, 3), (1, 0, 2, 3)), ((20, 3, 19, 2), (1, 3, 0, 2)),
                                         ((40, 3, 20), (2, 0, 1, 3)), ((18, 5, 2, 17), (3, 0, 1, 2)),
                                         ((32, 64, 2, 3), (2, 0, 1, 3))])
def test_transposing_copies_in_tiles(threads, shape, axes):
    """patches/0034: a copy whose source is strided along dim 0 and contiguous along dim 1, 2 or 3 goes tile by
    tile (the threads splitting dim 1)."""
    rng = np.random.default_rng(len(shape))
    b = G.ggml_backend_cpu_init()
    G.ggml_backend_cpu_set_n_threads(b, threads)
    try:
        ne = shape + (1,) * (4 - len(shape))
        x = rng.normal(size=tuple(reversed(ne))).astype(np.float32)
        perm = [0] * 4
        for i, ax in enumerate(axes):
            perm[3 - ax] = 3 - i
        (out,) = compute(lambda ctx, t: G.ggml_cont(ctx, G.ggml_permute(ctx, t, *axes)), x, backend=b)
        np.testing.assert_array_equal(out, np.transpose(x, perm))
    finally:
        b.free()


def test_transpose(rng):
    x = r32(rng, 3, 4, 5)
    (out,) = compute(lambda ctx, t: G.ggml_cont(ctx, G.ggml_transpose(ctx, t)), x)
    assert_close(out, np.swapaxes(f64(x), -1, -2))


@covers("ggml_cpy")
def test_cpy_converts_and_reshapes(rng):
    x = r32(rng, 4, 6)
    target16 = np.zeros((3, 8), np.float16)
    target32 = np.zeros((2, 12), np.float32)
    o16, o32 = compute(lambda ctx, t, b16, b32: (G.ggml_cpy(ctx, t, b16), G.ggml_cpy(ctx, t, b32)),
                       x, target16, target32)
    assert o16.dtype == np.float16
    assert_close(o16, f64(x.astype(np.float16)).reshape(3, 8), rtol=0, atol=0)
    assert_close(o32, f64(x).reshape(2, 12))


@covers("ggml_get_rows")
def test_get_rows(rng):
    table = r32(rng, 7, 5)                                 # 7 rows of 5
    idx = np.array([3, 0, 6, 3, 1], np.int32)
    (out,) = compute(lambda ctx, t, i: G.ggml_get_rows(ctx, t, i), table, idx)
    assert_close(out, f64(table)[idx])


def test_get_rows_batched(rng):
    table = r32(rng, 2, 4, 3)                              # [3, 4, 2]: one table per ne2
    idx = np.array([[1, 3, 0], [2, 2, 0]], np.int32)       # [3, 2]: b.ne[1] == a.ne[2]
    (out,) = compute(lambda ctx, t, i: G.ggml_get_rows(ctx, t, i), table, idx)
    ref = np.stack([f64(table[j])[idx[j]] for j in range(2)])
    assert_close(out, ref)


@covers("ggml_pad")
def test_pad(rng):
    x = r32(rng, 2, 3, 4)
    (out,) = compute(lambda ctx, t: G.ggml_pad(ctx, t, 2, 1, 1, 0), x)
    ref = np.pad(f64(nd4(x)), ((0, 0), (0, 1), (0, 1), (0, 2)))
    assert_close(out, ref)


# ---------------------------------------------------------------- softmax, masks, norms, losses

def _softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


@covers("ggml_soft_max")
def test_soft_max(rng):
    x = r32(rng, 2, 3, 9, lo=-5, hi=5)
    (out,) = compute(lambda ctx, t: G.ggml_soft_max(ctx, t), x)
    assert_close(out, _softmax(f64(x)), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("n", [1, 15, 16, 17, 31, 32, 33, 98, 1000])
def test_row_max_and_sum_over_every_lane_layout(n):
    """patches/0068: the CPU's row maximum and row sum over 16 lanes, then a tail of 0 to 15 elements. The mean of
    each row is the double sum of its floats rounded to float and divided in float, bit for bit (sums of this
    many floats are exact in double, whatever their order); softmax's largest element placed in the first
    vector, the last whole vector and the tail, and rows of -inf but one element."""
    rng = np.random.default_rng(n)
    x = (rng.normal(size=(4, n)) * 3 + 5).astype(np.float32)
    (mean,) = compute(lambda ctx, t: G.ggml_mean(ctx, t), x)
    want = (f64(x).sum(axis=-1).astype(np.float32) / np.float32(n)).astype(np.float32)
    np.testing.assert_array_equal(mean.ravel(), want)
    z = rng.uniform(-5, 5, size=(4, n)).astype(np.float32)
    for row, pos in enumerate([0, max(n - 17, 0), n - 1]):
        z[row, pos] = 40.0                        # the maximum, well above the rest
    z[3] = -np.inf
    z[3, n // 2] = 1.0
    (out,) = compute(lambda ctx, t: G.ggml_soft_max(ctx, t), z)
    ref = _softmax(f64(z))
    assert_close(out, ref, rtol=1e-5, atol=1e-7)
    assert out.ravel()[3 * n + n // 2] == 1.0


@pytest.mark.parametrize("n", [5, 40])
def test_soft_max_of_a_row_with_nan_is_nan(n):
    """patches/0068: a NaN anywhere in a row makes its maximum NaN, so its softmax is NaN, as numpy's; the scalar
    chain of maxima had dropped a NaN that did not come last, and a row of -inf but one NaN gave no NaN at all."""
    z = np.full((3, n), -np.inf, np.float32)
    z[0, 0] = np.nan                                   # NaN first, -inf after it
    z[1] = np.linspace(-1, 1, n)
    z[1, n // 2] = np.nan
    z[2] = np.linspace(-1, 1, n)
    (out,) = compute(lambda ctx, t: G.ggml_soft_max(ctx, t), z)
    out = out.reshape(3, n)
    assert np.isnan(out[0]).all() and np.isnan(out[1]).all()
    np.testing.assert_allclose(out[2], _softmax(f64(z[2])), rtol=1e-5, atol=1e-7)


@covers("ggml_soft_max_ext")
@pytest.mark.parametrize("mask_dtype", [np.float32, np.float16])
def test_soft_max_ext_with_mask(rng, mask_dtype):
    x = r32(rng, 2, 4, 6, lo=-3, hi=3)              # [6, 4, 2]
    mask = r32(rng, 5, 6, lo=-1, hi=1)              # [6, 5]: ne[1] >= 4, broadcast over ne[2]
    mask[np.triu_indices(5, 1, 6)] = -np.inf        # causal-style -inf entries
    mask = mask.astype(mask_dtype)
    (out,) = compute(lambda ctx, t, m: G.ggml_soft_max_ext(ctx, t, m, 0.5, 0.0), x, mask)
    ref = _softmax(0.5 * f64(x) + f64(mask)[None, :4, :])
    assert_close(out, ref, rtol=1e-5, atol=1e-7)
    assert np.all(out[np.broadcast_to(np.isinf(f64(mask)[None, None, :4, :]), out.shape)] == 0)


def test_soft_max_ext_without_mask(rng):
    x = r32(rng, 3, 6)
    (out,) = compute(lambda ctx, t: G.ggml_soft_max_ext(ctx, t, None, 2.0), x)
    assert_close(out, _softmax(2.0 * f64(x)), rtol=1e-5, atol=1e-7)


@covers("ggml_diag_mask_inf")
@pytest.mark.parametrize("n_past", [0, 2])
def test_diag_mask_inf(rng, n_past):
    x = r32(rng, 2, 4, 6)
    (out,) = compute(lambda ctx, t: G.ggml_diag_mask_inf(ctx, t, n_past), x)
    rows, cols = np.indices((4, 6))
    ref = np.where(cols > rows + n_past, -np.inf, f64(x))
    assert_close(out, ref)


@covers("ggml_norm")
def test_norm(rng):
    x = r32(rng, 3, 16, lo=-2, hi=4)
    (out,) = compute(lambda ctx, t: G.ggml_norm(ctx, t, 1e-5), x)
    xd = f64(x)
    ref = (xd - xd.mean(-1, keepdims=True)) / np.sqrt(xd.var(-1, keepdims=True) + 1e-5)
    assert_close(out, ref, rtol=1e-4, atol=1e-5)


@covers("ggml_rms_norm")
def test_rms_norm(rng):
    x = r32(rng, 3, 16, lo=-2, hi=4)
    (out,) = compute(lambda ctx, t: G.ggml_rms_norm(ctx, t, 1e-4), x)
    xd = f64(x)
    assert_close(out, xd / np.sqrt((xd ** 2).mean(-1, keepdims=True) + 1e-4), rtol=1e-4, atol=1e-5)


@covers("ggml_cross_entropy_loss")
def test_cross_entropy_loss(rng):
    logits = r32(rng, 6, 5, lo=-3, hi=3)
    labels = rng.dirichlet(np.ones(5), size=6).astype(np.float32)   # label distributions
    (out,) = compute(lambda ctx, a, b: G.ggml_cross_entropy_loss(ctx, a, b), logits, labels)
    z = f64(logits)
    log_sm = z - z.max(-1, keepdims=True)
    log_sm = log_sm - np.log(np.exp(log_sm).sum(-1, keepdims=True))
    ref = -(f64(labels) * log_sm).sum(-1).mean()    # mean over rows
    assert_close(out, np.array(ref).reshape(1, 1, 1, 1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("classes", [1, 3, 7, 8, 9, 16, 17, 98, 1000])
def test_cross_entropy_loss_over_every_tail_length(classes):
    """patches/0033: the log-softmax's exponentials over SIMD lanes, then a scalar tail of 0 to 15 elements."""
    rng = np.random.default_rng(classes)
    logits = rng.uniform(-8, 8, size=(5, classes)).astype(np.float32)
    labels = rng.dirichlet(np.ones(classes), size=5).astype(np.float32)
    (out,) = compute(lambda ctx, a, b: G.ggml_cross_entropy_loss(ctx, a, b), logits, labels)
    z = f64(logits)
    log_sm = z - z.max(-1, keepdims=True)
    log_sm = log_sm - np.log(np.exp(log_sm).sum(-1, keepdims=True))
    np.testing.assert_allclose(out.ravel()[0], -(f64(labels) * log_sm).sum(-1).mean(), rtol=2e-6, atol=1e-6)


# ---------------------------------------------------------------- im2col, convolution, pooling

def _out(n, k, s, p, d):
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def conv2d_ref(X, K, s0, s1, p0, p1, d0, d1):
    """Direct convolution (cross-correlation): X (N, C, H, W), K (O, C, KH, KW) -> (N, O, OH, OW)."""
    N, C, H, W = X.shape
    O, _, KH, KW = K.shape
    OH, OW = _out(H, KH, s1, p1, d1), _out(W, KW, s0, p0, d0)
    out = np.zeros((N, O, OH, OW))
    for n in range(N):
        for o in range(O):
            for oh in range(OH):
                for ow in range(OW):
                    acc = 0.0
                    for c in range(C):
                        for ky in range(KH):
                            for kx in range(KW):
                                y, x = oh * s1 + ky * d1 - p1, ow * s0 + kx * d0 - p0
                                if 0 <= y < H and 0 <= x < W:
                                    acc += X[n, c, y, x] * K[o, c, ky, kx]
                    out[n, o, oh, ow] = acc
    return out


def im2col_2d_ref(X, KH, KW, s0, s1, p0, p1, d0, d1):
    """(N, C, H, W) -> (N, OH, OW, C*KH*KW), kx fastest, as ggml_im2col lays it out."""
    N, C, H, W = X.shape
    OH, OW = _out(H, KH, s1, p1, d1), _out(W, KW, s0, p0, d0)
    cols = np.zeros((N, OH, OW, C, KH, KW))
    for oh in range(OH):
        for ow in range(OW):
            for ky in range(KH):
                for kx in range(KW):
                    y, x = oh * s1 + ky * d1 - p1, ow * s0 + kx * d0 - p0
                    if 0 <= y < H and 0 <= x < W:
                        cols[:, oh, ow, :, ky, kx] = X[:, :, y, x]
    return cols.reshape(N, OH, OW, C * KH * KW)


CONV2D_CASES = [
    # (N, C, H, W, O, KH, KW, s0, s1, p0, p1, d0, d1)
    (2, 3, 6, 7, 4, 3, 3, 1, 1, 0, 0, 1, 1),
    (1, 2, 7, 6, 3, 3, 2, 2, 1, 1, 2, 1, 1),
    (1, 2, 8, 8, 2, 3, 3, 1, 2, 1, 0, 2, 1),
]


@covers("ggml_im2col")
@pytest.mark.parametrize("case", CONV2D_CASES)
@pytest.mark.parametrize("dst", ["f32", "f16"])
def test_im2col_2d(rng, case, dst):
    N, C, H, W, O, KH, KW, s0, s1, p0, p1, d0, d1 = case
    X = r32(rng, N, C, H, W)
    K = r32(rng, O, C, KH, KW)
    dst_type = G.GGML_TYPE_F32 if dst == "f32" else G.GGML_TYPE_F16
    (out,) = compute(lambda ctx, k, x: G.ggml_im2col(ctx, k, x, s0, s1, p0, p1, d0, d1, True, dst_type), K, X)
    ref = im2col_2d_ref(f64(X), KH, KW, s0, s1, p0, p1, d0, d1)
    if dst == "f16":
        assert out.dtype == np.float16
        assert_close(out, f64(ref.astype(np.float16)), rtol=0, atol=0)
    else:
        assert_close(out, ref, rtol=0, atol=0)


def test_im2col_1d(rng):
    X = r32(rng, 2, 3, 9)          # [L=9, C=3, N=2]
    K = r32(rng, 4, 3, 3)          # [K=3, C=3, O=4]
    s0, p0, d0 = 2, 1, 1
    (out,) = compute(lambda ctx, k, x: G.ggml_im2col(ctx, k, x, s0, 0, p0, 0, d0, 0, False), K, X)
    ref = im2col_2d_ref(f64(X)[:, :, None, :], 1, 3, s0, 1, p0, 0, d0, 1)[:, 0]   # (N, OL, C*K)
    assert_close(out, ref, rtol=0, atol=0)


def _op_params_i32(t, n):
    """The first ``n`` int32 op parameters of tensor ``t`` (between ``op`` and ``flags`` in struct ggml_tensor)."""
    from ggmlpy._ffi import ffi
    at = ffi.offsetof("struct ggml_tensor", "op") + 4
    return list(ffi.cast("int32_t *", ffi.cast("char *", t.ptr) + at)[0:n])


@covers("ggml_prec_set_acc", "ggml_prec_set_src")
def test_prec_setters_mark_products_and_refuse_other_ops(rng):
    a, b = r32(rng, 5, 8), r32(rng, 3, 8)
    seen = {}

    def build(ctx, ta, tb):
        h = G.ggml_mul_mat(ctx, ta, tb)
        seen["acc"] = G.ggml_prec_set_acc(h, G.GGML_PREC_F32)
        seen["src1"] = G.ggml_prec_set_src(h, G.GGML_PREC_F16, 1)
        seen["src0"] = G.ggml_prec_set_src(h, G.GGML_PREC_F16, 0)   # ggml takes operand 1 only
        added = G.ggml_add(ctx, ta, ta)
        seen["add"] = G.ggml_prec_set_acc(added, G.GGML_PREC_F32)
        seen["params"] = _op_params_i32(h, 4)
        return h
    (out,) = compute(build, a, b)
    assert (seen["acc"], seen["src1"], seen["src0"], seen["add"]) == (True, True, False, False)
    # ggml keeps the accumulator precision in op_params[0] and operand i's in op_params[2 + i]
    assert seen["params"][0] == G.GGML_PREC_F32 and seen["params"][3] == G.GGML_PREC_F16
    assert_close(out, (f64(b) @ f64(a).T)[None, None], rtol=1e-5, atol=1e-5)  # F32 data: F32 products anyway


def test_prec_setters_misuse(ctx):
    h = G.ggml_mul_mat(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 2),
                       G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3))
    with pytest.raises(G.GgmlValueError, match="not an accumulation type"):
        G.ggml_prec_set_acc(h, G.GGML_PREC_Q8)
    with pytest.raises(G.GgmlValueError, match="prec must be one of"):
        G.ggml_prec_set_acc(h, 11)
    with pytest.raises(G.GgmlTypeError, match="prec must be one of"):
        G.ggml_prec_set_acc(h, "f32")
    for idx in (-1, 10):
        with pytest.raises(G.GgmlValueError, match="idx must be an operand index"):
            G.ggml_prec_set_src(h, G.GGML_PREC_F32, idx)
    with pytest.raises(G.GgmlTypeError, match="idx must be an int"):
        G.ggml_prec_set_src(h, G.GGML_PREC_F32, 1.0)


@covers("ggml_conv_2d")
@pytest.mark.parametrize("case", CONV2D_CASES)
def test_conv_2d(rng, case):
    N, C, H, W, O, KH, KW, s0, s1, p0, p1, d0, d1 = case
    X = r32(rng, N, C, H, W)
    K = r32(rng, O, C, KH, KW)
    (out,) = compute(lambda ctx, k, x: G.ggml_conv_2d(ctx, k, x, s0, s1, p0, p1, d0, d1), K, X)
    # ggml_conv_2d = im2col to F16 + mul_mat, which converts the F32 kernel to F16 too:
    # the reference uses F16-rounded operands and exact (float64) accumulation.
    ref = conv2d_ref(f64(X.astype(np.float16)), f64(K.astype(np.float16)), s0, s1, p0, p1, d0, d1)
    assert_close(out, ref, rtol=1e-4, atol=1e-4)
    # and it is within F16 rounding of the exact F32 convolution
    exact = conv2d_ref(f64(X), f64(K), s0, s1, p0, p1, d0, d1)
    assert_close(out, exact, rtol=0, atol=2e-2)


def _bf16_round(a):
    """float32 values rounded to bfloat16 (nearest, ties to even), as ggml converts them."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


def test_conv_2d_with_a_bf16_kernel(rng):
    """ggml 0.25 computes it on the CPU (0.20 aborted in its product): the patches stay F32, the kernel is BF16."""
    X, K = r32(rng, 2, 2, 7, 8), r32(rng, 4, 2, 3, 3)

    def conv(c, tk, tx):
        kb = G.ggml_cpy(c, tk, G.ggml_new_tensor_4d(c, G.GGML_TYPE_BF16, 3, 3, 2, 4))
        return G.ggml_conv_2d(c, kb, tx, 1, 1, 1, 1, 1, 1)
    (out,) = compute(conv, K, X)
    assert_close(out, conv2d_ref(f64(X), f64(_bf16_round(K)), 1, 1, 1, 1, 1, 1), rtol=1e-5, atol=1e-5)
    assert not np.allclose(_bf16_round(K), K, rtol=1e-5, atol=1e-5)  # the rounding is there to see


@covers("ggml_conv_1d")
@pytest.mark.parametrize("s0,p0,d0", [(1, 0, 1), (2, 1, 1), (1, 2, 2)])
def test_conv_1d(rng, s0, p0, d0):
    X = r32(rng, 2, 3, 10)         # [L=10, C=3, N=2]
    K = r32(rng, 4, 3, 3)          # [K=3, C=3, O=4]
    (out,) = compute(lambda ctx, k, x: G.ggml_conv_1d(ctx, k, x, s0, p0, d0), K, X)
    ref = conv2d_ref(f64(X.astype(np.float16))[:, :, None, :], f64(K.astype(np.float16))[:, :, None, :],
                     s0, 1, p0, 0, d0, 1)[:, :, 0, :]       # (N, O, OL)
    assert_close(out, ref, rtol=1e-4, atol=1e-4)


def pool2d_ref(X, op, k0, k1, s0, s1, p0, p1):
    """ggml's pool_2d: padded cells are skipped for max; avg always divides by k0*k1."""
    *lead, H, W = X.shape
    OH, OW = (H + 2 * p1 - k1) // s1 + 1, (W + 2 * p0 - k0) // s0 + 1
    out = np.zeros((*lead, OH, OW))
    for oh in range(OH):
        for ow in range(OW):
            y0, x0 = oh * s1 - p1, ow * s0 - p0
            win = X[..., max(y0, 0):min(y0 + k1, H), max(x0, 0):min(x0 + k0, W)]
            out[..., oh, ow] = win.max(axis=(-1, -2)) if op == "max" else win.sum(axis=(-1, -2)) / (k0 * k1)
    return out


@covers("ggml_pool_2d", "GGML_OP_POOL_MAX", "GGML_OP_POOL_AVG")
@pytest.mark.parametrize("op", ["max", "avg"])
@pytest.mark.parametrize("k0,k1,s0,s1,p0,p1", [(2, 2, 2, 2, 0, 0), (3, 2, 1, 2, 1, 0), (3, 3, 2, 2, 1, 1)])
def test_pool_2d(rng, op, k0, k1, s0, s1, p0, p1):
    X = r32(rng, 2, 3, 6, 7)
    gop = G.GGML_OP_POOL_MAX if op == "max" else G.GGML_OP_POOL_AVG
    (out,) = compute(lambda ctx, x: G.ggml_pool_2d(ctx, x, gop, k0, k1, s0, s1, p0, p1), X)
    assert_close(out, pool2d_ref(f64(X), op, k0, k1, s0, s1, p0, p1), rtol=1e-6, atol=1e-6)


@covers("ggml_pool_1d")
@pytest.mark.parametrize("op", ["max", "avg"])
@pytest.mark.parametrize("k0,s0,p0", [(2, 2, 0), (3, 1, 1), (3, 2, 1)])
def test_pool_1d(rng, op, k0, s0, p0):
    X = r32(rng, 2, 3, 9)
    gop = G.GGML_OP_POOL_MAX if op == "max" else G.GGML_OP_POOL_AVG
    (out,) = compute(lambda ctx, x: G.ggml_pool_1d(ctx, x, gop, k0, s0, p0), X)
    L = X.shape[-1]
    OL = (L + 2 * p0 - k0) // s0 + 1
    ref = np.zeros(X.shape[:-1] + (OL,))
    for o in range(OL):
        lo, hi = max(o * s0 - p0, 0), min(o * s0 - p0 + k0, L)
        win = f64(X)[..., lo:hi]
        # 1-D avg divides by the number of cells inside the input (unlike pool_2d)
        ref[..., o] = win.max(-1) if op == "max" else win.mean(-1)
    assert_close(out, ref, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- every op is covered

# modules whose own test file checks that each of their functions is tested (test_every_*_is_tested)
_SELF_CHECKED = {"ggmlpy.ops.activation", "ggmlpy.ops.inplace", "ggmlpy.ops.sort"}


def _op_modules():
    return [importlib.import_module(f"ggmlpy.ops.{info.name}") for info in pkgutil.iter_modules(ggmlpy.ops.__path__)]


def test_every_exported_op_is_covered():
    """Every op builder of ggmlpy.ops has a forward test: registered in this file, test_conv.py or
    test_recurrent.py, or called in test_attention.py, tests/patches/test_flash_attn_back.py or
    tests/patches/test_half_products.py (compared there with a numpy reference)."""
    from . import test_conv, test_recurrent
    here = os.path.dirname(os.path.abspath(__file__))
    attention_tests = "".join(open(os.path.join(here, *path)).read()
                              for path in (("test_attention.py",), ("..", "patches", "test_flash_attn_back.py"),
                                           ("..", "patches", "test_half_products.py")))
    exported = {name for module in _op_modules() if module.__name__ not in _SELF_CHECKED
                for name, obj in vars(module).items()
                if (name.startswith("ggml_") and callable(obj) and getattr(obj, "__module__", None) == module.__name__)
                or name.startswith(("GGML_OP_", "GGML_SCALE_MODE_"))}
    assert len(exported) > 100
    called = {name for name in exported if f"G.{name}(" in attention_tests}
    missing = sorted(exported - COVERED - test_conv.COVERED - test_recurrent.COVERED - called)
    assert not missing, f"ops without a forward test: {missing}"
    # and each is re-exported at the top level under its ggmlR name
    assert all(hasattr(G, name) for name in exported)


def test_get_rows_through_a_view_of_the_indices_checks_the_view():
    """The index check read the whole tensor a view of the indices looks into, refusing [0, 1] of [9, 0, 1, 2]."""
    be = G.ggml_backend_cpu_init()
    c = G.ggml_init(64 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(64), no_alloc=True)
    t = G.ggml_new_tensor_2d(c, G.GGML_TYPE_F32, 3, 4)
    i = G.ggml_new_tensor_1d(c, G.GGML_TYPE_I32, 4)
    r = G.ggml_get_rows(c, t, G.ggml_view_1d(c, i, 2, 4))    # elements 1 and 2 of i
    buf = G.ggml_backend_alloc_ctx_tensors(c, be)
    table = np.arange(12.0).reshape(4, 3)
    G.ggml_backend_tensor_set_data(t, table)
    G.ggml_backend_tensor_set_data(i, [9, 0, 1, 2])
    g = G.ggml_new_graph_custom(c, 64, False)
    G.ggml_build_forward_expand(g, r)
    galloc = G.ggml_gallocr_new(be)
    G.ggml_gallocr_alloc_graph(galloc, g)
    G.ggml_backend_graph_compute(be, g)
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(r), table[[0, 1]].ravel())
    G.ggml_backend_tensor_set_data(i, [0, 9, 1, 2])               # now the view holds 9: refused
    with pytest.raises(ValueError, match="got 9"):
        G.ggml_backend_graph_compute(be, g)
    galloc.free()
    buf.free()
    c.free()
