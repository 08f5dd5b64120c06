"""Keras' return_state and initial_state on LSTM/GRU: ``[output, state_h(, state_c)]`` nodes, and an
encoder's final states starting a decoder (seq2seq); against the float64 references and Keras 3 where
installed, on the CPU and Vulkan; saved and loaded; misuse refused.
Gradients (finite differences of the references, and Vulkan's against the CPU's): test_sequence_layers.py."""
from __future__ import annotations

import os

import numpy as np
import pytest

import ggmlpy as g
from tests.helpers import layer_refs as R


N, T, F, U = 6, 5, 3, 4


@pytest.fixture
def backend(each_device):
    return each_device


def _lstm_states(x, kernel, recurrent_kernel, bias, h=None, c=None):
    """Keras' LSTM from the state (h, c): [every step's h, final h, final c], float64."""
    return R.lstm(x, kernel, recurrent_kernel, bias, True, initial_state=None if h is None else [h, c],
                  return_state=True)


def _data(seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(N, T, F)).astype(np.float32), rng.normal(size=(N, T + 1, F)).astype(np.float32)


def test_return_state_gives_the_output_and_the_final_states(backend):
    x, _ = _data()
    np.random.seed(1)
    inp = g.ggml_input(shape=(T, F))
    out, h, c = g.ggml_layer_lstm(inp, U, return_sequences=True, return_state=True, name="r")
    assert (out.shape, h.shape, c.shape) == ((T, U), (U,), (U,))
    m = g.ggml_compile(g.ggml_model(inp, [out, h, c]), loss="mse", metrics=[], backend=backend)
    w = g.ggml_get_weights(m)
    want = _lstm_states(x, w["r.kernel"], w["r.recurrent_kernel"], w["r.bias"])
    for got, ref in zip(g.ggml_predict(m, x), want):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    inp = g.ggml_input(shape=(T, F))
    parts = g.ggml_layer_gru(inp, U, return_state=True, name="q")
    assert len(parts) == 2
    m = g.ggml_compile(g.ggml_model(inp, parts), loss="mse", metrics=[], backend=backend)
    w = g.ggml_get_weights(m)
    last = R.gru(x, w["q.kernel"], w["q.recurrent_kernel"], w["q.bias"])
    for got in g.ggml_predict(m, x):
        np.testing.assert_allclose(got, last, rtol=1e-5, atol=1e-6)


def test_an_encoders_states_start_a_decoder(backend):
    xe, xd = _data()
    np.random.seed(2)
    ie, idec = g.ggml_input(shape=(T, F)), g.ggml_input(shape=(T + 1, F))
    _, h, c = g.ggml_layer_lstm(ie, U, return_state=True, name="enc")
    dec = g.ggml_layer_lstm([idec, h, c], U, return_sequences=True, name="dec")
    m = g.ggml_compile(g.ggml_model([ie, idec], dec), optimizer="sgd", loss="mse", metrics=[], backend=backend,
                       learning_rate=0.1)
    w = g.ggml_get_weights(m)
    _, he, ce = _lstm_states(xe, w["enc.kernel"], w["enc.recurrent_kernel"], w["enc.bias"])
    want, _, _ = _lstm_states(xd, w["dec.kernel"], w["dec.recurrent_kernel"], w["dec.bias"], he, ce)
    np.testing.assert_allclose(g.ggml_predict(m, [xe, xd]), want, rtol=1e-5, atol=1e-6)
    y = np.random.default_rng(3).normal(size=(N, T + 1, U)).astype(np.float32)
    before = g.ggml_get_weights(m)["enc.kernel"].copy()
    g.ggml_fit(m, [xe, xd], y, epochs=2, batch_size=3, verbose=0)
    assert not np.allclose(g.ggml_get_weights(m)["enc.kernel"], before)  # the decoder's loss trains the encoder


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_seq2seq_trains_as_keras_and_saves(kind, tmp_path):
    os.environ.setdefault("KERAS_BACKEND", "torch")
    keras = pytest.importorskip("keras", reason="Keras 3 (with a backend) is not installed: the numpy references "
                                               "above and test_sequence_layers.py's gradient checks still run")
    xe, xd = _data(4)
    y = np.random.default_rng(5).normal(size=(N, T + 1, 2)).astype(np.float32)
    np.random.seed(6)
    layer = g.ggml_layer_lstm if kind == "lstm" else g.ggml_layer_gru
    ie, idec = g.ggml_input(shape=(T, F)), g.ggml_input(shape=(T + 1, F))
    states = layer(ie, U, return_state=True, name="enc")[1:]
    dec = layer([idec] + states, U, return_sequences=True, name="dec")
    out = g.ggml_layer_time_distributed(dec, g.ggml_dense(2), name="td")
    m = g.ggml_compile(g.ggml_model([ie, idec], out), optimizer="sgd", loss="mse", metrics=[], backend="cpu",
                       learning_rate=0.1)
    K = keras.layers.LSTM if kind == "lstm" else keras.layers.GRU
    ke, kd = keras.Input((T, F)), keras.Input((T + 1, F))
    enc = K(U, return_state=True)(ke)
    km = keras.Model([ke, kd], keras.layers.TimeDistributed(keras.layers.Dense(2))(
        K(U, return_sequences=True)(kd, initial_state=list(enc[1:]))))
    km.set_weights(list(g.ggml_get_weights(m).values()))
    km.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    kh = km.fit([xe, xd], y, batch_size=3, epochs=3, shuffle=False, verbose=0).history
    h = g.ggml_fit(m, [xe, xd], y, batch_size=3, epochs=3, shuffle=False, verbose=0)
    np.testing.assert_allclose(h["train_loss"], kh["loss"], rtol=1e-5)
    for got, want in zip(g.ggml_get_weights(m).values(), km.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    g.ggml_save_model(m, tmp_path / "m.gguf")
    np.testing.assert_allclose(g.ggml_predict(g.ggml_load_model(tmp_path / "m.gguf", backend="cpu"), [xe, xd]),
                               g.ggml_predict(m, [xe, xd]), rtol=1e-6)


def test_misuse_is_refused_with_the_fix():
    inp = g.ggml_input(shape=(T, F))
    with pytest.raises(g.GgmlTypeError, match="return_state=True gives several outputs"):
        g.ggml_layer_lstm(g.ggml_model_sequential(), U, return_state=True, input_shape=(T, F))
    h = g.ggml_input(shape=(U,))
    with pytest.raises(g.GgmlValueError, match=r"takes a sequence, or \[sequence, initial h, initial c\]"):
        g.ggml_layer_lstm([inp, h], U)
    with pytest.raises(g.GgmlValueError, match=r"each state of shape \(4,\)"):
        g.ggml_layer_gru([inp, g.ggml_input(shape=(U + 1,))], U)
    with pytest.raises(g.GgmlValueError, match="return_state is not supported yet"):
        g.ggml_bidirectional(g.ggml_lstm(U, return_state=True))
    with pytest.raises(g.GgmlValueError, match="return_state must be True or False"):
        g.ggml_lstm(U, return_state=1)
