"""ggml's autodiff against central finite differences computed in numpy float64.

Every case builds ``loss = sum(op(x, ...) * r)`` with a fixed random ``r``, marks ``x`` a
parameter, expands the backward graph, runs it through a scheduler and compares
``ggml_graph_get_grad(graph, x)`` with finite differences of the same function written in
numpy. Ops without a backward pass must be refused with a ValueError naming the op.
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.compute import compute_grad
from tests.helpers.gradients import f64, fd_grad, pool2d
from tests.helpers.subprocesses import (
    assert_refused_naming_op,
    backward_refusal_script,
    run_cases_in_subprocess,
    run_in_subprocess,
)


# ---------------------------------------------------------------- numpy references

def _softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _softplus(x):
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def _conv2d(X, K, s=1, p=0):
    """X (N, C, H, W), K (O, C, KH, KW) -> (N, O, OH, OW), vectorised over the kernel offsets."""
    N, C, H, W = X.shape
    O, _, KH, KW = K.shape
    Xp = np.pad(X, ((0, 0), (0, 0), (p, p), (p, p)))
    OH, OW = (H + 2 * p - KH) // s + 1, (W + 2 * p - KW) // s + 1
    out = np.zeros((N, O, OH, OW))
    for ky in range(KH):
        for kx in range(KW):
            patch = Xp[:, :, ky:ky + s * (OH - 1) + 1:s, kx:kx + s * (OW - 1) + 1:s]
            out += np.einsum("nchw,oc->nohw", patch, K[:, :, ky, kx])
    return out


def _conv1d(X, K, p):
    """X (N, C, L), K (O, C, KL) -> (N, O, OL), stride 1."""
    Xp = np.pad(X, ((0, 0), (0, 0), (p, p)))
    OL = Xp.shape[-1] - K.shape[-1] + 1
    return sum(np.einsum("ncl,oc->nol", Xp[:, :, k:k + OL], K[:, :, k]) for k in range(K.shape[-1]))


def _away_from_zero(rng, *shape, lo=0.2, hi=2.0):
    return (rng.uniform(lo, hi, shape) * rng.choice([-1, 1], shape)).astype(np.float32)


# ---------------------------------------------------------------- the cases
# name: (build(ctx, x, *others), numpy f(x, *others), make_x(rng), make_others(rng), tolerance)
# x and the others are numpy arrays in ggml layout.

def _u(lo, hi, *shape):
    return lambda rng: rng.uniform(lo, hi, shape).astype(np.float32)


A34 = _u(-2, 2, 3, 4)
CASES = {
    "add": (lambda c, x, a: G.ggml_add(c, x, a), lambda x, a: x + a, A34, [_u(-1, 1, 3, 4)], None),
    "add_broadcast_b": (lambda c, x, a: G.ggml_add(c, a, x), lambda x, a: a + x,
                        _u(-1, 1, 1, 4), [_u(-1, 1, 2, 3, 4)], None),
    "sub": (lambda c, x, a: G.ggml_sub(c, x, a), lambda x, a: x - a, A34, [_u(-1, 1, 3, 4)], None),
    "sub_b": (lambda c, x, a: G.ggml_sub(c, a, x), lambda x, a: a - x, A34, [_u(-1, 1, 3, 4)], None),
    "sub_broadcast_constant_b": (lambda c, x, a: G.ggml_sub(c, x, a), lambda x, a: x - a,
                                 A34, [_u(-1, 1, 1, 4)], None),
    "mul": (lambda c, x, a: G.ggml_mul(c, x, a), lambda x, a: x * a, A34, [_u(-1, 1, 3, 4)], None),
    "mul_broadcast_b": (lambda c, x, a: G.ggml_mul(c, a, x), lambda x, a: a * x,
                        _u(-1, 1, 3, 1), [_u(-1, 1, 2, 3, 4)], None),
    "div": (lambda c, x, a: G.ggml_div(c, x, a), lambda x, a: x / a, A34,
            [lambda rng: _away_from_zero(rng, 3, 4, lo=0.5)], None),
    "div_b": (lambda c, x, a: G.ggml_div(c, a, x), lambda x, a: a / x,
              lambda rng: _away_from_zero(rng, 3, 4, lo=0.5), [_u(-1, 1, 3, 4)], None),
    "sqr": (lambda c, x: G.ggml_sqr(c, x), np.square, A34, [], None),
    "sqrt": (lambda c, x: G.ggml_sqrt(c, x), np.sqrt, _u(0.3, 3, 3, 4), [], None),
    "log": (lambda c, x: G.ggml_log(c, x), np.log, _u(0.3, 3, 3, 4), [], None),
    "sin": (lambda c, x: G.ggml_sin(c, x), np.sin, A34, [], None),
    "cos": (lambda c, x: G.ggml_cos(c, x), np.cos, A34, [], None),
    "exp": (lambda c, x: G.ggml_exp(c, x), np.exp, A34, [], None),
    "neg": (lambda c, x: G.ggml_neg(c, x), np.negative, A34, [], None),
    "abs": (lambda c, x: G.ggml_abs(c, x), np.abs, lambda rng: _away_from_zero(rng, 3, 4), [], None),
    "relu": (lambda c, x: G.ggml_relu(c, x), lambda x: np.maximum(x, 0),
             lambda rng: _away_from_zero(rng, 3, 4), [], None),
    "silu": (lambda c, x: G.ggml_silu(c, x), lambda x: x / (1 + np.exp(-x)), _u(-4, 4, 3, 4), [], None),
    "softplus": (lambda c, x: G.ggml_softplus(c, x), _softplus, _u(-4, 4, 3, 4), [], None),
    # sigmoid, tanh, gelu and norm: backward passes from our ggml patch 0004.
    "sigmoid": (lambda c, x: G.ggml_sigmoid(c, x), lambda x: 1 / (1 + np.exp(-x)), _u(-4, 4, 3, 4), [], None),
    "tanh": (lambda c, x: G.ggml_tanh(c, x), np.tanh, _u(-3, 3, 3, 4), [], None),
    "gelu": (lambda c, x: G.ggml_gelu(c, x),
             lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))), _u(-3, 3, 3, 4), [],
             None),
    "norm": (lambda c, x: G.ggml_norm(c, x, 1e-5),
             lambda x: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5),
             _u(-2, 2, 3, 5), [], None),
    # concat: backward pass from our ggml patch 0006; x first or second, along ggml axes 0, 1 and 2
    "concat_a_dim0": (lambda c, x, b: G.ggml_concat(c, x, b, 0), lambda x, b: np.concatenate([x, b], -1),
                      A34, [_u(-1, 1, 3, 2)], None),
    "concat_b_dim1": (lambda c, x, a: G.ggml_concat(c, a, x, 1), lambda x, a: np.concatenate([a, x], -2),
                      _u(-1, 1, 2, 3, 4), [_u(-1, 1, 2, 1, 4)], None),
    "concat_a_dim2": (lambda c, x, b: G.ggml_concat(c, x, b, 2), lambda x, b: np.concatenate([x, b], -3),
                      _u(-1, 1, 2, 3, 4), [_u(-1, 1, 3, 3, 4)], None),
    "scale": (lambda c, x: G.ggml_scale(c, x, -1.75), lambda x: -1.75 * x, A34, [], None),
    "scale_bias": (lambda c, x: G.ggml_scale_bias(c, x, 0.5, 2.0), lambda x: 0.5 * x + 2.0, A34, [], None),
    "sum": (lambda c, x: G.ggml_sum(c, x), lambda x: np.sum(x).reshape(1), A34, [], None),
    "sum_rows": (lambda c, x: G.ggml_sum_rows(c, x), lambda x: x.sum(-1, keepdims=True),
                 _u(-2, 2, 2, 3, 4), [], None),
    "mean": (lambda c, x: G.ggml_mean(c, x), lambda x: x.mean(-1, keepdims=True), _u(-2, 2, 2, 3, 4), [], None),
    "repeat": (lambda c, x, t: G.ggml_repeat(c, x, t), lambda x, t: np.tile(x, (2, 1, 3)),
               _u(-1, 1, 1, 3, 2), [lambda rng: np.zeros((2, 3, 6), np.float32)], None),
    "mul_mat_a": (lambda c, x, b: G.ggml_mul_mat(c, x, b), lambda x, b: b @ x.T,
                  _u(-1, 1, 4, 5), [_u(-1, 1, 3, 5)], None),
    "mul_mat_b": (lambda c, x, a: G.ggml_mul_mat(c, a, x), lambda x, a: x @ a.T,
                  _u(-1, 1, 3, 5), [_u(-1, 1, 4, 5)], None),
    "soft_max": (lambda c, x: G.ggml_soft_max(c, x), _softmax, _u(-2, 2, 3, 5), [], None),
    "rms_norm": (lambda c, x: G.ggml_rms_norm(c, x, 1e-5),
                 lambda x: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5), _u(-2, 2, 3, 6), [], None),
    "get_rows_table": (lambda c, x, i: G.ggml_get_rows(c, x, i), lambda x, i: x[i], _u(-1, 1, 5, 3),
                       [lambda rng: np.array([4, 0, 4, 2, 4, 1], np.int32)], None),
    "cross_entropy_loss": (lambda c, x, y: G.ggml_cross_entropy_loss(c, x, y),
                           lambda x, y: np.array([-(y * np.log(_softmax(x))).sum(-1).mean()]),
                           _u(-2, 2, 4, 5), [lambda rng: rng.dirichlet(np.ones(5), 4).astype(np.float32)], None),
    "cont_transpose": (lambda c, x: G.ggml_cont(c, G.ggml_transpose(c, x)), lambda x: x.T.copy(), A34, [], None),
    "cont_permute": (lambda c, x: G.ggml_cont(c, G.ggml_permute(c, x, 2, 0, 1, 3)),
                     lambda x: np.transpose(x, (2, 0, 1)), _u(-1, 1, 2, 3, 4), [], None),
    "reshape": (lambda c, x: G.ggml_reshape_2d(c, x, 6, 2), lambda x: x.reshape(2, 6), A34, [], None),
    "view": (lambda c, x: G.ggml_cont(c, G.ggml_view_2d(c, x, 2, 2, 4 * 4, 4 * 5)),
             lambda x: x[1:3, 1:3], A34, [], None),
    # im2col (F16) + mul_mat: the forward pass rounds both operands to F16, so looser tolerances
    "conv_2d_kernel": (lambda c, x, img: G.ggml_conv_2d(c, x, img, 1, 1, 1, 1),
                       lambda x, img: _conv2d(img, x, 1, 1),
                       _u(-1, 1, 2, 2, 3, 3), [_u(-1, 1, 1, 2, 5, 6)], dict(rtol=2e-2, atol=2e-2)),
    "conv_2d_image": (lambda c, x, k: G.ggml_conv_2d(c, k, x, 2, 2, 0, 0),
                      lambda x, k: _conv2d(x, k, 2, 0),
                      _u(-1, 1, 2, 2, 5, 5), [_u(-1, 1, 3, 2, 3, 3)], dict(rtol=2e-2, atol=2e-2)),
    "conv_1d_kernel_batch": (lambda c, x, sig: G.ggml_conv_1d(c, x, sig, 1, 1),
                             lambda x, sig: _conv1d(sig, x, 1),
                             _u(-1, 1, 3, 2, 3), [_u(-1, 1, 2, 2, 7)], dict(rtol=2e-2, atol=2e-2)),
    "pool_2d_max": (lambda c, x: G.ggml_pool_2d(c, x, G.GGML_OP_POOL_MAX, 2, 2, 2, 2),
                    lambda x: pool2d(x, "max", 2, 2),
                    lambda rng: rng.permutation(2 * 4 * 6).astype(np.float32).reshape(1, 2, 4, 6) / 10, [], None),
    # a permute or transpose after an op: its backward must receive a contiguous gradient (patch 0007;
    # ggml passed a strided view that POOL_2D's backward misread and the element-wise backward refused)
    "pool_2d_max_then_permute": (lambda c, x: G.ggml_cont(c, G.ggml_permute(
                                     c, G.ggml_pool_2d(c, x, G.GGML_OP_POOL_MAX, 2, 2, 2, 2), 1, 2, 0, 3)),
                                 lambda x: np.transpose(pool2d(x, "max", 2, 2), (1, 2, 0)),
                                 lambda rng: rng.permutation(3 * 4 * 6).astype(np.float32).reshape(3, 4, 6) / 10,
                                 [], None),
    "sqr_then_transpose": (lambda c, x: G.ggml_cont(c, G.ggml_transpose(c, G.ggml_sqr(c, x))),
                           lambda x: np.square(x).T.copy(), A34, [], None),
    "pool_2d_avg": (lambda c, x: G.ggml_pool_2d(c, x, G.GGML_OP_POOL_AVG, 3, 3, 1, 1),
                    lambda x: pool2d(x, "avg", 3, 1), _u(-1, 1, 2, 5, 5), [], None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_matches_finite_differences(name):
    build, f, make_x, make_others, tol = CASES[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    x = make_x(rng)
    others = [m(rng) for m in make_others]
    ref_out = f(f64(x), *[f64(o) if o.dtype != np.int32 else o for o in others])
    r = rng.uniform(-1, 1, np.shape(ref_out)).astype(np.float32)
    loss, grad = compute_grad(build, x, r, *others)
    fd = fd_grad(lambda z: f(z, *[f64(o) if o.dtype != np.int32 else o for o in others]), x, f64(r))
    tol = tol or dict(rtol=1e-3, atol=1e-4)
    scale = max(1.0, float(np.abs(fd).max()))
    # the loss itself is right ...
    np.testing.assert_allclose(loss, float(np.sum(ref_out * f64(r))), rtol=tol["rtol"], atol=tol["atol"] * scale)
    # ... and so is its gradient
    np.testing.assert_allclose(grad, fd, rtol=tol["rtol"], atol=tol["atol"] * scale)
    assert np.abs(fd).max() > 0  # a meaningful check


def test_composite_network_gradient():
    """A small MLP with ops chained: mul_mat -> add bias -> silu -> mul_mat -> softmax -> CE."""
    rng = np.random.default_rng(7)
    W1 = rng.uniform(-1, 1, (6, 4)).astype(np.float32)    # [4, 6]
    X = rng.uniform(-1, 1, (5, 4)).astype(np.float32)     # [4, 5]: 5 samples
    b = rng.uniform(-1, 1, (1, 6)).astype(np.float32)
    W2 = rng.uniform(-1, 1, (3, 6)).astype(np.float32)
    Y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 5)]

    def build(c, w1, x, bias, w2, y):
        h = G.ggml_silu(c, G.ggml_add(c, G.ggml_mul_mat(c, w1, x), bias))
        return G.ggml_cross_entropy_loss(c, G.ggml_mul_mat(c, w2, h), y)

    def f(w1, x, bias, w2, y):
        h = x @ w1.T + bias
        h = h / (1 + np.exp(-h))
        z = h @ w2.T
        return np.array([-(y * np.log(_softmax(z))).sum(-1).mean()])

    r = np.array([1.0], np.float32)
    others = (X, b, W2, Y)
    _, grad = compute_grad(build, W1, r, *others)
    fd = fd_grad(lambda w: f(w, *map(f64, others)), W1, f64(r))
    np.testing.assert_allclose(grad, fd, rtol=1e-3, atol=1e-5)


# ---------------------------------------------------------------- graphs ggml would refuse

_NO_BACKWARD = backward_refusal_script('x = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)')

NO_BACKWARD = {
    "leaky_relu": ("G.ggml_leaky_relu(ctx, x, 0.1)", "LEAKY_RELU"),
    "leaky_relu_deeper": ("G.ggml_scale(ctx, G.ggml_leaky_relu(ctx, G.ggml_add(ctx, x, x), 0.1, False), 2.0)",
                          "LEAKY_RELU"),
    "elu": ("G.ggml_elu(ctx, x)", "ELU"),   # (CLAMP has one since patches/0055: test_backward_clamp.py)
    "pad": ("G.ggml_pad(ctx, x, 1, 0, 0, 0)", "PAD"),
    "pool_1d": ("G.ggml_pool_1d(ctx, x, G.GGML_OP_POOL_AVG, 2, 2, 0)", "POOL_1D"),
}


@pytest.fixture(scope="module")
def no_backward_results():
    """Run every case in one fresh interpreter (ggml would abort the process on each of them)."""
    return run_cases_in_subprocess(_NO_BACKWARD, NO_BACKWARD)


@pytest.mark.parametrize("key", sorted(NO_BACKWARD))
def test_op_without_backward_raises_valueerror_naming_it(no_backward_results, key):
    assert_refused_naming_op(no_backward_results, NO_BACKWARD, key)


def test_broadcast_sub_with_trainable_b_raises():
    rc, out, err = run_in_subprocess(_NO_BACKWARD.format(
        expr="G.ggml_sub(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3), "
             "G.ggml_view_2d(ctx, x, 4, 1, 16, 0))"))
    assert rc == 0, err[-2000:]
    # a view of x is broadcast as SUB's second operand: ggml would abort, ggmlpy refuses it
    assert "VALUEERROR" in out and "SUB" in out, out


def test_mean_whose_input_has_another_consumer_raises():
    # ggml accumulates MEAN's gradient with ADD1, which needs a scalar: when x already has a gradient
    # from a later consumer, ggml_build_backward_expand would abort.
    code = _NO_BACKWARD.format(expr="G.ggml_add(ctx, G.ggml_repeat(ctx, G.ggml_mean(ctx, x), x), G.ggml_sqr(ctx, x))")
    rc, out, err = run_in_subprocess(code)
    assert rc == 0, f"the interpreter died (rc={rc}): {err[-2000:]}"
    assert "VALUEERROR" in out and "MEAN" in out, out


def test_side_outputs_off_the_loss_path_do_not_block_backward():
    """ggml skips I32 nodes (argmax) and ops whose result does not reach the loss: no error for them."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (3, 4)).astype(np.float32)
    r = rng.uniform(-1, 1, (3, 4)).astype(np.float32)
    side = {}

    # The graph contains argmax and tanh(x): build it with both as extra graph outputs.
    def build_with_sides(c, xt):
        y = G.ggml_sqr(c, xt)
        side["argmax"] = G.ggml_argmax(c, xt)
        side["tanh"] = G.ggml_tanh(c, xt)
        return y

    ctx = G.ggml_init(8 * 1024 * 1024, no_alloc=True)
    try:
        xt = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)
        rt = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)
        G.ggml_set_param(xt)
        G.ggml_set_input(xt)
        G.ggml_set_input(rt)
        y = build_with_sides(ctx, xt)
        loss = G.ggml_sum(ctx, G.ggml_mul(ctx, y, rt))
        G.ggml_set_loss(loss)
        g = G.ggml_new_graph_custom(ctx, 256, True)
        G.ggml_build_forward_expand(g, side["argmax"])
        G.ggml_build_forward_expand(g, side["tanh"])
        G.ggml_build_forward_expand(g, loss)
        G.ggml_build_backward_expand(ctx, g)    # must not raise
        be = G.ggml_backend_cpu_init()
        sched = G.ggml_backend_sched_new([be], parallel=False, graph_size=256)
        G.ggml_backend_sched_alloc_graph(sched, g)
        G.ggml_backend_tensor_set_data(xt, x)
        G.ggml_backend_tensor_set_data(rt, r)
        G.ggml_graph_reset(g)
        G.ggml_backend_sched_graph_compute(sched, g)
        grad = G.ggml_backend_tensor_get_data(G.ggml_graph_get_grad(g, xt)).reshape(3, 4)
        np.testing.assert_allclose(grad, 2 * f64(x) * f64(r), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(side["argmax"]), np.argmax(x, axis=1))
        sched.free()
        be.free()
    finally:
        ctx.free()
