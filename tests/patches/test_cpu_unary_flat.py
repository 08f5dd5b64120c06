"""patches/0083: the CPU's element-by-element unary ops (ggml's ``apply_unary_op``: relu, sigmoid, tanh, exp, abs,
neg, sqr, sqrt, step, hardsigmoid...) run over a contiguous tensor as one row, each thread a range of whole 64-byte
lines, where they went row by row (two divisions and a call per row: a CNN's pooled feature maps, 11200 rows of 14
floats, took 0.07 ms). Checked against numpy float64 on 1-4 threads, on shapes whose element count is no multiple
of the 16-float lines or of the threads (a thread may get nothing), in F32, F16 and BF16, in place, on a contiguous
view that starts inside its tensor, and on a non-contiguous view, which keeps the rows' path."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.compute import compute, cpu_backend


OPS = {
    "ggml_relu": lambda x: np.maximum(x, 0.0),
    "ggml_sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "ggml_tanh": np.tanh,
    "ggml_exp": np.exp,
    "ggml_abs": np.abs,
    "ggml_neg": np.negative,
    "ggml_sqr": np.square,
    "ggml_step": lambda x: (x > 0).astype(np.float64),
}

# (ne0, ne1, ne2, ne3) as numpy shapes reversed: tiny rows (the CNN's 7 and 14), one element, fewer elements than
# threads' lines, a count no multiple of 16
SHAPES = [(100, 16, 7, 7), (100, 8, 14, 14), (1,), (3, 5), (2, 3, 17), (1001,)]


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", sorted(OPS))
def test_contiguous_unary_ops_match_numpy(name, shape, threads):
    rng = np.random.default_rng(len(shape) * 100 + threads)
    x = rng.uniform(-3, 3, size=shape).astype(np.float32)
    with cpu_backend(threads) as be:
        (out,) = compute(lambda ctx, t: getattr(G, name)(ctx, t), x, backend=be)
    np.testing.assert_allclose(out.reshape(shape), OPS[name](x.astype(np.float64)), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("threads", [1, 3])
def test_f16_and_in_place(threads):
    rng = np.random.default_rng(7)
    x = rng.uniform(-3, 3, size=(9, 14, 14)).astype(np.float16)
    with cpu_backend(threads) as be:
        (out,) = compute(lambda ctx, t: G.ggml_relu(ctx, t), x, backend=be)
        y = rng.uniform(-3, 3, size=(9, 14, 14)).astype(np.float32)
        (inplace,) = compute(lambda ctx, t: G.ggml_sigmoid_inplace(ctx, G.ggml_scale(ctx, t, 1.0)), y, backend=be)
    np.testing.assert_array_equal(out.reshape(x.shape), np.maximum(x, 0))
    np.testing.assert_allclose(inplace.reshape(y.shape), 1.0 / (1.0 + np.exp(-y.astype(np.float64))), rtol=2e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_view_with_gaps_between_rows_keeps_the_rows_path(threads):
    """A view of every other row of a [6, 10] tensor (rows contiguous, not the tensor): the op must skip the
    rows in between, as it did."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-3, 3, size=(6, 10)).astype(np.float32)

    def build(ctx, t):
        view = G.ggml_view_2d(ctx, t, 10, 3, 2 * 10 * 4, 0)   # rows 0, 2, 4
        return G.ggml_relu(ctx, view)

    with cpu_backend(threads) as be:
        (out,) = compute(build, x, backend=be)
    np.testing.assert_array_equal(out.reshape(3, 10), np.maximum(x[0::2], 0))


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("name,ref", [("ggml_tanh", np.tanh), ("ggml_sigmoid", lambda x: 1.0 / (1.0 + np.exp(-x))),
                                      ("ggml_exp", np.exp)])
def test_f16_ops_other_than_relu(name, ref, threads):
    """In F16 these take ggml's generic path (F32 takes patches/0023's vectorised rows), also as one row now."""
    x = np.random.default_rng(11).uniform(-3, 3, size=(5, 7, 7)).astype(np.float16)
    with cpu_backend(threads) as be:
        (out,) = compute(lambda ctx, t: getattr(G, name)(ctx, t), x, backend=be)
    np.testing.assert_allclose(out.reshape(x.shape).astype(np.float64), ref(x.astype(np.float64)), rtol=2e-3,
                               atol=1e-3)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_bf16_relu_is_exact(threads):
    """ReLU of a BF16 tensor (ggml's cast of the data) is the cast's values with the negatives made 0, bit for bit."""
    x = np.random.default_rng(12).uniform(-3, 3, size=(3, 14, 14)).astype(np.float32)

    def build(ctx, t):
        bf = G.ggml_cast(ctx, t, G.GGML_TYPE_BF16)
        back = lambda u: G.ggml_cast(ctx, u, G.GGML_TYPE_F32)   # noqa: E731
        return back(bf), back(G.ggml_relu(ctx, bf))

    with cpu_backend(threads) as be:
        cast, out = compute(build, x, backend=be)
    assert (cast < 0).any()
    np.testing.assert_array_equal(out, np.maximum(cast, 0))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_contiguous_view_inside_its_tensor(threads):
    """A 990-element view from element 5 of a 1001-element tensor: contiguous, so one row, from its own start."""
    x = np.random.default_rng(13).uniform(-3, 3, size=1001).astype(np.float32)
    with cpu_backend(threads) as be:
        (out,) = compute(lambda ctx, t: G.ggml_exp(ctx, G.ggml_view_1d(ctx, t, 990, 5 * 4)), x, backend=be)
    np.testing.assert_allclose(out.ravel(), np.exp(x[5:995].astype(np.float64)), rtol=2e-6)
