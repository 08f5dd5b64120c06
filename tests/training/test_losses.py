"""Every loss type: its value after one eval and its gradient, against float64 numpy.

Model: out = x * W (element-wise), x an input and W a parameter of the same shape [F, N], so
dL/dW = x * dL/dout. One SGD step with learning rate LR gives the gradient: W1 = W0 - LR * grad.
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.training_refs import loss_and_dout, Net


F, N = 3, 4
LR = 1.0
LOSS = {
    "mean": G.ggml_opt_loss_type_mean(), "sum": G.ggml_opt_loss_type_sum(),
    "cross_entropy": G.ggml_opt_loss_type_cross_entropy(), "mse": G.ggml_opt_loss_type_mse(),
    "mae": G.ggml_opt_loss_type_mae(), "huber": G.ggml_opt_loss_type_huber(),
    "binary_cross_entropy": G.ggml_opt_loss_type_binary_cross_entropy(),
    "weighted_mse": G.ggml_opt_loss_type_weighted_mse(),
    "kl_divergence": G.ggml_opt_loss_type_kl_divergence(), "hinge": G.ggml_opt_loss_type_hinge(),
    "squared_hinge": G.ggml_opt_loss_type_squared_hinge(),
    "cosine_similarity": G.ggml_opt_loss_type_cosine_similarity(),
    "binary_cross_entropy_logits": G.ggml_opt_loss_type_binary_cross_entropy_logits(),
}


def log_cosh(ctx, y, p):
    """Keras' LogCosh written with ggmlpy ops: log((exp(e) + exp(-e)) / 2), e = p - y."""
    e = G.ggml_sub(ctx, p, y)
    return G.ggml_log(ctx, G.ggml_scale(ctx, G.ggml_add(ctx, G.ggml_exp(ctx, e), G.ggml_exp(ctx, G.ggml_neg(ctx, e))),
                                        0.5))


LOSS["custom_log_cosh"] = G.ggml_opt_loss_custom(log_cosh)
LABELLED = set(LOSS) - {"mean", "sum"}
SGD = G.ggml_opt_optimizer_type_sgd()


def _data(kind: str, rng: np.random.Generator):
    x = rng.uniform(0.2, 0.9, (N, F))
    W = rng.uniform(0.6, 1.1, (N, F))
    if kind in ("cross_entropy", "kl_divergence"):
        y = rng.uniform(0, 1, (N, F))
        y /= y.sum(axis=1, keepdims=True)  # label distributions: ggml's CE gradient assumes rows summing to 1
        if kind == "kl_divergence":
            y[0, 0] = 0.0  # a zero label adds nothing (Keras clips it to 1e-7)
    elif kind in ("hinge", "squared_hinge"):
        y = rng.choice([-1.0, 1.0], (N, F))  # out = x * W in (0.12, 1): every margin 1 - y out is > 0
    elif kind == "binary_cross_entropy":
        y = rng.uniform(0, 1, (N, F))  # soft labels; out = x * W stays inside (0, 1)
    elif kind == "binary_cross_entropy_logits":
        x = rng.uniform(-3.0, 3.0, (N, F))  # logits of both signs
        x[0, :2] = (40.0, -40.0)  # where probabilities would be clipped: the logits' gradient stays exact
        y = rng.uniform(0, 1, (N, F))
    elif kind == "huber":
        y = rng.uniform(-2.5, 3.0, (N, F))  # errors on both sides of delta = 1
    else:
        y = rng.uniform(-1, 2, (N, F))
    return x.astype(np.float32), W.astype(np.float32), y.astype(np.float32)


class OneStep:
    """A static opt context on out = x * W with SGD (lr LR); ``step`` runs alloc -> write -> eval."""

    def __init__(self, backend, sched, kind: str, W0: np.ndarray, opt_period: int = 1, loss_mask_ne0=None,
                 shape=(N, F)):
        self.net = Net(backend)
        self.x = self.net.leaf(shape)
        self.W = self.net.leaf(shape, W0, param=True)
        self.net.alloc()
        self.out = G.ggml_mul(self.net.ctx, self.x, self.W)
        fit = G.ggml_opt_init_for_fit(sched, LOSS[kind], SGD, opt_period, self.net.ctx, self.x, self.out,
                                      loss_mask_ne0=loss_mask_ne0)
        self.opt, self.lr_ud = fit["opt_ctx"], fit["lr_ud"]
        G.ggml_opt_set_lr(self.lr_ud, sgd_lr=LR)
        self.result = G.ggml_opt_result_init()

    def step(self, x, y=None, w=None) -> None:
        G.ggml_opt_alloc(self.opt, True)
        self.net.set(self.x, x)
        if y is not None:
            self.net.set(G.ggml_opt_labels(self.opt), y)
        if w is not None:
            self.net.set(G.ggml_opt_loss_weights_i(self.opt, 1), w)
        G.ggml_opt_eval(self.opt, self.result)

    def weights(self) -> np.ndarray:
        return Net.get(self.W).astype(np.float64)

    def free(self) -> None:
        self.result.free()
        self.opt.free()
        self.net.free()


def _check(kind, backend, sched, rng, w=None, loss_mask_ne0=None):
    x, W0, y = _data(kind, rng)
    m = OneStep(backend, sched, kind, W0, loss_mask_ne0=loss_mask_ne0)
    try:
        m.step(x, y if kind in LABELLED else None, w)
        out = x.astype(np.float64) * W0
        ref_loss, dout = loss_and_dout(kind, out, y.astype(np.float64), None if w is None else w.astype(np.float64))
        ref_grad = dout * x
        assert G.ggml_opt_result_loss(m.result)["loss"] == pytest.approx(ref_loss, rel=1e-5, abs=1e-7)
        # the loss tensor the context optimises, read back after the eval
        loss_tensor = G.ggml_opt_loss_i(m.opt, 1)
        assert float(G.ggml_backend_tensor_get_data(loss_tensor)[0]) == pytest.approx(ref_loss, rel=1e-5, abs=1e-7)
        grad = (W0.astype(np.float64) - m.weights()) / LR
        np.testing.assert_allclose(grad, ref_grad, rtol=2e-4, atol=2e-7)
    finally:
        m.free()


@pytest.mark.parametrize("kind", ["mean", "sum", "cross_entropy", "mse", "mae", "huber", "binary_cross_entropy",
                                  "kl_divergence", "hinge", "squared_hinge", "cosine_similarity",
                                  "binary_cross_entropy_logits", "custom_log_cosh"])
def test_loss_value_and_gradient(kind, cpu, tsched, trng):
    _check(kind, cpu, tsched, trng)


@pytest.mark.parametrize("kind", ["hinge", "squared_hinge"])
def test_hinge_margins_of_both_signs(kind, cpu, tsched, trng):
    """The max(0, .) branch in the graph: Keras' hinge is mean(max(1 - y out, 0)), squared_hinge its square.

    Half the elements have y out > 1 (margin met: no loss, no gradient), the others y out < 1, some of them with
    y out < 0 (the wrong sign); none within 0.1 of the kink at y out = 1. Reference: numpy float64, inline.
    """
    y = np.where(trng.uniform(0, 1, (N, F)) > 0.5, 1.0, -1.0)
    y_out = np.array([[-1.4, 0.3, 1.5], [2.2, -0.2, 1.2], [0.6, 3.0, -2.1], [1.8, 0.85, 1.1]])  # y * out
    W0 = trng.uniform(0.6, 1.1, (N, F)).astype(np.float32)
    x = (y_out * y / W0).astype(np.float32)
    out = x.astype(np.float64) * W0
    yo = y * out
    assert (yo > 1.05).sum() == 6 and (yo < 0.95).sum() == 6 and (yo < 0).sum() == 3
    n = out.size
    margin = np.maximum(1.0 - yo, 0.0)
    if kind == "hinge":
        ref_loss, dout = margin.sum() / n, np.where(1.0 - yo > 0, -y, 0.0) / n
    else:
        ref_loss, dout = (margin ** 2).sum() / n, -2.0 * margin * y / n
    m = OneStep(cpu, tsched, kind, W0)
    try:
        m.step(x, y.astype(np.float32))
        assert G.ggml_opt_result_loss(m.result)["loss"] == pytest.approx(ref_loss, rel=1e-5, abs=1e-7)
        grad = (W0.astype(np.float64) - m.weights()) / LR
        np.testing.assert_allclose(grad, dout * x, rtol=2e-4, atol=1e-7)
        np.testing.assert_array_equal(grad[yo > 1], 0.0)  # the margin met: the weights did not move
    finally:
        m.free()


def test_weighted_mse_per_sample(cpu, tsched, trng):
    w = trng.uniform(0, 2, (N, 1)).astype(np.float32)
    w[1] = 0.0  # a masked sample: no gradient, and the mean is still over all N*F elements
    _check("weighted_mse", cpu, tsched, trng, w=w, loss_mask_ne0=1)


def test_weighted_mse_per_sample_is_the_default_width(cpu, tsched, trng):
    w = trng.uniform(0, 2, (N, 1)).astype(np.float32)
    _check("weighted_mse", cpu, tsched, trng, w=w, loss_mask_ne0=None)


def test_weighted_mse_per_element(cpu, tsched, trng):
    w = (trng.uniform(0, 1, (N, F)) > 0.4).astype(np.float32) * trng.uniform(0.5, 2, (N, F)).astype(np.float32)
    _check("weighted_mse", cpu, tsched, trng, w=w, loss_mask_ne0=F)


def test_weighted_mse_rejects_other_mask_widths(cpu, tsched):
    net = Net(cpu)
    try:
        x = net.leaf((N, F))
        W = net.leaf((N, F), np.ones((N, F)), param=True)
        net.alloc()
        out = G.ggml_mul(net.ctx, x, W)
        with pytest.raises(ValueError, match=r"loss_mask_ne0.*got 2"):
            G.ggml_opt_init_for_fit(tsched, LOSS["weighted_mse"], SGD, 1, net.ctx, x, out, loss_mask_ne0=2)
    finally:
        net.free()


def test_binary_cross_entropy_squeezes_probabilities(cpu, tsched):
    """p = 0 and p = 1 stay finite: p' = p (1 - 2 eps) + eps with eps = 1e-7."""
    x = np.array([[0.0, 1.0, 0.5], [1.0, 0.0, 0.25], [0.0, 0.5, 1.0], [0.75, 1.0, 0.0]], dtype=np.float32)
    y = np.array([[0, 1, 1], [0, 1, 0], [1, 0, 1], [1, 1, 0]], dtype=np.float32)  # includes y=1 at p=0 and y=0 at p=1
    W0 = np.ones((N, F), dtype=np.float32)
    m = OneStep(cpu, tsched, "binary_cross_entropy", W0)
    try:
        m.step(x, y)
        ref_loss, dout = loss_and_dout("binary_cross_entropy", x.astype(np.float64), y.astype(np.float64))
        loss = G.ggml_opt_result_loss(m.result)["loss"]
        assert np.isfinite(loss)
        assert loss == pytest.approx(ref_loss, rel=1e-4)
        grad = (W0.astype(np.float64) - m.weights()) / LR
        assert np.all(np.isfinite(grad))
        np.testing.assert_allclose(grad, dout * x, rtol=1e-3, atol=1e-6)
    finally:
        m.free()


@pytest.mark.parametrize("kind", ["mean", "cross_entropy", "mse", "mae", "huber", "binary_cross_entropy"])
def test_accumulation_scaling(kind, cpu, tsched, trng):
    """With opt_period 2 the per-batch loss is scaled by 1/2 for the gradient but reported unscaled,
    and two evals of the same batch step once by the (averaged) gradient of one."""
    x, W0, y = _data(kind, trng)
    m = OneStep(cpu, tsched, kind, W0, opt_period=2)
    try:
        labels = y if kind in LABELLED else None
        m.step(x, labels)
        np.testing.assert_array_equal(m.weights(), W0)  # accumulation only
        ref_loss, dout = loss_and_dout(kind, x.astype(np.float64) * W0, y.astype(np.float64))
        assert G.ggml_opt_result_loss(m.result)["loss"] == pytest.approx(ref_loss, rel=1e-5)
        assert float(G.ggml_backend_tensor_get_data(G.ggml_opt_loss(m.opt))[0]) == pytest.approx(ref_loss / 2,
                                                                                                rel=1e-5)
        m.step(x, labels)
        grad = (W0.astype(np.float64) - m.weights()) / LR
        np.testing.assert_allclose(grad, dout * x, rtol=2e-4, atol=2e-7)
        assert G.ggml_opt_result_loss(m.result)["loss"] == pytest.approx(ref_loss, rel=1e-5)
    finally:
        m.free()


def test_two_heads_weighted_sum(cpu, tsched, trng):
    """Multi-head: total = 0.3 * MAE(head 1) + 2 * CE(head 2); each head's loss is readable unweighted."""
    net = Net(cpu)
    try:
        x1 = net.leaf((N, F))
        W1_0 = trng.uniform(0.5, 1.5, (N, F)).astype(np.float32)
        W2_0 = trng.uniform(0.5, 1.5, (N, F)).astype(np.float32)
        W1 = net.leaf((N, F), W1_0, param=True)
        W2 = net.leaf((N, F), W2_0, param=True)
        net.alloc()
        h1, h2 = G.ggml_mul(net.ctx, x1, W1), G.ggml_mul(net.ctx, x1, W2)
        fit = G.ggml_opt_init_for_fit_multi(tsched, [LOSS["mae"], LOSS["cross_entropy"]], [0.3, 2.0], None, SGD, 1,
                                            net.ctx, x1, [h1, h2])
        opt = fit["opt_ctx"]
        G.ggml_opt_set_lr(fit["lr_ud"], sgd_lr=LR)
        x = trng.uniform(0.2, 0.9, (N, F)).astype(np.float32)
        y1 = trng.uniform(-1, 2, (N, F)).astype(np.float32)
        y2 = np.eye(F, dtype=np.float32)[trng.integers(0, F, N)]
        result = G.ggml_opt_result_init()
        G.ggml_opt_alloc(opt, True)
        net.set(x1, x)
        net.set(G.ggml_opt_labels_i(opt, 1), y1)
        net.set(G.ggml_opt_labels_i(opt, 2), y2)
        G.ggml_opt_eval(opt, result)
        xd = x.astype(np.float64)
        l1, d1 = loss_and_dout("mae", xd * W1_0, y1.astype(np.float64))
        l2, d2 = loss_and_dout("cross_entropy", xd * W2_0, y2.astype(np.float64))
        assert float(G.ggml_backend_tensor_get_data(G.ggml_opt_loss_i(opt, 1))[0]) == pytest.approx(l1, rel=1e-5)
        assert float(G.ggml_backend_tensor_get_data(G.ggml_opt_loss_i(opt, 2))[0]) == pytest.approx(l2, rel=1e-5)
        assert G.ggml_opt_result_loss(result)["loss"] == pytest.approx(0.3 * l1 + 2.0 * l2, rel=1e-5)
        np.testing.assert_allclose((W1_0 - Net.get(W1).astype(np.float64)) / LR, 0.3 * d1 * xd, rtol=2e-4, atol=2e-7)
        np.testing.assert_allclose((W2_0 - Net.get(W2).astype(np.float64)) / LR, 2.0 * d2 * xd, rtol=2e-4, atol=2e-7)
        result.free()
        opt.free()
    finally:
        net.free()


# ---------------------------------------------------------------- trainability of sigmoid -> BCE
#
# ggml 0.20.2 has no backward pass for SIGMOID; patches/0004 adds it. Checked against numpy here.

def test_sigmoid_before_bce_gradient(cpu, tsched, trng):
    x = trng.uniform(-1, 1, (N, F)).astype(np.float32)
    W0 = trng.uniform(-2, 2, (N, F)).astype(np.float32)
    y = (trng.uniform(0, 1, (N, F)) > 0.5).astype(np.float32)
    net = Net(cpu)
    try:
        xt = net.leaf((N, F))
        Wt = net.leaf((N, F), W0, param=True)
        net.alloc()
        p = G.ggml_sigmoid(net.ctx, G.ggml_mul(net.ctx, xt, Wt))
        fit = G.ggml_opt_init_for_fit(tsched, LOSS["binary_cross_entropy"], SGD, 1, net.ctx, xt, p)
        G.ggml_opt_set_lr(fit["lr_ud"], sgd_lr=LR)
        result = G.ggml_opt_result_init()
        G.ggml_opt_alloc(fit["opt_ctx"], True)
        net.set(xt, x)
        net.set(G.ggml_opt_labels(fit["opt_ctx"]), y)
        G.ggml_opt_eval(fit["opt_ctx"], result)
        z = x.astype(np.float64) * W0
        s = 1 / (1 + np.exp(-z))
        ref_loss, dp = loss_and_dout("binary_cross_entropy", s, y.astype(np.float64))
        assert G.ggml_opt_result_loss(result)["loss"] == pytest.approx(ref_loss, rel=1e-5)
        np.testing.assert_allclose((W0 - Net.get(Wt).astype(np.float64)) / LR, dp * s * (1 - s) * x,
                                   rtol=1e-3, atol=1e-6)
        result.free()
        fit["opt_ctx"].free()
    finally:
        net.free()
