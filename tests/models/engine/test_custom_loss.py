"""A custom loss written with ggmlpy ops, ``ggml_compile(loss=fn)``: its training trajectory, evaluation and
sample weighting against float64 numpy, on the CPU and Vulkan; what it may return, and what it cannot do
(be saved in a model file or a pickle)."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

import ggmlpy as g


LR = 0.1


def log_cosh(ctx, y, p):
    e = g.ggml_sub(ctx, p, y)
    return g.ggml_log(ctx, g.ggml_scale(ctx, g.ggml_add(ctx, g.ggml_exp(ctx, e), g.ggml_exp(ctx, g.ggml_neg(ctx, e))),
                                        0.5))


def per_sample_sq(ctx, y, p):
    """Each sample's summed squared error: [1, batch]."""
    return g.ggml_sum_rows(ctx, g.ggml_sqr(ctx, g.ggml_sub(ctx, p, y)))


def _data(n=24, seed=4):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    return x, (x @ rng.normal(size=(4, 2)) + 0.5).astype(np.float32)


def _model(loss, backend="cpu", **kw):
    np.random.seed(9)
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 2, input_shape=(4,), name="d")
    return g.ggml_compile(m, optimizer="sgd", loss=loss, metrics=[], backend=backend, learning_rate=LR, **kw)


@pytest.fixture
def backend(each_device):
    return each_device


def test_a_custom_loss_trains_and_evaluates_as_numpy_says(backend):
    x, y = _data()
    m = _model(log_cosh, backend)
    w0 = g.ggml_get_weights(m)
    h = g.ggml_fit(m, x, y, epochs=2, batch_size=8, shuffle=False, verbose=0)
    W, b = w0["d.weight"].astype(np.float64), w0["d.bias"].astype(np.float64)
    losses = []
    for _ in range(2):
        epoch = []
        for i in range(0, 24, 8):
            xb, yb = x[i:i + 8].astype(np.float64), y[i:i + 8]
            e = xb @ W + b - yb
            epoch.append(np.log(np.cosh(e)).mean())
            d = np.tanh(e) / e.size
            W, b = W - LR * xb.T @ d, b - LR * d.sum(axis=0)
        losses.append(np.mean(epoch))
    got = g.ggml_get_weights(m)
    np.testing.assert_allclose(got["d.weight"], W, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(got["d.bias"], b, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(h["train_loss"], losses, rtol=2e-5)
    assert m.compiled.heads[0].loss == "log_cosh"
    p = g.ggml_predict(m, x).astype(np.float64)
    assert g.ggml_evaluate(m, x, y)["loss"] == pytest.approx(np.log(np.cosh(p - y)).mean(), rel=1e-5)


def test_per_sample_values_take_sample_weights_and_validation():
    x, y = _data()
    w = np.linspace(0.0, 2.0, len(x)).astype(np.float32)
    m = _model(per_sample_sq)
    p = g.ggml_predict(m, x).astype(np.float64)
    per = ((p - y) ** 2).sum(axis=1)
    assert g.ggml_evaluate(m, x, y)["loss"] == pytest.approx(per.mean(), rel=1e-5)
    assert g.ggml_evaluate(m, x, y, sample_weight=w)["loss"] == pytest.approx((per * w).mean(), rel=1e-5)
    h = g.ggml_fit(m, x, y, epochs=2, batch_size=8, sample_weight=w, validation_split=0.25, verbose=0)
    assert np.isfinite(h["val_loss"]).all() and h["train_loss"].iloc[-1] < h["train_loss"].iloc[0]


def test_a_scalar_result_is_the_batch_loss_but_cannot_weigh_samples():
    def mean_abs(ctx, y, p):
        return g.ggml_scale(ctx, g.ggml_sum(ctx, g.ggml_abs(ctx, g.ggml_sub(ctx, p, y))), 1.0 / 16)
    x, y = _data()
    m = _model(g.ggml_opt_loss_custom(mean_abs, name="half_mae"))
    p = g.ggml_predict(m, x[:8]).astype(np.float64)
    assert g.ggml_evaluate(m, x[:8], y[:8], batch_size=8)["loss"] == pytest.approx(np.abs(p - y[:8]).sum() / 16,
                                                                                    rel=1e-5)
    assert "half_mae" == m.compiled.heads[0].loss
    with pytest.raises(g.GgmlValueError, match="returns one value per batch, so sample weights cannot weigh"):
        g.ggml_fit(m, x, y, epochs=1, batch_size=8, sample_weight=np.ones(len(x)), verbose=0)


@pytest.mark.parametrize("fn, error, match", [
    (lambda ctx, y, p: 1.0, g.GgmlTypeError, "returned float; it must return a tensor"),
    (lambda ctx, y, p: g.ggml_sum_rows(ctx, g.ggml_cont(ctx, g.ggml_transpose(ctx, p))), g.GgmlValueError,
     r"returned shape \[1, 2, 1, 1\]: expected a scalar or a tensor whose last axis is the batch \(8\)"),
    (lambda ctx, y, p: g.ggml_sub(ctx, p, g.ggml_transpose(ctx, y)), g.GgmlValueError, "the custom loss '<lambda>'"),
])
def test_what_a_custom_loss_returns_is_checked(fn, error, match):
    """On the real batch at the fit (compile builds the loss on stand-in outputs for the backward check, and leaves
    what it cannot build there to the fit: a loss may depend on the batch size)."""
    x, y = _data()
    m = _model(fn)
    with pytest.raises(error, match=match):
        g.ggml_fit(m, x, y, epochs=1, batch_size=8, verbose=0)
    # the model is left usable: a good loss trains it
    m = _model(log_cosh)
    g.ggml_fit(m, x, y, epochs=1, batch_size=8, verbose=0)


def test_a_custom_loss_is_called_as_fn_ctx_y_true_y_pred():
    with pytest.raises(g.GgmlTypeError, match=r"called as fn\(ctx, y_true, y_pred\), but its signature is \(y, p\)"):
        _model(lambda y, p: p)
    with pytest.raises(g.GgmlTypeError, match="fn must be a function"):
        g.ggml_opt_loss_custom("mse")
    with pytest.raises(g.GgmlValueError, match="trained with the custom loss 'log_cosh'"):
        _model(log_cosh, from_logits=True)


def test_a_model_with_a_custom_loss_saves_its_weights_but_not_itself(tmp_path):
    x, y = _data()
    m = _model(log_cosh)
    g.ggml_fit(m, x, y, epochs=1, batch_size=8, verbose=0)
    with pytest.raises(g.GgmlValueError, match=r"output\(s\) \['d'\] are trained with custom losses"):
        g.ggml_save_model(m, tmp_path / "m.gguf")
    with pytest.raises(g.GgmlValueError, match="custom losses"):
        pickle.dumps(m)
    g.ggml_save_weights(m, tmp_path / "w.gguf")
    again = g.ggml_load_weights(_model(log_cosh), tmp_path / "w.gguf")
    np.testing.assert_array_equal(g.ggml_get_weights(again)["d.weight"], g.ggml_get_weights(m)["d.weight"])


def test_a_custom_loss_beside_a_named_one_in_a_multi_output_model():
    a = g.ggml_input(shape=(4,))
    h = g.ggml_layer_dense(a, 6, activation="tanh")
    out1, out2 = g.ggml_layer_dense(h, 2, name="one"), g.ggml_layer_dense(h, 2, name="two")
    m = g.ggml_compile(g.ggml_model(a, [out1, out2]), loss={"one": log_cosh, "two": "mse"}, loss_weights=[2.0, 1.0],
                       backend="cpu", metrics=[])
    x, y = _data()
    p1, p2 = (o.astype(np.float64) for o in g.ggml_predict(m, x))
    want = 2.0 * np.log(np.cosh(p1 - y)).mean() + ((p2 - y) ** 2).mean()
    assert g.ggml_evaluate(m, x, [y, y])["loss"] == pytest.approx(want, rel=1e-5)
    hist = g.ggml_fit(m, x, [y, y], epochs=3, batch_size=8, verbose=0)
    assert hist["train_loss"].iloc[-1] < hist["train_loss"].iloc[0]


def _clipped_bce(ctx, y, p):
    """Keras' binary cross-entropy written as a user would with ops.clip (ggml_clamp, patches/0055)."""
    q = g.ggml_clamp(ctx, p, 1e-7, 1 - 1e-7)
    pos = g.ggml_mul(ctx, y, g.ggml_log(ctx, q))
    neg = g.ggml_mul(ctx, g.ggml_scale_bias(ctx, y, -1.0, 1.0), g.ggml_log(ctx, g.ggml_scale_bias(ctx, q, -1.0, 1.0)))
    return g.ggml_scale(ctx, g.ggml_add(ctx, pos, neg), -1.0)


def test_a_clamp_in_a_custom_loss_trains_and_its_output_takes_probability_metrics():
    """ops.clip in a custom loss failed at ggml_fit (no backward for CLAMP); and metrics=["auc", "precision"] were
    refused for a custom loss's output, which Keras computes on any output."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.float32)
    np.random.seed(1)
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 1, activation="sigmoid", input_shape=(3,))
    m = g.ggml_compile(m, loss=_clipped_bce, optimizer="sgd", learning_rate=0.5, metrics=["auc", "precision"],
                       backend="cpu")
    p0 = g.ggml_predict(m, x).ravel().astype(np.float64)
    h = g.ggml_fit(m, x, y, epochs=20, batch_size=64, shuffle=False, verbose=0)
    want0 = -np.mean(y * np.log(np.clip(p0, 1e-7, 1 - 1e-7)) + (1 - y) * np.log(1 - np.clip(p0, 1e-7, 1 - 1e-7)))
    assert h["train_loss"].iloc[0] == pytest.approx(want0, rel=1e-4)
    assert h["train_loss"].iloc[-1] < 0.8 * h["train_loss"].iloc[0] and h["train_auc"].iloc[-1] > 0.9


def test_a_custom_loss_that_depends_on_the_batch_size_compiles():
    """A loss written for batches of 8 (a reshape to [2, 8]) cannot be built on compile's stand-in outputs: compile
    leaves it to the fit, which builds it on the real batch (it was refused at compile for a while)."""
    x, y = _data()

    def per_row_of_8(ctx, t, p):
        return g.ggml_reshape_2d(ctx, g.ggml_sqr(ctx, g.ggml_sub(ctx, p, t)), 2, 8)
    m = _model(per_row_of_8)
    assert np.isfinite(g.ggml_fit(m, x, y, epochs=1, batch_size=8, verbose=0)["train_loss"]).all()


def test_a_custom_loss_ggml_cannot_train_through_is_refused_at_compile():
    def leaky(ctx, y, p):
        return g.ggml_leaky_relu(ctx, g.ggml_sub(ctx, p, y), 0.1, False)
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 1, input_shape=(3,))
    with pytest.raises(g.GgmlValueError, match="the custom loss 'leaky' cannot be trained through.*LEAKY_RELU"):
        g.ggml_compile(m, loss=leaky, backend="cpu")
