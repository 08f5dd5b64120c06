"""Keras' weight regularizers (kernel_regularizer=, bias_regularizer=, recurrent_regularizer=,
embeddings_regularizer=): the penalty joins the loss that trains and the loss that is reported, checked against
float64 numpy and Keras where installed, on the CPU and Vulkan; saved with the model; frozen weights add none."""
from __future__ import annotations

import os

import numpy as np
import pytest

import ggmlpy as g


LR = 0.1


def _data(seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(16, 4)).astype(np.float32), rng.normal(size=(16, 3)).astype(np.float32)


def _linear(backend="cpu", reg=None, bias_reg=None):
    np.random.seed(1)
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 3, input_shape=(4,), name="d", kernel_regularizer=reg,
                           bias_regularizer=bias_reg)
    return g.ggml_compile(m, optimizer="sgd", loss="mse", metrics=[], backend=backend, learning_rate=LR)


@pytest.fixture
def backend(each_device):
    return each_device


def test_the_penalty_trains_and_is_reported_as_numpy_says(backend):
    x, y = _data()
    l1, l2, lb = 0.03, 0.05, 0.02
    m = _linear(backend, g.ggml_regularizer_l1_l2(l1, l2), g.ggml_regularizer_l1(lb))
    w0 = g.ggml_get_weights(m)
    W, b = w0["d.weight"].astype(np.float64), w0["d.bias"].astype(np.float64)
    losses = []
    for i in (0, 8):
        xb, yb = x[i:i + 8].astype(np.float64), y[i:i + 8]
        e = xb @ W + b - yb
        losses.append((e ** 2).mean() + l1 * np.abs(W).sum() + l2 * (W ** 2).sum() + lb * np.abs(b).sum())
        gW = 2 * xb.T @ e / e.size + l1 * np.sign(W) + 2 * l2 * W
        gb = 2 * e.sum(axis=0) / e.size + lb * np.sign(b)
        W, b = W - LR * gW, b - LR * gb
    h = g.ggml_fit(m, x, y, epochs=1, batch_size=8, shuffle=False, verbose=0)
    got = g.ggml_get_weights(m)
    np.testing.assert_allclose(got["d.weight"], W, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(got["d.bias"], b, rtol=2e-5, atol=2e-6)
    assert h["train_loss"].iloc[0] == pytest.approx(np.mean(losses), rel=2e-5)
    e = x @ W + b - y
    want = (e ** 2).mean() + l1 * np.abs(W).sum() + l2 * (W ** 2).sum() + lb * np.abs(b).sum()
    assert g.ggml_evaluate(m, x, y)["loss"] == pytest.approx(want, rel=2e-5)


def test_an_mlp_with_regularizers_trains_as_keras():
    os.environ.setdefault("KERAS_BACKEND", "torch")
    keras = pytest.importorskip("keras", reason="Keras 3 (with a backend) is not installed: the numpy check "
                                               "above still runs")
    x, y = _data(3)
    np.random.seed(2)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 5, activation="tanh", input_shape=(4,), name="h", kernel_regularizer="l2",
                           bias_regularizer=g.ggml_regularizer_l1(0.02))
    m = g.ggml_layer_dense(m, 3, name="o", kernel_regularizer=g.ggml_regularizer_l1_l2(0.02, 0.03))
    m = g.ggml_compile(m, optimizer="sgd", loss="mse", metrics=[], backend="cpu", learning_rate=LR)
    w0 = g.ggml_get_weights(m)
    R = keras.regularizers
    km = keras.Sequential([keras.Input((4,)),
                           keras.layers.Dense(5, activation="tanh", kernel_regularizer="l2",
                                              bias_regularizer=R.L1(0.02)),
                           keras.layers.Dense(3, kernel_regularizer=R.L1L2(0.02, 0.03))])
    km.set_weights([w0["h.weight"], w0["h.bias"], w0["o.weight"], w0["o.bias"]])
    km.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    kh = km.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0, validation_data=(x, y)).history
    h = g.ggml_fit(m, x, y, epochs=3, batch_size=8, shuffle=False, verbose=0, validation_data=(x, y))
    np.testing.assert_allclose(h["train_loss"], kh["loss"], rtol=1e-5)
    np.testing.assert_allclose(h["val_loss"], kh["val_loss"], rtol=1e-5)
    got = g.ggml_get_weights(m)
    for k, want in zip(("h.weight", "h.bias", "o.weight", "o.bias"), km.get_weights()):
        np.testing.assert_allclose(got[k], want, rtol=1e-5, atol=1e-6, err_msg=k)


def test_frozen_layers_add_no_penalty_and_settings_are_saved(tmp_path):
    x, y = _data()
    m = _linear(reg="l2")
    plain = _linear()
    g.ggml_freeze_weights(m)
    g.ggml_freeze_weights(plain)
    assert g.ggml_evaluate(m, x, y)["loss"] == pytest.approx(g.ggml_evaluate(plain, x, y)["loss"], rel=1e-7)
    g.ggml_unfreeze_weights(m)
    g.ggml_unfreeze_weights(plain)
    assert g.ggml_evaluate(m, x, y)["loss"] > g.ggml_evaluate(plain, x, y)["loss"]
    g.ggml_save_model(m, tmp_path / "m.gguf")
    loaded = g.ggml_load_model(tmp_path / "m.gguf", backend="cpu")
    assert loaded.layers[0].regularizers == {"weight": g.ggml_regularizer_l2(0.01)}
    assert g.ggml_evaluate(loaded, x, y)["loss"] == pytest.approx(g.ggml_evaluate(m, x, y)["loss"], rel=1e-6)


def test_recurrent_and_embedding_weights_take_their_regularizers():
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 10, (8, 5))
    y = rng.normal(size=(8, 2)).astype(np.float32)
    t = g.ggml_input(shape=(5,), dtype="int32")
    e = g.ggml_layer_embedding(t, 10, 3, embeddings_regularizer="l1", name="emb")
    r = g.ggml_layer_lstm(e, 4, kernel_regularizer="l2", recurrent_regularizer="l2", name="rnn")
    m = g.ggml_compile(g.ggml_model(t, g.ggml_layer_dense(r, 2, name="o")), loss="mse", metrics=[], backend="cpu")
    w = g.ggml_get_weights(m)
    p = g.ggml_predict(m, ids).astype(np.float64)
    want = ((p - y) ** 2).mean() + 0.01 * np.abs(w["emb.weight"]).sum() + \
        0.01 * ((w["rnn.kernel"].astype(np.float64) ** 2).sum()
                + (w["rnn.recurrent_kernel"].astype(np.float64) ** 2).sum())
    assert g.ggml_evaluate(m, ids, y)["loss"] == pytest.approx(want, rel=1e-5)
    h = g.ggml_fit(m, ids, y, epochs=2, batch_size=4, verbose=0)
    assert np.isfinite(h["train_loss"]).all()


@pytest.mark.parametrize("make, error, match", [
    (lambda: g.ggml_regularizer_l2(-1.0), g.GgmlValueError, "l2 must be a finite number >= 0"),
    (lambda: g.ggml_regularizer_l1(float("nan")), g.GgmlValueError, "l1 must be a finite number >= 0"),
    (lambda: g.ggml_layer_dense(g.ggml_model_sequential(), 3, kernel_regularizer="l3"), g.GgmlValueError,
     "unknown regularizer 'l3'"),
    (lambda: g.ggml_layer_dense(g.ggml_model_sequential(), 3, kernel_regularizer=0.01), g.GgmlTypeError,
     "expected None, 'l1', 'l2' or a ggml_regularizer"),
    (lambda: g.ggml_layer_dense(g.ggml_model_sequential(), 3, kernel_regularizer="l1l2"), g.GgmlValueError,
     "Keras' 'l1l2' is L1L2\\(\\) with both factors 0"),
    (lambda: g.ggml_layer_dense(g.ggml_model_sequential(), 3, recurrent_regularizer="l2"), TypeError,
     "recurrent_regularizer"),
])
def test_regularizer_arguments_are_checked(make, error, match):
    with pytest.raises(error, match=match):
        make()
