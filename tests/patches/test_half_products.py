"""patches/0060: products with a half-precision weight (``ggml_cast`` of an F32 weight to BF16 or F16, how mixed
precision trains) have a backward pass: the gradient of the other operand is a product of the same half type
(ggml built an OUT_PROD the CPU has no BF16 kernel for, and its backward builder asserted F32/F16 operands), and so
is the weight's (both operands transposed into the half type; a 3-D product keeps ggml's F32 OUT_PROD), which flows
through the cast into the F32 weight; the CPU's OUT_PROD takes a BF16 operand.

References are numpy float64. The tolerance of a half product is the type's rounding of both operands: each
product term is off by at most 2u of its size (u = 2^-8 for BF16, 2^-11 for F16; F32 accumulation adds far less),
so an element may differ by 2u * (|A| @ |B|) from the exact product, on every device. On the CPU ggml rounds both
operands to the weight's type, which the tight check pins down (equal to the product of the rounded operands up to
F32 accumulation): it fails if the product silently ran in F32. The weight's gradient has the same bound.
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.compute import compute, compute_grad, nd4
from tests.helpers.devices import require_gpu


UNIT = {G.GGML_TYPE_BF16: 2.0 ** -8, G.GGML_TYPE_F16: 2.0 ** -11}
TYPES = [pytest.param(G.GGML_TYPE_BF16, id="bf16"), pytest.param(G.GGML_TYPE_F16, id="f16")]


def round_to(t: int, a: np.ndarray) -> np.ndarray:
    """``a`` rounded to ``t`` (nearest even), as float64: numpy's float16, or BF16 from float32's bits."""
    a = np.asarray(a, np.float32)
    if t == G.GGML_TYPE_F16:
        with np.errstate(over="ignore"):   # beyond 65504: inf, as ggml rounds it
            return a.astype(np.float16).astype(np.float64)
    u = a.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(np.float32).astype(np.float64)


@pytest.fixture(params=["cpu", "Vulkan0", "CUDA0"])
def backend(request):
    if request.param == "cpu":
        b = G.ggml_backend_cpu_init()
        G.ggml_backend_cpu_set_n_threads(b, 2)
    else:
        require_gpu(request.param)
        b = G.ggml_backend_init_by_name(request.param)
    yield request.param, b
    b.free()


def _bound(t: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return 2 * UNIT[t] * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))) + 1e-6


@pytest.mark.parametrize("t", TYPES)
def test_cast_rounds_to_nearest_even(t):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((3, 50)) * 10.0 ** rng.integers(-3, 4, (3, 50))).astype(np.float32)
    x[0, :4] = [0.0, -0.0, 1.0 + 2.0 ** -9, 1.0 + 3 * 2.0 ** -9]   # ties: even below, even above (BF16)
    (y,) = compute(lambda c, a: G.ggml_cast(c, G.ggml_cast(c, a, t), G.GGML_TYPE_F32), x)
    np.testing.assert_array_equal(y, nd4(round_to(t, x)))


def test_cast_refuses_a_type_it_cannot_make():
    ctx = G.ggml_init(1 << 16, no_alloc=True)
    try:
        a = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 8)
        with pytest.raises(G.GgmlTypeError, match="F32, F16 and BF16"):
            G.ggml_cast(ctx, a, G.GGML_TYPE_Q8_0)
        with pytest.raises(G.GgmlValueError, match="not a ggml type"):
            G.ggml_cast(ctx, a, 999)
    finally:
        ctx.free()


@pytest.mark.parametrize("t", TYPES)
@pytest.mark.parametrize("n, m, p, planes", [(40, 6, 9, (1, 1)), (64, 33, 17, (1, 1)), (24, 5, 7, (2, 2))])
def test_a_half_weight_product_and_its_gradients(backend, t, n, m, p, planes):
    """y = cast(W) @ X (ggml: mul_mat(cast(W) [n, m], X [n, p])), loss = sum(y * r): dL/dX = r @ W through the
    patched half product, dL/dW = r^T @ X through the cast. ``planes``: W's planes and X's (X's a multiple: W
    broadcast over them)."""
    name, be = backend
    rng = np.random.default_rng(n * m + p)
    qw, qx = planes
    w = rng.standard_normal((qw, m, n)).astype(np.float32)        # numpy order: ggml [n, m, qw]
    x = rng.standard_normal((qx, p, n)).astype(np.float32)        # ggml [n, p, qx]
    r = rng.standard_normal((qx, p, m)).astype(np.float32)        # like y: ggml [m, p, qx]
    wb = np.repeat(w, qx // qw, axis=0)                            # W of each of X's planes

    def product(c, a, b):
        return G.ggml_mul_mat(c, G.ggml_cast(c, a, t), b)

    loss, gx = compute_grad(lambda c, xt, wt: product(c, wt, xt), x, r, w, backend=be)
    want_gx = r.astype(np.float64) @ wb
    assert np.all(np.abs(gx - want_gx) <= _bound(t, r, wb)), f"{name}: dX beyond the half type's rounding"
    exact_loss = float(np.sum((x.astype(np.float64) @ wb.transpose(0, 2, 1)) * r))
    assert abs(loss - exact_loss) <= float(np.sum(_bound(t, x, wb.transpose(0, 2, 1)) * np.abs(r)))

    _, gw = compute_grad(lambda c, wt, xt: product(c, wt, xt), w, r, x, backend=be)
    want_gw = np.einsum("qpm,qpn->qmn", r.astype(np.float64), x).reshape(qw, qx // qw, m, n).sum(axis=1)
    bound_gw = 2 * UNIT[t] * np.einsum("qpm,qpn->qmn", np.abs(r.astype(np.float64)), np.abs(x)).reshape(
        qw, qx // qw, m, n).sum(axis=1) + 1e-6
    assert np.all(np.abs(gw - want_gw) <= bound_gw), f"{name}: dW beyond the half type's rounding"

    if name == "cpu":   # ggml's CPU rounds both operands to the weight's type: it really computed in half precision
        tight = round_to(t, r) @ np.repeat(round_to(t, w), qx // qw, axis=0)
        np.testing.assert_allclose(gx, tight, rtol=0, atol=1e-5 * np.abs(tight).max())
        assert np.abs(gx - want_gx).max() > 10 * 1e-5 * np.abs(tight).max(), "the product ran in F32"


@pytest.mark.parametrize("t", TYPES)
def test_cpu_out_prod_takes_a_half_operand(t):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((7, 30)).astype(np.float32)   # ggml [30, 7]
    b = rng.standard_normal((7, 11)).astype(np.float32)   # ggml [11, 7]
    (y,) = compute(lambda c, at, bt: G.ggml_out_prod(c, G.ggml_cast(c, at, t), bt), a, b)
    want = b.astype(np.float64).T @ round_to(t, a)        # ggml [30, 11]: sum over the 7 rows
    np.testing.assert_allclose(y, nd4(want), rtol=0, atol=1e-5 * np.abs(want).max())


def test_a_bf16_tensor_elsewhere_on_the_gradient_path_is_refused_with_the_fix():
    """Only a matrix product's first operand may be BF16 on the way to a parameter (ggml asserts the rest): a
    reshape of the cast is refused before ggml is called, saying to cast last."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((4, 6)).astype(np.float32)
    x = rng.standard_normal((3, 24)).astype(np.float32)
    r = rng.standard_normal((3, 1)).astype(np.float32)

    def build(c, wt, xt):
        flat = G.ggml_reshape_2d(c, G.ggml_cast(c, wt, G.GGML_TYPE_BF16), 24, 1)
        return G.ggml_mul_mat(c, flat, xt)
    with pytest.raises(G.GgmlTypeError, match="cast last"):
        compute_grad(build, w, r, x)
