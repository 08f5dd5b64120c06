"""``learning_rate=`` of the fit functions: the starting rate of both optimizers."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.training_refs import Net


def _one_sgd_step(cpu, tsched, trng, fit):
    x = trng.normal(size=(4, 3)).astype(np.float32)
    y = trng.normal(size=(4, 1)).astype(np.float32)
    w0 = trng.normal(size=(1, 3)).astype(np.float32)
    net = Net(cpu)
    try:
        xt = net.leaf((4, 3))
        wt = net.leaf((1, 3), w0, param=True)
        net.alloc()
        out = G.ggml_mul_mat(net.ctx, wt, xt)
        fit(net.ctx, xt, out, x, y)
        w1 = G.ggml_backend_tensor_get_data(wt).reshape(1, 3)
    finally:
        net.free()
    # MSE over 4 samples: d/dw mean((x w - y)^2) = 2/4 * (x w - y)^T x
    x64, y64, w64 = x.astype(np.float64), y.astype(np.float64), w0.astype(np.float64)
    grad = 2.0 / 4 * (x64 @ w64.T - y64).T @ x64
    return w64, w1, grad


@pytest.mark.parametrize("path", ["gen", "dataset"])
def test_learning_rate_sets_the_first_step(cpu, tsched, trng, path):
    lr = 0.25

    def fit(ctx, xt, out, x, y):
        if path == "gen":
            G.ggml_fit_opt_gen(tsched, ctx, xt, out, [(x, y)], epochs=1, optimizer=G.ggml_opt_optimizer_type_sgd(),
                               learning_rate=lr, silent=True)
        else:
            ds = G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_F32, 3, 1, 4)
            G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_data(ds), x)
            G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_labels(ds), y)
            G.ggml_fit_opt(tsched, ctx, xt, out, ds, nepoch=1, nbatch_logical=4, shuffle=False,
                           optimizer=G.ggml_opt_optimizer_type_sgd(), learning_rate=lr, silent=True)
            ds.free()

    w0, w1, grad = _one_sgd_step(cpu, tsched, trng, fit)
    np.testing.assert_allclose(w1, w0 - lr * grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "0.1", True])
def test_learning_rate_must_be_positive_and_finite(cpu, tsched, bad):
    net = Net(cpu)
    try:
        xt = net.leaf((4, 3))
        wt = net.leaf((1, 3), np.zeros((1, 3)), param=True)
        net.alloc()
        out = G.ggml_mul_mat(net.ctx, wt, xt)
        calls = []
        with pytest.raises(ValueError, match="learning_rate"):
            G.ggml_fit_opt_gen(tsched, net.ctx, xt, out, lambda: calls.append(1), learning_rate=bad, silent=True)
        assert not calls  # refused before any batch was drawn
    finally:
        net.free()
