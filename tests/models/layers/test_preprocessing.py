"""Keras' Rescaling and RandomFlip (models/layers/preprocessing.py), on the CPU and Vulkan.

RandomFlip is seen through a one-sample trainer step: a dense layer (no bias, a learning rate of ~0) after the flip
makes the step's loss that of the image as it is or of the image flipped, so each step's loss must be one of the two
numpy values, both must occur about equally often, and a prediction must be the unflipped image's."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g


def test_rescaling_scales_and_offsets_in_training_and_inference(device):
    x = np.random.default_rng(0).uniform(0, 255, (6, 4, 3, 2)).astype(np.float32)
    m = g.ggml_layer_rescaling(g.ggml_model_sequential(), 1 / 127.5, offset=-1.0, input_shape=(4, 3, 2))
    m = g.ggml_compile(g.ggml_layer_dense(g.ggml_layer_flatten(m), 1), loss="mse", backend=device)
    w = g.ggml_get_weights(m)
    got = g.ggml_predict(m, x)
    key = next(k for k in w if k.endswith(".weight"))
    bias = next(k for k in w if k.endswith(".bias"))
    want = (x.reshape(6, -1).astype(np.float64) / 127.5 - 1) @ w[key] + w[bias]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(g.GgmlValueError, match="scale must be a finite number"):
        g.ggml_rescaling(float("nan"))


@pytest.mark.parametrize("mode, flip", [("horizontal", lambda a: a[:, :, ::-1]), ("vertical", lambda a: a[:, ::-1])])
def test_random_flip_flips_about_half_of_the_training_images_and_none_at_inference(device, mode, flip):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(1, 3, 5, 2)).astype(np.float32)
    y = rng.normal(size=(1, 2)).astype(np.float32)
    np.random.seed(2)
    m = g.ggml_layer_random_flip(g.ggml_model_sequential(), mode, input_shape=(3, 5, 2))
    m = g.ggml_layer_dense(g.ggml_layer_flatten(m), 2, use_bias=False, name="d")
    m = g.ggml_compile(m, loss="mse", optimizer="sgd", learning_rate=1e-12, backend=device)
    w = g.ggml_get_weights(m)["d.weight"].astype(np.float64)

    def loss_of(image):
        return float(np.mean((image.reshape(1, -1).astype(np.float64) @ w - y) ** 2))
    plain, flipped = loss_of(x), loss_of(flip(x))
    assert abs(plain - flipped) > 1e-3 * max(plain, flipped)   # the two are told apart
    np.testing.assert_allclose(g.ggml_predict(m, x), x.reshape(1, -1) @ w, rtol=1e-5, atol=1e-6)
    trainer = g.ggml_trainer(m, batch_size=1)
    losses = [trainer.step(x, y) for _ in range(60)]
    trainer.free()
    is_flipped = [abs(v - flipped) < 1e-4 * flipped for v in losses]
    is_plain = [abs(v - plain) < 1e-4 * plain for v in losses]
    assert all(a or b for a, b in zip(is_flipped, is_plain)), losses
    assert 12 <= sum(is_flipped) <= 48, sum(is_flipped)   # binomial(60, 1/2): outside this once in 10^5


def test_random_flip_checks_its_mode_and_input():
    with pytest.raises(g.GgmlValueError, match="mode must be one of"):
        g.ggml_random_flip("diagonal")
    with pytest.raises(g.GgmlValueError, match="takes image samples"):
        g.ggml_layer_random_flip(g.ggml_model_sequential(), input_shape=(4, 3))
