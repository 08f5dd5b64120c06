"""Keras' wrappers: TimeDistributed (one layer on every step) and Bidirectional (an LSTM/GRU both ways), and the
recurrent layers' go_backwards: forward passes against the float64 references of tests/helpers/layer_refs.py,
training against Keras where installed, on the CPU and Vulkan; saving, and wrapping refused where it cannot work.
Gradients (finite differences of the references, and Vulkan's against the CPU's): test_sequence_layers.py."""
from __future__ import annotations

import os

import numpy as np
import pytest

import ggmlpy as g
from tests.helpers import layer_refs as R


@pytest.fixture
def backend(each_device):
    return each_device


def _seq(n=8, steps=5, f=3, seed=0):
    return np.random.default_rng(seed).normal(size=(n, steps, f)).astype(np.float32)


def test_time_distributed_dense_and_conv_1d_apply_one_layer_per_step(backend):
    x = _seq()
    np.random.seed(1)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_time_distributed(m, g.ggml_dense(4, activation="tanh"), input_shape=(5, 3), name="td")
    m = g.ggml_compile(m, loss="mse", metrics=[], backend=backend)
    w = g.ggml_get_weights(m)
    want = np.stack([R.dense(x[:, t], w["td.weight"], w["td.bias"], "tanh") for t in range(5)], axis=1)
    np.testing.assert_allclose(g.ggml_predict(m, x), want, rtol=1e-5, atol=1e-6)
    images = np.random.default_rng(2).normal(size=(4, 3, 7, 2)).astype(np.float32)   # (steps, length, channels)
    c = g.ggml_model_sequential()
    c = g.ggml_layer_time_distributed(c, g.ggml_conv_1d(5, 3, activation="relu"), input_shape=(3, 7, 2), name="tc")
    c = g.ggml_compile(c, loss="mse", metrics=[], backend=backend)
    w = g.ggml_get_weights(c)
    want = np.stack([R.activation(R.conv1d(images[:, t], w["tc.kernel"], w["tc.bias"]), "relu") for t in range(3)],
                    axis=1)
    np.testing.assert_allclose(g.ggml_predict(c, images), want, rtol=1e-5, atol=1e-6)
    h = g.ggml_fit(c, images, want * 0.5, epochs=2, batch_size=2, verbose=0)
    assert h["train_loss"].iloc[-1] < h["train_loss"].iloc[0]


@pytest.mark.parametrize("rnn", ["lstm", "gru"])
@pytest.mark.parametrize("return_sequences", [False, True])
@pytest.mark.parametrize("merge_mode", ["concat", "sum", "mul", "ave"])
def test_bidirectional_runs_a_forward_and_a_backward_copy(rnn, return_sequences, merge_mode, backend):
    x = _seq()
    np.random.seed(3)
    inner = (g.ggml_lstm if rnn == "lstm" else g.ggml_gru)(4, return_sequences=return_sequences)
    m = g.ggml_layer_bidirectional(g.ggml_model_sequential(), inner, merge_mode=merge_mode, input_shape=(5, 3),
                                   name="bi")
    m = g.ggml_compile(m, loss="mse", metrics=[], backend=backend)
    w = g.ggml_get_weights(m)
    want = R.bidirectional(x, w, "bi", R.lstm if rnn == "lstm" else R.gru, return_sequences, merge_mode)
    np.testing.assert_allclose(g.ggml_predict(m, x), want, rtol=1e-5, atol=1e-6)


def test_go_backwards_reads_the_steps_last_to_first():
    x = _seq()
    np.random.seed(4)
    m = g.ggml_layer_lstm(g.ggml_model_sequential(), 3, return_sequences=True, go_backwards=True, input_shape=(5, 3),
                          name="r")
    m = g.ggml_compile(m, loss="mse", metrics=[], backend="cpu")
    w = g.ggml_get_weights(m)
    want = R.lstm(x[:, ::-1], w["r.kernel"], w["r.recurrent_kernel"], w["r.bias"], True)  # in processing order
    np.testing.assert_allclose(g.ggml_predict(m, x), want, rtol=1e-5, atol=1e-6)


def test_wrapped_layers_train_as_keras_and_save():
    os.environ.setdefault("KERAS_BACKEND", "torch")
    keras = pytest.importorskip("keras", reason="Keras 3 (with a backend) is not installed: the numpy references "
                                               "above and test_sequence_layers.py's gradient checks still run")
    x = _seq(n=16)
    y = np.random.default_rng(5).normal(size=(16, 5, 2)).astype(np.float32)
    np.random.seed(6)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_bidirectional(m, g.ggml_gru(3, return_sequences=True), input_shape=(5, 3), name="bi")
    m = g.ggml_layer_time_distributed(m, g.ggml_dense(2), name="td")
    m = g.ggml_compile(m, optimizer="sgd", loss="mse", metrics=[], backend="cpu", learning_rate=0.1)
    w = g.ggml_get_weights(m)
    names = [f"bi.{d}_{k}" for d in ("forward", "backward") for k in ("kernel", "recurrent_kernel", "bias")] + \
        ["td.weight", "td.bias"]
    km = keras.Sequential([keras.Input((5, 3)), keras.layers.Bidirectional(keras.layers.GRU(3, return_sequences=True)),
                           keras.layers.TimeDistributed(keras.layers.Dense(2))])
    km.set_weights([w[k] for k in names])
    km.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    kh = km.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0).history
    h = g.ggml_fit(m, x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
    np.testing.assert_allclose(h["train_loss"], kh["loss"], rtol=1e-5)
    got = g.ggml_get_weights(m)
    for k, want in zip(names, km.get_weights()):
        np.testing.assert_allclose(got[k], want, rtol=1e-5, atol=1e-6, err_msg=k)


def test_a_saved_model_rebuilds_its_wrappers(tmp_path):
    x = _seq()
    m = g.ggml_model_sequential()
    m = g.ggml_layer_bidirectional(m, g.ggml_lstm(3, return_sequences=True, kernel_regularizer="l2"),
                                   merge_mode="ave", input_shape=(5, 3))
    m = g.ggml_layer_time_distributed(m, g.ggml_dense(2, activation="softmax"))
    m = g.ggml_compile(m, loss="categorical_crossentropy", backend="cpu")
    y = np.eye(2, dtype=np.float32)[np.random.default_rng(0).integers(0, 2, (8, 5))]
    g.ggml_fit(m, x, y, epochs=1, batch_size=4, verbose=0)
    assert m.compiled.heads[0].fused  # the inner softmax is left to the fused cross-entropy
    g.ggml_save_model(m, tmp_path / "m.gguf", include_optimizer=True)
    loaded = g.ggml_load_model(tmp_path / "m.gguf", backend="cpu")
    np.testing.assert_allclose(g.ggml_predict(loaded, x), g.ggml_predict(m, x), rtol=1e-6)
    assert g.ggml_evaluate(loaded, x, y)["loss"] == pytest.approx(g.ggml_evaluate(m, x, y)["loss"], rel=1e-6)


@pytest.mark.parametrize("make, match", [
    (lambda: g.ggml_layer_bidirectional(g.ggml_model_sequential(), g.ggml_dense(3)), "wraps a recurrent layer"),
    (lambda: g.ggml_layer_bidirectional(g.ggml_model_sequential(), g.ggml_lstm(3, go_backwards=True)),
     "give the forward layer"),
    (lambda: g.ggml_layer_bidirectional(g.ggml_model_sequential(), g.ggml_lstm(3), merge_mode="max"),
     "merge_mode must be one of"),
    (lambda: g.ggml_layer_time_distributed(g.ggml_model_sequential(), g.ggml_dropout(0.5)),
     "a dropout drops each value on its own"),
    (lambda: g.ggml_layer_time_distributed(g.ggml_model_sequential(), "dense"), "expected a layer object to wrap"),
])
def test_wrapping_what_cannot_work_is_refused(make, match):
    with pytest.raises((g.GgmlValueError, g.GgmlTypeError), match=match):
        make()


def test_a_layer_object_is_wrapped_once_and_shapes_are_checked():
    dense = g.ggml_dense(3)
    g.ggml_time_distributed(dense)
    with pytest.raises(g.GgmlValueError, match="already part of a model or a wrapper"):
        g.ggml_time_distributed(dense)
    with pytest.raises(g.GgmlValueError, match=r"takes sequences \(steps, \.\.\.\)"):
        g.ggml_layer_time_distributed(g.ggml_model_sequential(), g.ggml_dense(3), input_shape=(4,))
