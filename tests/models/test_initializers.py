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
