"""Keras' kernel_initializer / bias_initializer names against Keras' VarianceScaling formulas, and input_dim."""
from __future__ import annotations

import math

import numpy as np
import pytest

import ggmlpy as g


FAN_IN, UNITS = 400, 300
TRUNC = 0.87962566103423978  # the standard deviation of a standard normal cut at +-2


def _dense_kernel(init: str) -> np.ndarray:
    np.random.seed(3)
    m = g.ggml_layer_dense(g.ggml_model_sequential(), UNITS, kernel_initializer=init, bias_initializer="ones",
                           input_shape=(FAN_IN,), name="d")
    w = g.ggml_get_weights(g.ggml_compile(m, loss="mse", backend="cpu"))
    np.testing.assert_array_equal(w["d.bias"], 1.0)
    assert w["d.weight"].shape == (FAN_IN, UNITS)
    return w["d.weight"].astype(np.float64)


# Keras: variance = scale / n, n = fan_in or (fan_in + fan_out) / 2; uniform limit sqrt(3 * variance)
@pytest.mark.parametrize("init, scale, n", [("glorot_uniform", 1.0, (FAN_IN + UNITS) / 2),
                                            ("he_uniform", 2.0, FAN_IN), ("lecun_uniform", 1.0, FAN_IN)])
def test_uniform_initializers(init, scale, n):
    w = _dense_kernel(init)
    limit = math.sqrt(3 * scale / n)
    assert np.abs(w).max() <= limit and np.abs(w).max() > 0.99 * limit
    assert w.std() == pytest.approx(limit / math.sqrt(3), rel=0.01)


@pytest.mark.parametrize("init, scale, n", [("glorot_normal", 1.0, (FAN_IN + UNITS) / 2),
                                            ("he_normal", 2.0, FAN_IN), ("lecun_normal", 1.0, FAN_IN)])
def test_truncated_normal_initializers(init, scale, n):
    w = _dense_kernel(init)
    std = math.sqrt(scale / n) / TRUNC   # the normal before the cut; after it the variance is scale / n
    assert np.abs(w).max() <= 2 * std
    assert w.std() == pytest.approx(math.sqrt(scale / n), rel=0.01)
    assert abs(w.mean()) < 0.01 * std


def test_fixed_initializers_and_conv_fans():
    assert _dense_kernel("random_normal").std() == pytest.approx(0.05, rel=0.01)
    assert np.abs(_dense_kernel("random_uniform")).max() <= 0.05
    np.testing.assert_array_equal(_dense_kernel("zeros"), 0.0)
    np.random.seed(1)
    m = g.ggml_layer_conv_2d(g.ggml_model_sequential(), 64, (3, 3), kernel_initializer="he_uniform",
                             input_shape=(16, 16, 32), name="c")
    k = g.ggml_get_weights(g.ggml_compile(m, loss="mse", backend="cpu"))["c.kernel"]
    assert np.abs(k).max() <= math.sqrt(6 / (3 * 3 * 32))  # fan_in = kh * kw * in channels, as Keras


def test_input_dim_and_bad_names():
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 3, input_dim=7)
    assert m.layers[0].input_shape == (7,)
    with pytest.raises(g.GgmlValueError, match="input_dim or input_shape, not both"):
        g.ggml_layer_dense(g.ggml_model_sequential(), 3, input_dim=7, input_shape=(7,))
    with pytest.raises(g.GgmlValueError, match="kernel_initializer must be one of glorot_uniform"):
        g.ggml_layer_dense(g.ggml_model_sequential(), 3, kernel_initializer="xavier", input_dim=2)


def test_the_default_initializer_draws_as_before():
    """glorot_uniform is the former 'glorot': the same draws from numpy's seed, so seeded runs repeat."""
    w = _dense_kernel("glorot_uniform")
    np.random.seed(3)
    m = g.ggml_layer_dense(g.ggml_model_sequential(), UNITS, bias_initializer="ones", input_shape=(FAN_IN,), name="d")
    np.testing.assert_array_equal(g.ggml_get_weights(g.ggml_compile(m, loss="mse", backend="cpu"))["d.weight"], w)


def _weights(layer_fn, *args, **kw):
    np.random.seed(2)
    m = layer_fn(g.ggml_model_sequential(), *args, name="r", **kw)
    return g.ggml_get_weights(g.ggml_compile(m, loss="mse", backend="cpu"))


@pytest.mark.parametrize("layer_fn, gates", [(g.ggml_layer_lstm, 4), (g.ggml_layer_gru, 3)])
def test_recurrent_layers_take_keras_initializers_with_keras_fans(layer_fn, gates):
    """Keras' LSTM/GRU: kernel fans (features, gates * units), the recurrent kernel's (units, gates * units)."""
    units, features = 64, 200
    w = _weights(layer_fn, units, kernel_initializer="he_uniform", recurrent_initializer="glorot_normal",
                 bias_initializer="ones", input_shape=(3, features))
    kernel, rec = w["r.kernel"].astype(np.float64), w["r.recurrent_kernel"].astype(np.float64)
    assert kernel.shape == (features, gates * units) and rec.shape == (units, gates * units)
    assert np.abs(kernel).max() <= math.sqrt(6 / features) and kernel.std() == pytest.approx(
        math.sqrt(2 / features), rel=0.03)
    assert rec.std() == pytest.approx(math.sqrt(2 / (units + gates * units)), rel=0.03)
    np.testing.assert_array_equal(w["r.bias"], 1.0)   # LSTM: the forget gate's ones anyway
    default = _weights(layer_fn, units, input_shape=(3, features))["r.recurrent_kernel"].astype(np.float64)
    gram = default @ default.T   # orthonormal rows: Keras' default recurrent initializer (the wide matrix)
    np.testing.assert_allclose(gram, np.eye(units), atol=1e-5)


def test_lstm_unit_forget_bias_and_its_bias_initializer():
    units = 5
    on = _weights(g.ggml_layer_lstm, units, bias_initializer="random_uniform", input_shape=(2, 3))["r.bias"]
    np.testing.assert_array_equal(on[units:2 * units], 1.0)
    assert np.abs(np.delete(on, range(units, 2 * units))).max() <= 0.05 and on[:units].std() > 0
    off = _weights(g.ggml_layer_lstm, units, unit_forget_bias=False, input_shape=(2, 3))["r.bias"]
    np.testing.assert_array_equal(off, 0.0)
    with pytest.raises(ValueError, match="recurrent_initializer must be one of"):
        g.ggml_layer_gru(g.ggml_model_sequential(), 3, recurrent_initializer="identity", input_shape=(2, 3))
    with pytest.raises(TypeError, match="unexpected keyword argument 'unit_forget_bias'"):
        g.ggml_layer_gru(g.ggml_model_sequential(), 3, unit_forget_bias=False, input_shape=(2, 3))


def test_embedding_takes_keras_names_and_initializer():
    w = _weights(g.ggml_layer_embedding, input_dim=50, output_dim=8, embeddings_initializer="random_normal",
                 input_shape=(4,))["r.weight"]
    assert w.shape == (50, 8) and w.std() == pytest.approx(0.05, rel=0.1)
    default = _weights(g.ggml_layer_embedding, 50, 8, input_shape=(4,))["r.weight"]
    assert np.abs(default).max() <= 0.05 and default.std() == pytest.approx(0.1 / math.sqrt(12), rel=0.1)
    with pytest.raises(ValueError, match="give vocab_size or input_dim"):
        g.ggml_layer_embedding(g.ggml_model_sequential(), 50, 8, input_dim=50)
    with pytest.raises(TypeError, match="missing a required argument: 'dim'"):
        g.ggml_layer_embedding(g.ggml_model_sequential(), 50, input_shape=(4,))
