"""Keras' Masking of padded sequences: recurrent layers carry their state over padding steps, global average
pooling averages the real steps, layers in between pass the mask on, and a layer that cannot honour it drops
it with a warning (Keras 3's behaviour); checked against float64 numpy and Keras 3 where installed, on the CPU
and Vulkan.
Gradients (finite differences of the references, and Vulkan's against the CPU's): test_sequence_layers.py."""
from __future__ import annotations

import os

import numpy as np
import pytest

import ggmlpy as g
from tests.helpers import layer_refs as R


N, T, F = 8, 6, 3


@pytest.fixture
def backend(each_device):
    return each_device


def _padded(seed=0, value=0.0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N, T, F)).astype(np.float32)
    lengths = rng.integers(1, T + 1, N)
    for i, n in enumerate(lengths):
        x[i, n:] = value
    x[0, 1] = value  # a padding step between real ones
    return x, np.any(x != value, axis=-1)


def test_an_lstm_carries_its_state_over_padding(backend):
    x, mask = _padded(value=-1.0)
    np.random.seed(2)
    m = g.ggml_layer_masking(g.ggml_model_sequential(), mask_value=-1.0, input_shape=(T, F))
    m = g.ggml_layer_lstm(m, 4, name="r")
    m = g.ggml_compile(m, loss="mse", metrics=[], backend=backend)
    w = g.ggml_get_weights(m)
    want = R.lstm(x, w["r.kernel"], w["r.recurrent_kernel"], w["r.bias"], mask=mask)  # the state carried over
    np.testing.assert_allclose(g.ggml_predict(m, x), want, rtol=1e-5, atol=1e-6)
    # padding at the end changes nothing: the same as the unpadded sequence's last real state
    short = x[3:4, :int(mask[3].sum())]   # sample 3 is padded at its end only
    alone = R.lstm(short, w["r.kernel"], w["r.recurrent_kernel"], w["r.bias"])
    np.testing.assert_allclose(g.ggml_predict(m, x)[3], alone[0], rtol=1e-5, atol=1e-6)


def test_global_average_pooling_averages_the_real_steps(backend):
    x, mask = _padded()
    m = g.ggml_layer_masking(g.ggml_model_sequential(), input_shape=(T, F))
    m = g.ggml_layer_dense(m, 5, activation="tanh", name="d")
    m = g.ggml_layer_global_average_pooling_1d(m)
    m = g.ggml_compile(m, loss="mse", metrics=[], backend=backend)
    w = g.ggml_get_weights(m)
    want = R.masked_average(R.dense(x, w["d.weight"], w["d.bias"], "tanh"), mask)
    np.testing.assert_allclose(g.ggml_predict(m, x), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["lstm", "stacked_gru", "bidirectional", "pooling"])
def test_masked_models_train_as_keras(kind):
    os.environ.setdefault("KERAS_BACKEND", "torch")
    keras = pytest.importorskip("keras", reason="Keras 3 (with a backend) is not installed: the numpy references "
                                               "above and test_sequence_layers.py's gradient checks still run")
    x, _ = _padded(seed=3)
    y = np.random.default_rng(4).normal(size=(N, 2)).astype(np.float32)
    np.random.seed(5)
    m = g.ggml_layer_masking(g.ggml_model_sequential(), input_shape=(T, F))
    layers = [keras.Input((T, F)), keras.layers.Masking()]
    if kind == "lstm":
        m = g.ggml_layer_lstm(m, 4)
        layers.append(keras.layers.LSTM(4))
    elif kind == "stacked_gru":
        m = g.ggml_layer_gru(g.ggml_layer_gru(m, 4, return_sequences=True), 3)
        layers += [keras.layers.GRU(4, return_sequences=True), keras.layers.GRU(3)]
    elif kind == "bidirectional":
        m = g.ggml_layer_bidirectional(m, g.ggml_gru(3))
        layers.append(keras.layers.Bidirectional(keras.layers.GRU(3)))
    else:
        m = g.ggml_layer_global_average_pooling_1d(g.ggml_layer_dropout(g.ggml_layer_dense(m, 5, activation="relu"),
                                                                        0.0))
        layers += [keras.layers.Dense(5, activation="relu"), keras.layers.Dropout(0.0),
                   keras.layers.GlobalAveragePooling1D()]
    m = g.ggml_compile(g.ggml_layer_dense(m, 2), optimizer="sgd", loss="mse", metrics=[], backend="cpu",
                       learning_rate=0.1)
    layers.append(keras.layers.Dense(2))
    km = keras.Sequential(layers)
    km.set_weights(list(g.ggml_get_weights(m).values()))
    km.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    np.testing.assert_allclose(g.ggml_predict(m, x), km.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
    kh = km.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0).history
    h = g.ggml_fit(m, x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    np.testing.assert_allclose(h["train_loss"], kh["loss"], rtol=1e-5)
    for got, want in zip(g.ggml_get_weights(m).values(), km.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("build, match", [
    (lambda m: g.ggml_layer_conv_1d(m, 4, 3), r"layer 'conv_1d_\d+' \(conv_1d\) gets the padding mask"),
    (lambda m: g.ggml_layer_flatten(m), r"\(flatten\) gets the padding mask"),
    (lambda m: g.ggml_layer_flatten(g.ggml_layer_dense(g.ggml_layer_dropout(m, 0.1), 3)),
     r"\(flatten\) gets the padding mask"),
])
def test_a_mask_a_layer_cannot_honour_is_dropped_with_a_warning(build, match):
    """Keras 3 warns that such a layer destroys the mask, and trains (this was refused, saying Keras refuses it):
    the layers after it see the padding steps as real ones, so the model is the same model without the masking."""
    m = g.ggml_layer_masking(g.ggml_model_sequential(), input_shape=(T, F))
    with pytest.warns(g.GgmlpyWarning, match=match + ".*the mask is dropped there"):
        build(m)
    m = g.ggml_compile(g.ggml_layer_dense(g.ggml_layer_flatten(m) if m.layers[-1].kind != "flatten" else m, 2),
                       loss="mse", backend="cpu")
    x, _ = _padded()
    h = g.ggml_fit(m, x, np.ones((len(x), 2), np.float32), epochs=1, batch_size=4, verbose=0)
    assert np.isfinite(h["train_loss"]).all() and np.isfinite(g.ggml_predict(m, x)).all()


def test_a_mask_reaching_the_output_is_refused_at_compile():
    m = g.ggml_layer_lstm(g.ggml_layer_masking(g.ggml_model_sequential(), input_shape=(T, F)), 3,
                          return_sequences=True)   # a later layer could still end the mask: not refused yet
    with pytest.raises(g.GgmlValueError, match="still carries the padding mask"):
        g.ggml_compile(m, loss="mse", backend="cpu")


def test_masking_saves_and_checks_its_arguments(tmp_path):
    x, _ = _padded(value=9.0)
    m = g.ggml_layer_masking(g.ggml_model_sequential(), mask_value=9.0, input_shape=(T, F))
    m = g.ggml_compile(g.ggml_layer_dense(g.ggml_layer_gru(m, 3), 2), loss="mse", backend="cpu")
    g.ggml_save_model(m, tmp_path / "m.gguf")
    np.testing.assert_allclose(g.ggml_predict(g.ggml_load_model(tmp_path / "m.gguf", backend="cpu"), x),
                               g.ggml_predict(m, x), rtol=1e-6)
    with pytest.raises(g.GgmlValueError, match="mask_value must be a finite number"):
        g.ggml_masking(mask_value=float("nan"))
    with pytest.raises(g.GgmlValueError, match=r"takes sequences \(steps, features\)"):
        g.ggml_layer_masking(g.ggml_model_sequential(), input_shape=(4,))


def test_an_embedding_with_mask_zero_masks_its_padding_ids(backend):
    """Keras' Embedding(mask_zero=True): id 0 is padding, the LSTM after it carries its state over those steps."""
    rng = np.random.default_rng(7)
    ids = rng.integers(1, 10, (N, T))
    for i, n in enumerate(rng.integers(1, T + 1, N)):
        ids[i, n:] = 0
    np.random.seed(8)
    t = g.ggml_input(shape=(T,), dtype="int32")
    r = g.ggml_layer_lstm(g.ggml_layer_embedding(t, 10, F, mask_zero=True, name="emb"), 4, name="r")
    m = g.ggml_compile(g.ggml_model(t, r), loss="mse", metrics=[], backend=backend)
    w = g.ggml_get_weights(m)
    x = w["emb.weight"][ids]
    want = R.lstm(x, w["r.kernel"], w["r.recurrent_kernel"], w["r.bias"], mask=ids != 0)
    np.testing.assert_allclose(g.ggml_predict(m, ids), want, rtol=1e-5, atol=1e-6)
    tokens = g.ggml_input(shape=(T,), dtype="int32")
    plain = g.ggml_model(tokens, g.ggml_layer_flatten(g.ggml_layer_embedding(tokens, 10, F, mask_zero=True)))
    with pytest.warns(g.GgmlpyWarning, match=r"\(flatten\) gets the padding mask"):
        g.ggml_compile(plain, loss="mse", backend="cpu")
